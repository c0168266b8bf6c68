// Permutation: a seeded bijection on [0, n), computed per position in O(1) time and memory, so
// that an epoch's shuffled order needs no table however large the dataset (a table of 4-byte
// indexes is 4 GB at a billion samples) and a cursor resumes without replaying anything.
//
// A balanced Feistel network on the smallest even number of bits 2h with 4^h >= n (so 4^h < 4n),
// six rounds whose round function is a 64-bit finalizer (MurmurHash3's fmix64) of the half and
// a round key, is a bijection on [0, 4^h); "cycle walking" (apply it again until the value is
// below n) restricts it to a bijection on [0, n) with fewer than 4 applications on average.
// With good round functions, four or more rounds make the network indistinguishable from a
// random permutation for an observer of few positions (Luby-Rackoff); six leave a margin. It is
// not a uniform draw among all n! orders (the key is 64 bits), which no training order needs.
// docs/design/shuffle.md gives the measured quality.
#pragma once

#include <array>
#include <cstdint>

namespace mmfeed {

class Permutation {
 public:
  Permutation(uint64_t n, uint64_t seed);
  uint64_t size() const { return n_; }
  // The position i goes to. REQUIRES: i < size().
  uint64_t operator()(uint64_t i) const;
  // The position that goes to j: Inverse((*this)(i)) == i. The rounds run backwards, walking
  // the same cycle the other way; O(1) expected like operator(). REQUIRES: j < size().
  uint64_t Inverse(uint64_t j) const;

 private:
  static constexpr int kRounds = 6;
  uint64_t Encrypt(uint64_t x) const;
  uint64_t Decrypt(uint64_t x) const;

  uint64_t n_;
  int half_bits_ = 1;
  uint64_t half_mask_ = 1;
  std::array<uint64_t, kRounds> keys_{};
};

}  // namespace mmfeed
