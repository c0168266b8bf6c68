// The stream plan (engine/stream_plan.h) as a value, with no pipeline and no thread: property
// tests over random shapes, mixtures, token budgets and origins.
// - Every epoch deals each sample at most once over every node and rank, and leaves out fewer
//   than the shape's remainder.
// - Cursors: the batches of the epochs follow one another (CursorAt, EpochBatches), and every
//   cursor of the data passes CheckCursor while the one past the end does not.
// - Any prefix of an epoch that every rank finished, resumed at any other shape (Rebased, then
//   WithOrigin), deals the rest of the epoch: together with the prefix, each sample at most once
//   and all but fewer than the new shape's remainder.
#include "engine/stream_plan.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "source/catalog.h"
#include "source/mixture.h"

namespace mmfeed {
namespace {

struct Shape {
  int nodes = 1, consumers = 1;
  uint32_t lanes() const { return static_cast<uint32_t>(nodes * consumers); }
};

// The data of one trial: one source of `n` samples, or a mixture of two; with a token budget,
// every sample's cost.
struct Data {
  size_t n = 0;
  bool mixture = false;
  std::vector<size_t> part_sizes;
  std::vector<MixSource> mix_sources;
  uint64_t mix_per_epoch = 0;
  std::vector<SampleCost> costs;  // empty: fixed-size batches
  int64_t max_tokens = 0;
};

struct Settings {
  uint64_t seed = 1;
  bool shuffle = true, drop_last = false;
  int64_t batch_size = 1;
  int epochs = 3;
};

PipelineConfig ConfigOf(const Data& d, const Settings& s, const Shape& shape, int node) {
  PipelineConfig cfg;
  cfg.source.seed = s.seed;
  cfg.source.shuffle = s.shuffle;
  cfg.source.epochs = s.epochs;
  cfg.source.num_nodes = shape.nodes;
  cfg.source.node_rank = node;
  cfg.consumers = shape.consumers;
  cfg.batch_size = s.batch_size;
  cfg.drop_last = s.drop_last;
  cfg.max_tokens = d.max_tokens;
  if (d.mixture) cfg.sources.resize(d.part_sizes.size());
  return cfg;
}

std::shared_ptr<const Catalog> CatalogOf(const Data& d, const Shape& shape) {
  auto cat = std::make_shared<Catalog>();
  if (!d.mixture) {
    cat->entries.resize(d.n);
    for (size_t i = 0; i < d.n; ++i) cat->entries[i].id = fmt::format("s{}", i);
    return cat;
  }
  uint64_t first = 0;
  for (size_t size : d.part_sizes) {
    auto part = std::make_shared<Catalog>();
    part->entries.resize(size);
    cat->parts.push_back(part);
    cat->part_first.push_back(first);
    first += size;
  }
  cat->part_sources.resize(d.part_sizes.size());
  Result<Mixture> m = Mixture::Create(d.mix_sources, MixMode::kWeighted, d.mix_per_epoch,
                                      shape.lanes(), 9, static_cast<uint32_t>(shape.consumers));
  EXPECT_TRUE(m.ok()) << m.status().message();
  cat->mixture = std::make_shared<const Mixture>(std::move(m.value()));
  return cat;
}

// One plan per node of the shape.
std::vector<StreamPlan> PlansOf(const Data& d, const Settings& s, const Shape& shape) {
  std::vector<StreamPlan> plans;
  const std::shared_ptr<const Catalog> cat = CatalogOf(d, shape);
  for (int node = 0; node < shape.nodes; ++node) {
    Result<StreamPlan> p = StreamPlan::Make(ConfigOf(d, s, shape, node), cat, d.costs);
    EXPECT_TRUE(p.ok()) << p.status().message();
    if (!p.ok()) return {};
    plans.push_back(std::move(p.value()));
  }
  return plans;
}

// The first seq of `epoch` (>= the origin's epoch).
uint64_t FirstSeqOf(const StreamPlan& p, uint32_t epoch) {
  uint64_t seq = p.origin().seq;
  for (uint32_t e = p.origin().epoch; e < epoch; ++e) seq += p.EpochBatches(e);
  return seq;
}

// Each dealt sample of `epoch`'s batches [from, to) over every node's ranks, counted into `seen`
// (a mixture's draw may name a sample twice in an epoch: counted by draw, so a multiset).
void Deal(const std::vector<StreamPlan>& plans, uint32_t epoch, uint64_t from, uint64_t to,
          std::multiset<uint32_t>* seen) {
  for (const StreamPlan& p : plans) {
    const uint64_t first = FirstSeqOf(p, epoch);
    const int consumers = static_cast<int>(p.streams() / plans.size());
    for (uint64_t b = from; b < to; ++b) {
      const StreamCursor c = p.CursorAt(first + b);
      ASSERT_EQ(c.epoch, epoch);
      ASSERT_EQ(c.batch, b);
      for (int r = 0; r < consumers; ++r)
        for (uint32_t e : p.BatchEntries(r, c)) seen->insert(e);
    }
  }
}

// Every draw of a mixture's epoch (its numbering at `shape`): the samples it names, by count.
std::multiset<uint32_t> MixDraws(const Catalog& cat, uint32_t epoch) {
  std::multiset<uint32_t> all;
  const Mixture& m = *cat.mixture;
  for (uint32_t l = 0; l < m.lanes(); ++l)
    for (uint64_t p = 0; p < m.per_lane(); ++p) {
      const MixDraw d = m.At(epoch, l, p);
      all.insert(static_cast<uint32_t>(cat.part_first[d.source] + d.sample));
    }
  return all;
}

bool Within(const std::multiset<uint32_t>& sub, const std::multiset<uint32_t>& all) {
  for (auto it = sub.begin(); it != sub.end(); it = sub.upper_bound(*it))
    if (sub.count(*it) > all.count(*it)) {
      ADD_FAILURE() << "sample " << *it << ": dealt " << sub.count(*it) << " times, drawn "
                    << all.count(*it);
      return false;
    }
  return true;
}

// The draws (or samples) of `all` whose sample cannot be used (token budgets).
uint64_t Unusable(const std::multiset<uint32_t>& all, const std::vector<SampleCost>& costs) {
  uint64_t n = 0;
  for (uint32_t e : all) n += !costs.empty() && !costs[e].usable();
  return n;
}

struct Trial {
  Data data;
  Settings settings;
  Shape before, after;
};

Trial RandomTrial(std::mt19937_64& rng, bool mixture, bool budget) {
  auto pick = [&](int lo, int hi) { return static_cast<int>(rng() % (hi - lo + 1)) + lo; };
  Trial t;
  t.settings.seed = rng();
  t.settings.shuffle = pick(0, 3) != 0;
  t.settings.drop_last = pick(0, 1) == 1;
  t.settings.batch_size = pick(1, 6);
  for (Shape* s : {&t.before, &t.after}) {
    s->nodes = pick(1, 3);
    s->consumers = pick(1, 4);
  }
  const int most_lanes = std::max(t.before.lanes(), t.after.lanes());
  Data& d = t.data;
  d.mixture = mixture;
  if (!mixture) {
    d.n = static_cast<size_t>(pick(most_lanes * 12, 400));
  } else {
    d.part_sizes = {static_cast<size_t>(pick(20, 90)), static_cast<size_t>(pick(10, 60))};
    d.mix_sources = {{d.part_sizes[0], static_cast<double>(pick(1, 4)), 0, true, rng()},
                     {d.part_sizes[1], 1, 0, pick(0, 1) == 1, rng()}};
    d.mix_per_epoch = static_cast<uint64_t>(pick(most_lanes * 12, 300));
    d.n = d.part_sizes[0] + d.part_sizes[1];
  }
  if (budget) {
    d.max_tokens = pick(200, 800);
    for (size_t i = 0; i < d.n; ++i) {
      SampleCost c;
      c.tokens = static_cast<uint32_t>(pick(1, 150));
      if (pick(0, 30) == 0) c.tokens = SampleCost::kUnusable;  // unreadable at start
      d.costs.push_back(c);
    }
  }
  return t;
}

// Every epoch of the data at one shape: each sample at most once (a mixture: each draw), the
// batches numbered back to back, every cursor of the data valid and the one past it not.
void CheckEpochs(const Trial& t, const Shape& shape) {
  const std::vector<StreamPlan> plans = PlansOf(t.data, t.settings, shape);
  ASSERT_EQ(plans.size(), static_cast<size_t>(shape.nodes));
  const uint64_t streams = shape.lanes();
  const uint64_t bs = static_cast<uint64_t>(t.settings.batch_size);
  uint64_t unusable = 0;
  for (const SampleCost& c : t.data.costs) unusable += !c.usable();
  for (uint32_t epoch = 0; epoch < static_cast<uint32_t>(t.settings.epochs); ++epoch) {
    SCOPED_TRACE(fmt::format("epoch {}", epoch));
    const uint64_t k = plans[0].EpochBatches(epoch);
    for (const StreamPlan& p : plans) ASSERT_EQ(p.EpochBatches(epoch), k) << "every rank alike";
    std::multiset<uint32_t> seen;
    ASSERT_NO_FATAL_FAILURE(Deal(plans, epoch, 0, k, &seen));
    if (t.data.mixture) {
      const std::multiset<uint32_t> draws = MixDraws(*plans[0].catalog(), epoch);
      EXPECT_TRUE(Within(seen, draws)) << "a draw dealt twice";
      EXPECT_GE(seen.size() + streams * bs + streams + Unusable(draws, t.data.costs), draws.size());
    } else {
      EXPECT_EQ(std::set<uint32_t>(seen.begin(), seen.end()).size(), seen.size())
          << "a sample dealt twice";
      const uint64_t n = t.data.n;
      EXPECT_GE(seen.size() + streams * bs + streams + unusable, n)
          << "more left out than the shape's remainder";
    }
    for (uint32_t e : seen) {
      if (!t.data.costs.empty()) {
        EXPECT_TRUE(t.data.costs[e].usable()) << "sample " << e;
      }
    }
    // Cursors: each batch of the epoch is a valid cursor, numbered after the last epoch's.
    const uint64_t first = FirstSeqOf(plans[0], epoch);
    EXPECT_EQ(plans[0].CursorAt(first).batch, 0u);
    EXPECT_TRUE(plans[0].CheckCursor(first + k - 1).ok());
  }
  const uint64_t end = FirstSeqOf(plans[0], static_cast<uint32_t>(t.settings.epochs));
  EXPECT_TRUE(plans[0].CheckCursor(end).ok()) << "the end itself: a finished rank's cursor";
  EXPECT_FALSE(plans[0].CheckCursor(end + 1).ok()) << "past the end of the data";
}

// A prefix of `epoch` finished by every rank at `before`, resumed at `after` from the position
// the client would report: the rest of the epoch, each sample (draw) at most once with the
// prefix, all but fewer than `after`'s remainder.
void CheckResume(const Trial& t, uint32_t epoch, double fraction) {
  const std::vector<StreamPlan> before = PlansOf(t.data, t.settings, t.before);
  ASSERT_FALSE(before.empty());
  ASSERT_TRUE(before[0].positional());
  const uint64_t k = before[0].EpochBatches(epoch);
  const uint64_t done = static_cast<uint64_t>(fraction * static_cast<double>(k));
  std::multiset<uint32_t> seen;
  ASSERT_NO_FATAL_FAILURE(Deal(before, epoch, 0, done, &seen));
  // The client's rule (PositionJson, the rings' step start): where the next batch starts.
  const StreamCursor next = before[0].CursorAt(FirstSeqOf(before[0], epoch) + done);
  const uint64_t position =
      done == k ? 0
      : t.data.costs.empty()
          ? done * static_cast<uint64_t>(t.settings.batch_size) * before[0].streams()
          : before[0].StepStart(next);
  const uint32_t lanes = t.data.mixture ? t.before.lanes() : 0;
  std::vector<StreamPlan> after = PlansOf(t.data, t.settings, t.after);
  ASSERT_FALSE(after.empty());
  const uint32_t from_epoch = done == k ? epoch + 1 : epoch;
  for (StreamPlan& p : after) {
    Result<StreamOrigin> o = p.Rebased(from_epoch, position, lanes, 0);
    ASSERT_TRUE(o.ok()) << o.status().message();
    o->seq = 0;
    Result<StreamPlan> moved = p.WithOrigin(*o);
    ASSERT_TRUE(moved.ok()) << moved.status().message();
    p = std::move(moved.value());
  }
  if (after[0].origin().epoch == epoch) {
    ASSERT_NO_FATAL_FAILURE(Deal(after, epoch, 0, after[0].EpochBatches(epoch), &seen));
  }
  uint64_t unusable = 0;  // a mixture's: counted by draw, below
  for (const SampleCost& c : t.data.costs) unusable += !t.data.mixture && !c.usable();
  const uint64_t slack = t.after.lanes() * static_cast<uint64_t>(t.settings.batch_size) +
                         t.after.lanes() + t.before.lanes() + unusable;
  if (t.data.mixture) {
    // The epoch's draws in the numbering of the shape it stood at (from its start: the new
    // shape's own).
    const std::multiset<uint32_t> draws =
        MixDraws(*(done == 0 ? after : before)[0].catalog(), epoch);
    EXPECT_TRUE(Within(seen, draws)) << "a draw dealt twice";
    if (done < k) {
      EXPECT_GE(seen.size() + slack + Unusable(draws, t.data.costs), draws.size());
    }
  } else {
    EXPECT_EQ(std::set<uint32_t>(seen.begin(), seen.end()).size(), seen.size())
        << "a sample dealt twice";
    if (done < k) {
      EXPECT_GE(seen.size() + slack, t.data.n);
    }
  }
}

TEST(StreamPlanTest, EveryEpochDealsEachSampleOnceAtRandomShapes) {
  std::mt19937_64 rng(20261207);
  for (int i = 0; i < 60; ++i)
    for (bool mixture : {false, true})
      for (bool budget : {false, true}) {
        const Trial t = RandomTrial(rng, mixture, budget);
        SCOPED_TRACE(fmt::format("trial {}: {} samples{}{}, batch {}{}, {}x{} ranks", i, t.data.n,
                                 mixture ? " mixed" : "",
                                 budget ? fmt::format(", max_tokens {}", t.data.max_tokens) : "",
                                 t.settings.batch_size, t.settings.drop_last ? " drop_last" : "",
                                 t.before.nodes, t.before.consumers));
        ASSERT_NO_FATAL_FAILURE(CheckEpochs(t, t.before));
      }
}

TEST(StreamPlanTest, AnyPrefixResumesAtAnyOtherShape) {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 60; ++i)
    for (bool mixture : {false, true})
      for (bool budget : {false, true}) {
        const Trial t = RandomTrial(rng, mixture, budget);
        const double fraction = static_cast<double>(rng() % 101) / 100;
        const uint32_t epoch = static_cast<uint32_t>(rng() % 2);
        SCOPED_TRACE(fmt::format(
            "trial {}: {} samples{}{}, batch {}{}, {}x{} -> {}x{} ranks, epoch {} at {:.2f}", i,
            t.data.n, mixture ? " mixed" : "",
            budget ? fmt::format(", max_tokens {}", t.data.max_tokens) : "", t.settings.batch_size,
            t.settings.drop_last ? " drop_last" : "", t.before.nodes, t.before.consumers,
            t.after.nodes, t.after.consumers, epoch, fraction));
        ASSERT_NO_FATAL_FAILURE(CheckResume(t, epoch, fraction));
      }
}

// The plan is a value: another origin is another plan, and the first is unchanged; equal inputs
// give equal fingerprints, another seed another order.
TEST(StreamPlanTest, AnotherOriginIsAnotherPlan) {
  Data d;
  d.n = 100;
  Settings s;
  s.batch_size = 4;
  const Shape shape{1, 2};
  const std::vector<StreamPlan> plans = PlansOf(d, s, shape);
  ASSERT_EQ(plans.size(), 1u);
  const StreamPlan& p = plans[0];
  EXPECT_EQ(p.EpochBatches(0), 13u);  // 50 a rank, the last batch of 2
  EXPECT_EQ(p.RowsOf(0, 12), 2);
  StreamOrigin o;
  o.epoch = 1;
  o.seq = 40;
  o.stream = 5;
  o.previous = 3;
  Result<StreamPlan> q = p.WithOrigin(o);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->CursorAt(40).epoch, 1u);
  EXPECT_EQ(q->CursorAt(40).batch, 0u);
  EXPECT_EQ(q->CursorAt(53).epoch, 2u);
  EXPECT_FALSE(q->CheckCursor(39).ok()) << "before the origin";
  EXPECT_EQ(q->StreamBefore(40), 3u);
  EXPECT_EQ(q->StreamBefore(41), 5u);
  EXPECT_EQ(p.CursorAt(40).epoch, 3u) << "the first plan is unchanged";
  EXPECT_EQ(p.origin().seq, 0u);
  EXPECT_EQ(q->fingerprint(), p.fingerprint()) << "the same stream, numbered from elsewhere";
  const std::vector<StreamPlan> same = PlansOf(d, s, shape);
  EXPECT_EQ(same[0].fingerprint(), p.fingerprint());
  s.seed = 2;
  const std::vector<StreamPlan> other = PlansOf(d, s, shape);
  EXPECT_NE(other[0].order_fingerprint(), p.order_fingerprint());
  EXPECT_EQ(other[0].order_tag() == p.order_tag(), false);
}

}  // namespace
}  // namespace mmfeed
