#include "base/rng.h"

#include <cstring>

namespace mmfeed {

uint64_t HashString(std::string_view s, uint64_t h) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

Rng::Rng(uint64_t seed, uint64_t epoch, std::string_view id, std::string_view purpose) {
  uint64_t h = HashString(purpose, HashString(id));
  state_ = seed * 0x9E3779B97F4A7C15ull ^ (epoch + 1) * 0xC2B2AE3D27D4EB4Full ^ h;
  Next();
}

uint64_t Rng::Next() {
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t Rng::Below(uint64_t n) {
  // Lemire's multiply-shift with rejection: unbiased and the same on every platform.
  while (true) {
    __uint128_t m = static_cast<__uint128_t>(Next()) * n;
    uint64_t low = static_cast<uint64_t>(m);
    if (low >= n || low >= (-n) % n) return static_cast<uint64_t>(m >> 64);
  }
}

}  // namespace mmfeed
