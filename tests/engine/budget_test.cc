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

// The epoch's global order of a permutation (one node, one rank: nothing interleaved).
std::vector<uint32_t> GlobalOrder(size_t n, SourceConfig source, uint32_t epoch) {
  source.num_nodes = 1;
  source.node_rank = 0;
  const EpochOrder order(n, source, epoch, 1);
  std::vector<uint32_t> global(order.size());
  for (size_t i = 0; i < global.size(); ++i) global[i] = order[i];
  return global;
}

// Every node's plans of one epoch at one shape, checked: the same K and steps on every node (and
// when only they are asked for); every batch of every rank within the budgets and not empty;
// step s's batches of all ranks together exactly the usable samples at positions [steps[s],
// steps[s + 1]) of the global order, and fewer usable samples than ranks after the last step.
struct Dealt {
  std::vector<uint64_t> steps;
  std::vector<std::multiset<uint32_t>> by_step;  // the entries of each step's batches
};
Dealt CheckEpoch(const std::vector<SampleCost>& costs, SourceConfig source, uint32_t epoch,
                 int consumers, const BatchBudget& budget, uint64_t base) {
  const std::vector<uint32_t> global = GlobalOrder(costs.size(), source, epoch);
  const uint64_t streams = static_cast<uint64_t>(consumers) * source.num_nodes;
  Dealt dealt;
  std::vector<uint64_t>& steps = dealt.steps;
  std::vector<std::multiset<uint32_t>>& by_step = dealt.by_step;
  for (int node = 0; node < source.num_nodes; ++node) {
    source.node_rank = node;
    const EpochPlan plan = PlanEpoch(costs, source, epoch, consumers, budget, true, nullptr, base);
    EXPECT_TRUE(plan.status.ok()) << plan.status.message();
    if (node == 0) {
      steps = plan.steps;
      by_step.resize(plan.batches);
    }
    EXPECT_EQ(plan.steps, steps) << "node " << node << " plans the same steps";
    const EpochPlan counted =
        PlanEpoch(costs, source, epoch, consumers, budget, false, nullptr, base);
    EXPECT_EQ(counted.batches, plan.batches);
    EXPECT_EQ(counted.steps, steps);
    EXPECT_TRUE(counted.ranks.empty());
    EXPECT_EQ(plan.steps.size(), plan.batches + 1);
    EXPECT_EQ(plan.ranks.size(), static_cast<size_t>(consumers));
    for (const RankPlan& rp : plan.ranks) {
      EXPECT_EQ(rp.batches(), plan.batches);
      for (size_t b = 0; b < rp.batches() && b < by_step.size(); ++b) {
        EXPECT_LT(rp.starts[b], rp.starts[b + 1]) << "no empty batch";
        int64_t tokens = 0, patches = 0;
        for (uint32_t k = rp.starts[b]; k < rp.starts[b + 1]; ++k) {
          tokens += costs[rp.entries[k]].tokens;
          patches += costs[rp.entries[k]].patches;
          by_step[b].insert(rp.entries[k]);
        }
        EXPECT_TRUE(budget.Fits(rp.starts[b + 1] - rp.starts[b], tokens, patches))
            << "batch " << b << ": " << rp.starts[b + 1] - rp.starts[b] << " rows, " << tokens
            << " tokens, " << patches << " patches";
      }
    }
  }
  EXPECT_FALSE(steps.empty());
  if (steps.empty()) return dealt;
  EXPECT_EQ(steps.front(), base);
  // The dealt range: the global order's positions that the nodes' orders hold (a remainder of
  // fewer than `streams` positions is left out, as without a budget).
  const uint64_t end = base + (global.size() - base) / streams * streams;
  auto usable_in = [&](uint64_t from, uint64_t to) {
    std::multiset<uint32_t> u;
    for (uint64_t g = from; g < to; ++g)
      if (costs[global[g]].usable()) u.insert(global[g]);
    return u;
  };
  for (size_t s = 0; s + 1 < steps.size(); ++s) {
    EXPECT_LT(steps[s], steps[s + 1]);
    EXPECT_EQ(by_step[s], usable_in(steps[s], steps[s + 1])) << "step " << s;
  }
  EXPECT_LE(steps.back(), end);
  EXPECT_LT(usable_in(steps.back(), end).size(), streams) << "only a last partial step left out";
  return dealt;
}

