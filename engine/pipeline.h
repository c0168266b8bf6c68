// Pipeline: runs a validated PipelineConfig as actors.
//
//   source thread ──► one mailbox per processing stage ──► N worker threads each ──┐
//        (deals each rank's batches from the rank's own stream, reserving each batch's   │
//         memory from the rank's BatchSink; every sample gets its row) workers write ◄──┘
//   batch thread ◄── join mailbox ◄── (sample done or failed)
//        joins the branches of a sample, refills the rows of failed samples with draws from
//        the rank's own share (sent back to the source), and commits complete batches in order.
//
// A rank's stream is a pure function of (data, seed, epoch, node rank/count, consumers, rank):
// every epoch has the same number of batches for every rank, whatever fails, and batch
// (epoch, index) can be regenerated on its own. See docs/design/threads.md, "Batches and failures".
//
// All methods may be called from any one controlling thread (the daemon's supervisor); the
// pipeline's own threads only touch their stage's state, the mailboxes and relaxed counters.
#pragma once

#include <array>
#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "base/cursor.h"
#include "base/status.h"
#include "base/tensor.h"
#include "engine/batch_plan.h"
#include "engine/budget.h"
#include "engine/config.h"
#include "engine/profile.h"
#include "engine/stream_plan.h"
#include "source/path_check.h"

namespace mmfeed {

struct Catalog;
class EpochOrder;
class Mixture;
struct CatalogEntry;

// Memory for one batch, reserved from a sink before the batch's samples are dealt, so that
// workers write every sample straight into its place: tensor k's row i is at
// base[k] + i * (per-sample bytes of tensor k).
struct BatchMemory {
  int handle = -1;  // the sink's own (the ring slot)
  std::vector<uint8_t*> base;
};

// What a sink publishes with a batch.
struct BatchInfo {
  uint32_t rank = 0;
  uint64_t seq = 0;  // batch number for this rank, from 0, across epochs
  uint32_t epoch = 0;
  uint32_t rows = 0;             // rows [0, rows) are valid
  std::vector<std::string> ids;  // the samples in them: one per row, except for packed text
  StreamCursor next;             // the rank's cursor after this batch
  // Per tensor, when the batch has ragged ones (TensorSpec::rows_from): the rows a ragged
  // tensor holds, packed at the start of its memory (a starts tensor: rows + 1); the others'
  // entries are `rows`.
  std::vector<int64_t> ragged_rows;
};

// Tensor `k` (of spec `s`) of a committed batch: [info.rows, s.shape...], or for a ragged
// tensor [its rows in the batch, s.shape[1:]...].
TensorSpec CommittedTensor(const TensorSpec& s, const BatchInfo& info, size_t k);

enum class Reservation { kReserved, kFull, kClosed };

// Where a consumer rank's batches go (the daemon's: its shared-memory ring).
class BatchSink {
 public:
  virtual ~BatchSink() = default;
  // Reserves memory for one batch of up to batch_size rows of every tensor. Called from the
  // source thread; waits up to `timeout_ms` while the sink is full (back-pressure), then
  // returns kFull. kClosed once the sink no longer accepts batches.
  virtual Reservation Reserve(BatchMemory* memory, int timeout_ms) = 0;
  // Publishes rows [0, info.rows) of a reserved batch. Called from the batch thread.
  virtual void Commit(const BatchMemory& memory, const BatchInfo& info) = 0;
  // Returns a reserved batch unpublished. Called from the batch thread.
  virtual void Discard(const BatchMemory& memory) = 0;
  // Drops every published batch no trainer holds (the rank was rewound). Called from the
  // controlling thread while no trainer is attached to the sink.
  virtual void DropPublished() {}
  // No batch will follow. `complete`: every rank's data was dealt to its end (false when the
  // pipeline was stopped or failed first).
  virtual void Finish(bool complete) = 0;
};

// Per-sample errors: counted by reason, the most recent kept with origin and stage. The log
// names the first kLoggedPerSource skips of each reason from each source file (a manifest, a
// shard), at most kLoggedInAll one by one in all; after that a (reason, file)'s further skips
// are one line every kSummaryEverySeconds with a count and the latest. Never thousands of
// lines, and a second kind of failure is still named after a first one flooded.
class ErrorLog {
 public:
  static constexpr uint64_t kLoggedPerSource = 20, kLoggedInAll = 100;
  static constexpr double kSummaryEverySeconds = 10;
  void Add(const std::string& origin, const std::string& stage, const std::string& reason_code,
           const std::string& message);
  nlohmann::json ToJson() const;
  // The most frequent reasons, most first, each with its count and latest example:
  // "200 invalid (latest: a.jpg (image): a.jpg: outside the data roots ...)".
  std::string Summary(size_t reasons = 3) const;

