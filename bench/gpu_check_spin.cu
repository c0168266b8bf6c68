// The mock training step of bench/gpu_check.cc: one thread spinning for a number of cycles.
#include <cuda_runtime_api.h>

namespace {

__global__ void Spin(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

}  // namespace

cudaError_t LaunchSpin(long long cycles, cudaStream_t stream) {
  Spin<<<1, 1, 0, stream>>>(cycles);
  return cudaGetLastError();
}
