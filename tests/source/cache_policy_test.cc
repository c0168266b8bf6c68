#include "source/cache_policy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <string>

namespace mmfeed {
namespace {

TEST(PlanEvictionTest, FurthestNextReadGoesFirstAndASoonerOneBypasses) {
  // Three kept items of 10 bytes in a cache of 30: read next at 5, 50 and 20.
  const std::vector<EvictionCandidate> kept = {{5, 10, 0}, {50, 10, 0}, {20, 10, 0}};
  Eviction e = PlanEviction(kept, 30, 10, /*next=*/10, 30, /*bypass=*/true);
  ASSERT_TRUE(e.keep);
  EXPECT_EQ(e.victims, std::vector<size_t>{1});  // the one read at 50
  EXPECT_EQ(e.freed, 10u);
  // Twenty bytes, read at 10: the items read at 50 and 20 go.
  e = PlanEviction(kept, 30, 20, 10, 30, true);
  ASSERT_TRUE(e.keep);
  EXPECT_EQ(e.victims, (std::vector<size_t>{1, 2}));
  // Read at 30: making room would drop the one read at 20, sooner: not kept, nothing dropped.
  e = PlanEviction(kept, 30, 20, 30, 30, true);
  EXPECT_FALSE(e.keep);
  EXPECT_TRUE(e.victims.empty());
  EXPECT_EQ(e.freed, 0u);
  // Read as soon as one it would displace: that one stays.
  EXPECT_FALSE(PlanEviction(kept, 30, 10, 50, 30, true).keep);
  // Never read again: only free room.
  EXPECT_FALSE(PlanEviction(kept, 30, 10, kNeverRead, 30, true).keep);
  EXPECT_TRUE(PlanEviction(kept, 20, 10, kNeverRead, 30, true).keep);
  // Without bypass (an item that must be held), any may go, furthest first.
  e = PlanEviction(kept, 30, 30, 1, 30, false);
  ASSERT_TRUE(e.keep);
  EXPECT_EQ(e.victims, (std::vector<size_t>{1, 2, 0}));
  // Larger than the whole cache: never kept.
  EXPECT_FALSE(PlanEviction({}, 0, 31, 1, 30, false).keep);
}

TEST(PlanEvictionTest, WithoutAFutureTheLeastRecentlyUsedGoesFirst) {
  const std::vector<EvictionCandidate> kept = {
      {kNeverRead, 10, 300}, {kNeverRead, 10, 100}, {kNeverRead, 10, 200}};
  Eviction e = PlanEviction(kept, 30, 15, kNeverRead, 30, /*bypass=*/false);
  ASSERT_TRUE(e.keep);
  EXPECT_EQ(e.victims, (std::vector<size_t>{1, 2}));
}

// MinSet keeps the same rule incrementally: over random reads of random sizes, its choices (what
// is kept, what is dropped) are PlanEviction's with bypass, step by step.
TEST(MinSetTest, AgreesWithPlanEvictionOnRandomReads) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 20; ++trial) {
    const uint64_t capacity = 200 + rng() % 400;
    MinSet set(capacity);
    std::map<uint32_t, std::pair<uint64_t, uint64_t>> model;  // entry -> (next, bytes)
    uint64_t time = 0;
    for (int step = 0; step < 400; ++step) {
      const uint32_t entry = static_cast<uint32_t>(rng() % 60);
      // Next reads mostly distinct; items never read again tie, and MinSet breaks ties by entry
      // (the highest goes first): the candidates' last use says the same below.
      const uint64_t next = rng() % 10 == 0 ? kNeverRead : (++time) * 1000 + rng() % 1000;
      const uint64_t bytes = 1 + rng() % 120;
      if (set.contains(entry)) {
        set.Erase(entry);
        model.erase(entry);
      }
      std::vector<EvictionCandidate> candidates;
      std::vector<uint32_t> ids;
      uint64_t held = 0;
      for (const auto& [id, v] : model) {
        candidates.push_back({v.first, v.second, UINT32_MAX - id});
        ids.push_back(id);
        held += v.second;
      }
      ASSERT_EQ(held, set.bytes());
      const Eviction plan = PlanEviction(candidates, held, bytes, next, capacity, true);
      std::vector<uint32_t> dropped;
      const bool kept = set.Admit(entry, next, bytes, &dropped);
      ASSERT_EQ(kept, plan.keep) << "trial " << trial << " step " << step;
      std::vector<uint32_t> planned;
      for (size_t v : plan.victims) planned.push_back(ids[v]);
      std::sort(planned.begin(), planned.end());
      std::sort(dropped.begin(), dropped.end());
      ASSERT_EQ(dropped, planned) << "trial " << trial << " step " << step;
      for (uint32_t d : dropped) model.erase(d);
      if (kept) model[entry] = {next, bytes};
    }
  }
}

TEST(ChecksumTest, IsXxh3AndSeesEveryByte) {
  // XXH3_64bits of the empty input (the reference value of xxHash 0.8).
  EXPECT_EQ(Checksum("", 0), 0x2D06800538D394C2ull);
  std::string data(1 << 16, 'x');
  const uint64_t whole = Checksum(data.data(), data.size());
  for (size_t at : {size_t{0}, size_t{4095}, data.size() - 1}) {
    data[at] ^= 1;
    EXPECT_NE(Checksum(data.data(), data.size()), whole) << at;
    data[at] ^= 1;
  }
  EXPECT_EQ(Checksum(data.data(), data.size()), whole);
}

}  // namespace
}  // namespace mmfeed
