// The epoch order (source/catalog.h, EpochOrder): permutation and window modes, nodes, resumes
// at another shape.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "source/catalog.h"
#include "source/mixture.h"
#include "tests/source/tar_util.h"
#include "tests/test_util.h"

namespace mmfeed {
namespace {

using testing::TarRecord;
using testing::TempDir;
using testing::WebDataset;
using testing::WriteFile;

std::vector<uint32_t> Positions(const EpochOrder& o) {
  std::vector<uint32_t> v;
  for (size_t i = 0; i < o.size(); ++i) v.push_back(o[i]);
  return v;
}

TEST(EpochOrderTest, NodesGetDisjointEqualShares) {
  SourceConfig s;
  s.shuffle = true;
  s.seed = 3;
  s.num_nodes = 3;
  std::set<uint32_t> all;
  for (int node = 0; node < 3; ++node) {
    s.node_rank = node;
    std::vector<uint32_t> o = Positions(EpochOrder(100, s, 0, 4));
    EXPECT_EQ(o.size(), 32u);  // 33 per node, trimmed to a multiple of 4 ranks
    for (uint32_t i : o) EXPECT_TRUE(all.insert(i).second);
    EXPECT_EQ(o, Positions(EpochOrder(100, s, 0, 4))) << "deterministic";
    EXPECT_NE(o, Positions(EpochOrder(100, s, 1, 4))) << "new order each epoch";
  }
  s.shuffle = false;
  s.num_nodes = 1;
  s.node_rank = 0;
  EXPECT_EQ(Positions(EpochOrder(5, s, 0, 1)), (std::vector<uint32_t>{0, 1, 2, 3, 4}));
}

// A mixture resumed at another shape (issue #31): a job of `before` lanes stopped with every
// lane at position 7 (the first 7 x lanes positions of the epoch's global order delivered); the
// nodes and ranks of the new shape deal the rest of that epoch in the numbering of the shape it
// stood at: together with what was delivered, each draw of the epoch at most once, and all but
// fewer than one per new lane (the remainder, left out as an epoch's is).
// PositionOf is the order's inverse on each node, from a base too; other nodes' entries and the
// remainder are nowhere.
TEST(EpochOrderTest, PositionOfInvertsThePermutationOrder) {
  for (bool shuffle : {true, false})
    for (uint64_t base : {0ull, 37ull}) {
      SourceConfig s;
      s.shuffle = shuffle;
      s.seed = 5;
      s.num_nodes = 3;
      const size_t n = 1001;
      for (int node = 0; node < 3; ++node) {
        s.node_rank = node;
        const EpochOrder order(n, s, 2, 4, base);
        std::vector<bool> here(n);
        for (size_t i = 0; i < order.size(); ++i) {
          ASSERT_EQ(order.PositionOf(order[i]), i);
          here[order[i]] = true;
        }
        for (uint32_t e = 0; e < n; ++e) {
          if (!here[e]) {
            ASSERT_EQ(order.PositionOf(e), EpochOrder::kNowhere) << e;
          }
        }
      }
    }
}

TEST(EpochOrderTest, AMixtureResumedAtAnotherShapeDealsTheRestOfItsEpochOnce) {
  auto part = [](size_t n) {
    auto c = std::make_shared<Catalog>();
    c->entries.resize(n);
    return c;
  };
  Catalog cat;
  cat.parts = {part(64), part(40)};
  cat.part_first = {0, 64};
  cat.part_sources.resize(2);
  // Weights 3:1 over an epoch of 101 draws: source 0 runs past its size (its next pass).
  const std::vector<MixSource> sources = {{64, 3, 0, true, 11}, {40, 1, 0, true, 12}};
  for (const auto& [before, nodes, consumers] :
       {std::tuple{4u, 3, 1}, std::tuple{4u, 1, 4}, std::tuple{3u, 2, 2}, std::tuple{6u, 1, 5}}) {
    SCOPED_TRACE(fmt::format("{} lanes -> {} x {}", before, nodes, consumers));
    const uint32_t lanes = static_cast<uint32_t>(nodes * consumers);
    Result<Mixture> own = Mixture::Create(sources, MixMode::kWeighted, 101, lanes, 9,
                                          static_cast<uint32_t>(consumers));
    ASSERT_TRUE(own.ok()) << own.status().message();
    cat.mixture = std::make_shared<const Mixture>(std::move(own.value()));
    Result<Mixture> numbering = cat.mixture->WithLanes(before);
    ASSERT_TRUE(numbering.ok()) << numbering.status().message();
    // The epoch's draws at the old shape, less the delivered ones.
    const uint32_t epoch = 1;
    std::multiset<uint32_t> left;
    for (uint32_t l = 0; l < before; ++l)
      for (uint64_t p = 7; p < numbering->per_lane(); ++p) {
        const MixDraw d = numbering->At(epoch, l, p);
        left.insert(static_cast<uint32_t>(cat.part_first[d.source] + d.sample));
      }
    const uint64_t base = 7 * before, rest = left.size();
    SourceConfig s;
    s.num_nodes = nodes;
    uint64_t dealt = 0;
    for (int node = 0; node < nodes; ++node) {
      s.node_rank = node;
      const EpochOrder order(cat, s, epoch, consumers, base, &*numbering);
      EXPECT_EQ(order.size(), rest / lanes * consumers) << "equal shares, the remainder out";
      for (size_t i = 0; i < order.size(); ++i) {
        auto it = left.find(order[i]);
        ASSERT_NE(it, left.end()) << "position " << i << " of node " << node
                                  << ": delivered already, or dealt twice";
        left.erase(it);
        ++dealt;
        // A refill comes from the failed sample's source.
        EXPECT_EQ(cat.PartOf(order.SameSource(order[i], static_cast<int>(i % consumers), i * 7919)),
                  cat.PartOf(order[i]));
      }
    }
    EXPECT_EQ(dealt, rest - rest % lanes);
    EXPECT_EQ(left.size(), rest % lanes);
  }
}

// Nine indexed tar shards of uneven sizes (an empty one, primes): the catalog, and which shard
// holds each catalog entry.
struct UnevenShards {
  TempDir dir;
  SourceConfig source;
  std::optional<Catalog> cat;
  std::vector<int> shard_of;
  void Load() {
    const std::vector<int> counts = {7, 0, 13, 1, 8, 11, 2, 17, 5};
    size_t total = 0;
    for (size_t k = 0; k < counts.size(); ++k) {
      std::string tar;
      for (int i = 0; i < counts[k]; ++i) tar += TarRecord(fmt::format("s{}_{}.txt", k, i), "t");
      WriteFile(dir / fmt::format("shard-{}.tar", k), tar + std::string(1024, '\0'));
      total += counts[k];
    }
    source = WebDataset(dir / "shard-{0..8}.tar");
    source.index = "on";
    Result<Catalog> c = LoadWebDataset(source, {"text"});
    ASSERT_TRUE(c.ok()) << c.status().message();
    ASSERT_EQ(c->size(), total);
    cat.emplace(std::move(*c));
    shard_of.resize(total);
    for (size_t k = 0; k < cat->shards->shard_count(); ++k) {
      const ShardIndex::ShardSpan sp = cat->shards->shard(k);
      for (uint64_t i = sp.first; i < sp.first + sp.count; ++i) shard_of[i] = static_cast<int>(k);
    }
  }
};

// Window mode: shards in a seeded order, samples permuted within runs of W shards, each node a
// contiguous part. Shards of uneven sizes (an empty one, primes) over 1-3 nodes and 1-2 ranks:
// every position of every node is a distinct catalog entry, each node's part is what the
// contiguous split says, positions stay within one window's shards, and the order is
// deterministic, seeded and new each epoch.
TEST(EpochOrderTest, WindowModeDealsEveryShardsSamplesOnceInWindows) {
  UnevenShards u;
  ASSERT_NO_FATAL_FAILURE(u.Load());
  SourceConfig& s = u.source;
  const Catalog* cat = &*u.cat;
  const size_t total = cat->size();
  const std::vector<int>& shard_of = u.shard_of;
  for (bool shuffle : {true, false})
    for (int window : {1, 2, 4, 100})
      for (int nodes : {1, 2, 3})
        for (int consumers : {1, 2}) {
          s.shuffle = shuffle;
          s.seed = 11;
          s.shuffle_window = window;
          s.num_nodes = nodes;
          std::set<uint32_t> seen;
          for (int node = 0; node < nodes; ++node) {
            s.node_rank = node;
            const EpochOrder order(*cat, s, 0, consumers);
            ASSERT_TRUE(order.windowed());
            const size_t per_node = total / nodes;
            EXPECT_EQ(order.size(), per_node / consumers * consumers);
            std::vector<uint32_t> got = Positions(order);
            for (uint32_t i : got) EXPECT_TRUE(seen.insert(i).second) << "twice: " << i;
            EXPECT_EQ(got, Positions(EpochOrder(*cat, s, 0, consumers))) << "deterministic";
            // A window's positions come from that window's shards only.
            for (size_t i = 0; i < got.size(); ++i) {
              const std::vector<uint32_t> shards = order.WindowShards(i, 0);
              EXPECT_TRUE(std::count(shards.begin(), shards.end(), shard_of[got[i]]))
                  << "position " << i << " left its window";
              EXPECT_LE(shards.size(), static_cast<size_t>(window));
            }
            if (shuffle && window > 1 && nodes == 1) {
              EXPECT_NE(got, Positions(EpochOrder(*cat, s, 1, consumers))) << "new each epoch";
            }
            if (!shuffle) {  // the catalog's order, each node a contiguous part
              for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], node * per_node + i);
            }
          }
          // Everything but the remainders is dealt.
          EXPECT_EQ(seen.size(), total / nodes / consumers * consumers * nodes);
        }
  // A full window with shuffle visits its shards' samples in a shuffled, not the stored, order.
  s.shuffle = true, s.shuffle_window = 100, s.num_nodes = 1, s.node_rank = 0;
  std::vector<uint32_t> all = Positions(EpochOrder(*cat, s, 0, 1));
  EXPECT_EQ(std::set<uint32_t>(all.begin(), all.end()).size(), total);
  EXPECT_FALSE(std::is_sorted(all.begin(), all.end()));
}

