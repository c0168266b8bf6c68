#include "engine/pipeline.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <set>
#include <thread>
#include <unordered_map>

#include "base/rng.h"
#include "engine/mailbox.h"
#include "engine/numa.h"
#include "engine/trace.h"
#include "source/catalog.h"

namespace mmfeed {

// ---------------------------------------------------------------- errors

void ErrorLog::Add(const std::string& origin, const std::string& stage,
                   const std::string& reason_code, const std::string& message) {
  spdlog::warn("skipped {} ({}): {}", origin, stage, message);
  std::lock_guard<std::mutex> lock(mu_);
  ++total_;
  ++by_reason_[reason_code];
  if (recent_.size() >= 100) recent_.erase(recent_.begin());
  recent_.push_back(
      {{"origin", origin}, {"stage", stage}, {"reason", reason_code}, {"message", message}});
}

nlohmann::json ErrorLog::ToJson() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {{"total", total_}, {"by_reason", by_reason_}, {"recent", recent_}};
}

// ---------------------------------------------------------------- internals

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

// A grid: int32 [n, 3], a [t, h, w] per row (Qwen's image_grid_thw, video_grid_thw).
static bool IsGrid(const TensorSpec& s) {
  return s.dtype == DType::kInt32 && s.shape.size() == 2 && s.shape[1] == 3;
}

// Calls a stage. Its library may throw (OpenCV does): the sample fails, the worker goes on.
static Status Guarded(const std::string& type, const std::function<Status()>& call) {
  try {
    return call();
  } catch (const std::exception& e) {
    return Status::Corrupt(fmt::format("{} threw: {}", type, e.what()));
  } catch (...) {
    return Status::Corrupt(fmt::format("{} threw an unknown exception", type));
  }
}

