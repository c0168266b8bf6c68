// Token-budget batches: the batch stage's `max_tokens` / `max_patches`. A batch is filled with
// whole samples, in the rank's order, until the next one would pass a budget (or batch_size
// rows), so its size varies; every rank of every node still gets the same number of batches
// per epoch, with no coordinator:
//
// 1. Each sample's cost (text tokens with its vision pads, vision patches) is measured once
//    when the pipeline is built, from file headers and the tokenizer (StageWorker::Measure),
//    for the whole catalog: every node measures every sample, so every node can plan every
//    rank's epoch.
// 2. An epoch's plan cuts each stream (one per rank of each node: the rank's share of the
//    epoch's order) greedily into batches. The epoch's batch count K is the largest stream's;
//    the other streams split their fullest batches (in two, at the middle row) until they have
//    K too. A split batch is still within the budgets, so nothing is dropped: every usable
//    sample of a rank's share is in exactly one of its batches. K depends on the epoch (the
//    shuffle), and is the same on every node because the plan is a pure function of the costs,
//    the order and the budgets.
// 3. Samples that cannot be measured (an unreadable header) or that pass a budget on their own
//    are reported once when the pipeline is built and left out of every plan.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/config.h"

namespace mmfeed {

struct SampleCost {
  static constexpr uint32_t kUnusable = UINT32_MAX;  // in `tokens`: left out of every plan
  uint32_t tokens = 0, patches = 0;
  bool usable() const { return tokens != kUnusable; }
};

struct BatchBudget {
  int64_t max_rows = 0;     // batch_size
  int64_t max_tokens = 0;   // 0: not budgeted
  int64_t max_patches = 0;  // 0: not budgeted
  bool Fits(int64_t rows, int64_t tokens, int64_t patches) const {
    return rows <= max_rows && (max_tokens == 0 || tokens <= max_tokens) &&
           (max_patches == 0 || patches <= max_patches);
  }
  // Why one sample can never be batched ("" if it can).
  std::string Refuses(const SampleCost& c) const;
};

// One rank's epoch: batch b holds the samples at positions[starts[b]] .. positions[starts[b +
// 1] - 1] of the rank's share (position k is the share's k-th sample of the epoch's order).
struct RankPlan {
  std::vector<uint32_t> positions, starts;
  uint64_t batches() const { return starts.empty() ? 0 : starts.size() - 1; }
};

// Where the samples of a stream are: position k of stream `s` of the world (rank r of node n is
// stream r * num_nodes + n; streams = consumers * num_nodes) is EpochOrder position
// (k * streams + s).
struct EpochPlan {
  uint64_t batches = 0;         // K: every rank's
  std::vector<RankPlan> ranks;  // this node's, by rank (empty when only K was asked for)
  // Not ok when some rank cannot have K batches (fewer usable samples than K, or none at all):
  // the epoch cannot be dealt.
  Status status;
};

// `costs` by catalog entry; `per_rank` samples in each stream. `with_ranks`: also this node's
// rank plans (else only K).
struct Catalog;

// `catalog`: a mixture's, whose EpochOrder deals by its Mixture (nullptr: a permutation of
// costs.size() samples).
EpochPlan PlanEpoch(const std::vector<SampleCost>& costs, const SourceConfig& source,
                    uint32_t epoch, int consumers, uint64_t per_rank, const BatchBudget& budget,
                    bool with_ranks, const Catalog* catalog = nullptr);

// What measuring a catalog found: every entry's cost (kUnusable where measuring failed) and
// the failures, by entry. Kept in a file for indexed sources (large ones), so that later starts
// read it instead of measuring again: `<source>.costs.mmfidx` beside the data, or in the state
// dir (source/index_file.h). `key` names what the costs were measured from (the source's
// index stamp, the measuring stages' parameters); a file with another key, count or size is
// measured again and replaced.
struct MeasuredCatalog {
  struct Failure {
    uint32_t entry = 0;
    std::string stage;
    Status status;
  };
  std::vector<SampleCost> costs;
  std::vector<Failure> failures;
};
std::string CostIndexPath(const std::string& source_path, const std::string& index_dir);
// The file's contents if they are for `key` and `count` entries; else why not.
Result<MeasuredCatalog> ReadCostIndex(const std::string& path, uint64_t key, size_t count);
// False (errno set) when it cannot be written; nothing is left behind then.
bool WriteCostIndex(const std::string& path, uint64_t key, const MeasuredCatalog& m);

// The greedy cut of one stream's costs (in order): the batch starts, then the end.
std::vector<uint32_t> PackGreedy(const std::vector<SampleCost>& stream, const BatchBudget& budget);
// Splits the fullest batches of `starts` (over `stream`) in two until there are `count`.
// REQUIRES: count <= stream.size().
void SplitFullest(const std::vector<SampleCost>& stream, const BatchBudget& budget, uint64_t count,
                  std::vector<uint32_t>* starts);

}  // namespace mmfeed