// Window mode resumed at another shape: the job's order interleaves the nodes' parts, and a
// base taken at N0 nodes (every node past its first p positions: base = p x N0) deals the rest
// of that order over another number of nodes and ranks. Over the two shapes every position is a
// distinct entry, all of the order but fewer than one round of the new streams is dealt, and a
// position's shards are among those WindowShards names (a node now reads several parts).
TEST(EpochOrderTest, WindowModeResumedAtAnotherShapeDealsTheRestOnce) {
  UnevenShards u;
  ASSERT_NO_FATAL_FAILURE(u.Load());
  SourceConfig& s = u.source;
  s.shuffle = true, s.seed = 3, s.shuffle_window = 2;
  const Catalog* cat = &*u.cat;
  const size_t total = cat->size();
  const std::vector<int>& shard_of = u.shard_of;
  for (int before : {1, 2, 3})
    for (uint64_t p : {1, 4, 9})
      for (int nodes : {1, 2, 3})
        for (int consumers : {1, 2}) {
          SCOPED_TRACE(fmt::format("{} nodes, p {}, then {} x {}", before, p, nodes, consumers));
          std::set<uint32_t> seen;
          s.num_nodes = before;
          for (int node = 0; node < before; ++node) {  // what the first shape delivered
            s.node_rank = node;
            const EpochOrder first(*cat, s, 0, 1);
            for (size_t i = 0; i < p; ++i) ASSERT_TRUE(seen.insert(first[i]).second);
          }
          const uint64_t base = p * before, order = total / before * before;
          s.num_nodes = nodes;
          size_t dealt = 0;
          for (int node = 0; node < nodes; ++node) {
            s.node_rank = node;
            const EpochOrder rest(*cat, s, 0, consumers, base, nullptr, before);
            EXPECT_EQ(rest.size(), (order - base) / nodes / consumers * consumers);
            for (size_t i = 0; i < rest.size(); ++i) {
              EXPECT_TRUE(seen.insert(rest[i]).second) << "position " << i << " dealt twice";
              const std::vector<uint32_t> shards = rest.WindowShards(i, 0);
              EXPECT_TRUE(std::count(shards.begin(), shards.end(), shard_of[rest[i]]))
                  << "position " << i << " outside the windows named";
            }
            dealt += rest.size();
          }
          EXPECT_EQ(base + dealt, seen.size());
          EXPECT_LT(order - seen.size(), static_cast<size_t>(nodes * consumers));
        }
}

}  // namespace
}  // namespace mmfeed
