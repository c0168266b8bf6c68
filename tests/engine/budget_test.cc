#include "engine/budget.h"

#include <gtest/gtest.h>

#include <map>
#include <set>

#include "base/rng.h"
#include "source/catalog.h"

namespace mmfeed {
namespace {

// Costs like a chat dataset's: tokens 20..1200 (a few long ones), patches 0 (text only) to 900.
std::vector<SampleCost> RandomCosts(size_t n, uint64_t seed, double unusable = 0) {
  Rng rng(seed);
  std::vector<SampleCost> costs(n);
  for (SampleCost& c : costs) {
    c.tokens = 20 + static_cast<uint32_t>(rng.Below(rng.Below(8) == 0 ? 1200 : 300));
    c.patches = rng.Below(4) == 0 ? 0 : 64 + static_cast<uint32_t>(rng.Below(836));
    if (rng.Below(1000) < unusable * 1000) c.tokens = SampleCost::kUnusable;
  }
  return costs;
}

void ExpectWithin(const std::vector<SampleCost>& stream, const std::vector<uint32_t>& starts,
                  const BatchBudget& budget) {
  ASSERT_GE(starts.size(), 1u);
  EXPECT_EQ(starts.front(), 0u);
  EXPECT_EQ(starts.back(), stream.size());
  for (size_t b = 0; b + 1 < starts.size(); ++b) {
    ASSERT_LT(starts[b], starts[b + 1]) << "no empty batch";
    int64_t tokens = 0, patches = 0;
    for (uint32_t i = starts[b]; i < starts[b + 1]; ++i) {
      tokens += stream[i].tokens;
      patches += stream[i].patches;
    }
    EXPECT_TRUE(budget.Fits(starts[b + 1] - starts[b], tokens, patches))
        << "batch " << b << ": " << starts[b + 1] - starts[b] << " rows, " << tokens << " tokens, "
        << patches << " patches";
  }
}

TEST(BudgetTest, GreedyBatchesStayWithinEveryBudgetAndAreFull) {
  const BatchBudget budget{16, 4096, 8192};
  const std::vector<SampleCost> stream = RandomCosts(5000, 1);
  const std::vector<uint32_t> starts = PackGreedy(stream, budget);
  ExpectWithin(stream, starts, budget);
  // Greedy: the sample after each batch would not have fitted into it.
  for (size_t b = 0; b + 2 < starts.size(); ++b) {
    int64_t tokens = 0, patches = 0;
    for (uint32_t i = starts[b]; i <= starts[b + 1]; ++i) {
      tokens += stream[i].tokens;
      patches += stream[i].patches;
    }
    EXPECT_FALSE(budget.Fits(starts[b + 1] - starts[b] + 1, tokens, patches)) << "batch " << b;
  }
  EXPECT_EQ(PackGreedy({}, budget), std::vector<uint32_t>{0});
}

TEST(BudgetTest, SplittingReachesTheCountWithinBudgetAndKeepsTheOrder) {
  const BatchBudget budget{8, 2000, 0};
  const std::vector<SampleCost> stream = RandomCosts(300, 2);
  std::vector<uint32_t> starts = PackGreedy(stream, budget);
  const uint64_t greedy = starts.size() - 1;
  for (uint64_t count : {greedy, greedy + 1, greedy + 17, uint64_t{300}}) {
    std::vector<uint32_t> split = starts;
    SplitFullest(stream, budget, count, &split);
    EXPECT_EQ(split.size() - 1, count);
    ExpectWithin(stream, split, budget);
    // The greedy cuts are kept: splitting only adds cuts.
    for (uint32_t s : starts) EXPECT_TRUE(std::binary_search(split.begin(), split.end(), s)) << s;
  }
}

// Every rank of every node gets the same number of batches, each within the budget, and the
// world's batches of an epoch hold every usable sample of the epoch's shares once.
TEST(BudgetTest, EveryRankOfEveryNodeHasTheSameBatchCountAndEverySampleOnce) {
  const size_t n = 10007;  // a prime: shares leave a remainder out
  const std::vector<SampleCost> costs = RandomCosts(n, 3, 0.05);
  const BatchBudget budget{32, 8192, 16384};
  const int nodes = 3, consumers = 2;
  SourceConfig source;
  source.shuffle = true;
  source.seed = 11;
  source.num_nodes = nodes;
  const uint64_t per_rank = n / nodes / consumers;
  for (uint32_t epoch = 0; epoch < 3; ++epoch) {
    std::map<uint32_t, int> seen;
    uint64_t k = 0;
    for (int node = 0; node < nodes; ++node) {
      source.node_rank = node;
      const EpochPlan plan = PlanEpoch(costs, source, epoch, consumers, per_rank, budget, true);
      ASSERT_TRUE(plan.status.ok()) << plan.status.message();
      if (node == 0) k = plan.batches;
      EXPECT_EQ(plan.batches, k) << "node " << node << " plans the same count";
      EXPECT_EQ(PlanEpoch(costs, source, epoch, consumers, per_rank, budget, false).batches, k);
      const EpochOrder order(n, source, epoch, consumers);
      ASSERT_EQ(plan.ranks.size(), static_cast<size_t>(consumers));
      for (int r = 0; r < consumers; ++r) {
        const RankPlan& rp = plan.ranks[r];
        EXPECT_EQ(rp.batches(), k) << "node " << node << " rank " << r;
        std::vector<SampleCost> stream;
        for (uint32_t pos : rp.positions) {
          const uint32_t entry = order[static_cast<uint64_t>(pos) * consumers + r];
          stream.push_back(costs[entry]);
          EXPECT_TRUE(costs[entry].usable());
          ++seen[entry];
        }
        ExpectWithin(stream, rp.starts, budget);
      }
    }
    // The usable samples of all shares, each once.
    size_t usable = 0;
    for (int node = 0; node < nodes; ++node) {
      source.node_rank = node;
      const EpochOrder order(n, source, epoch, consumers);
      for (size_t i = 0; i < per_rank * consumers; ++i) usable += costs[order[i]].usable();
    }
    EXPECT_EQ(seen.size(), usable);
    for (auto [entry, times] : seen) ASSERT_EQ(times, 1) << entry;
  }
}

TEST(BudgetTest, AnEpochARankCannotFillIsRefused) {
  // Rank 0's share holds 2 usable samples, rank 1's eight that each fill a batch.
  std::vector<SampleCost> costs(20, SampleCost{100, 0});
  for (size_t i = 0; i < 20; i += 2) costs[i].tokens = SampleCost::kUnusable;
  costs[0].tokens = costs[2].tokens = 10;
  SourceConfig source;
  const EpochPlan plan = PlanEpoch(costs, source, 0, 2, 10, BatchBudget{4, 100, 0}, true);
  EXPECT_EQ(plan.batches, 10u);
  EXPECT_FALSE(plan.status.ok());
  EXPECT_NE(plan.status.message().find("only 2 usable samples"), std::string::npos)
      << plan.status.message();
}

TEST(BudgetTest, ASampleAloneOverABudgetIsNamed) {
  const BatchBudget budget{4, 100, 50};
  EXPECT_EQ(budget.Refuses({100, 50}), "");
  EXPECT_EQ(budget.Refuses({101, 0}), "101 tokens, above the batch's max_tokens 100");
  EXPECT_EQ(budget.Refuses({1, 51}), "51 patches, above the batch's max_patches 50");
}

}  // namespace
}  // namespace mmfeed