TEST(BudgetTest, EveryRankHasTheSameCountAndEachStepIsTheNextPartOfTheOrder) {
  const size_t n = 10007;  // a prime: a remainder is left out
  const std::vector<SampleCost> costs = RandomCosts(n, 3, 0.05);
  const BatchBudget budget{32, 8192, 16384};
  SourceConfig source;
  source.shuffle = true;
  source.seed = 11;
  source.num_nodes = 3;
  for (uint32_t epoch = 0; epoch < 3; ++epoch) {
    const Dealt d = CheckEpoch(costs, source, epoch, 2, budget, 0);
    // The least full batch takes each sample: the batches are nearly as few as the budgets
    // allow (the largest of rows, tokens and patches over what all ranks' batches hold).
    double rows = 0, tokens = 0, patches = 0;
    for (const auto& step : d.by_step)
      for (uint32_t entry : step) {
        rows += 1;
        tokens += costs[entry].tokens;
        patches += costs[entry].patches;
      }
    const double fewest = std::max({rows / budget.max_rows, tokens / budget.max_tokens,
                                    patches / budget.max_patches}) /
                          6;
    EXPECT_LT(static_cast<double>(d.by_step.size()), 1.3 * fewest + 1) << "epoch " << epoch;
  }
}

TEST(BudgetTest, AJobResumedAtAnotherShapeDealsTheRestOfTheEpochFromItsStep) {
  const size_t n = 4001;
  const std::vector<SampleCost> costs = RandomCosts(n, 5, 0.05);
  const BatchBudget budget{16, 4096, 8192};
  SourceConfig source;
  source.shuffle = true;
  source.seed = 3;
  // 2 nodes x 2 ranks finish s steps; 3 x 1 resume from G_s and finish t; 1 x 4 from G'_t on.
  source.num_nodes = 2;
  const Dealt a = CheckEpoch(costs, source, 1, 2, budget, 0);
  ASSERT_GT(a.by_step.size(), 8u);
  const size_t s = a.by_step.size() / 3;
  source.num_nodes = 3;
  const Dealt b = CheckEpoch(costs, source, 1, 1, budget, a.steps[s]);
  ASSERT_GT(b.by_step.size(), 3u);
  const size_t t = b.by_step.size() / 2;
  source.num_nodes = 1;
  const Dealt c = CheckEpoch(costs, source, 1, 4, budget, b.steps[t]);
  ASSERT_GE(c.by_step.size(), 1u);
  // The three lives' batches: every usable sample of the order up to where the last life's
  // plan ends, once; after it, fewer than 4 positions (the remainder of the last shape's 4
  // ranks) and fewer than 4 usable samples (a step that could not be made).
  std::map<uint32_t, int> lives, order;
  for (size_t k = 0; k < s; ++k)
    for (uint32_t e : a.by_step[k]) ++lives[e];
  for (size_t k = 0; k < t; ++k)
    for (uint32_t e : b.by_step[k]) ++lives[e];
  for (const auto& step : c.by_step)
    for (uint32_t e : step) ++lives[e];
  const std::vector<uint32_t> global = GlobalOrder(n, source, 1);
  for (uint64_t g = 0; g < c.steps.back(); ++g)
    if (costs[global[g]].usable()) ++order[global[g]];
  EXPECT_EQ(lives, order);
  EXPECT_GT(c.steps.back() + 8, n);
}

TEST(BudgetTest, AnEpochTooPoorForABatchPerRankIsRefused) {
  // One usable sample for two ranks.
  std::vector<SampleCost> costs(20, SampleCost{SampleCost::kUnusable, 0});
  costs[7].tokens = 10;
  SourceConfig source;
  const EpochPlan plan = PlanEpoch(costs, source, 0, 2, BatchBudget{4, 100, 0}, true);
  EXPECT_EQ(plan.batches, 0u);
  EXPECT_TRUE(plan.ranks.empty());
  EXPECT_FALSE(plan.status.ok());
  EXPECT_NE(plan.status.message().find("1 usable sample(s) from position 0 of its order, too few "
                                       "for a batch for each of the 2 rank(s)"),
            std::string::npos)
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
