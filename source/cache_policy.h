// The caches' one eviction rule, and the one checksum of their files.
//
// Every cache in mmfeed knows the future: the order is a pure function of (seed, epoch,
// position), so the time each item is read next is known (docs/design/cache.md). The rule is
// Belady's MIN with bypass: to make room, drop the items read next furthest in the future; an
// item read later than every one it would displace is not kept at all. Where no next read is
// known (kNeverRead), the least recently used goes first. Used by the processed-sample cache and
// its disk tier (engine/sample_cache.h, as MinSet), the shard cache on disk
// (source/shard_cache.h) and the remote store's shards in memory (source/remote_store.h), both
// through PlanEviction.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

namespace mmfeed {

// A next read that is not known, or not within the reads looked at.
inline constexpr uint64_t kNeverRead = UINT64_MAX;

// A kept item that may be dropped: its next read, its size, and when it was last used (for ties
// and for items without a known next read: the least recent goes first).
struct EvictionCandidate {
  uint64_t next = kNeverRead;
  uint64_t bytes = 0;
  uint64_t last_use = 0;
};

struct Eviction {
  bool keep = false;            // the new item fits once `victims` are dropped
  std::vector<size_t> victims;  // indexes into the candidates, in the order dropped
  uint64_t freed = 0;           // their bytes
};

// Room for an item of `bytes`, read next at `next`, in a cache of `capacity` holding `held`
// bytes, by dropping candidates: furthest next read first, then least recently used. With
// `bypass`, a candidate read sooner than (or as soon as) the new item is never dropped for it:
// the new item is then not kept (MIN with bypass); without, any candidate may go (an item that
// must be held, such as a shard being fetched for a read now). An item larger than the capacity
// is never kept.
Eviction PlanEviction(const std::vector<EvictionCandidate>& candidates, uint64_t held,
                      uint64_t bytes, uint64_t next, uint64_t capacity, bool bypass);

// The same rule kept incrementally, for a tier of many items (a stage's processed samples):
// Admit is O(log n) per dropped item. Agrees with PlanEviction with bypass (a test compares).
class MinSet {
 public:
  explicit MinSet(uint64_t max_bytes) : max_bytes_(max_bytes) {}
  bool contains(uint32_t entry) const { return kept_.count(entry) != 0; }
  uint64_t bytes() const { return bytes_; }
  size_t size() const { return kept_.size(); }
  // Keeps `entry` (`size` bytes, next read `next`) if MIN does: room is made from the entries
  // read after it, furthest first (appended to `out`); if they cannot free enough, keeping it
  // would displace entries read sooner, and it is not kept (false). One read by no read in
  // sight (kNeverRead) takes only free room. REQUIRES: !contains(entry).
  bool Admit(uint32_t entry, uint64_t next, uint64_t size, std::vector<uint32_t>* out);
  // Ranks `entry` by its next read `next`, if it is kept.
  void Rank(uint32_t entry, uint64_t next);
  // The next read `entry` is ranked by, if it is kept.
  std::optional<uint64_t> NextOf(uint32_t entry) const;
  void Erase(uint32_t entry);
  // The kept entries whose next read is before `now`, as (next read, entry).
  std::vector<std::pair<uint64_t, uint32_t>> Before(uint64_t now) const;

 private:
  const uint64_t max_bytes_;
  uint64_t bytes_ = 0;
  std::unordered_map<uint32_t, std::pair<uint64_t, uint64_t>> kept_;  // entry -> (next, size)
  std::set<std::pair<uint64_t, uint32_t>> by_next_;                   // (next read, entry)
};

// The checksum of cached files' bytes (XXH3, 64 bits): a file edited, cut or swapped is found
// before any byte is served.
uint64_t Checksum(const void* data, size_t size);

}  // namespace mmfeed
