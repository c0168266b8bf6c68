// Deterministic random numbers for augmentation and shuffling. A stream is seeded from
// (seed, epoch, sample id, purpose), never from thread-local state, so results do not depend
// on which worker ran a sample. The generator (SplitMix64) and the distributions are written
// out here rather than taken from <random>, whose distributions differ between libraries.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace mmfeed {

// 64-bit FNV-1a, used to turn ids and names into seeds.
uint64_t HashString(std::string_view s, uint64_t h = 0xcbf29ce484222325ull);

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  Rng(uint64_t seed, uint64_t epoch, std::string_view id, std::string_view purpose);

  uint64_t Next();
  // Uniform in [0, 1).
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  double Uniform(double lo, double hi) { return lo + (hi - lo) * Uniform(); }
  // Uniform integer in [0, n). REQUIRES: n > 0.
  uint64_t Below(uint64_t n);

 private:
  uint64_t state_;
};

}  // namespace mmfeed
