#include "source/cache_policy.h"

#include <algorithm>
#include <iterator>
#include <numeric>

#define XXH_INLINE_ALL  // header-only: no library to link
#include <xxhash.h>

namespace mmfeed {

Eviction PlanEviction(const std::vector<EvictionCandidate>& candidates, uint64_t held,
                      uint64_t bytes, uint64_t next, uint64_t capacity, bool bypass) {
  Eviction e;
  if (bytes > capacity) return e;
  std::vector<size_t> order(candidates.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const EvictionCandidate &x = candidates[a], &y = candidates[b];
    return x.next != y.next ? x.next > y.next : x.last_use < y.last_use;
  });
  for (size_t i : order) {
    if (held - e.freed + bytes <= capacity) break;
    // MIN: an item read no later than the new one stays; the new one is then not kept. One
    // with no known next read takes only free room.
    if (bypass && (next == kNeverRead || candidates[i].next <= next)) break;
    e.victims.push_back(i);
    e.freed += candidates[i].bytes;
  }
  e.keep = held - e.freed + bytes <= capacity;
  if (!e.keep) {
    e.victims.clear();
    e.freed = 0;
  }
  return e;
}

bool MinSet::Admit(uint32_t entry, uint64_t next, uint64_t size, std::vector<uint32_t>* out) {
  uint64_t freed = 0;
  auto first_out = by_next_.end();
  while (bytes_ - freed + size > max_bytes_ && first_out != by_next_.begin() &&
         next != kNeverRead) {
    auto prev = std::prev(first_out);
    if (prev->first <= next) break;
    freed += kept_[prev->second].second;
    first_out = prev;
  }
  if (bytes_ - freed + size > max_bytes_) return false;
  for (auto it = first_out; it != by_next_.end(); ++it) {
    kept_.erase(it->second);
    out->push_back(it->second);
  }
  by_next_.erase(first_out, by_next_.end());
  bytes_ += size - freed;
  kept_[entry] = {next, size};
  by_next_.emplace(next, entry);
  return true;
}

void MinSet::Rank(uint32_t entry, uint64_t next) {
  auto it = kept_.find(entry);
  if (it == kept_.end()) return;
  by_next_.erase({it->second.first, entry});
  it->second.first = next;
  by_next_.emplace(next, entry);
}

std::optional<uint64_t> MinSet::NextOf(uint32_t entry) const {
  auto it = kept_.find(entry);
  if (it == kept_.end()) return std::nullopt;
  return it->second.first;
}

void MinSet::Erase(uint32_t entry) {
  auto it = kept_.find(entry);
  if (it == kept_.end()) return;
  bytes_ -= it->second.second;
  by_next_.erase({it->second.first, entry});
  kept_.erase(it);
}

std::vector<std::pair<uint64_t, uint32_t>> MinSet::Before(uint64_t now) const {
  std::vector<std::pair<uint64_t, uint32_t>> out;
  for (auto it = by_next_.begin(); it != by_next_.end() && it->first < now; ++it)
    out.push_back(*it);
  return out;
}

uint64_t Checksum(const void* data, size_t size) { return XXH3_64bits(data, size); }

}  // namespace mmfeed
