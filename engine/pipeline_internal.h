// The pipeline's internals, shared by its files (and by nothing else): the work items that
// carry a sample through the stages, the batches being filled, the source's refill queue, the
// stages' branches. engine/pipeline.h is the interface; the code is split by role:
//   pipeline_build.cc  Create (the graph from a config, then its StreamPlan), the start
//                      cursors, the origin and Rewind (the arithmetic: engine/stream_plan.h)
//   pipeline.cc        the threads: start/stop, the source thread, the workers, introspection
//   collator.cc        the batch thread: joining, refills, collation, ragged packing
//   measure.cc         token budgets: every sample's cost, measured or read from its index
#pragma once

#include <fmt/format.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/mailbox.h"
#include "engine/pipeline.h"
#include "engine/sample_cache.h"
#include "source/catalog.h"

namespace mmfeed {

// One batch being filled: its memory in the rank's sink and its place in the rank's stream.
// Immutable once made; shared by the work items that write into it and the collator.
struct Pipeline::Provisional {
  BatchMemory memory;
  uint64_t gen = 0;  // the rank's stream generation (bumped by Rewind)
  uint32_t rank = 0;
  uint32_t epoch = 0;
  uint64_t index = 0;  // within the epoch
  uint64_t seq = 0;    // in the rank's stream
  int rows = 0;
  int64_t tokens = 0, patches = 0;  // token budget: the planned samples' costs
};

// Calls a stage. Its library may throw (OpenCV does): the sample fails, the worker goes on.
inline Status Guarded(const std::string& type, const std::function<Status()>& call) {
  try {
    return call();
  } catch (const std::exception& e) {
    return Status::Corrupt(fmt::format("{} threw: {}", type, e.what()));
  } catch (...) {
    return Status::Corrupt(fmt::format("{} threw an unknown exception", type));
  }
}

// The sample's field `name`, or nullptr.
inline const FieldValue* FieldOf(const CatalogEntry& e, const std::string& name) {
  for (const auto& kv : e.fields)
    if (kv.first == name) return &kv.second;
  return nullptr;
}

// What a stage reads for a field a mixture's sample lacks (SourceConfig::fields_optional) when
// the stage has no `<stage>_present` mask: no value, as a manifest's "images": [] says.
inline const FieldValue kAbsentField{FieldValue::Kind::kList};

// The sample's field `name`; for a mixture's sample without it kAbsentField; else nullptr (a
// missing field, the sample's error).
inline const FieldValue* FieldOrAbsent(const Catalog& catalog, const CatalogEntry& e,
                                       const std::string& name) {
  const FieldValue* f = FieldOf(e, name);
  return !f && catalog.mixture ? &kAbsentField : f;
}

constexpr int kMaxOutputs = 16;  // tensors per stage (the ring holds 16 per batch anyway)

// One sample's field on its way through one branch, and back to the join.
struct Pipeline::WorkItem {
  uint64_t key = 0;    // one per dispatched sample: joins its branches
  uint32_t entry = 0;  // catalog index
  // The sample's entry, shared by its branches (parsed once when the catalog is indexed).
  std::shared_ptr<const CatalogEntry> sample;
  bool source_failed = false;  // its manifest line could not be read or parsed: no stage runs
  int branch = -1;      // its branch (one skipped because a stage it reads failed: that stage's)
  bool refill = false;  // drawn to fill the row of a failed sample
  std::shared_ptr<const Provisional> batch;
  int row = 0;
  std::array<uint8_t*, kMaxOutputs> out{};
  Status status;
  // Set when some stage reads another's outputs (Stage::ExtraInputs): the sample's items of
  // the reading stages wait in it until the stages they read have finished the sample.
  std::shared_ptr<Readers> readers;
};

struct Pipeline::Readers {
  std::atomic<int> producers{0};  // read stages still working on the sample
  std::mutex mu;
  Status failed;  // the first failure of a read stage (guarded by mu)
  int failed_branch = -1;
  std::vector<std::unique_ptr<WorkItem>> items;
};

// A row to refill, asked of the source by the batch thread.
struct Pipeline::Refill {
  std::shared_ptr<const Provisional> batch;
  int row = 0;
  uint32_t entry = 0;
};

// The batch thread's requests to the source thread. Never blocks the batch thread: it holds at
// most one entry per row of the open batches.
class Pipeline::RefillQueue {
 public:
  void Push(std::vector<Refill> r) {
    std::lock_guard<std::mutex> lock(mu_);
    for (Refill& x : r) q_.push_back(std::move(x));
    cv_.notify_one();
  }
  std::vector<Refill> Take() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<Refill> out(std::make_move_iterator(q_.begin()), std::make_move_iterator(q_.end()));
    q_.clear();
    return out;
  }
  void Wait(int timeout_ms) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return !q_.empty(); });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Refill> q_;
};

class JoinBox : public BulkMailbox<std::unique_ptr<Pipeline::WorkItem>> {
 public:
  using BulkMailbox::BulkMailbox;
};

struct Pipeline::Branch {
  explicit Branch(size_t capacity) : inbox(capacity) {}
  const StageConfig* cfg = nullptr;
  std::vector<TensorSpec> specs;
  Mailbox<std::unique_ptr<WorkItem>> inbox;
  StageCounters counters;
  std::vector<int> cpus;
  int threads = 1;                   // started; `active` of them take items, the rest park
  std::atomic<int> active{1};        // workers: auto moves it (SetWorkers)
  std::atomic<bool> closing{false};  // no more input: parked threads help drain, then exit
  std::mutex park_mu;
  std::condition_variable park_cv;
  FilePolicy files;  // what its samples may open
  // Stage::ExtraInputs: the sample's fields and the batch's tensors (indices into plan_.specs) its
  // workers read; the branches it reads from (it runs after them) and those that read it.
  std::vector<std::string> read_fields;
  std::vector<size_t> read_tensors;
  std::vector<size_t> read_branches;  // the branch making each of read_tensors
  bool reads_others = false;
  bool read_by_others = false;
  // `cache:`: the stage's outputs kept per sample; per output, the index of the output of this
  // stage that counts its ragged rows (only those rows are kept), or -1 (kept whole).
  std::unique_ptr<SampleCache> cache;
  bool own_cache = false;  // the stage keeps its own work there (Stage::OwnCache), not outputs
  std::vector<int> cache_rows_from;
  // faults.leak_bytes_per_item: memory kept per item until the pipeline ends.
  int64_t leak_bytes_per_item = 0;
  std::mutex leak_mu;
  std::vector<std::unique_ptr<char[]>> leaked;
};

// Registers the calling thread as working for `stage` while it lives (Threads()).
class Pipeline::ThreadTag {
 public:
  ThreadTag(Pipeline* p, const std::string& stage) : p_(p), tid_(gettid()) {
    std::lock_guard<std::mutex> lock(p_->threads_mu_);
    p_->thread_stages_[tid_] = stage;
  }
  ~ThreadTag() {
    std::lock_guard<std::mutex> lock(p_->threads_mu_);
    p_->thread_stages_.erase(tid_);
  }
  ThreadTag(const ThreadTag&) = delete;
  ThreadTag& operator=(const ThreadTag&) = delete;

 private:
  Pipeline* p_;
  int tid_;
};

}  // namespace mmfeed
