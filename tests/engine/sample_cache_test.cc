#include "engine/sample_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <list>
#include <set>
#include <unordered_map>
#include <vector>

#include "source/permutation.h"

namespace mmfeed {
namespace {

constexpr uint32_t kSamples = 400, kEpochs = 4;

// Epoch e's order: a permutation of the samples seeded by e (as EpochOrder's).
Permutation OrderOf(uint32_t epoch) { return Permutation(kSamples, 1000 + epoch); }

uint64_t NextUse(uint32_t entry, uint32_t after) {
  if (after + 1 >= kEpochs) return SampleCache::kNever;
  return (uint64_t{after + 1} << 32) | OrderOf(after + 1).Inverse(entry);
}

// The whole run's reads, in order.
std::vector<uint32_t> Reads() {
  std::vector<uint32_t> reads;
  for (uint32_t e = 0; e < kEpochs; ++e) {
    const Permutation p = OrderOf(e);
    for (uint32_t i = 0; i < kSamples; ++i) reads.push_back(static_cast<uint32_t>(p(i)));
  }
  return reads;
}

// Belady's MIN with bypass, offline, for `capacity` equal-sized items: on a miss with the cache
// full, the item whose next read is furthest (the new one included) is not kept.
uint64_t MinHits(const std::vector<uint32_t>& reads, size_t capacity) {
  auto next_after = [&](size_t t) {
    for (size_t u = t + 1; u < reads.size(); ++u)
      if (reads[u] == reads[t]) return u;
    return reads.size();
  };
  std::unordered_map<uint32_t, size_t> next;  // kept item -> its next read
  uint64_t hits = 0;
  for (size_t t = 0; t < reads.size(); ++t) {
    const size_t n = next_after(t);
    if (next.count(reads[t])) {
      ++hits;
      next[reads[t]] = n;
      continue;
    }
    if (next.size() < capacity) {
      next[reads[t]] = n;
      continue;
    }
    auto worst = std::max_element(next.begin(), next.end(),
                                  [](const auto& a, const auto& b) { return a.second < b.second; });
    if (worst->second > n) {
      next.erase(worst);
      next[reads[t]] = n;
    }
  }
  return hits;
}

uint64_t LruHits(const std::vector<uint32_t>& reads, size_t capacity) {
  std::list<uint32_t> recent;
  uint64_t hits = 0;
  for (uint32_t r : reads) {
    auto it = std::find(recent.begin(), recent.end(), r);
    if (it != recent.end()) {
      ++hits;
      recent.erase(it);
    } else if (recent.size() == capacity) {
      recent.pop_back();
    }
    recent.push_front(r);
  }
  return hits;
}

uint64_t CacheHits(const std::vector<uint32_t>& reads, size_t capacity, size_t item_bytes) {
  SampleCache cache(capacity * item_bytes, NextUse);
  for (size_t t = 0; t < reads.size(); ++t) {
    const uint32_t epoch = static_cast<uint32_t>(t / kSamples);
    if (auto kept = cache.Find(reads[t], epoch)) {
      EXPECT_EQ(*kept, std::string(item_bytes, static_cast<char>(reads[t])));
      continue;
    }
    cache.Offer(reads[t], epoch, std::string(item_bytes, static_cast<char>(reads[t])));
  }
  const SampleCache::Stats s = cache.stats();
  EXPECT_LE(s.bytes, capacity * item_bytes);
  EXPECT_EQ(s.hits + s.misses, reads.size());
  return s.hits;
}

// Half the samples fit: the cache's hits are MIN's (it sees the same future), well above LRU's
// (which, on a fresh shuffle every epoch, does no better than chance).
TEST(SampleCacheTest, HitsWhatMinHitsWithHalfTheSamples) {
  const std::vector<uint32_t> reads = Reads();
  const uint64_t min = MinHits(reads, kSamples / 2), lru = LruHits(reads, kSamples / 2);
  const uint64_t hits = CacheHits(reads, kSamples / 2, 100);
  EXPECT_EQ(hits, min);
  EXPECT_GT(hits, lru * 5 / 4) << "min " << min << ", lru " << lru;
}

// Every sample fits: every read after the first epoch is a hit; the last epoch's samples (read
// by no later epoch) are never evicted for nothing.
TEST(SampleCacheTest, KeepsEverythingThatFits) {
  const std::vector<uint32_t> reads = Reads();
  EXPECT_EQ(CacheHits(reads, kSamples, 64), uint64_t{kSamples} * (kEpochs - 1));
}

// A sample larger than the cache is not kept, and evicts nothing; a sample no read needs again
// takes only free room.
TEST(SampleCacheTest, NeverKeepsWhatCannotHelp) {
  SampleCache cache(1000, NextUse);
  cache.Offer(1, 0, std::string(600, 'a'));
  cache.Offer(2, 0, std::string(2000, 'b'));
  EXPECT_TRUE(cache.Find(1, 1));
  EXPECT_FALSE(cache.Find(2, 1));
  cache.Offer(3, kEpochs - 1, std::string(600, 'c'));  // the last epoch: never read again
  EXPECT_TRUE(cache.Find(1, 2));
  EXPECT_FALSE(cache.Find(3, 2));
  const SampleCache::Stats s = cache.stats();
  EXPECT_EQ(s.not_kept, 2u);
  EXPECT_EQ(s.evicted_bytes, 0u);
  EXPECT_EQ(s.bytes, 600u);
  EXPECT_EQ(s.samples, 1u);
}

// A kept sample whose read was missed (it failed, or another node read it) is ranked anew when
// the epoch moves on, not kept forever as "needed soonest".
TEST(SampleCacheTest, RanksAgainWhatMissedItsRead) {
  // Sample 7 is read at epoch 1 only; sample 9 at epoch 3.
  auto next_use = [](uint32_t entry, uint32_t after) -> uint64_t {
    if (entry == 7 && after < 1) return (uint64_t{1} << 32) | 5;
    if (entry == 9 && after < 3) return uint64_t{3} << 32;
    return SampleCache::kNever;
  };
  SampleCache cache(100, next_use);
  cache.Offer(7, 0, std::string(100, 'x'));
  // Epoch 1 passes without reading 7; at epoch 2 it is needed by no read, so 9 displaces it.
  cache.Offer(9, 2, std::string(100, 'z'));
  EXPECT_TRUE(cache.Find(9, 3));
  EXPECT_EQ(cache.stats().evicted_bytes, 100u);
}

}  // namespace
}  // namespace mmfeed
