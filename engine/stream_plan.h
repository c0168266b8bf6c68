// StreamPlan: the stream's arithmetic as one immutable value. Made from the config (the order
// and the shape: seed, shuffle, epochs, nodes, consumers, batch size, budgets), the loaded
// catalog, every sample's cost (token budgets only) and the origin, it answers every question
// about positions with no thread and no pipeline: the cursor of a batch and the batch of a
// cursor, the samples of a rank's batch, an epoch's batches and token-budget plan, a node's
// reading order and when it next reads a sample, the origin of a job resumed at another shape,
// and the fingerprints that say whether two streams are the same.
//
// The pipeline keeps the threads and asks its plan; the daemon's reload, resume, --check and
// state directory ask the plan of the pipeline they built. A plan never changes: another origin
// (WithOrigin) or another mixture (WithCatalog) is another plan. Copies are cheap (shared
// immutable inputs); the epochs' plans and inverses it computes on demand are memoised behind
// a lock, so one plan may be asked from any thread.
//
// A rank's stream is a pure function of (data, seed, epoch, node rank/count, consumers, rank):
// every epoch has the same number of batches for every rank, and batch (epoch, index) can be
// made again on its own. See docs/design/threads.md, "Batches and failures".
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/cursor.h"
#include "base/status.h"
#include "engine/budget.h"
#include "engine/config.h"

namespace mmfeed {

struct Catalog;
class EpochOrder;
class Mixture;

// Where a stream's numbering starts, and the stream it continues: batch `index` of epoch `e`
// (e >= epoch) is seq `seq + (e - epoch) * batches_per_epoch + index`. {0, 0} unless a reload
// changed the batches per epoch at an epoch boundary (the earlier epochs were numbered by
// another pipeline); cursors before it cannot be served. `stream` tags the batches from the
// origin on (StreamCursor::stream), `previous` the batches before it (0: unknown). A fresh
// stream's tag is FirstStreamTag of the order; an order-changing reload chains NextStreamTag, so
// equal tags mean the same order and reload history.
// `base`: the origin epoch is dealt from that position of its global order on, the rest of it
// over this plan's ranks (a job resumed at another shape: Rebased); later epochs whole.
// `lanes`: those of the shape whose global order `base` counts in (StreamCursor::lanes): a
// mixture's lanes, or the nodes whose shard-window parts that order interleaves; `nodes`: that
// shape's nodes, for a mixture with a source in shard windows (StreamCursor::nodes).
struct StreamOrigin {
  uint32_t epoch = 0;
  uint64_t seq = 0;
  uint32_t stream = 0, previous = 0;
  uint64_t base = 0;
  uint32_t lanes = 0, nodes = 0;
};

class StreamPlan {
 public:
  // How far ahead the caches look (NextUse; the pipeline's remote-shard future).
  static constexpr uint32_t kFutureEpochs = 3;
  // A token-budget seq further ahead than this many epochs is refused (CheckCursor).
  static constexpr size_t kMaxEpochsAhead = 1000;

  // The plan from the origin {0, 0}. `costs`: every catalog entry's (token budgets; else
  // empty). Refused: no full batch per rank (drop_last), or a budgeted epoch 0 that cannot be
  // dealt.
  static Result<StreamPlan> Make(const PipelineConfig& cfg, std::shared_ptr<const Catalog> catalog,
                                 std::vector<SampleCost> costs = {});
  // The same stream numbered from `origin` (its tag and previous as given). Refused: a
  // mixture's base in lanes it cannot be dealt to.
  Result<StreamPlan> WithOrigin(StreamOrigin origin) const;
  // The same settings over another catalog of the same samples (a weights-only mixture switch:
  // Mixture::Switched), from the origin {0, 0} and with new fingerprints.
  StreamPlan WithCatalog(std::shared_ptr<const Catalog> catalog) const;

  static uint32_t FirstStreamTag(const std::string& order_fingerprint);
  static uint32_t NextStreamTag(const StreamOrigin& before, uint64_t seq,
                                const std::string& order_fingerprint);

