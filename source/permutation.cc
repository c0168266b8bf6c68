#include "source/permutation.h"

#include "base/rng.h"

namespace mmfeed {
namespace {

uint64_t Fmix64(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdull;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ull;
  k ^= k >> 33;
  return k;
}

}  // namespace

Permutation::Permutation(uint64_t n, uint64_t seed) : n_(n) {
  while (half_bits_ < 32 && (uint64_t{1} << (2 * half_bits_)) < n) ++half_bits_;
  half_mask_ = (uint64_t{1} << half_bits_) - 1;
  Rng rng(seed);
  for (uint64_t& k : keys_) k = rng.Next();
}

uint64_t Permutation::Encrypt(uint64_t x) const {
  uint64_t left = x >> half_bits_, right = x & half_mask_;
  for (uint64_t key : keys_) {
    const uint64_t next = left ^ (Fmix64(right ^ key) & half_mask_);
    left = right;
    right = next;
  }
  return (left << half_bits_) | right;
}

uint64_t Permutation::Decrypt(uint64_t x) const {
  uint64_t left = x >> half_bits_, right = x & half_mask_;
  for (int r = kRounds - 1; r >= 0; --r) {
    const uint64_t prev = right ^ (Fmix64(left ^ keys_[r]) & half_mask_);
    right = left;
    left = prev;
  }
  return (left << half_bits_) | right;
}

uint64_t Permutation::operator()(uint64_t i) const {
  uint64_t x = Encrypt(i);
  while (x >= n_) x = Encrypt(x);  // cycle walking: stays on i's cycle, so it ends below n
  return x;
}

uint64_t Permutation::Inverse(uint64_t j) const {
  uint64_t x = Decrypt(j);
  while (x >= n_) x = Decrypt(x);
  return x;
}

}  // namespace mmfeed