// The sample's field `name`, or nullptr.
static const FieldValue* FieldOf(const CatalogEntry& e, const std::string& name) {
  for (const auto& kv : e.fields)
    if (kv.first == name) return &kv.second;
  return nullptr;
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
  // Stage::ExtraInputs: the sample's fields and the batch's tensors (indices into specs_) its
  // workers read; the branches it reads from (it runs after them) and those that read it.
  std::vector<std::string> read_fields;
  std::vector<size_t> read_tensors;
  std::vector<size_t> read_branches;  // the branch making each of read_tensors
  bool reads_others = false;
  bool read_by_others = false;
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

Pipeline::Pipeline() : refills_(std::make_unique<RefillQueue>()) {}

Result<std::unique_ptr<Pipeline>> Pipeline::Create(const PipelineConfig& cfg,
                                                   std::vector<BatchSink*> sinks,
                                                   std::vector<StreamCursor> start) {
  std::unique_ptr<Pipeline> p(new Pipeline());
  p->cfg_ = cfg;
  p->sinks_ = std::move(sinks);
  if (static_cast<int>(p->sinks_.size()) != cfg.consumers)
    return Status::Invalid("one batch sink per consumer rank is required");
  // Branches point into the pipeline's own copy of the config.
  const std::vector<StageConfig>& stages = p->cfg_.stages;
  // workers: auto: such stages share what the fixed ones leave of the budget, evenly at first;
  // each starts enough threads to take all of it but one per other such stage.
  int fixed = 0, autos = 0;
  for (const StageConfig& s : stages) {
    if (s.field.empty()) continue;  // the batch stage: not a worker
    if (s.workers_auto)
      ++autos;
    else
      fixed += s.workers;
  }
  if (autos) {
    p->cpu_budget_ = cfg.cpu_budget;
    if (!p->cpu_budget_) {
      Result<std::vector<int>> cpus = CpusFor(cfg.placement);
      if (!cpus.ok()) return cpus.status().WithContext("placement");
      p->cpu_budget_ = static_cast<int>(cpus->size());
    }
    if (p->cpu_budget_ < fixed + autos)
      return Status::Invalid(fmt::format(
          "cpu_budget {}{} is less than the {} fixed worker(s) plus one for each of the {} "
          "stage(s) with workers: auto",
          p->cpu_budget_, cfg.cpu_budget ? "" : " (the placement's CPUs)", fixed, autos));
  }
  const int shared = p->cpu_budget_ - fixed;
  int auto_index = 0;
  std::set<std::string> needed, path_fields;
  for (const std::string& in : stages[cfg.batch_stage].inputs) {
    auto it = std::find_if(stages.begin(), stages.end(),
                           [&](const StageConfig& s) { return s.name == in; });
    int threads = it->workers, active = it->workers;
    if (it->workers_auto) {
      threads = shared - (autos - 1);
      active = shared / autos + (auto_index++ < shared % autos ? 1 : 0);
    }
    auto b = std::make_unique<Branch>(it->queue ? it->queue : std::max(8, 4 * threads));
    b->cfg = &*it;
    b->threads = threads;
    b->active.store(active);
    b->specs = it->stage->OutputSpecs();
    Result<std::vector<int>> cpus = CpusFor(it->placement);
    if (!cpus.ok()) return cpus.status().WithContext(fmt::format("stage '{}'", it->name));
    b->cpus = *cpus;
    needed.insert(it->field);
    if (it->schema->field_is_path) path_fields.insert(it->field);
    b->read_fields = it->stage->ExtraInputs().fields;
    needed.insert(b->read_fields.begin(), b->read_fields.end());
    if (b->specs.size() > static_cast<size_t>(kMaxOutputs))
      return Status::Invalid(fmt::format("stage '{}' declares {} outputs, at most {}", it->name,
                                         b->specs.size(), kMaxOutputs));
    p->first_tensor_.push_back(
        p->first_tensor_.empty() ? 0 : p->first_tensor_.back() + p->branches_.back()->specs.size());
    p->branches_.push_back(std::move(b));
  }
  p->specs_ = BatchSpecs(p->cfg_);
  // The batch tensor named `name`: its index, or -1.
  auto tensor = [&](const std::string& name) {
    for (size_t k = 0; k < p->specs_.size(); ++k)
      if (p->specs_[k].name == name) return static_cast<int>(k);
    return -1;
  };
  for (const TensorSpec& t : p->specs_) {  // ragged tensors: where their row counts are
    int from = t.rows_from.empty() ? -1 : tensor(t.rows_from);
    if (from >= 0 && p->specs_[from].dtype != DType::kInt32) from = -1;
    if (!t.rows_from.empty() && (from < 0 || t.shape.empty()))
      return Status::Invalid(
          fmt::format("output '{}' takes its rows from '{}', which is not "
                      "an int32 output of the pipeline",
                      t.name, t.rows_from));
    p->rows_from_.push_back(from);
  }
  for (const TensorSpec& t : p->specs_) {  // starts tensors: of which ragged tensor
    int of = t.starts_of.empty() ? -1 : tensor(t.starts_of);
    if (of >= 0 && p->rows_from_[of] < 0) of = -1;
    // Of a grid: [the most grid rows * the most t + 1]; else two values per sample.
    const bool fits = of >= 0 && (IsGrid(p->specs_[of]) ? t.shape.size() == 1 && t.shape[0] >= 2
                                                        : t.shape == std::vector<int64_t>{2});
    if (!t.starts_of.empty() && (!fits || t.dtype != DType::kInt32))
      return Status::Invalid(fmt::format(
          "output '{}' holds the row starts of '{}', which is not a ragged output of the "
          "pipeline (or it is not int32 [2], or of a grid int32 [n])",
          t.name, t.starts_of));
    p->starts_of_.push_back(of);
  }
  // Stages that read other stages' outputs run after them; one level (a stage that reads others
  // is read by none), so that a sample's branches still finish in two steps.
  for (size_t b = 0; b < p->branches_.size(); ++b) {
    Branch& br = *p->branches_[b];
    for (const std::string& name : br.cfg->stage->ExtraInputs().tensors) {
      const int t = tensor(name);
      if (t < 0)
        return Status::Invalid(
            fmt::format("stage '{}' reads '{}', which no input of the batch stage outputs",
                        br.cfg->name, name));
      size_t from = 0;
      while (from + 1 < p->branches_.size() && p->first_tensor_[from + 1] <= static_cast<size_t>(t))
        ++from;
      if (from == b)
        return Status::Invalid(
            fmt::format("stage '{}' reads its own output '{}'", br.cfg->name, name));
      br.read_tensors.push_back(t);
      br.read_branches.push_back(from);
      br.reads_others = true;
      p->branches_[from]->read_by_others = true;
    }
  }
  for (const auto& b : p->branches_) {
    if (b->reads_others && b->read_by_others)
      return Status::Invalid(fmt::format(
          "stage '{}' reads another stage's outputs and is read by another: one level only",
          b->cfg->name));
    p->read_stages_ += b->read_by_others ? 1 : 0;
  }
  // Sample files: the source's folder and data_roots, by real path.
  FilePolicy files;
  files.max_bytes = cfg.source.max_bytes;
  if (!cfg.data_roots_any) {
    std::vector<std::string> roots = cfg.data_roots;
    if (!cfg.source.remote)
      roots.push_back(std::filesystem::path(cfg.source.path).parent_path().string());
    for (const std::string& r : roots) {
      std::error_code ec;
      std::string real = std::filesystem::canonical(r.empty() ? "." : r, ec).string();
      if (ec) return Status::Invalid(fmt::format("data root {}: {}", r, ec.message()));
      files.roots.push_back(real == "/" ? real : real + "/");
    }
  }
  for (auto& b : p->branches_) {
    b->files = files;
    if (b->cfg->name == cfg.faults.stage) {  // injected faults, for tests of the profile
      b->files.read_delay_ms = cfg.faults.read_delay_ms;
      b->leak_bytes_per_item = cfg.faults.leak_bytes_per_item;
    }
  }
  // Worker threads against the CPUs they may use, per set of CPUs: oversubscription only
  // adds context switches; warn, or refuse under `placement: {strict: true}`.
  std::map<std::vector<int>, std::pair<int, bool>> budget;  // cpus -> (workers, strict)
  for (const auto& b : p->branches_) {
    auto& [workers, strict] = budget[b->cpus];
    workers += b->active.load();
    strict |= b->cfg->placement.strict || cfg.placement.strict;
  }
  for (const auto& [cpus, use] : budget) {
    if (use.first <= static_cast<int>(cpus.size())) continue;
    std::string msg = fmt::format("{} worker threads on {} usable CPU(s) ({})", use.first,
                                  cpus.size(), CpuList(cpus));
    if (use.second) return Status::Invalid(fmt::format("placement: strict: {}", msg));
    spdlog::warn("{}: more workers than CPUs only adds context switches", msg);
  }
  Result<std::vector<int>> control_cpus = CpusFor(cfg.placement);  // the source and batch threads
  if (!control_cpus.ok()) return control_cpus.status().WithContext("placement");
  p->control_cpus_ = *control_cpus;
  Result<Catalog> cat = LoadCatalog(cfg.source, needed, path_fields);
  if (!cat.ok()) return cat.status();
  for (const LoadError& e : cat->errors) {
    if (cfg.on_error == ErrorPolicy::kFail)
      return Status::Corrupt(fmt::format("{}: {} (on_error: fail)", e.origin, e.reason));
    p->errors_.Add(e.origin, "source", "corrupt", e.reason);
  }
  if (cat->size() == 0)
    return Status::Invalid(fmt::format("{}: no usable samples", cfg.source.path));
  if (cat->size() > UINT32_MAX) return Status::TooLarge("more than 4G samples in one source");
  if (cat->size() / cfg.source.num_nodes < static_cast<size_t>(cfg.consumers))
    return Status::Invalid(fmt::format("{} samples cannot be dealt to {} node(s) x {} consumer(s)",
                                       cat->size(), cfg.source.num_nodes, cfg.consumers));
  p->catalog_ = std::make_shared<Catalog>(std::move(cat.value()));
  for (auto& b : p->branches_) b->files.remote = p->catalog_->remote.get();
  p->per_rank_ = p->catalog_->size() / cfg.source.num_nodes / cfg.consumers;
  const uint64_t bs = static_cast<uint64_t>(cfg.batch_size);
  p->batches_per_epoch_ = cfg.drop_last ? p->per_rank_ / bs : (p->per_rank_ + bs - 1) / bs;
  if (cfg.budgeted()) {
    p->budget_ = {cfg.batch_size, cfg.max_tokens, cfg.max_patches};
    MMFEED_RETURN_IF_ERROR(p->MeasureCatalog());
    std::shared_ptr<const EpochPlan> first = p->PlanOf(0);
    if (!first->status.ok()) return first->status;
    p->batches_per_epoch_ = first->batches;
    // Every epoch has at least this many batches: its fullest share holds at least the
    // average of the usable samples dealt, at most batch_size a batch.
    const uint64_t usable = static_cast<uint64_t>(
        std::count_if(p->costs_.begin(), p->costs_.end(), [](auto& c) { return c.usable(); }));
    const uint64_t streams = static_cast<uint64_t>(cfg.consumers) * cfg.source.num_nodes,
                   left_out = p->catalog_->size() - streams * p->per_rank_;
    p->min_epoch_batches_ =
        std::max<uint64_t>(1, (usable > left_out ? usable - left_out : 0) / streams / bs);
  }
  if (p->batches_per_epoch_ == 0)
    return Status::Invalid(
        fmt::format("each rank gets {} samples per epoch, fewer than batch_size {} with drop_last",
                    p->per_rank_, bs));
  p->rewinds_.resize(cfg.consumers);
  p->next_commit_ = std::make_unique<std::atomic<uint64_t>[]>(cfg.consumers);
  if (start.empty()) start.assign(cfg.consumers, StreamCursor{});
  MMFEED_RETURN_IF_ERROR(p->SetStart(std::move(start)));
  // The fingerprint: the order's version ("order 2": the shuffle is a Feistel permutation; a
  // cursor saved by a daemon that shuffled with a table is for another stream), every catalog
  // id in order, then the settings (each stage's full config stands in for its sample-changing
  // parameters).
  uint64_t h = HashString(fmt::format(
      "order 2|{}|{}|{}|{}|{}|{}|{}|{}", cfg.source.seed, cfg.source.shuffle, cfg.source.node_rank,
      cfg.source.num_nodes, cfg.consumers, cfg.batch_size, cfg.drop_last, cfg.source.epochs));
  if (cfg.source.shuffle_window > 0)  // window mode: another order
    h = HashString(fmt::format("windows {}", cfg.source.shuffle_window), h);
  if (p->catalog_->indexed())  // an indexed source: its contents (size, mtime, inode, ends)
    h = HashString(fmt::format("index {:016x}", p->catalog_->index_fingerprint()), h);
  if (cfg.budgeted()) {  // the budgets and every sample's cost decide the batches
    h = HashString(fmt::format("budget {}|{}", cfg.max_tokens, cfg.max_patches), h);
    h = HashString(std::string_view(reinterpret_cast<const char*>(p->costs_.data()),
                                    p->costs_.size() * sizeof(SampleCost)),
                   h);
  }
  for (const CatalogEntry& e : p->catalog_->entries) h = HashString(e.id, HashString("\n", h));
  p->order_fingerprint_ = fmt::format("{:016x}", h);
  p->origin_.stream = FirstStreamTag(p->order_fingerprint_);
  for (const StageConfig& s : cfg.stages)
    h = HashString(fmt::format("{}|{}|{}|{}", s.name, s.type, s.field, s.params.Canonical()), h);
  p->fingerprint_ = fmt::format("{:016x}", h);
  // The batch thread is woken every half batch of finished items, or for a failed sample (its
  // row is refilled at once).
  const size_t items_per_batch = static_cast<size_t>(cfg.batch_size) * p->branches_.size();
  p->join_ = std::make_unique<JoinBox>(256, std::clamp<size_t>(items_per_batch / 2, 1, 64));
  return p;
}

Status Pipeline::SetStart(std::vector<StreamCursor> start) {
  if (static_cast<int>(start.size()) != cfg_.consumers)
    return Status::Invalid(
        fmt::format("{} start cursor(s) for {} consumer rank(s)", start.size(), cfg_.consumers));
  for (size_t r = 0; r < start.size(); ++r) {
    StreamCursor c = start[r];
    c.stream = 0;  // the position only (a resume's stream is the supervisor's to check)
    Status st = CheckCursor(c.seq);
    if (st.ok() &&
        (c.epoch < origin_.epoch || c.batch >= EpochBatches(c.epoch) || c != CursorAt(c.seq)))
      st = Status::Invalid(fmt::format(
          "cursor (epoch {}, batch {}, seq {}) is not where seq {} stands (epoch {}, batch {}; "
          "{} batches per epoch from epoch {}, seq {})",
          c.epoch, c.batch, c.seq, c.seq, CursorAt(c.seq).epoch, CursorAt(c.seq).batch,
          budgeted() ? "this pipeline's" : std::to_string(batches_per_epoch_), origin_.epoch,
          origin_.seq));
    if (!st.ok()) return st.WithContext(fmt::format("rank {}", r));
  }
  start_ = std::move(start);
  for (int r = 0; r < cfg_.consumers; ++r) next_commit_[r] = start_[r].seq;
  return Status::Ok();
}

uint32_t Pipeline::FirstStreamTag(const std::string& order_fingerprint) {
  return static_cast<uint32_t>(HashString("stream|" + order_fingerprint)) | 1;  // never 0
}

uint32_t Pipeline::NextStreamTag(const Origin& before, uint64_t seq,
                                 const std::string& order_fingerprint) {
  return static_cast<uint32_t>(
             HashString(fmt::format("{:08x}|{}|{}", before.stream, seq, order_fingerprint))) |
         1;
}

void Pipeline::SetOrigin(Origin origin) {
  origin_ = origin;
  {
    std::lock_guard<std::mutex> lock(plans_mu_);
    epoch_starts_.clear();
  }
  start_.assign(cfg_.consumers, CursorAt(origin.seq));
  for (int r = 0; r < cfg_.consumers; ++r) next_commit_[r] = origin.seq;
}

int Pipeline::RowsOf(uint64_t index) const {
  const uint64_t bs = static_cast<uint64_t>(cfg_.batch_size);
  return static_cast<int>(std::min(bs, per_rank_ - index * bs));
}

StreamCursor Pipeline::CursorAt(uint64_t seq) const {
  StreamCursor c;
  c.seq = seq;
  if (!budgeted()) {
    c.epoch = origin_.epoch + static_cast<uint32_t>((seq - origin_.seq) / batches_per_epoch_);
    c.batch = (seq - origin_.seq) % batches_per_epoch_;
    return c;
  }
  uint64_t first = origin_.seq;
  Locate(seq, &c.epoch, &first);
  c.batch = seq - first;
  return c;
}

std::shared_ptr<const EpochPlan> Pipeline::PlanOf(uint32_t epoch) const {
  {
    std::lock_guard<std::mutex> lock(plans_mu_);
    auto it = plans_.find(epoch);
    if (it != plans_.end()) return it->second;
  }
  // Made outside the lock (O(samples)): cursors are looked up meanwhile.
  auto plan = std::make_shared<const EpochPlan>(PlanEpoch(
      costs_, cfg_.source, epoch, cfg_.consumers, per_rank_, budget_, /*with_ranks=*/true));
  std::lock_guard<std::mutex> lock(plans_mu_);
  epoch_batches_[epoch] = plan->batches;
  // Ranks run apart by at most their rings' depth, and rewinds are rare: a few epochs do.
  if (plans_.size() >= 4 && !plans_.count(epoch))
    plans_.erase(plans_.begin()->first < epoch ? plans_.begin() : std::prev(plans_.end()));
  return plans_.emplace(epoch, std::move(plan)).first->second;
}

uint64_t Pipeline::EpochBatches(uint32_t epoch) const {
  if (!budgeted()) return batches_per_epoch_;
  std::lock_guard<std::mutex> lock(plans_mu_);
  return EpochBatchesLocked(epoch);
}

uint64_t Pipeline::EpochBatchesLocked(uint32_t epoch) const {
  auto it = epoch_batches_.find(epoch);  // PlanOf also records its plans' counts
  if (it != epoch_batches_.end()) return it->second;
  const uint64_t k = PlanEpoch(costs_, cfg_.source, epoch, cfg_.consumers, per_rank_, budget_,
                               /*with_ranks=*/false)
                         .batches;
  epoch_batches_[epoch] = k;
  return k;
}

bool Pipeline::Locate(uint64_t seq, uint32_t* epoch, uint64_t* first) const {
  std::lock_guard<std::mutex> lock(plans_mu_);
  if (epoch_starts_.empty()) epoch_starts_.push_back(origin_.seq);
  while (seq >= epoch_starts_.back()) {
    const size_t i = epoch_starts_.size() - 1;  // the start of epoch origin + i is known
    if (i >= kMaxEpochsAhead) return false;
    epoch_starts_.push_back(epoch_starts_.back() +
                            EpochBatchesLocked(origin_.epoch + static_cast<uint32_t>(i)));
  }
  auto it = std::upper_bound(epoch_starts_.begin(), epoch_starts_.end(), seq);
  if (it != epoch_starts_.begin()) --it;
  *epoch = origin_.epoch + static_cast<uint32_t>(it - epoch_starts_.begin());
  *first = *it;
  return true;
}

Status Pipeline::Reachable(uint64_t seq) const {
  uint32_t epoch;
  uint64_t first;
  if (!budgeted() || seq < origin_.seq) return Status::Ok();
  // Refused at once, before any epoch is planned, when even the fewest batches an epoch can
  // have put it too far (a hostile cursor must not keep the control thread planning).
  if ((seq - origin_.seq) / min_epoch_batches_ < kMaxEpochsAhead && Locate(seq, &epoch, &first))
    return Status::Ok();
  return Status::Invalid(fmt::format(
      "cursor seq {} is more than {} epochs past epoch {}: token-budget batches are numbered "
      "by planning each epoch, and so far ahead is refused",
      seq, kMaxEpochsAhead, origin_.epoch));
}

Status Pipeline::CheckCursor(uint64_t seq) const {
  if (seq < origin_.seq)
    return Status::Invalid(fmt::format(
        "cursor seq {} is before batch {}, where a reload changed the order or the batch "
        "numbering at epoch {}: the earlier batches cannot be made again",
        seq, origin_.seq, origin_.epoch));
  const uint32_t epochs = static_cast<uint32_t>(cfg_.source.epochs);
  if (!budgeted()) {
    const uint64_t total =
        epochs ? origin_.seq + (epochs - std::min(epochs, origin_.epoch)) * batches_per_epoch_
               : UINT64_MAX;
    if (seq > total)
      return Status::Invalid(fmt::format(
          "cursor seq {} is past the end of the data ({} batches per rank)", seq, total));
    // An endless run: the epoch a seq falls in must be one a cursor can name (32 bits).
    if ((seq - origin_.seq) / batches_per_epoch_ >= UINT32_MAX - origin_.epoch)
      return Status::Invalid(
          fmt::format("cursor seq {} is past the last epoch a cursor can name", seq));
    return Status::Ok();
  }
  // Token budgets: refused before any epoch is planned when too far (Reachable), then the
  // seq's epoch is found by planning the epochs up to it (at most kMaxEpochsAhead).
  MMFEED_RETURN_IF_ERROR(Reachable(seq));
  uint32_t epoch = 0;
  uint64_t first = 0;
  if (epochs && Locate(seq, &epoch, &first) &&
      (epoch > epochs || (epoch == epochs && seq != first)))
    return Status::Invalid(fmt::format("cursor seq {} is past the end of the data (epoch {} of {})",
                                       seq, epoch, epochs));
  return Status::Ok();
}

Status Pipeline::Rewind(uint32_t rank, uint64_t from_seq) {
  if (cfg_.packed_stage >= 0)
    return Status::Unsupported(
        "a packed text stream cannot be resumed at a cursor (its rows cross batches)");
  if (rank >= static_cast<uint32_t>(cfg_.consumers))
    return Status::Invalid(fmt::format("rank {} out of range", rank));
  MMFEED_RETURN_IF_ERROR(CheckCursor(from_seq));
  std::lock_guard<std::mutex> lock(rewind_mu_);
  if (source_exited_)
    return Status::Closed(fmt::format(
        "the run has ended; rank {} cannot be served from batch {} again", rank, from_seq));
  RankRewind& rw = rewinds_[rank];
  ++rw.gen;
  rw.to = CursorAt(from_seq);
  rw.source_pending = rw.collator_pending = true;
  rewind_pending_.store(true, std::memory_order_release);
  sinks_[rank]->DropPublished();
  next_commit_[rank].store(from_seq, std::memory_order_release);
  spdlog::info("rank {}: rewound to batch {} (epoch {}, batch {} of the epoch)", rank, from_seq,
               rw.to.epoch, rw.to.batch);
  return Status::Ok();
}

Pipeline::~Pipeline() {
  RequestStop();
  Wait();
}

Status Pipeline::Start() {
  start_ns_ = NowNs();
  spdlog::info("pipeline '{}': {} samples, {} consumer rank(s), batch {}{}", cfg_.name,
               catalog_->size(), cfg_.consumers, cfg_.batch_size,
               budgeted() ? fmt::format(" at most, within max_tokens {} and max_patches {} (0: "
                                        "none): {} batches per rank in epoch {}",
                                        cfg_.max_tokens, cfg_.max_patches,
                                        EpochBatches(origin_.epoch), origin_.epoch)
                          : "");
  threads_.emplace_back([this] { BatchLoop(); });
  for (auto& b : branches_) live_workers_ += b->threads;
  for (auto& b : branches_) {
    for (int w = 0; w < b->threads; ++w)
      threads_.emplace_back([this, br = b.get(), w] { WorkerLoop(br, w); });
  }
  threads_.emplace_back([this] { SourceLoop(); });
  return Status::Ok();
}

void Pipeline::RequestStop() { stop_.store(true, std::memory_order_release); }

void Pipeline::Quiesce() {
  finish_sinks_.store(false, std::memory_order_release);
  RequestStop();
}

void Pipeline::QuiesceAtEpochEnd(bool together) {
  finish_sinks_.store(false, std::memory_order_release);
  epoch_end_together_.store(together, std::memory_order_release);
  stop_at_epoch_end_.store(true, std::memory_order_release);
}

void Pipeline::Wait() {
  for (auto& t : threads_)
    if (t.joinable()) t.join();
  threads_.clear();
}

Status Pipeline::status() const {
  std::lock_guard<std::mutex> lock(status_mu_);
  return status_;
}

void Pipeline::Fail(const Status& st) {
  {
    std::lock_guard<std::mutex> lock(status_mu_);
    if (status_.ok()) status_ = st;
  }
  spdlog::error("stopping: {}", st.message());
  RequestStop();
}

void Pipeline::Dispatch(const std::shared_ptr<const Provisional>& batch, int row, uint32_t entry,
                        bool refill) {
  const uint64_t key = next_key_++;
  std::shared_ptr<const CatalogEntry> sample;
  Status read;
  if (catalog_->indexed()) {
    auto e = std::make_shared<CatalogEntry>();
    read = catalog_->Read(entry, e.get());
    sample = std::move(e);
  } else {  // shares the catalog's entry (aliasing: keeps the catalog alive, copies nothing)
    sample = std::shared_ptr<const CatalogEntry>(catalog_, &catalog_->entries[entry]);
  }
  std::shared_ptr<Readers> readers;
  if (read_stages_ > 0 && read.ok()) {
    readers = std::make_shared<Readers>();
    readers->producers.store(read_stages_, std::memory_order_relaxed);
  }
  std::vector<std::unique_ptr<WorkItem>> items;
  for (size_t b = 0; b < branches_.size(); ++b) {
    auto item = std::make_unique<WorkItem>();
    item->key = key;
    item->entry = entry;
    item->sample = sample;
    item->status = read;
    item->source_failed = !read.ok();
    item->branch = static_cast<int>(b);
    item->refill = refill;
    item->batch = batch;
    item->row = row;
    for (size_t k = 0; k < branches_[b]->specs.size(); ++k) {
      size_t t = first_tensor_[b] + k;
      item->out[k] = batch->memory.base[t] + row * specs_[t].NumBytes();
    }
    item->readers = readers;
    items.push_back(std::move(item));
  }
  // The readers' items wait before any stage they read can finish the sample.
  for (size_t b = 0; b < branches_.size(); ++b)
    if (readers && branches_[b]->reads_others) readers->items.push_back(std::move(items[b]));
  for (size_t b = 0; b < branches_.size(); ++b) {
    if (!items[b]) continue;
    trace::WaitSpan wait("source", "wait: output");
    branches_[b]->inbox.Push(std::move(items[b]), &source_counters_.blocked_ns);
  }
  if (!refill) {
    dealt_.fetch_add(1, std::memory_order_relaxed);
    source_counters_.items.fetch_add(1, std::memory_order_relaxed);
  }
}

// Remote shards: asks the store for the shards each rank reads from its oldest batch not yet
// committed (its samples may still be read) through the window of the batch it deals next and
// kAhead windows after that (the store keeps what fits prefetch_bytes, most urgent first).
// Only when one of those windows changed.
void Pipeline::WantShards(const std::vector<StreamCursor>& next, const std::vector<bool>& done,
                          std::vector<uint32_t>* last) {
  constexpr int kAhead = 2, kMostWindows = 64;
  const int consumers = cfg_.consumers;
  const uint64_t bs = static_cast<uint64_t>(cfg_.batch_size);
  std::vector<std::vector<uint32_t>> per_rank(consumers);
  std::vector<uint32_t> key;
  for (int r = 0; r < consumers; ++r) {
    if (done[r]) continue;
    const StreamCursor oldest = CursorAt(std::min(next[r].seq, NextCommit(r)));
    const EpochOrder from(*catalog_, cfg_.source, oldest.epoch, consumers);
    const EpochOrder to(*catalog_, cfg_.source, next[r].epoch, consumers);
    const uint64_t a = oldest.batch * bs * consumers + r, b = next[r].batch * bs * consumers + r;
    if (!from.windowed() || a >= from.size()) continue;
    const size_t first = from.WindowOf(a);
    if (oldest.epoch == next[r].epoch) {
      const int more = static_cast<int>(std::min<uint64_t>(
          kMostWindows, to.WindowOf(std::min<uint64_t>(b, to.size() - 1)) - first + kAhead));
      per_rank[r] = from.WindowShards(a, more);
    } else {  // the rest of the earlier epoch, then the next one's first windows
      per_rank[r] = from.WindowShards(a, kMostWindows);
      if (b < to.size())
        for (uint32_t shard : to.WindowShards(b, kAhead)) per_rank[r].push_back(shard);
    }
    key.insert(key.end(), {oldest.epoch, static_cast<uint32_t>(first), next[r].epoch,
                           static_cast<uint32_t>(b < to.size() ? to.WindowOf(b) : UINT32_MAX)});
  }
  if (key == *last) return;
  *last = key;
  // Round-robin over the ranks, shard by shard: every rank's oldest window comes first.
  std::vector<RemoteStore::Want> want;
  for (size_t k = 0;; ++k) {
    bool any = false;
    for (const auto& shards : per_rank) {
      if (k >= shards.size()) continue;
      any = true;
      const ShardIndex::ShardSpan s = catalog_->shards->shard(shards[k]);
      want.push_back({*s.path, s.bytes});
    }
    if (!any) break;
  }
  catalog_->remote->SetWanted(want);
}

// Deals whole batches, each rank from its own cursor, to whichever rank's sink has room, and
// dispatches the refills the batch thread asks for. After a stop it deals no new batch but
// keeps serving refills until every dealt batch is committed or discarded.
void Pipeline::SourceLoop() {
  Status pin = PinAndNameThisThread(control_cpus_, "mmf:source");
  if (!pin.ok()) spdlog::warn("{}", pin.message());
  ThreadTag tag(this, "source");
  const int consumers = cfg_.consumers;
  const uint64_t bs = static_cast<uint64_t>(cfg_.batch_size);
  std::vector<StreamCursor> next = start_;
  auto past_end = [&](const StreamCursor& c) {
    return cfg_.source.epochs != 0 && c.epoch >= static_cast<uint32_t>(cfg_.source.epochs);
  };
  // QuiesceAtEpochEnd: each rank stops at the first epoch boundary at or after where it is.
  std::vector<uint32_t> last_epoch(consumers, UINT32_MAX);
  bool at_epoch_end = false;
  std::vector<bool> done(consumers);
  std::vector<uint64_t> gen(consumers, 0);
  auto is_done = [&](int r) { return past_end(next[r]) || next[r].epoch >= last_epoch[r]; };
  for (int r = 0; r < consumers; ++r) done[r] = is_done(r);
  std::thread planner;  // token budgets: the next epoch's plan
  uint32_t planning = UINT32_MAX;
  std::vector<uint32_t> wanted_windows;  // remote shards: what the store was last asked for
  for (int turn = 0;; turn = (turn + 1) % consumers) {
    if (!at_epoch_end && stop_at_epoch_end_.load(std::memory_order_acquire)) {
      at_epoch_end = true;
      for (int r = 0; r < consumers; ++r)
        last_epoch[r] = next[r].batch == 0 ? next[r].epoch : next[r].epoch + 1;
      if (epoch_end_together_.load(std::memory_order_acquire))
        last_epoch.assign(consumers, *std::max_element(last_epoch.begin(), last_epoch.end()));
      for (int r = 0; r < consumers; ++r) done[r] = is_done(r);
    }
    // Busy is the iteration less the time Push waited on full mailboxes (counted as blocked).
    const uint64_t t0 = NowNs(),
                   blocked0 = source_counters_.blocked_ns.load(std::memory_order_relaxed);
    if (rewind_pending_.exchange(false, std::memory_order_acq_rel)) {
      std::lock_guard<std::mutex> lock(rewind_mu_);
      for (int r = 0; r < consumers; ++r) {
        if (!rewinds_[r].source_pending) continue;
        rewinds_[r].source_pending = false;
        next[r] = rewinds_[r].to;
        gen[r] = rewinds_[r].gen;
        // A rank resumed past the boundary a QuiesceAtEpochEnd chose (its trainer was ahead of
        // the position the daemon knew, after a restart) moves the boundary on: for every rank
        // when they stop together, so that no epoch is made by two configs.
        if (at_epoch_end) {
          const uint32_t own = next[r].batch == 0 ? next[r].epoch : next[r].epoch + 1;
          const bool together = epoch_end_together_.load(std::memory_order_acquire);
          for (int q = 0; q < consumers; ++q)
            if ((together || q == r) && own > last_epoch[q]) last_epoch[q] = own;
          for (int q = 0; q < consumers; ++q) done[q] = is_done(q);
        }
        done[r] = is_done(r);
      }
    }
    if (catalog_->remote) WantShards(next, done, &wanted_windows);
    bool progressed = false, any_full = false;
    for (Refill& f : refills_->Take()) {
      Dispatch(f.batch, f.row, f.entry, true);
      progressed = true;
    }
    for (int i = 0; i < consumers && !stop_.load(std::memory_order_acquire); ++i) {
      const int r = (turn + i) % consumers;
      if (done[r]) continue;
      std::shared_ptr<const EpochPlan> plan;
      if (budgeted()) {
        const uint32_t epoch = next[r].epoch;
        if (planner.joinable() && planning == epoch) planner.join();
        plan = PlanOf(epoch);
        if (!plan->status.ok()) {
          Fail(plan->status);
          break;
        }
        // The next epoch's plan is made ahead, on its own thread: no pause at the boundary
        // (forward only: a rank rewound to an earlier epoch plans that one itself).
        if ((planning == UINT32_MAX || epoch + 1 > planning) &&
            !past_end(StreamCursor{epoch + 1, 0, 0})) {
          if (planner.joinable()) planner.join();
          planning = epoch + 1;
          planner = std::thread([this, epoch] { PlanOf(epoch + 1); });
        }
      }
      auto pb = std::make_shared<Provisional>();
      Reservation res = sinks_[r]->Reserve(&pb->memory, 0);
      if (res == Reservation::kClosed) done[r] = true;
      any_full |= res == Reservation::kFull;
      if (res != Reservation::kReserved) continue;
      pb->gen = gen[r];
      pb->rank = static_cast<uint32_t>(r);
      pb->epoch = next[r].epoch;
      pb->index = next[r].batch;
      pb->seq = next[r].seq;
      const EpochOrder order(*catalog_, cfg_.source, pb->epoch, consumers);
      // The rank's share of the epoch's order is at positions r, r + consumers, ...; batch
      // `index` holds shares positions index * bs ..., or (a budget) those its plan says.
      std::vector<uint32_t> entries;
      if (plan) {
        const RankPlan& rp = plan->ranks[r];
        for (uint32_t k = rp.starts[pb->index]; k < rp.starts[pb->index + 1]; ++k) {
          entries.push_back(order[static_cast<uint64_t>(rp.positions[k]) * consumers + r]);
          pb->tokens += costs_[entries.back()].tokens;
          pb->patches += costs_[entries.back()].patches;
        }
      } else {
        for (int row = 0; row < RowsOf(pb->index); ++row)
          entries.push_back(order[(pb->index * bs + row) * consumers + r]);
      }
      pb->rows = static_cast<int>(entries.size());
      open_batches_.fetch_add(1, std::memory_order_acq_rel);
      for (int row = 0; row < pb->rows; ++row) Dispatch(pb, row, entries[row], false);
      next[r] = CursorAfter(next[r].seq);
      done[r] = is_done(r);
      progressed = true;
    }
    source_counters_.busy_ns.fetch_add(
        NowNs() - t0 - (source_counters_.blocked_ns.load(std::memory_order_relaxed) - blocked0),
        std::memory_order_relaxed);
    bool complete = std::all_of(next.begin(), next.end(), past_end);
    complete_.store(complete, std::memory_order_release);
    bool all_dealt = stop_.load(std::memory_order_acquire) ||
                     std::all_of(done.begin(), done.end(), [](bool d) { return d; });
    if (all_dealt && open_batches_.load(std::memory_order_acquire) == 0) {
      std::lock_guard<std::mutex> lock(rewind_mu_);
      if (!rewind_pending_.load(std::memory_order_acquire)) {
        source_exited_ = true;
        break;
      }
    }
    if (!progressed) {
      uint64_t w0 = NowNs();
      trace::WaitSpan wait("source", any_full ? "wait: rings full" : "wait: input");
      refills_->Wait(1);
      (any_full ? source_counters_.blocked_ns : source_counters_.starved_ns)
          .fetch_add(NowNs() - w0, std::memory_order_relaxed);
    }
  }
  if (planner.joinable()) planner.join();
  for (auto& b : branches_) {
    {
      std::lock_guard<std::mutex> lock(b->park_mu);
      b->closing.store(true, std::memory_order_release);
    }
    b->park_cv.notify_all();
    b->inbox.Close(b->threads);
  }
}

void Pipeline::WorkerLoop(Branch* b, int worker) {
  Status pin = PinAndNameThisThread(b->cpus, fmt::format("mmf:{}:{}", b->cfg->name, worker));
  if (!pin.ok()) spdlog::warn("{}", pin.message());
  ThreadTag tag(this, b->cfg->name);
  std::unique_ptr<StageWorker> impl = b->cfg->stage->NewWorker();
  ScopedFilePolicy files(&b->files);
  std::vector<const FieldValue*> read_fields;  // the sample's, for SampleContext
  std::vector<const uint8_t*> read_tensors;
  std::vector<const TensorSpec*> read_specs;
  for (size_t t : b->read_tensors) read_specs.push_back(&specs_[t]);
  const std::string& name = b->cfg->name;
  while (true) {
    if (worker >= b->active.load(std::memory_order_acquire) &&
        !b->closing.load(std::memory_order_acquire)) {  // workers: auto took this thread
      // Parked time is counted every 100 ms, so that a profile sees threads parked for long.
      std::unique_lock<std::mutex> lock(b->park_mu);
      auto in_use = [&] {
        return worker < b->active.load(std::memory_order_acquire) ||
               b->closing.load(std::memory_order_acquire);
      };
      for (bool done = false; !done;) {
        const uint64_t t0 = NowNs();
        done = b->park_cv.wait_for(lock, std::chrono::milliseconds(100), in_use);
        b->counters.parked_ns.fetch_add(NowNs() - t0, std::memory_order_relaxed);
      }
    }
    std::unique_ptr<WorkItem> item;
    {
      trace::WaitSpan wait(name, "wait: input");
      item = b->inbox.Pop(&b->counters.starved_ns);
    }
    if (!item) break;
    if (item->source_failed) {  // its manifest line could not be read: nothing to do here
      join_->Push(std::move(item), true, &b->counters.blocked_ns);
      continue;
    }
    b->counters.fill_sum.fetch_add(b->inbox.SizeApprox(), std::memory_order_relaxed);
    b->counters.fill_samples.fetch_add(1, std::memory_order_relaxed);
    WorkTimer timer;
    const CatalogEntry& e = *item->sample;
    // The sample's field `name`, or nullptr (then `missing` names it).
    std::string missing;
    auto find = [&](const std::string& name) {
      const FieldValue* f = FieldOf(e, name);
      if (!f) missing = name;
      return f;
    };
    const FieldValue* field = find(b->cfg->field);
    SampleContext ctx{cfg_.source.seed, item->batch->epoch, e.id, e.origin};
    read_fields.clear();
    for (const std::string& name : b->read_fields) read_fields.push_back(find(name));
    read_tensors.clear();
    for (size_t t : b->read_tensors)
      read_tensors.push_back(item->batch->memory.base[t] + item->row * specs_[t].NumBytes());
    ctx.fields = read_fields.data();
    ctx.tensors = read_tensors.data();
    ctx.tensor_specs = read_specs.data();
    if (!missing.empty()) {
      item->status = Status::NotFound(fmt::format("sample has no field '{}'", missing));
    } else {
      // A sample that outlives sample_timeout_s is given up, whatever the stage made of it.
      auto process = [&]() -> Status {
        ScopedSampleDeadline deadline(cfg_.sample_timeout_s);
        Status st = Guarded(b->cfg->type, [&] {
          return impl->Process(ctx, *field, OutputRow(item->out.data(), b->specs.size()));
        });
        if (SampleDeadlinePassed())
          return Status::Timeout(fmt::format("took longer than sample_timeout_s {}s{}",
                                             cfg_.sample_timeout_s,
                                             st.ok() ? "" : " (" + st.message() + ")"));
        return st;
      };
      item->status = process();
      // Out of descriptors or memory says nothing about the sample: wait and retry (up to
      // ~30 s), then stop the pipeline whatever on_error says.
      for (int attempt = 0; item->status.code() == Status::Code::kResourceExhausted &&
                            attempt < 300 && !stop_.load(std::memory_order_acquire);
           ++attempt) {
        if (attempt == 0) spdlog::warn("{}; retrying", item->status.message());
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        item->status = process();
      }
      if (item->status.code() == Status::Code::kResourceExhausted)
        Fail(item->status.WithContext("out of resources, not a bad sample"));
    }
    if (b->leak_bytes_per_item > 0) {  // touched, so that it is resident
      auto kept = std::make_unique_for_overwrite<char[]>(b->leak_bytes_per_item);
      std::memset(kept.get(), 1, b->leak_bytes_per_item);
      std::lock_guard<std::mutex> lock(b->leak_mu);
      b->leaked.push_back(std::move(kept));
    }
    timer.AddTo(&b->counters);
    if (trace::On()) trace::Span(name, "work", e.id, timer.start_ns(), NowNs());
    b->counters.items.fetch_add(1, std::memory_order_relaxed);
    if (!item->status.ok()) b->counters.errors.fetch_add(1, std::memory_order_relaxed);
    const bool failed = !item->status.ok();
    std::shared_ptr<Readers> readers = b->read_by_others ? item->readers : nullptr;
    if (readers && failed) {
      std::lock_guard<std::mutex> lock(readers->mu);
      if (readers->failed.ok()) {
        readers->failed = item->status;
        readers->failed_branch = item->branch;
      }
    }
    trace::WaitSpan wait(name, "wait: output");
    join_->Push(std::move(item), failed, &b->counters.blocked_ns);
    if (readers && readers->producers.fetch_sub(1, std::memory_order_acq_rel) == 1)
      ReleaseReaders(readers.get(), &b->counters.blocked_ns);
  }
  if (live_workers_.fetch_sub(1, std::memory_order_acq_rel) == 1)
    join_->Close();  // the last worker of all
}

// Completes one rank's batches and commits them in order. A batch is complete when every row
// holds a good sample. The rows of failed samples are refilled in rounds: once every
// outstanding sample of the batch is resolved, each empty row (in row order) draws one
// catalog entry from the rank's share of the epoch with the batch's own random stream, seeded
// by (seed, epoch, node, rank, batch index). The draws' outcomes decide the bytes, never
// their timing: a draw of an entry already known to be bad fails at once, exactly as it
// would have after decoding. Runs on the batch thread only.
class Pipeline::Collator {
 public:
  Collator(Pipeline* p, uint32_t rank, uint64_t first_seq, std::vector<bool>* known_bad)
      : p_(p), rank_(rank), next_commit_(first_seq), known_bad_(known_bad) {}

  // Every branch of a sample reported; `status` is the first failure, if any.
  void Resolve(const WorkItem& s, Status status, std::string failed_stage) {
    TakeRewind();
    Open& o = Get(s.batch);
    --o.outstanding;
    if (s.batch->gen != gen_) {  // dealt before a rewind: abandoned
      if (o.outstanding == 0) Drop(s.batch);
      return;
    }
    const CatalogEntry& e = *s.sample;
    if (status.ok() && p_->budgeted()) {  // the plan counted what was measured at start
      const Provisional& b = *s.batch;
      const SampleCost got =
          p_->CostOf([&](size_t t) { return b.memory.base[t] + s.row * p_->specs_[t].NumBytes(); });
      const SampleCost& want = p_->costs_[s.entry];
      if (got.tokens != want.tokens || got.patches != want.patches) {
        status = Status::Corrupt(fmt::format(
            "it changed since it was measured at start: {} tokens and {} patches, measured {} "
            "and {} (the batch's budget counted those)",
            got.tokens, got.patches, want.tokens, want.patches));
        failed_stage = p_->cfg_.stages[p_->cfg_.batch_stage].name;
      }
    }
    if (status.ok()) {
      o.ids[s.row] = e.id;
      if (s.refill) {
        p_->refills_ok_.fetch_add(1, std::memory_order_relaxed);
        o.failed_run = 0;
      }
    } else if (status.code() == Status::Code::kResourceExhausted) {
      o.holes.push_back(s.row);  // not the sample's fault: never counted (the pipeline stops)
    } else {
      (*known_bad_)[s.entry] = true;
      if (p_->budgeted()) {  // its cost leaves the batch with it
        o.tokens -= p_->costs_[s.entry].tokens;
        o.patches -= p_->costs_[s.entry].patches;
      }
      if (s.refill) {
        p_->refills_failed_.fetch_add(1, std::memory_order_relaxed);
        ++o.failed_run;
      } else {
        // Logged before counted, and Profile() reads the count first: a profile taken while
        // samples fail never shows more failed samples than logged errors.
        p_->SampleFailed(e, failed_stage, status);
        p_->failed_.fetch_add(1, std::memory_order_release);
      }
      o.holes.push_back(s.row);
    }
    if (!p_->status().ok()) return DiscardIdle();
    if (o.outstanding == 0 && !o.holes.empty()) Refill(o);
    for (auto it = open_.find({gen_, next_commit_}); it != open_.end();
         it = open_.find({gen_, next_commit_})) {
      Open& f = it->second;
      if (f.outstanding > 0 || !f.holes.empty()) break;
      // Under rewind_mu_, so that a batch of a generation that a rewind just ended never
      // reaches the sink.
      std::lock_guard<std::mutex> lock(p_->rewind_mu_);
      if (p_->rewinds_[rank_].gen != gen_) break;
      Commit(it);
    }
  }

  // After a failure: gives back every batch no worker is writing to any more.
  void DiscardIdle() {
    for (auto it = open_.begin(); it != open_.end();) {
      if (it->second.outstanding > 0) {
        ++it;
        continue;
      }
      p_->sinks_[rank_]->Discard(it->second.batch->memory);
      p_->open_batches_.fetch_sub(1, std::memory_order_acq_rel);
      it = open_.erase(it);
    }
  }

 private:
  // Takes up a rewind of this rank: commits restart at its seq; batches of earlier
  // generations are dropped as soon as no worker writes to them.
  void TakeRewind() {
    {
      std::lock_guard<std::mutex> lock(p_->rewind_mu_);
      RankRewind& rw = p_->rewinds_[rank_];
      if (!rw.collator_pending) return;
      rw.collator_pending = false;
      gen_ = rw.gen;
      next_commit_ = rw.to.seq;
    }
    for (auto it = open_.begin(); it != open_.end();) {
      auto next = std::next(it);
      if (it->second.batch->gen != gen_ && it->second.outstanding == 0) Drop(it->second.batch);
      it = next;
    }
  }

  void Drop(const std::shared_ptr<const Provisional>& b) {
    p_->sinks_[rank_]->Discard(b->memory);
    p_->open_batches_.fetch_sub(1, std::memory_order_acq_rel);
    open_.erase({b->gen, b->seq});
  }

  struct Open {
    std::shared_ptr<const Provisional> batch;
    std::vector<std::string> ids;
    std::vector<int> holes;  // rows whose sample failed, not yet redrawn
    int outstanding = 0;     // samples dispatched and not yet resolved
    Rng draws{0};
    uint64_t failed_run = 0;  // refill draws that failed since the last good one
    // A token budget: the costs of the batch's samples (failed ones left out), refill draws
    // that did not fit since the last that did, and rows left empty (no draw fitted).
    int64_t tokens = 0, patches = 0;
    int misfits = 0;
    std::vector<int> dropped;
  };
  // Refill draws in a row that pass the budget before the row is left out of its batch.
  static constexpr int kMaxMisfits = 64;

  Open& Get(const std::shared_ptr<const Provisional>& b) {
    auto it = open_.find({b->gen, b->seq});
    if (it != open_.end()) return it->second;
    Open& o = open_[{b->gen, b->seq}];
    o.batch = b;
    o.ids.resize(b->rows);
    o.outstanding = b->rows;
    o.tokens = b->tokens;
    o.patches = b->patches;
    o.draws = Rng(p_->cfg_.source.seed, b->epoch,
                  fmt::format("{}/{}/{}", p_->cfg_.source.node_rank, rank_, b->index), "refill");
    return o;
  }

  void Refill(Open& o) {
    const uint64_t limit = 4 * p_->per_rank_ + 256;
    const EpochOrder order(*p_->catalog_, p_->cfg_.source, o.batch->epoch, p_->cfg_.consumers);
    std::vector<Pipeline::Refill> requests;
    bool give_up = false;
    while (!give_up && o.outstanding == 0 && !o.holes.empty()) {  // one round per pass
      std::vector<int> rows;
      rows.swap(o.holes);
      std::sort(rows.begin(), rows.end());
      for (int row : rows) {
        if (!give_up && o.failed_run > limit) {
          give_up = true;
          p_->unusable_data_.store(true, std::memory_order_relaxed);
          p_->Fail(Status::Corrupt(
              fmt::format("rank {}, epoch {}, batch {}: {} draws in a row from the rank's {} "
                          "samples failed; the data has (almost) "
                          "no usable sample",
                          rank_, o.batch->epoch, o.batch->index, o.failed_run, p_->per_rank_)));
        }
        if (give_up) {
          o.holes.push_back(row);
          continue;
        }
        uint64_t pos = o.draws.Below(p_->per_rank_);
        uint32_t entry = order[pos * p_->cfg_.consumers + rank_];
        if ((*known_bad_)[entry]) {
          p_->refills_failed_.fetch_add(1, std::memory_order_relaxed);
          ++o.failed_run;
          o.holes.push_back(row);
          continue;
        }
        if (p_->budgeted()) {
          const SampleCost& c = p_->costs_[entry];
          if (!p_->budget_.Fits(1, o.tokens + c.tokens, o.patches + c.patches)) {
            if (++o.misfits >= kMaxMisfits) {
              o.dropped.push_back(row);
              o.misfits = 0;
            } else {
              o.holes.push_back(row);
            }
            continue;
          }
          o.misfits = 0;
          o.tokens += c.tokens;
          o.patches += c.patches;
        }
        requests.push_back({o.batch, row, entry});
        ++o.outstanding;
      }
    }
    if (!requests.empty()) p_->refills_->Push(std::move(requests));
    if (give_up) DiscardIdle();
  }

  void Commit(std::map<std::pair<uint64_t, uint64_t>, Open>::iterator it) {
    Open& f = it->second;
    BatchInfo info;
    info.rank = rank_;
    info.seq = f.batch->seq;
    info.epoch = f.batch->epoch;
    if (!f.dropped.empty()) DropRows(f);
    info.rows = static_cast<uint32_t>(f.batch->rows - f.dropped.size());
    info.ids = std::move(f.ids);
    info.next = p_->CursorAfter(info.seq);
    info.next.stream = p_->origin_.stream;
    info.ragged_rows = p_->PackRagged(f.batch->memory, info.rows);
    uint64_t t0 = NowNs();
    p_->sinks_[rank_]->Commit(f.batch->memory, info);
    p_->batch_counters_.blocked_ns.fetch_add(NowNs() - t0, std::memory_order_relaxed);
    p_->open_batches_.fetch_sub(1, std::memory_order_acq_rel);
    open_.erase(it);
    p_->next_commit_[rank_].store(++next_commit_, std::memory_order_release);
  }

  // Moves the rows that follow each dropped one down over it, in every tensor (a ragged
  // tensor's rows too: each row has its own region until PackRagged).
  void DropRows(Open& f) {
    std::vector<bool> gone(f.batch->rows);
    for (int r : f.dropped) gone[r] = true;
    std::vector<std::string> ids;
    int to = 0;
    for (int from = 0; from < f.batch->rows; ++from) {
      if (gone[from]) continue;
      if (to != from)
        for (size_t t = 0; t < p_->specs_.size(); ++t) {
          const size_t bytes = p_->specs_[t].NumBytes();
          std::memmove(f.batch->memory.base[t] + to * bytes, f.batch->memory.base[t] + from * bytes,
                       bytes);
        }
      ids.push_back(std::move(f.ids[from]));
      ++to;
    }
    f.ids = std::move(ids);
  }

  Pipeline* p_;
  uint32_t rank_;
  std::map<std::pair<uint64_t, uint64_t>, Open> open_;  // by (generation, seq)
  uint64_t gen_ = 0;                                    // the rank's current stream generation
  uint64_t next_commit_;
  std::vector<bool>* known_bad_;  // by catalog index, shared by the batch thread's collators
};

TensorSpec CommittedTensor(const TensorSpec& s, const BatchInfo& info, size_t k) {
  TensorSpec t = s;
  const bool packed = k < info.ragged_rows.size();
  if (!s.starts_of.empty() && packed)
    t.shape = {info.ragged_rows[k]};
  else if (!s.rows_from.empty() && packed && s.shape.size() == 1)
    t.shape = {1, info.ragged_rows[k]};
  else if (!s.rows_from.empty() && packed)
    t.shape[0] = info.ragged_rows[k];
  else
    t.shape.insert(t.shape.begin(), static_cast<int64_t>(info.rows));
  return t;
}

// A sample's rows of a ragged tensor: the sum, over its rows_from tensor's last-axis vectors
// (one for a scalar or a vector), of each vector's product: an image's [t, h, w] grid gives
// t*h*w patches, several images' [n, 3] grids the sum of theirs, a count the count. Bounded by
// the tensor's most rows (a stage's bug stays in bounds).
static int64_t RaggedRows(const TensorSpec& s, const TensorSpec& from, const uint8_t* counts) {
  const size_t values = from.NumBytes() / sizeof(int32_t);
  const size_t width = from.shape.empty() ? 1 : static_cast<size_t>(from.shape.back());
  int64_t total = 0;
  for (size_t v = 0; v + width <= values; v += width) {
    int64_t n = 1;
    for (size_t k = 0; k < width; ++k) {
      int32_t c;
      std::memcpy(&c, counts + (v + k) * sizeof c, sizeof c);
      n = std::min<int64_t>(n * std::max(c, 0), s.shape[0]);
    }
    total = std::min<int64_t>(total + n, s.shape[0]);
  }
  return total;
}

// Each row of a ragged tensor was written at row * (its most rows); the rows it used move down
// to follow the previous row's (towards lower addresses: memmove is safe). Every count is
// taken before anything moves: one ragged tensor may count another's rows (images' grids).
std::vector<int64_t> Pipeline::PackRagged(const BatchMemory& memory, uint32_t rows) const {
  if (std::all_of(rows_from_.begin(), rows_from_.end(), [](int f) { return f < 0; })) return {};
  std::vector<std::vector<int64_t>> used(specs_.size());
  for (size_t t = 0; t < specs_.size(); ++t) {
    if (rows_from_[t] < 0) continue;
    const TensorSpec& from = specs_[rows_from_[t]];
    for (uint32_t i = 0; i < rows; ++i)
      used[t].push_back(
          RaggedRows(specs_[t], from, memory.base[rows_from_[t]] + i * from.NumBytes()));
  }
  std::vector<int64_t> out;
  for (size_t t = 0; t < specs_.size(); ++t) {
    if (rows_from_[t] < 0) continue;
    if (out.empty()) out.assign(specs_.size(), rows);
    const size_t per_row = specs_[t].NumBytes(), row_bytes = per_row / specs_[t].shape[0];
    int64_t total = 0;
    for (uint32_t i = 0; i < rows; ++i) {
      std::memmove(memory.base[t] + total * row_bytes, memory.base[t] + i * per_row,
                   used[t][i] * row_bytes);
      total += used[t][i];
    }
    out[t] = total;
  }
  for (size_t t = 0; t < specs_.size(); ++t) {  // starts: [rows + 1] in [rows][2] of memory
    if (starts_of_[t] < 0) continue;
    // Block sizes: each sample's rows, or for a grid (packed above) h * w, t times per row.
    std::vector<int64_t> blocks;
    const int of = starts_of_[t];
    if (IsGrid(specs_[of])) {
      for (int64_t g = 0; g < out[of]; ++g) {
        int32_t thw[3];
        std::memcpy(thw, memory.base[of] + g * sizeof thw, sizeof thw);
        blocks.insert(blocks.end(), std::max(thw[0], 0), int64_t{thw[1]} * thw[2]);
      }
    } else {
      blocks = used[of];
    }
    // Bounded by its memory (a stage's bug stays in bounds).
    blocks.resize(std::min<size_t>(blocks.size(), rows * specs_[t].NumBytes() / 4 - 1));
    int32_t start = 0;
    for (size_t i = 0; i <= blocks.size(); ++i) {
      std::memcpy(memory.base[t] + i * sizeof start, &start, sizeof start);
      if (i < blocks.size()) start += static_cast<int32_t>(blocks[i]);
    }
    out[t] = static_cast<int64_t>(blocks.size()) + 1;
  }
  return out;
}

SampleCost Pipeline::CostOf(const std::function<const uint8_t*(size_t)>& row) const {
  int64_t tokens = 0, patches = 0;
  for (size_t t : token_tensors_) {
    int32_t len;
    std::memcpy(&len, row(t), sizeof len);
    tokens += std::max(len, 0);
  }
  for (size_t t : patch_tensors_) {
    const int from = rows_from_[t];
    patches += RaggedRows(specs_[t], specs_[from], row(from));
  }
  SampleCost c;
  c.tokens = static_cast<uint32_t>(std::min<int64_t>(tokens, SampleCost::kUnusable - 1));
  c.patches = static_cast<uint32_t>(std::min<int64_t>(patches, UINT32_MAX));
  return c;
}

// Token-budget batches: every catalog entry's cost, measured by the stages (an image's header,
// a video's stream, a text's tokens) on as many threads as the measured stages have workers, or
// read from the cost index an earlier start kept (indexed sources). Costs are measured for the
// whole catalog, not only this node's share: every node plans every rank.
Status Pipeline::MeasureCatalog() {
  const uint64_t t0 = NowNs();
  const size_t n = catalog_->size();
  // The tensors holding tokens, and the patch tensors (null rows when measuring). The stages
  // measured: those a budget counts, and the ones they read (an image stage beside a budgeted
  // text stage is not). What they are, with the source's stamp, keys the cost index.
  std::vector<bool> measured(branches_.size());
  for (size_t b = 0; b < branches_.size(); ++b) {
    const Stage::CostOutputs c = branches_[b]->cfg->stage->Costs();
    for (size_t k = 0; k < branches_[b]->specs.size(); ++k) {
      if (branches_[b]->specs[k].name == c.tokens) token_tensors_.push_back(first_tensor_[b] + k);
      if (branches_[b]->specs[k].name == c.patches) patch_tensors_.push_back(first_tensor_[b] + k);
    }
    if (c.tokens.empty() && c.patches.empty()) continue;
    measured[b] = true;
    for (size_t o : branches_[b]->read_branches) measured[o] = true;
  }
  uint64_t key = HashString(fmt::format("costs 1|{}|{:016x}|{}", n,
                                        catalog_->indexed() ? catalog_->index_fingerprint() : 0,
                                        cfg_.source.max_bytes));
  for (const std::string& root : branches_[0]->files.roots) key = HashString(root, key);
  for (size_t b = 0; b < branches_.size(); ++b) {
    const StageConfig& s = *branches_[b]->cfg;
    if (measured[b])
      key = HashString(fmt::format("{}|{}|{}|{}", s.name, s.type, s.field, s.params.Canonical()),
                       key);
  }

  MeasuredCatalog m;
  std::string path, how = "measured";
  bool have = false;
  if (catalog_->indexed()) {
    path = CostIndexPath(cfg_.source.path, cfg_.source.index_dir);
    Result<MeasuredCatalog> read = ReadCostIndex(path, key, n);
    if (read.ok()) {
      m = std::move(read.value());
      have = true;
      how = "read from " + path;
    } else if (read.status().code() != Status::Code::kNotFound) {
      spdlog::info("token budget: measuring again ({})", read.status().message());
    }
  }
  if (!have) {
    m.costs.assign(n, {});
    std::mutex failures_mu;
    std::atomic<size_t> next{0};
    auto measure = [&] {
      std::vector<std::unique_ptr<StageWorker>> workers(branches_.size());
      std::vector<std::vector<uint8_t>> rows(specs_.size());  // one sample's outputs
      std::vector<uint8_t*> out(specs_.size());
      for (size_t b = 0; b < branches_.size(); ++b) {
        if (!measured[b]) continue;
        workers[b] = branches_[b]->cfg->stage->NewWorker();
        for (size_t t = first_tensor_[b]; t < first_tensor_[b] + branches_[b]->specs.size(); ++t) {
          const bool patches =
              std::find(patch_tensors_.begin(), patch_tensors_.end(), t) != patch_tensors_.end();
          if (!patches) rows[t].resize(specs_[t].NumBytes());
          out[t] = patches ? nullptr : rows[t].data();
        }
      }
      CatalogEntry read;
      std::vector<const FieldValue*> fields;
      std::vector<const uint8_t*> tensors;
      std::vector<const TensorSpec*> tensor_specs;
      for (size_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < n;) {
        const CatalogEntry* e = &read;
        Status st;
        if (catalog_->indexed())
          st = catalog_->Read(i, &read);
        else
          e = &catalog_->entries[i];
        std::string stage = "source";
        // The stages others read first, then those that read them.
        for (int pass = 0; pass < 2 && st.ok(); ++pass) {
          for (size_t b = 0; b < branches_.size() && st.ok(); ++b) {
            const Branch& br = *branches_[b];
            if (!measured[b] || br.reads_others != (pass == 1)) continue;
            stage = br.cfg->name;
            fields.clear();
            for (const std::string& f : br.read_fields) fields.push_back(FieldOf(*e, f));
            tensors.clear();
            tensor_specs.clear();
            for (size_t t : br.read_tensors) {
              tensors.push_back(out[t]);
              tensor_specs.push_back(&specs_[t]);
            }
            const FieldValue* field = FieldOf(*e, br.cfg->field);
            if (!field || std::find(fields.begin(), fields.end(), nullptr) != fields.end()) {
              st = Status::NotFound("sample lacks a field a stage needs");
              break;
            }
            SampleContext ctx{cfg_.source.seed, 0, e->id, e->origin};
            ctx.fields = fields.data();
            ctx.tensors = tensors.data();
            ctx.tensor_specs = tensor_specs.data();
            ScopedFilePolicy files(&br.files);
            ScopedSampleDeadline deadline(cfg_.sample_timeout_s);
            st = Guarded(br.cfg->type, [&] {
              return workers[b]->Measure(ctx, *field,
                                         OutputRow(out.data() + first_tensor_[b], br.specs.size()));
            });
          }
        }
        if (st.ok()) {
          m.costs[i] = CostOf([&](size_t t) { return out[t]; });
          continue;
        }
        m.costs[i].tokens = SampleCost::kUnusable;
        if (st.code() == Status::Code::kResourceExhausted) {
          Fail(st.WithContext("measuring samples: out of resources, not a bad sample"));
          next.store(n);
        }
        std::lock_guard<std::mutex> lock(failures_mu);
        m.failures.push_back({static_cast<uint32_t>(i), stage, st});
      }
    };
    int threads = 0;
    for (size_t b = 0; b < branches_.size(); ++b)
      threads += measured[b] ? branches_[b]->threads : 0;
    threads = std::clamp<int>(threads, 1, static_cast<int>(std::max<size_t>(n / 64, 1)));
    spdlog::info("token budget: measuring {} samples on {} thread(s)", n, threads);
    std::atomic<int> running{threads};
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&] {
        measure();
        running.fetch_sub(1, std::memory_order_release);
      });
    // Progress every 10 s: a large catalog takes minutes the first time.
    for (uint64_t last = NowNs(); running.load(std::memory_order_acquire) > 0;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      if (NowNs() - last < 10'000'000'000ull) continue;
      last = NowNs();
      spdlog::info("token budget: {} of {} samples measured", std::min(next.load(), n), n);
    }
    for (std::thread& t : pool) t.join();
    MMFEED_RETURN_IF_ERROR(status());
    std::sort(m.failures.begin(), m.failures.end(),
              [](const auto& a, const auto& b) { return a.entry < b.entry; });
    if (!path.empty() && !WriteCostIndex(path, key, m))
      spdlog::warn("token budget: cannot keep the costs in {} ({}): the next start measures again",
                   path, std::strerror(errno));
  }

  // A sample over a budget on its own can never be batched.
  costs_ = std::move(m.costs);
  std::vector<MeasuredCatalog::Failure> failures = std::move(m.failures);
  const size_t unreadable = failures.size();
  for (size_t i = 0; i < n; ++i) {
    if (!costs_[i].usable()) continue;
    const std::string refused = budget_.Refuses(costs_[i]);
    if (refused.empty()) continue;
    costs_[i].tokens = SampleCost::kUnusable;
    failures.push_back({static_cast<uint32_t>(i), cfg_.stages[cfg_.batch_stage].name,
                        Status::TooLarge("the sample alone has " + refused)});
  }
  std::inplace_merge(failures.begin(), failures.begin() + unreadable, failures.end(),
                     [](const auto& a, const auto& b) { return a.entry < b.entry; });
  for (const MeasuredCatalog::Failure& f : failures) {
    CatalogEntry e;
    if (catalog_->indexed()) {
      Status read = catalog_->Read(f.entry, &e);  // even unparsed, it has its id and origin
      (void)read;
    } else {
      e = catalog_->entries[f.entry];
    }
    SampleFailed(e, f.stage, f.status);
    MMFEED_RETURN_IF_ERROR(status());  // on_error: fail
    failed_.fetch_add(1, std::memory_order_relaxed);
  }
  spdlog::info("token budget: {} samples {} in {:.3f}s, {} unusable", n, how, (NowNs() - t0) / 1e9,
               failures.size());
  return Status::Ok();
}

