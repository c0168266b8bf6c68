// Pipeline: runs a validated PipelineConfig as actors.
//
//   source thread ──► one mailbox per processing stage ──► N worker threads each ──┐
//        (deals samples to ranks in a fixed order, reserving each rank's batch memory │
//         from its BatchSink; every sample gets its row)      workers write the row ◄┘
//   batch thread ◄── join mailbox ◄── (sample done or failed)
//        joins the branches of a sample by sequence number, restores each rank's order,
//        fills the rows of failed samples from the next samples, and commits batches.
//
// The thread model is described in docs/threads.md. All methods may be called from any one
// controlling thread (the daemon's supervisor); the pipeline's own threads only touch their
// stage's state, the mailboxes and relaxed counters.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "stages/runtime/config.h"
#include "stages/runtime/profile.h"
#include "stages/runtime/status.h"
#include "stages/runtime/tensor.h"

namespace mmfeed {

struct Catalog;
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
};

// Where a consumer rank's batches go (the daemon's: its shared-memory ring).
class BatchSink {
 public:
  virtual ~BatchSink() = default;
  // Reserves memory for one batch of up to batch_size rows of every tensor. Called from the
  // source thread; blocks while the sink is full (back-pressure). Returns false once the
  // sink no longer accepts batches.
  virtual bool Reserve(BatchMemory* memory) = 0;
  // Publishes rows [0, info.rows) of a reserved batch. Called from the batch thread.
  virtual void Commit(const BatchMemory& memory, const BatchInfo& info) = 0;
  // Returns a reserved batch unpublished. Called from the batch thread.
  virtual void Discard(const BatchMemory& memory) = 0;
  // No batch will follow.
  virtual void Finish() = 0;
};

// Per-sample errors: counted by reason, the most recent kept with origin and stage.
class ErrorLog {
 public:
  void Add(const std::string& origin, const std::string& stage, const std::string& reason_code,
           const std::string& message);
  nlohmann::json ToJson() const;

 private:
  mutable std::mutex mu_;
  uint64_t total_ = 0;
  std::map<std::string, uint64_t> by_reason_;
  std::vector<nlohmann::json> recent_;  // bounded
};

class Pipeline {
 public:
  // Loads the source catalog and builds the stages. `sinks` has one entry per consumer rank
  // and must outlive the pipeline. A load error under on_error: fail, or an empty dataset,
  // is returned here.
  static Result<std::unique_ptr<Pipeline>> Create(const PipelineConfig& cfg,
                                                  std::vector<BatchSink*> sinks);
  ~Pipeline();

  Status Start();
  // The source stops dealing; samples already dealt are processed and batched (a rank's
  // partial batch is delivered), then the sinks are finished.
  void RequestStop();
  // True once every thread has finished and every sink was told so.
  bool Finished() const { return finished_.load(std::memory_order_acquire); }
  void Wait();
  // The error that stopped the pipeline under on_error: fail; ok otherwise.
  Status status() const;

  // Adds a stage that lives outside the pipeline (a ring sink) to the profile.
  // REQUIRES: before Start().
  void AddProfiledStage(const StageInfo& info) { extra_infos_.push_back(info); }
  nlohmann::json Profile() const;
  const ErrorLog& errors() const { return errors_; }

  struct WorkItem;  // internal: one sample's field travelling through a branch

 private:
  struct Branch;
  struct Provisional;
  class Collator;
  Pipeline() = default;
  void SourceLoop();
  void WorkerLoop(Branch* b, int worker);
  void BatchLoop();
  void Fail(const Status& st);
  void SampleFailed(const CatalogEntry& e, const std::string& stage, const Status& st);

  PipelineConfig cfg_;
  std::vector<BatchSink*> sinks_;
  std::vector<TensorSpec> specs_;      // every tensor of a batch, in order
  std::vector<size_t> first_tensor_;   // per branch: index of its first tensor in specs_
  std::shared_ptr<const Catalog> catalog_;
  std::vector<std::unique_ptr<Branch>> branches_;
  std::unique_ptr<class JoinBox> join_;
  StageCounters source_counters_, batch_counters_;
  std::vector<StageInfo> extra_infos_;
  ErrorLog errors_;
  std::vector<std::thread> threads_;
  std::atomic<bool> stop_{false};
  std::atomic<int> live_workers_{0};
  std::atomic<bool> finished_{false};
  uint64_t start_ns_ = 0;
  std::atomic<uint64_t> end_ns_{0};
  mutable std::mutex status_mu_;
  Status status_;
};

}  // namespace mmfeed
