// Token-budget batches: the batch stage's `max_tokens` / `max_patches`. A batch is filled with
// whole samples until the next one would pass a budget (or batch_size rows), so its size
// varies; every rank of every node still gets the same number of batches per epoch, with no
// coordinator, and what the job has consumed is always a prefix of the epoch's global order:
//
// 1. Each sample's cost (text tokens with its vision pads, vision patches) is measured once
//    when the pipeline is built, from file headers and the tokenizer (StageWorker::Measure),
//    for the whole catalog: every node measures every sample, so every node can plan every
//    rank's epoch.
// 2. An epoch's plan deals the epoch's global order (the permutation, or the mixture's lanes
//    interleaved: EpochOrder::GlobalOf) in steps. Step s gives batch s of every stream (rank r
//    of node n is stream n x consumers + r): from position G_s on, each usable sample goes to
//    the stream whose batch is least full (its largest share of a budget; the lowest stream
//    among equals) until the next sample does not fit there; that position is G_(s + 1). So
//    when every rank has finished its batches before step s, the samples consumed are the
//    usable ones of positions [G_0, G_s), one number, whatever the shape: a job resumed at
//    another shape plans the rest of the epoch from G_s over its own streams (StreamOrigin::
//    base), as fixed-size batches do. The plan is a pure function of the costs, the order and
//    the budgets, so every node computes the same K and G.
// 3. The epoch ends with the order: a last step that cannot give every stream a sample is not
//    made (fewer than `streams` usable samples wait for the next epoch, as a remainder does).
// 4. Samples that cannot be measured (an unreadable header) or that pass a budget on their own
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

// The batch stage's budgets (max_rows: batch_size).
inline BatchBudget BudgetOf(const PipelineConfig& cfg) {
  return {cfg.batch_size, cfg.max_tokens, cfg.max_patches};
}

// One rank's epoch: batch b holds catalog entries entries[starts[b]] .. entries[starts[b + 1] -
// 1].
struct RankPlan {
  std::vector<uint32_t> entries, starts;
  uint64_t batches() const { return starts.empty() ? 0 : starts.size() - 1; }
};

struct EpochPlan {
  uint64_t batches = 0;  // K: every rank's
  // Step s (batch s of every rank) holds the usable samples at positions [steps[s], steps[s +
  // 1]) of the epoch's global order; steps[0] is the base, steps[K] where the plan stops.
  std::vector<uint64_t> steps;
  std::vector<RankPlan> ranks;  // this node's, by rank (empty when only K and G were asked for)
  // Not ok when the order holds too few usable samples for one batch per rank: the epoch cannot
  // be dealt.
  Status status;
};

struct Catalog;
class Mixture;

// Epoch `epoch` for `consumers` ranks on each of `source.num_nodes` nodes, of `catalog` (null:
// a permutation of costs.size() samples) whose entries cost `costs`; `with_ranks`: also this
// node's rank plans (else only K and G). From `base` on, a mixture numbered by `numbering` (the
// catalog's Mixture dealt to the lanes the base counts in), `lanes` those of shard windows
// (StreamOrigin).
EpochPlan PlanEpoch(const std::vector<SampleCost>& costs, const SourceConfig& source,
                    uint32_t epoch, int consumers, const BatchBudget& budget, bool with_ranks,
                    const Catalog* catalog = nullptr, uint64_t base = 0,
                    const Mixture* numbering = nullptr, uint32_t lanes = 0);

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

}  // namespace mmfeed
