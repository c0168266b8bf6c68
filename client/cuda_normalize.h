// On-GPU conversion of uint8 images, so that the host can ship `dtype: uint8` (4x less shared
// memory and PCIe traffic than float32): HWC uint8 -> CHW float32, (pixel / 255 - mean) / std,
// what an image stage with `dtype: float32, layout: CHW` and the same mean and std gives.
// Built when CMake finds nvcc (MMFEED_HAVE_CUDA_KERNELS); otherwise do it in the trainer with
// mmfeed.torch.normalize on the GPU tensor.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace mmfeed {

// `in`: n images [h, w, 3] uint8, `out`: n images [3, h, w] float32, both in device memory.
// Queued on `stream`; returns the launch's error.
cudaError_t NormalizeU8HwcToF32Chw(const uint8_t* in, float* out, int64_t n, int h, int w,
                                   const float mean[3], const float std[3], cudaStream_t stream);

}  // namespace mmfeed