// The stages a sample's readers read have all finished it: the readers run on it, or, when one
// of those stages failed, are reported failed with that stage's error without running.
void Pipeline::ReleaseReaders(Readers* r, std::atomic<uint64_t>* blocked_ns) {
  std::lock_guard<std::mutex> lock(r->mu);
  for (std::unique_ptr<WorkItem>& item : r->items) {
    if (r->failed.ok()) {
      Branch& reader = *branches_[item->branch];
      reader.inbox.Push(std::move(item), blocked_ns);
    } else {
      item->status = r->failed;
      item->branch = r->failed_branch;
      join_->Push(std::move(item), true, blocked_ns);
    }
  }
  r->items.clear();
}

void Pipeline::SampleFailed(const CatalogEntry& e, const std::string& stage, const Status& st) {
  batch_counters_.errors.fetch_add(1, std::memory_order_relaxed);
  if (cfg_.on_error == ErrorPolicy::kFail)
    Fail(st.WithContext(fmt::format("{} ({})", e.origin, stage)));
  else
    errors_.Add(e.origin, stage, st.CodeName(), st.message());
}

void Pipeline::BatchLoop() {
  Status pin = PinAndNameThisThread(control_cpus_, "mmf:batch");
  if (!pin.ok()) spdlog::warn("{}", pin.message());
  ThreadTag tag(this, cfg_.stages[cfg_.batch_stage].name);
  const size_t nb = branches_.size();
  struct Pending {
    size_t arrived = 0;
    Status status;
    std::string failed_stage;
    std::unique_ptr<WorkItem> first;
  };
  std::unordered_map<uint64_t, Pending> pending;  // by key: the branches reported so far
  std::vector<bool> known_bad(catalog_->size());
  for (size_t i = 0; i < costs_.size(); ++i) known_bad[i] = !costs_[i].usable();
  std::vector<Collator> collators;
  for (int r = 0; r < cfg_.consumers; ++r)
    collators.emplace_back(this, static_cast<uint32_t>(r), start_[r].seq, &known_bad);

  const std::string& name = cfg_.stages[cfg_.batch_stage].name;
  while (true) {
    std::unique_ptr<WorkItem> item;
    {
      trace::WaitSpan wait(name, "wait: input");
      item = join_->Pop(&batch_counters_.starved_ns);
    }
    if (!item) break;
    WorkTimer timer;
    const std::string trace_id = trace::On() ? item->sample->id : std::string();
    batch_counters_.fill_sum.fetch_add(join_->SizeApprox(), std::memory_order_relaxed);
    batch_counters_.fill_samples.fetch_add(1, std::memory_order_relaxed);
    Pending& p = pending[item->key];
    if (!item->status.ok() && p.status.ok()) {
      p.status = item->status;
      p.failed_stage = item->source_failed ? "source" : branches_[item->branch]->cfg->name;
    }
    if (!p.first) p.first = std::move(item);
    if (++p.arrived == nb) {
      Pending done = std::move(p);
      pending.erase(done.first->key);
      collators[done.first->batch->rank].Resolve(*done.first, done.status, done.failed_stage);
      batch_counters_.items.fetch_add(1, std::memory_order_relaxed);
      if (!status().ok())
        for (Collator& c : collators) c.DiscardIdle();
    }
    timer.AddTo(&batch_counters_);
    if (trace::On()) trace::Span(name, "work", trace_id, timer.start_ns(), NowNs());
  }
  // Every worker has finished, so nothing writes into an open batch; normally none is left.
  for (Collator& c : collators) c.DiscardIdle();
  if (finish_sinks_.load(std::memory_order_acquire))
    for (BatchSink* s : sinks_)
      s->Finish(complete_.load(std::memory_order_acquire) && status().ok());
  end_ns_.store(NowNs());
  finished_.store(true, std::memory_order_release);
}