  const StreamOrigin& origin() const { return origin_; }
  const std::shared_ptr<const Catalog>& catalog() const { return in_->catalog; }
  const std::vector<SampleCost>& costs() const { return in_->costs; }
  const BatchBudget& budget() const { return in_->budget; }
  bool budgeted() const { return in_->cfg.budgeted(); }
  // The job's streams (every node's ranks).
  uint64_t streams() const {
    return static_cast<uint64_t>(in_->cfg.consumers) * in_->cfg.source.num_nodes;
  }
  // Samples in each rank's share of a whole epoch.
  uint64_t per_rank() const { return in_->per_rank; }
  // Every rank's batches in an epoch dealt whole (with a token budget: epoch 0's).
  uint64_t batches_per_epoch() const { return in_->batches_per_epoch; }
  // Identifies the streams: the catalog's ids and every setting that changes which samples go
  // where or their bytes. Equal fingerprints, equal batches.
  const std::string& fingerprint() const { return in_->fingerprint; }
  // The same, for only what decides which sample goes into which batch row (the catalog's ids,
  // seed, shuffle, nodes, consumers, batch size): equal, equal ids batch by batch.
  const std::string& order_fingerprint() const { return in_->order_fingerprint; }
  // The data, seed and shuffle (not the shape): what a cursor's `order` must match.
  uint32_t order_tag() const { return in_->order_tag; }
  // The tag of the batch before cursor seq `seq` (0 when unknown or seq is 0).
  uint32_t StreamBefore(uint64_t seq) const {
    return seq == 0 ? 0 : seq > origin_.seq ? origin_.stream : origin_.previous;
  }

  // Samples in each rank's share of epoch `epoch` (fewer in a rebased origin epoch).
  uint64_t PerRank(uint32_t epoch) const;
  // Every rank's batches in epoch `epoch` (>= origin().epoch).
  uint64_t EpochBatches(uint32_t epoch) const;
  // Rows of batch `index` of epoch `epoch` (fixed-size batches).
  int RowsOf(uint32_t epoch, uint64_t index) const;
  // The cursor of batch `seq` of a rank. REQUIRES: seq >= origin().seq (CheckCursor).
  StreamCursor CursorAt(uint64_t seq) const;
  StreamCursor CursorAfter(uint64_t seq) const { return CursorAt(seq + 1); }
  // Whether a rank can be served from batch `seq` on: at or after the origin, at most the end
  // of the data, in an epoch a cursor can name (and, with a token budget, not kMaxEpochsAhead
  // epochs ahead). Every cursor from outside is checked here before it is used.
  Status CheckCursor(uint64_t seq) const;
  // Epoch `epoch`'s token-budget plan with this node's rank plans; the last few are kept.
  std::shared_ptr<const EpochPlan> PlanOf(uint32_t epoch) const;
  // The catalog entries of rank `rank`'s batch at `at` (of this node). With a token budget,
  // `plan` is PlanOf(at.epoch) (null: asked for here).
  std::vector<uint32_t> BatchEntries(int rank, const StreamCursor& at,
                                     const EpochPlan* plan = nullptr) const;
  // Epoch `epoch`'s order of this node (from the origin's base in the origin epoch).
  EpochOrder OrderOf(uint32_t epoch) const;
  // The shards this node reads in `epoch` of the source (`part` 0) or of a mixture's source
  // `part`, in reading order (with repeats at windows' edges).
  std::vector<uint32_t> ReadingOrder(uint32_t epoch, size_t part) const;
  // For the stages' caches (SampleCache::NextUse): when this node reads catalog entry `entry`
  // next after epoch `after`, over kFutureEpochs epochs: epoch << 32 | its position
  // (SampleCache::kNever: not in that time). A permutation order is inverted per entry; a
  // window or mixture order is walked once per epoch into a table (4 bytes per entry).
  uint64_t NextUse(uint32_t entry, uint32_t after) const;

