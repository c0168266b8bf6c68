// SampleCache: one stage's outputs kept in memory per sample (catalog entry), up to a byte
// budget, so that a later epoch copies them instead of decoding again (a stage's `cache:`,
// docs/cache.md).
//
// The order is a pure function of (seed, epoch, position), so the cache knows when each sample
// is read next (Pipeline::NextUse: the inverse of the coming epochs' orders) and evicts by
// Belady's MIN: when a new sample does not fit, the samples needed furthest ahead leave, and a
// sample needed later than all those it would displace is not kept (bypass). A rank never
// depends on it for its bytes: a miss runs the stage, and a kept row is the stage's own output.
//
// Thread-safe: every worker of the stage calls it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>

namespace mmfeed {

class SampleCache {
 public:
  // When `entry` is read next after its read in epoch `after`: epoch << 32 | position in that
  // epoch's order, or kNever (not within the epochs looked at, or past the run's end).
  static constexpr uint64_t kNever = UINT64_MAX;
  using NextUse = std::function<uint64_t(uint32_t entry, uint32_t after)>;

  SampleCache(uint64_t max_bytes, NextUse next_use);

  // The bytes kept for `entry` (read now, in `epoch`), or null (a miss). A hit is ranked anew by
  // its next read after this one.
  std::shared_ptr<const std::string> Find(uint32_t entry, uint32_t epoch);
  // Offers the bytes `entry`'s read in `epoch` made; kept if MIN keeps them. Returns them (the
  // copy kept before, if another worker kept the sample first).
  std::shared_ptr<const std::string> Offer(uint32_t entry, uint32_t epoch, std::string bytes);

  struct Stats {
    uint64_t hits = 0, misses = 0, bytes = 0, max_bytes = 0, samples = 0, evicted_bytes = 0,
             not_kept = 0;
  };
  Stats stats() const;

 private:
  struct Kept {
    std::shared_ptr<const std::string> bytes;
    uint64_t next = kNever;
  };
  // Ranks again the kept samples whose next read lies before epoch `epoch` (they missed it: a
  // failed sample, one another node read). Their next reads are found with `lock` released
  // (the first lookup in a new epoch may walk its order). REQUIRES: `lock` holds mu_.
  void Advance(uint32_t epoch, std::unique_lock<std::mutex>& lock);

  const uint64_t max_bytes_;
  const NextUse next_use_;
  mutable std::mutex mu_;
  std::unordered_map<uint32_t, Kept> kept_;
  std::set<std::pair<uint64_t, uint32_t>> by_next_;  // (next read, entry), furthest last
  uint32_t epoch_ = 0;                               // the latest epoch read
  Stats stats_;
};

}  // namespace mmfeed