nlohmann::json Pipeline::PlacementJson() const {
  nlohmann::json stages = nlohmann::json::array();
  stages.push_back({{"stage", "source+batch"}, {"threads", 2}, {"cpus", CpuList(control_cpus_)}});
  for (const auto& b : branches_)
    stages.push_back({{"stage", b->cfg->name},
                      {"threads", b->active.load()},
                      {"auto", b->cfg->workers_auto},
                      {"max_threads", b->threads},
                      {"cpus", CpuList(b->cpus)},
                      {"numa_node", b->cfg->placement.numa_node}});
  return stages;
}

uint64_t Pipeline::Progress() const {
  uint64_t n = dealt_.load(std::memory_order_relaxed) +
               batch_counters_.items.load(std::memory_order_relaxed);
  for (const auto& b : branches_) n += b->counters.items.load(std::memory_order_relaxed);
  return n;
}

std::vector<StageInfo> Pipeline::StageInfos() const {
  std::vector<StageInfo> infos;
  infos.push_back({"source", cfg_.source.type, 1, 0, &source_counters_,
                   catalog_->remote ? catalog_->remote->Metrics()
                                    : std::vector<std::pair<std::string, double>>{}});
  for (const auto& b : branches_)
    infos.push_back({b->cfg->name, b->cfg->type, b->active.load(), b->inbox.capacity(),
                     &b->counters, b->cfg->stage->Metrics(), b->inbox.SizeApprox(), b->threads,
                     b->cfg->workers_auto});
  infos.push_back({cfg_.stages[cfg_.batch_stage].name,
                   "batch",
                   1,
                   join_->capacity(),
                   &batch_counters_,
                   {},
                   join_->SizeApprox()});
  infos.insert(infos.end(), extra_infos_.begin(), extra_infos_.end());
  return infos;
}

