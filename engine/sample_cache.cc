#include "engine/sample_cache.h"

#include <iterator>
#include <utility>
#include <vector>

namespace mmfeed {

SampleCache::SampleCache(uint64_t max_bytes, NextUse next_use)
    : max_bytes_(max_bytes), next_use_(std::move(next_use)) {
  stats_.max_bytes = max_bytes;
}

void SampleCache::Advance(uint32_t epoch, std::unique_lock<std::mutex>& lock) {
  if (epoch <= epoch_) return;
  epoch_ = epoch;
  const uint64_t now = uint64_t{epoch} << 32;
  std::vector<std::pair<uint64_t, uint32_t>> stale;  // (next read it missed, entry)
  for (auto it = by_next_.begin(); it != by_next_.end() && it->first < now; ++it)
    stale.push_back(*it);
  if (stale.empty()) return;
  lock.unlock();
  std::vector<uint64_t> next(stale.size());
  for (size_t i = 0; i < stale.size(); ++i) next[i] = next_use_(stale[i].second, epoch - 1);
  lock.lock();
  for (size_t i = 0; i < stale.size(); ++i) {
    const auto [missed, entry] = stale[i];
    auto it = kept_.find(entry);
    if (it == kept_.end() || it->second.next != missed) continue;  // evicted or ranked meanwhile
    by_next_.erase({missed, entry});
    it->second.next = next[i];
    by_next_.emplace(next[i], entry);
  }
}

std::shared_ptr<const std::string> SampleCache::Find(uint32_t entry, uint32_t epoch) {
  std::shared_ptr<const std::string> bytes;
  {
    std::unique_lock<std::mutex> lock(mu_);
    Advance(epoch, lock);
    auto it = kept_.find(entry);
    if (it == kept_.end()) {
      ++stats_.misses;
      return nullptr;
    }
    ++stats_.hits;
    bytes = it->second.bytes;
  }
  const uint64_t next = next_use_(entry, epoch);  // outside the lock: it may walk an order
  std::lock_guard<std::mutex> lock(mu_);
  auto it = kept_.find(entry);
  if (it != kept_.end() && it->second.bytes == bytes) {
    by_next_.erase({it->second.next, entry});
    it->second.next = next;
    by_next_.emplace(next, entry);
  }
  return bytes;
}

std::shared_ptr<const std::string> SampleCache::Offer(uint32_t entry, uint32_t epoch,
                                                      std::string bytes) {
  auto offered = std::make_shared<const std::string>(std::move(bytes));
  const uint64_t size = offered->size();
  const uint64_t next = next_use_(entry, epoch);
  std::unique_lock<std::mutex> lock(mu_);
  Advance(epoch, lock);
  // Another worker's copy of the same sample (a refill) was kept first.
  if (auto it = kept_.find(entry); it != kept_.end()) return it->second.bytes;
  // MIN with bypass: make room from the samples needed after this one, furthest first; if they
  // cannot free enough, keeping this one would displace samples needed sooner. One needed by
  // no read in sight takes only free room.
  uint64_t freed = 0;
  auto first_out = by_next_.end();
  while (stats_.bytes - freed + size > max_bytes_ && first_out != by_next_.begin() &&
         next != kNever) {
    auto prev = std::prev(first_out);
    if (prev->first <= next) break;
    freed += kept_[prev->second].bytes->size();
    first_out = prev;
  }
  if (stats_.bytes - freed + size > max_bytes_) {
    ++stats_.not_kept;
    return offered;
  }
  for (auto it = first_out; it != by_next_.end(); ++it) kept_.erase(it->second);
  stats_.evicted_bytes += freed;
  by_next_.erase(first_out, by_next_.end());
  stats_.bytes += size - freed;
  kept_[entry] = Kept{offered, next};
  by_next_.emplace(next, entry);
  stats_.samples = kept_.size();
  return offered;
}

SampleCache::Stats SampleCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace mmfeed
