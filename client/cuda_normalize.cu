#include "client/cuda_normalize.h"

namespace mmfeed {
namespace {

struct Affine {
  float scale[3], shift[3];  // out = pixel * scale + shift
};

// One thread per output value: reads are strided by 3 bytes, writes coalesced per channel plane.
__global__ void NormalizeKernel(const uint8_t* in, float* out, int64_t total, int64_t plane,
                                Affine a) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t image = i / (3 * plane), rest = i % (3 * plane);
    const int c = static_cast<int>(rest / plane);
    const int64_t pixel = rest % plane;
    out[i] = in[(image * plane + pixel) * 3 + c] * a.scale[c] + a.shift[c];
  }
}

}  // namespace

cudaError_t NormalizeU8HwcToF32Chw(const uint8_t* in, float* out, int64_t n, int h, int w,
                                   const float mean[3], const float std[3], cudaStream_t stream) {
  Affine a;
  for (int c = 0; c < 3; ++c) {  // (p / 255 - mean) / std = p / (255 std) - mean / std, as the
    a.scale[c] = static_cast<float>(1.0 / (255.0 * std[c]));  // image stage computes it
    a.shift[c] = static_cast<float>(-static_cast<double>(mean[c]) / std[c]);
  }
  const int64_t plane = static_cast<int64_t>(h) * w, total = n * 3 * plane;
  if (total == 0) return cudaSuccess;
  const int threads = 256;
  const int64_t blocks = (total + threads - 1) / threads;
  NormalizeKernel<<<static_cast<unsigned>(blocks < 65535 ? blocks : 65535), threads, 0, stream>>>(
      in, out, total, plane, a);
  return cudaGetLastError();
}

}  // namespace mmfeed