 private:
  struct Reason {
    uint64_t count = 0;
    std::string latest;
  };
  struct Source {                   // one reason from one file
    uint64_t logged = 0, held = 0;  // held: not logged since the last summary line
    uint64_t summary_ns = 0;        // when that line was written
  };
  mutable std::mutex mu_;
  uint64_t total_ = 0, logged_ = 0;
  std::map<std::string, Reason> reasons_;
  std::map<std::pair<std::string, std::string>, Source> sources_;  // (reason, file)
  std::vector<nlohmann::json> recent_;                             // bounded
};

class Pipeline {
 public:
  // Loads the source catalog and builds the stages. `sinks` has one entry per consumer rank
  // and must outlive the pipeline; none (empty): the pipeline is only built, to ask its plan and
  // check its files (--check, a restart's kept config), and cannot be started or rewound. `start`
  // (empty, or one per rank) is where each rank's stream begins. A load error under on_error: fail,
  // or an empty dataset, is returned here.
  static Result<std::unique_ptr<Pipeline>> Create(const PipelineConfig& cfg,
                                                  std::vector<BatchSink*> sinks,
                                                  std::vector<StreamCursor> start = {});
  ~Pipeline();

  // Where each rank's stream begins (one cursor per rank), instead of Create's `start`. Each
  // cursor is checked (CheckCursor, and its epoch and batch against its seq); the error names
  // the rank. REQUIRES: before Start().
  Status SetStart(std::vector<StreamCursor> start);
  // Where this pipeline's numbering starts, and the stream it continues (StreamOrigin), instead
  // of {0, 0}: the plan is rebuilt from it (StreamPlan::WithOrigin) and the start cursors reset
  // to the origin. Refused (nothing changed): a mixture's base in lanes it cannot be dealt to.
  // REQUIRES: before Start().
  using Origin = StreamOrigin;
  Status SetOrigin(Origin origin);
  // The stream's arithmetic (cursors, epochs, positions, fingerprints): engine/stream_plan.h.
  const StreamPlan& stream() const { return *stream_; }
  Status Start();
  // The source stops dealing at a batch boundary; batches already dealt are completed
  // (refilled where samples fail) and committed, then the sinks are finished.
  void RequestStop();
  // Like RequestStop, but the sinks are left open (not finished): batches already dealt are
  // completed and committed, and a new pipeline can go on feeding the same sinks from each
  // rank's NextCommit(). Rings outlive pipelines; a config reload builds on this.
  void Quiesce();
  // Like Quiesce, but each rank's batches are dealt up to the end of the epoch it is in (at
  // once if it stands at an epoch boundary): a new pipeline whose order differs (another seed)
  // takes over at an epoch boundary, and so never changes an epoch halfway.
  // `together`: every rank goes on to the same boundary, the first one at or after where the
  // furthest rank is (the successor's batch numbering differs, and all ranks switch to it at
  // one epoch).
  void QuiesceAtEpochEnd(bool together = false);
  // Like Quiesce, but every rank's batches are dealt up to one batch boundary, the furthest
  // rank's next batch (moved on by a rank resumed past it): a weights-only reload
  // (SwitchWeightsAt) takes over there.
  void QuiesceAtBatch();
  // A weights-only reload of a mixture (ConfigChanges::weights_only) can take over from
  // `running` at a batch boundary ("") or not, and why: not a weighted mixture on one node, a
  // source read in shard windows, token budgets, a packed text stream, or the sources' data
  // changed.
  WhyNot WhyNotSwitchWeights(const Pipeline& running) const;
  // Takes over from `running` at its batch `seq` (every rank's next): `running`'s mixture
  // before it, this one's weights after, each source's draws going on from where it stood
  // (Mixture::Switched); MixSwitches() then names every switch so far.
  // REQUIRES: WhyNotSwitchWeights(running) says nothing, before Start().
  Status SwitchWeightsAt(const Pipeline& running, uint64_t seq);
  // The weight switches its mixture makes (MixConfig::switches).
  std::vector<MixSwitch> MixSwitches() const {
    return catalog_->mixture ? catalog_->mixture->switches() : std::vector<MixSwitch>();
  }
  // True once every thread has finished and every sink was told so.
  bool Finished() const { return finished_.load(std::memory_order_acquire); }
  void Wait();
  // The error that stopped the pipeline under on_error: fail; ok otherwise.
  Status status() const;
  // Whether it stopped because a rank's data had (almost) no usable sample left: a problem
  // of the data, like a bad config (the daemon exits 2), not of the run.
  bool stopped_on_unusable_data() const { return unusable_data_.load(std::memory_order_relaxed); }

