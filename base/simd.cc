#include "base/simd.h"

#include <atomic>

namespace mmfeed {
namespace {

std::atomic<bool> portable_only{false};

}  // namespace

bool UseAvx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has && !portable_only.load(std::memory_order_relaxed);
}

bool UseAvx512() {
  static const bool has = __builtin_cpu_supports("avx512f");
  return has && !portable_only.load(std::memory_order_relaxed);
}

void UsePortableKernels(bool portable) { portable_only = portable; }

}  // namespace mmfeed
