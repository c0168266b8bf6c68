#include "source/mixture.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <set>
#include <tuple>

#include "base/rng.h"

namespace mmfeed {
namespace {

std::vector<MixSource> Weighted(const std::vector<double>& weights, uint64_t size = 5000) {
  std::vector<MixSource> out;
  for (size_t i = 0; i < weights.size(); ++i)
    out.push_back(MixSource{size + 37 * i, weights[i], 0, true, 100 + i});
  return out;
}

// The most any source's count, over every window of `window` consecutive positions of each
// lane, is off its share of the window (shares from the weights).
double WorstWindowError(const Mixture& m, const std::vector<double>& weights, uint64_t positions,
                        uint64_t window) {
  const double sum = std::accumulate(weights.begin(), weights.end(), 0.0);
  double worst = 0;
  for (uint32_t lane = 0; lane < m.lanes(); ++lane) {
    std::vector<uint32_t> src;
    for (uint64_t p = 0; p < positions; ++p) src.push_back(m.At(0, lane, p).source);
    std::vector<int64_t> count(weights.size());
    for (uint64_t p = 0; p < positions; ++p) {
      ++count[src[p]];
      if (p >= window) --count[src[p - window]];
      if (p + 1 < window) continue;
      for (size_t i = 0; i < weights.size(); ++i)
        worst = std::max(worst, std::abs(count[i] - window * weights[i] / sum));
    }
  }
  return worst;
}

TEST(MixtureTest, EveryWindowOfAThousandHoldsEachSourceWithinOnePercentOfItsWeight) {
  Rng rng(7);
  std::vector<std::vector<double>> cases = {
      {1, 1}, {1, 1000}, {1000, 1}, {5, 2, 2, 1}, {1, 2, 3, 4, 5, 6, 7}, {1000, 1, 1, 1, 1, 1, 1}};
  for (int k = 2; k <= 7; ++k) {  // random weights from 1 to 1000
    std::vector<double> w;
    for (int i = 0; i < k; ++i) w.push_back(1 + static_cast<double>(rng.Below(1000)));
    cases.push_back(w);
  }
  for (const auto& weights : cases) {
    for (uint32_t lanes : {1u, 2u, 8u}) {
      auto m = Mixture::Create(Weighted(weights), MixMode::kWeighted, 2'000'000, lanes, 42);
      ASSERT_TRUE(m.ok()) << m.status().message();
      const double worst = WorstWindowError(*m, weights, 12000, 1000);
      // The issue asks for 1% (10 of 1000); the interleave stays within 2 (independent draws
      // would be off by about 45 at 1:1, three standard deviations).
      EXPECT_LE(worst, 4.0) << "weights " << ::testing::PrintToString(weights) << ", " << lanes
                            << " lane(s)";
    }
  }
}

TEST(MixtureTest, AWeightedEpochDealsEachSourceItsQuotaExactly) {
  const std::vector<double> weights = {5, 2, 2, 1};
  auto m = Mixture::Create(Weighted(weights, 700), MixMode::kWeighted, 10'000, 4, 1);
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->per_lane(), 2500u);
  EXPECT_EQ(m->dealt(), (std::vector<uint64_t>{5000, 2000, 2000, 1000}));
  for (uint32_t lane = 0; lane < 4; ++lane) {
    std::vector<uint64_t> count(4);
    for (uint64_t p = 0; p < m->per_lane(); ++p) ++count[m->At(3, lane, p).source];
    for (uint32_t i = 0; i < 4; ++i) EXPECT_EQ(count[i], m->LaneQuota(i, lane));
  }
}

// Epochs mode, over all lanes of one epoch: each source's draws are exactly repeat x size
// (less the few an uneven split leaves out), numbered 0..dealt-1, each sample at most
// ceil(repeat) times, and a whole pass is every sample once.
TEST(MixtureTest, AnEpochsModeEpochDrawsRepeatTimesEachSourceExactly) {
  std::vector<MixSource> sources = {{1000, 0, 1.0, true, 1},
                                    {400, 0, 2.0, true, 2},
                                    {3000, 0, 0.5, true, 3},
                                    {250, 0, 1.5, false, 4}};
  for (uint32_t lanes : {1u, 3u, 8u}) {
    auto m = Mixture::Create(sources, MixMode::kEpochs, 0, lanes, 9);
    ASSERT_TRUE(m.ok()) << m.status().message();
    const std::vector<uint64_t> want = {1000, 800, 1500, 375};
    uint64_t left_out = 0;
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_LE(m->dealt()[i], want[i]);
      left_out += want[i] - m->dealt()[i];
    }
    EXPECT_LT(left_out, lanes) << "only an uneven split's remainder is left out";
    for (uint32_t epoch : {0u, 1u}) {
      std::vector<std::set<uint64_t>> draws(4);
      std::vector<std::map<uint64_t, int>> samples(4);
      for (uint32_t lane = 0; lane < lanes; ++lane)
        for (uint64_t p = 0; p < m->per_lane(); ++p) {
          MixDraw d = m->At(epoch, lane, p);
          EXPECT_TRUE(draws[d.source].insert(d.draw).second) << "draw " << d.draw << " twice";
          EXPECT_LT(d.sample, sources[d.source].size);
          ++samples[d.source][d.sample];
        }
      for (size_t i = 0; i < 4; ++i) {
        ASSERT_EQ(draws[i].size(), m->dealt()[i]);
        // Draws continue over the epochs: epoch 1 starts where epoch 0 ended.
        EXPECT_EQ(*draws[i].begin(), epoch * m->dealt()[i]);
        EXPECT_EQ(*draws[i].rbegin(), (epoch + 1) * m->dealt()[i] - 1);
        const int most = static_cast<int>(std::ceil(sources[i].repeat));
        for (const auto& [sample, n] : samples[i]) EXPECT_LE(n, most) << "source " << i;
      }
      if (lanes == 1) {
        EXPECT_EQ(samples[0].size(), 1000u) << "repeat 1: every sample once";
      }
    }
  }
}

// A source that runs out starts its next pass in a fresh order: within a pass no sample
// repeats; the next pass is another order of the same samples.
TEST(MixtureTest, ASmallSourceCyclesThroughFreshPasses) {
  std::vector<MixSource> sources = {{50, 9, 0, true, 5}, {10000, 1, 0, true, 6}};
  auto m = Mixture::Create(sources, MixMode::kWeighted, 2000, 2, 3);
  ASSERT_TRUE(m.ok()) << m.status().message();
  std::map<uint64_t, std::vector<uint64_t>> by_pass;  // pass -> samples in draw order
  std::map<uint64_t, uint64_t> by_draw;
  for (uint32_t lane = 0; lane < 2; ++lane)
    for (uint64_t p = 0; p < m->per_lane(); ++p) {
      MixDraw d = m->At(0, lane, p);
      if (d.source == 0) by_draw[d.draw] = d.sample;
    }
  ASSERT_EQ(by_draw.size(), 1800u);  // 90% of 2000: 36 passes of 50
  for (const auto& [draw, sample] : by_draw) by_pass[draw / 50].push_back(sample);
  for (auto& [pass, got] : by_pass) {
    std::vector<uint64_t> sorted = got;
    std::sort(sorted.begin(), sorted.end());
    std::vector<uint64_t> all(50);
    std::iota(all.begin(), all.end(), 0);
    EXPECT_EQ(sorted, all) << "pass " << pass;
  }
  EXPECT_NE(by_pass[0], by_pass[1]) << "each pass in another order";
}

// Positions are a pure function: the lanes of an epoch never share a draw, and a position
// deep in a long run (a resume) is the same whatever was asked before.
TEST(MixtureTest, LanesShareNoDrawAndDeepPositionsNeedNoReplay) {
  auto m = Mixture::Create(Weighted({3, 1, 1}, 1'000'000), MixMode::kWeighted, 100'000'000, 16, 11);
  ASSERT_TRUE(m.ok()) << m.status().message();
  std::set<std::pair<uint32_t, uint64_t>> seen;
  for (uint32_t lane = 0; lane < 16; ++lane)
    for (uint64_t p = 0; p < 2000; ++p) {
      MixDraw d = m->At(0, lane, p);
      EXPECT_TRUE(seen.insert({d.source, d.draw}).second);
    }
  const MixDraw deep = m->At(40'000, 15, m->per_lane() - 1);
  const MixDraw again =
      Mixture::Create(Weighted({3, 1, 1}, 1'000'000), MixMode::kWeighted, 100'000'000, 16, 11)
          ->At(40'000, 15, m->per_lane() - 1);
  EXPECT_EQ(deep.source, again.source);
  EXPECT_EQ(deep.draw, again.draw);
  EXPECT_EQ(deep.sample, again.sample);
  EXPECT_GE(deep.draw, 40'000ull * m->dealt()[deep.source]);
}

// A source read in shard windows: each node's lanes take one contiguous run of the epoch's
// draws (so a node reads its own part of the shard order), in node order, every draw once;
// its draw's sample is the position in the pass (mapped through the windows by the caller).
TEST(MixtureTest, AWindowedSourceGivesEachNodeOneRunOfAnEpochsDraws) {
  for (uint64_t epoch_size : {6000u, 6007u, 6011u}) {  // with and without extra draws
    std::vector<MixSource> sources = Weighted({2, 1, 1}, 1000);
    sources[1].windowed = true;
    const uint32_t nodes = 3, per_node = 4;
    auto m =
        Mixture::Create(sources, MixMode::kWeighted, epoch_size, nodes * per_node, 8, per_node);
    ASSERT_TRUE(m.ok()) << m.status().message();
    for (uint32_t epoch : {0u, 1u, 7u}) {
      std::vector<std::vector<uint64_t>> runs(nodes);
      for (uint32_t lane = 0; lane < nodes * per_node; ++lane)
        for (uint64_t p = 0; p < m->per_lane(); ++p) {
          const MixDraw d = m->At(epoch, lane, p);
          if (d.source != 1) continue;
          runs[lane / per_node].push_back(d.draw);
          EXPECT_EQ(d.sample, d.draw % sources[1].size);
        }
      uint64_t next = uint64_t{epoch} * m->dealt()[1];
      for (uint32_t n = 0; n < nodes; ++n) {
        std::sort(runs[n].begin(), runs[n].end());
        for (uint64_t draw : runs[n])
          EXPECT_EQ(draw, next++) << "node " << n << ", epoch " << epoch;
      }
      EXPECT_EQ(next, uint64_t{epoch + 1} * m->dealt()[1]) << "every draw of the epoch once";
    }
  }
  EXPECT_FALSE(Mixture::Create(Weighted({1, 1}), MixMode::kWeighted, 0, 6, 1, 4).ok())
      << "6 lanes are not nodes of 4";
}

// A job resumed at another shape deals the rest of an epoch in the numbering of the shape it
// stood at (Mixture::WithLanes): with a source in shard windows that numbering is node by node,
// so it needs the old shape's nodes as well as its lanes; without them it is refused.
TEST(MixtureTest, WithLanesKeepsAWindowedSourcesNumberingByNode) {
  std::vector<MixSource> sources = Weighted({2, 1}, 500);
  sources[1].windowed = true;
  auto now = Mixture::Create(sources, MixMode::kWeighted, 3001, 3, 4, 1);   // 3 nodes x 1
  auto then = Mixture::Create(sources, MixMode::kWeighted, 3001, 4, 4, 2);  // 2 nodes x 2
  ASSERT_TRUE(now.ok() && then.ok());
  Result<Mixture> numbering = now->WithLanes(4, 2);
  ASSERT_TRUE(numbering.ok()) << numbering.status().message();
  bool by_node_differs = false;
  Result<Mixture> one_node = now->WithLanes(4, 4);
  for (uint32_t lane = 0; lane < 4; ++lane)
    for (uint64_t p = 0; p < then->per_lane(); ++p) {
      const MixDraw a = then->At(2, lane, p), b = numbering->At(2, lane, p);
      ASSERT_EQ(std::tie(a.source, a.draw, a.sample), std::tie(b.source, b.draw, b.sample));
      by_node_differs |= one_node->At(2, lane, p).draw != a.draw;
    }
  EXPECT_TRUE(by_node_differs) << "the nodes change a windowed source's numbering";
  const Result<Mixture> unnamed = now->WithLanes(4);
  ASSERT_FALSE(unnamed.ok());
  EXPECT_NE(unnamed.status().message().find("the nodes are not named"), std::string::npos);
}

// Weights changed at batch boundaries (a reload): before each switch the stream is the earlier
// weights', after it the new weights' interleave; every source's draws go on from where it
// stood, so no draw repeats, no sample repeats within a pass, and only a few are skipped.
TEST(MixtureTest, WeightsSwitchedMidEpochContinueEachSourceWithoutRepeats) {
  const uint32_t lanes = 4;
  const std::vector<std::vector<double>> weights = {{5, 2, 1}, {1, 1, 6}, {2, 3, 2}};
  std::vector<std::shared_ptr<const Mixture>> plain;
  for (const auto& w : weights)
    plain.push_back(std::make_shared<const Mixture>(
        Mixture::Create(Weighted(w, 300), MixMode::kWeighted, 4000, lanes, 5).value()));
  // Switches at epoch 1 position 300, then at epoch 2's start... position 0 of epoch 3.
  auto first = Mixture::Switched(plain[0], *plain[1], 1, 300);
  ASSERT_TRUE(first.ok()) << first.status().message();
  auto shared_first = std::make_shared<const Mixture>(std::move(first.value()));
  auto second = Mixture::Switched(shared_first, *plain[2], 3, 0);
  ASSERT_TRUE(second.ok()) << second.status().message();
  const Mixture& m = *second;
  ASSERT_EQ(m.switches().size(), 2u);
  EXPECT_EQ(m.switches()[0].weights, weights[0]);
  EXPECT_EQ(m.switches()[1].position, 0u);
  EXPECT_NE(m.Describe({"a", "b", "c"}).find("weights before position 300 of epoch 1: 5:2:1"),
            std::string::npos)
      << m.Describe({"a", "b", "c"});
  std::vector<std::set<uint64_t>> draws(3);
  std::vector<std::map<uint64_t, std::set<uint64_t>>> passes(3);  // pass -> samples
  for (uint32_t epoch = 0; epoch < 5; ++epoch)
    for (uint32_t lane = 0; lane < lanes; ++lane)
      for (uint64_t p = 0; p < m.per_lane(); ++p) {
        const MixDraw d = m.At(epoch, lane, p);
        const size_t segment = epoch < 1 || (epoch == 1 && p < 300) ? 0 : epoch < 3 ? 1 : 2;
        const MixDraw own = plain[segment]->At(epoch, lane, p);
        ASSERT_EQ(d.source, own.source) << "epoch " << epoch << " lane " << lane << " p " << p;
        if (segment == 0) {
          EXPECT_EQ(d.draw, own.draw);
        }
        EXPECT_TRUE(draws[d.source].insert(d.draw).second) << "draw " << d.draw << " twice";
        const uint64_t size = 300 + 37 * d.source;
        EXPECT_TRUE(passes[d.source][d.draw / size].insert(d.sample).second)
            << "sample " << d.sample << " twice in pass " << d.draw / size;
        const std::optional<MixDraw> refill = m.Refill(epoch, lane, d.source, p * 7919);
        ASSERT_TRUE(refill.has_value());
        EXPECT_EQ(refill->source, d.source);
      }
  for (uint32_t i = 0; i < 3; ++i) {
    const uint64_t skipped = *draws[i].rbegin() + 1 - draws[i].size();
    EXPECT_LE(skipped, 2u * 4 * lanes) << "source " << i << ": a few per lane and switch";
  }
  // A pure function: the same switches made again give the same stream.
  auto again = Mixture::Switched(
      std::make_shared<const Mixture>(Mixture::Switched(plain[0], *plain[1], 1, 300).value()),
      *plain[2], 3, 0);
  for (uint64_t p : {0u, 299u, 300u, 999u}) EXPECT_EQ(again->At(4, 3, p).draw, m.At(4, 3, p).draw);
}

TEST(MixtureTest, OnlyWeightsSwitchMidEpoch) {
  auto make = [](std::vector<MixSource> s, MixMode mode, uint32_t lanes, uint32_t per_node = 0) {
    return std::make_shared<const Mixture>(
        Mixture::Create(std::move(s), mode, 4000, lanes, 5, per_node).value());
  };
  auto msg = [](Result<Mixture> r) { return r.ok() ? std::string("ok") : r.status().message(); };
  auto base = make(Weighted({1, 1}), MixMode::kWeighted, 2);
  EXPECT_EQ(msg(Mixture::Switched(base, *make(Weighted({1, 3}), MixMode::kWeighted, 2), 0, 10)),
            "ok");
  EXPECT_NE(msg(Mixture::Switched(base, *make(Weighted({1, 3}), MixMode::kWeighted, 4), 0, 10))
                .find("one node"),
            std::string::npos);
  EXPECT_NE(msg(Mixture::Switched(make(Weighted({1, 1}), MixMode::kWeighted, 4, 2),
                                  *make(Weighted({1, 3}), MixMode::kWeighted, 4, 2), 0, 10))
                .find("one node"),
            std::string::npos);
  EXPECT_NE(msg(Mixture::Switched(base, *make(Weighted({1, 1, 1}), MixMode::kWeighted, 2), 0, 10))
                .find("sources differ"),
            std::string::npos);
  EXPECT_NE(msg(Mixture::Switched(base, *make(Weighted({1, 3}, 99), MixMode::kWeighted, 2), 0, 10))
                .find("source 0's samples or order differ"),
            std::string::npos);
  std::vector<MixSource> windowed = Weighted({1, 3});
  windowed[1].windowed = true;
  EXPECT_NE(msg(Mixture::Switched(base, *make(windowed, MixMode::kWeighted, 2), 0, 10))
                .find("source 1 is read in shard windows"),
            std::string::npos);
  EXPECT_NE(msg(Mixture::Switched(base, *make(Weighted({1, 3}), MixMode::kWeighted, 2), 0, 2000))
                .find("no switch at position 2000"),
            std::string::npos);
}

TEST(MixtureTest, MistakesAreRefusedSayingWhy) {
  auto msg = [](Result<Mixture> r) { return r.ok() ? std::string("ok") : r.status().message(); };
  EXPECT_EQ(msg(Mixture::Create({}, MixMode::kWeighted, 0, 1, 0)),
            "a mixture needs at least one source");
  EXPECT_EQ(msg(Mixture::Create({{0, 1, 0, true, 0}}, MixMode::kWeighted, 0, 1, 0)),
            "source 0 has no samples");
  EXPECT_NE(msg(Mixture::Create(Weighted({1, -2}), MixMode::kWeighted, 0, 1, 0))
                .find("source 1: weight -2 is out of range"),
            std::string::npos);
  EXPECT_NE(msg(Mixture::Create(Weighted({1e9, 1}), MixMode::kWeighted, 1000, 1, 0))
                .find("source 1 would never be drawn"),
            std::string::npos);
  EXPECT_NE(msg(Mixture::Create({{3, 0, 1, true, 0}}, MixMode::kEpochs, 0, 8, 0))
                .find("fewer than the 8 consumer rank(s)"),
            std::string::npos);
}

TEST(MixtureTest, DescribeNamesEachSourcesShareAndPasses) {
  auto m = Mixture::Create(Weighted({3, 1}, 1000), MixMode::kWeighted, 4000, 2, 0);
  ASSERT_TRUE(m.ok());
  const std::string plan = m->Describe({"captions", "ocr"});
  EXPECT_NE(
      plan.find("captions: 1000 samples, 75.00% of the stream, 3000 draws an epoch (3 passes)"),
      std::string::npos)
      << plan;
  EXPECT_NE(plan.find("an epoch: 2000 positions per rank x 2 rank(s)"), std::string::npos) << plan;
}

}  // namespace
}  // namespace mmfeed