std::vector<StageSample> Pipeline::SampleStages() const {
  std::vector<StageSample> out;
  for (const StageInfo& info : StageInfos()) out.push_back(SampleStage(info));
  return out;
}

Status Pipeline::SetWorkers(const std::string& stage, int workers) {
  for (auto& b : branches_) {
    if (b->cfg->name != stage) continue;
    if (!b->cfg->workers_auto)
      return Status::Invalid(fmt::format("stage '{}' has a fixed number of workers", stage));
    if (workers < 1 || workers > b->threads)
      return Status::Invalid(
          fmt::format("stage '{}' may have 1 to {} workers, not {}", stage, b->threads, workers));
    {
      std::lock_guard<std::mutex> lock(b->park_mu);
      b->active.store(workers, std::memory_order_release);
    }
    b->park_cv.notify_all();
    return Status::Ok();
  }
  return Status::NotFound(fmt::format("no stage named '{}' reads a field", stage));
}

std::map<int, std::string> Pipeline::Threads() const {
  std::lock_guard<std::mutex> lock(threads_mu_);
  return thread_stages_;
}

nlohmann::json Pipeline::Profile() const {
  std::vector<StageInfo> infos = StageInfos();
  uint64_t end = end_ns_.load();
  double wall = ((end ? end : NowNs()) - start_ns_) / 1e9;
  nlohmann::json j = BuildProfile(infos, wall);
  j["samples"] = {{"dealt", dealt_.load()},
                  {"failed", failed_.load(std::memory_order_acquire)},
                  {"refilled", refills_ok_.load()},
                  {"refill_failed", refills_failed_.load()}};
  j["errors"] = errors_.ToJson();  // read after failed_: see where failed_ grows
  j["samples_in_catalog"] = catalog_->size();
  if (catalog_->remote) j["storage"] = StorageStats();
  return j;
}

nlohmann::json Pipeline::StorageStats() const {
  return catalog_->remote ? catalog_->remote->Stats() : nlohmann::json();
}

}  // namespace mmfeed