  // Adds a stage that lives outside the pipeline (a ring sink) to the profile.
  // REQUIRES: before Start().
  void AddProfiledStage(const StageInfo& info) { extra_infos_.push_back(info); }
  // Remote shards: the store's figures (RemoteStore::Stats); null for local data.
  nlohmann::json StorageStats() const;
  // The files `max_samples` samples (spread over the catalog; every one when it has fewer)
  // name: missing, unreadable, or outside the data roots (source/path_check.h). For --check.
  PathCheck CheckSamplePaths(size_t max_samples) const;
  // A mixture's plan (Mixture::Describe: each source's size, share, draws and passes per
  // epoch), or "" for one source.
  std::string MixPlan() const;
  nlohmann::json Profile() const;
  // workers: auto: how many of the stage's threads take items from now on (1 to the threads it
  // started, SampleStages()' `threads`); the others finish their item and park. The bytes of
  // every batch are the same whatever the counts.
  Status SetWorkers(const std::string& stage, int workers);
  // The worker threads field stages may have together (0 unless a stage has workers: auto).
  int cpu_budget() const { return cpu_budget_; }
  // Every stage's counters now (the windowed profile compares two of these).
  std::vector<StageSample> SampleStages() const;
  // The pipeline's live threads: thread id -> the stage they work for (the source's and the
  // batch stage's names for those two threads).
  std::map<int, std::string> Threads() const;
  // Grows whenever any stage finishes an item (a watchdog's sign of life).
  uint64_t Progress() const;
  // Where each stage's threads run: [{"stage", "threads", "cpus": "0-3", "numa_node"}].
  nlohmann::json PlacementJson() const;
  const ErrorLog& errors() const { return errors_; }
  // Serves rank `rank` from `from` on (a cursor its trainer finished at): the rank's batches
  // not yet in its sink are abandoned, the sink's unheld ones dropped (DropPublished), and
  // the rank's stream restarts there. Other ranks are untouched. Refused for packed text and
  // once the pipeline has finished.
  Status Rewind(uint32_t rank, uint64_t from_seq);
  // The seq of the next batch the rank's sink will be given.
  uint64_t NextCommit(uint32_t rank) const {
    return next_commit_[rank].load(std::memory_order_acquire);
  }
  struct WorkItem;  // internal: one sample's field travelling through a branch

 private:
  struct Branch;
  struct Readers;
  struct Provisional;
  struct Refill;
  class Collator;
  class RefillQueue;
  Pipeline();
  // Create's steps, in its order (engine/pipeline_build.cc).
  Status BuildBranches(std::set<std::string>* needed, std::set<std::string>* path_fields);
  Status LinkReaders();
  Status ApplyPolicies();
  Status LoadSource(const std::set<std::string>& needed, const std::set<std::string>& path_fields);
  void WantShards(const std::vector<StreamCursor>& next, const std::vector<bool>& done,
                  std::vector<uint32_t>* last);
  void WantMixShards(const std::vector<StreamCursor>& next, const std::vector<bool>& done,
                     std::vector<uint32_t>* last);
  // A rank's wanted shards, most urgent first: (shard, the epoch of the read it is wanted for).
  using RankWants = std::vector<std::pair<uint32_t, uint32_t>>;
  // Tells the store of the source (`part` 0), or of a mixture's source `part`, the future from
  // `oldest_epoch` (UINT32_MAX: no rank reads on) and the ranks' wanted shards, round-robin.
  void AskStore(size_t part, uint32_t oldest_epoch, const std::vector<RankWants>& per_rank);
  // The remote store and shard index of the source (`part` 0) or of a mixture's source `part`.
  RemoteStore* StoreOf(size_t part) const;
  const ShardIndex& IndexOf(size_t part) const;
  // When this node reads each remote shard of the source (`part` 0), or of a mixture's source
  // `part`, from epoch `epoch` on over kFutureEpochs epochs (WantShards and WantMixShards tell
  // the store, for its eviction).
  class WindowFuture;
  std::shared_ptr<const WindowFuture> FutureFrom(uint32_t epoch, size_t part);
  void SourceLoop();
  void Deal(const std::shared_ptr<Provisional>& batch, int rank, const StreamCursor& at,
            uint64_t gen, const EpochPlan* plan);
  void CloseBranches();
  void Dispatch(const std::shared_ptr<const Provisional>& batch, int row, uint32_t entry,
                bool refill);
  void WorkerLoop(Branch* b, int worker);
  // A cached stage (`cache:`): copies the sample's kept outputs into its row (false: a miss);
  // offers the outputs the stage just made (a ragged output's rows only).
  static bool FromCache(Branch* b, WorkItem* item);
  static void ToCache(Branch* b, const WorkItem& item);
  void BatchLoop();
  void Fail(const Status& st);
  void SampleFailed(const CatalogEntry& e, const std::string& stage, const Status& st);
  void ReleaseReaders(Readers* readers, std::atomic<uint64_t>* blocked_ns);
  std::vector<int64_t> PackRagged(const BatchMemory& memory, uint32_t rows) const;
  std::vector<StageInfo> StageInfos() const;
  // Token budgets: every catalog entry's cost (engine/measure.cc), those over a budget on their
  // own unusable; their failures are counted as samples' errors.
  Result<std::vector<SampleCost>> MeasureCatalog();
  Status MeasureEntries(const std::vector<bool>& measured, MeasuredCatalog* m);
  // A sample's cost from its outputs: `row(t)` gives tensor t's bytes for the sample.
  SampleCost CostOf(const std::function<const uint8_t*(size_t)>& row) const;
  // Makes the stages' caches (`cache:`), once their reads are linked.
  Status MakeCaches();
  class ThreadTag;