  // Positions (StreamCursor::order, position) need an order that is one global sequence whose
  // every prefix of steps the ranks consume together (dealt round-robin to fixed-size batches,
  // or in a token budget's steps: engine/budget.h), not a packed stream's: one source in
  // permutation mode or in shard windows (its nodes' parts interleaved); a mixture (its lanes
  // interleaved) without a weight switch (and with a budget, under 2^32 draws an epoch: the
  // rings carry a budgeted position in 32 bits). Else the reason it has none.
  bool positional() const { return !why_not_positional(); }
  WhyNot why_not_positional() const;
  // With a token budget: the job's position at cursor `c`, where the step of its batch starts
  // (EpochPlan::steps). The rings carry it in each slot (the client cannot compute it).
  uint64_t StepStart(const StreamCursor& c) const;
  // The origin of a stream that resumes the job at `position` of epoch `epoch`'s global order
  // (a mixture's or shard windows' in `lanes` lanes, a mixture with a source in shard windows'
  // over `nodes` nodes) with this plan's shape (an epoch with no full row a stream left is
  // skipped: the next epoch's start). Refused: a mixture's cursor without its lanes (or nodes
  // where they count), lanes the mixture cannot be dealt to, or a position past the epoch's end.
  // REQUIRES: positional().
  Result<StreamOrigin> Rebased(uint32_t epoch, uint64_t position, uint32_t lanes,
                               uint32_t nodes) const;
  // The attach reply's "position" rule ("step_position" with a token budget): how a client
  // turns the cursors of epochs >= the origin's into positions (null when not positional()).
  nlohmann::json PositionJson() const;
  // The first source of a mixture read in shard windows, or null.
  const SourceConfig* WindowedSource() const;

 private:
  struct Inputs {  // shared by copies, immutable once made
    PipelineConfig cfg;
    std::shared_ptr<const Catalog> catalog;
    std::vector<SampleCost> costs;
    BatchBudget budget;
    uint64_t per_rank = 0, batches_per_epoch = 0;
    uint64_t min_epoch_batches = 1;  // a lower bound of every epoch's count (token budgets)
    std::string fingerprint, order_fingerprint;
    uint32_t order_tag = 0;
  };
  struct Memo;  // shared by copies of one plan, behind a lock
  struct EpochInverse;
  StreamPlan() = default;
  static void Fingerprint(Inputs* in);
  Result<std::shared_ptr<const Mixture>> NumberingOf(uint64_t base, uint32_t lanes,
                                                     uint32_t nodes) const;
  uint32_t LanesOf(uint64_t base, uint32_t lanes) const;
  uint32_t NodesOf(const Mixture* numbering, uint32_t nodes) const;
  uint64_t BaseOf(uint32_t epoch) const { return epoch == origin_.epoch ? origin_.base : 0; }
  uint64_t PositionsOf(const Mixture* numbering, uint32_t lanes) const;
  uint64_t PerRankFrom(uint64_t base, const Mixture* numbering, uint32_t lanes) const;
  uint64_t BatchesOf(uint64_t per_rank) const;
  EpochPlan PlanAt(uint32_t epoch, bool with_ranks) const;
  EpochPlan PlanFrom(uint32_t epoch, bool with_ranks, uint64_t base, const Mixture* numbering,
                     uint32_t lanes) const;
  uint64_t EpochBatchesLocked(uint32_t epoch) const;
  bool Locate(uint64_t seq, uint32_t* epoch, uint64_t* first) const;
  Status Reachable(uint64_t seq) const;
  std::shared_ptr<const EpochInverse> InverseOf(uint32_t epoch) const;

  std::shared_ptr<const Inputs> in_;
  StreamOrigin origin_;
  std::shared_ptr<const Mixture> numbering_;  // a mixture's origin base's (NumberingOf)
  std::shared_ptr<Memo> memo_;
};

}  // namespace mmfeed
