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

uint64_t HashBytes(const void* data, size_t size) {
  constexpr uint64_t kMul = 0x9E3779B97F4A7C15ull;
  auto mix = [](uint64_t h, uint64_t w) {
    h ^= w * 0xC2B2AE3D27D4EB4Full;
    h = (h << 31 | h >> 33) * kMul;
    return h;
  };
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t lane[4] = {1, 2, 3, 4};
  size_t i = 0;
  for (; i + 32 <= size; i += 32) {
    for (int k = 0; k < 4; ++k) {
      uint64_t w;
      std::memcpy(&w, p + i + 8 * k, 8);
      lane[k] = mix(lane[k], w);
    }
  }
  uint64_t h = size * kMul;
  for (uint64_t l : lane) h = mix(h, l);
  for (; i < size; ++i) h = mix(h, p[i]);
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ull;
  return h ^ (h >> 32);
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