  PipelineConfig cfg_;
  std::vector<BatchSink*> sinks_;
  BatchPlan plan_;       // the batch's tensors (branch b's are from plan_.first_tensor[b] on)
  int read_stages_ = 0;  // stages whose outputs other stages read
  std::vector<int> control_cpus_;  // where the source and batch threads run (top-level placement)
  // The catalog (shared with the plan), and the stream's arithmetic made from it once loaded
  // (and, with a token budget, its costs measured).
  std::shared_ptr<const Catalog> catalog_;
  std::optional<StreamPlan> stream_;
  std::vector<size_t> token_tensors_, patch_tensors_;  // what a budget counts (Stage::Costs)
  std::vector<StreamCursor> start_;
  std::unique_ptr<RefillQueue> refills_;
  // FutureFrom's tables per part (source thread only): per epoch, each shard's position in this
  // node's reading order (UINT32_MAX: not read); shard ids by URL.
  struct EpochReads {
    std::vector<uint32_t> at;  // per shard: its first read's position (UINT32_MAX: none)
    uint64_t count = 0;        // reads in the epoch
  };
  struct ReadTables {
    std::map<uint32_t, std::shared_ptr<const EpochReads>> reads;
    std::shared_ptr<const std::unordered_map<std::string, uint32_t>> ids;
  };
  std::map<size_t, ReadTables> read_tables_;
  std::atomic<int64_t> open_batches_{0};  // dealt and not yet committed or discarded
  // Rewinds, guarded by rewind_mu_: per rank the stream generation, where it restarts, and
  // whether the source and the collator have taken it up yet.
  struct RankRewind {
    uint64_t gen = 0;
    StreamCursor to;
    bool source_pending = false, collator_pending = false;
  };
  std::mutex rewind_mu_;
  std::vector<RankRewind> rewinds_;
  bool source_exited_ = false;
  std::atomic<bool> rewind_pending_{false};
  std::unique_ptr<std::atomic<uint64_t>[]> next_commit_;
  uint64_t next_key_ = 0;  // source thread: one per dispatched sample
  // Sample accounting: dealt = first-time positions; refill draws are counted apart.
  std::atomic<uint64_t> dealt_{0}, failed_{0}, refills_ok_{0}, refills_failed_{0};
  // A mixture: per source, samples committed in batches and samples that failed (refill draws
  // included; also by Status code), counted by the collators.
  struct SourceCounts {
    std::atomic<uint64_t> samples{0}, errors{0};
    std::array<std::atomic<uint64_t>, Status::kCodes> by_code{};
  };
  std::unique_ptr<SourceCounts[]> source_counts_;
  SourceCounts& CountsOf(uint32_t entry) const;
  std::vector<std::unique_ptr<Branch>> branches_;
  std::unique_ptr<class JoinBox> join_;
  StageCounters source_counters_, batch_counters_;
  std::vector<StageInfo> extra_infos_;
  int cpu_budget_ = 0;
  mutable std::mutex threads_mu_;
  std::map<int, std::string> thread_stages_;  // guarded by threads_mu_
  ErrorLog errors_;
  std::vector<std::thread> threads_;
  std::atomic<bool> stop_{false};
  std::atomic<int> live_workers_{0};
  std::atomic<bool> finished_{false};
  std::atomic<bool> finish_sinks_{true};  // false after Quiesce
  std::atomic<bool> stop_at_epoch_end_{false};
  std::atomic<bool> epoch_end_together_{false};
  std::atomic<bool> stop_at_batch_{false};
  std::atomic<bool> complete_{false};  // every rank dealt to the end of its data
  std::atomic<bool> unusable_data_{false};
  uint64_t start_ns_ = 0;
  std::atomic<uint64_t> end_ns_{0};
  mutable std::mutex status_mu_;
  Status status_;
};

}  // namespace mmfeed
