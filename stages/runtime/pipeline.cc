#include "stages/runtime/pipeline.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <array>
#include <cstring>
#include <set>
#include <map>
#include <unordered_map>

#include "stages/runtime/mailbox.h"
#include "stages/runtime/numa.h"
#include "stages/source/catalog.h"

namespace mmfeed {

// ---------------------------------------------------------------- errors

void ErrorLog::Add(const std::string& origin, const std::string& stage, const std::string& reason_code,
                   const std::string& message) {
  spdlog::warn("skipped {} ({}): {}", origin, stage, message);
  std::lock_guard<std::mutex> lock(mu_);
  ++total_;
  ++by_reason_[reason_code];
  if (recent_.size() >= 100) recent_.erase(recent_.begin());
  recent_.push_back({{"origin", origin}, {"stage", stage}, {"reason", reason_code}, {"message", message}});
}

nlohmann::json ErrorLog::ToJson() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {{"total", total_}, {"by_reason", by_reason_}, {"recent", recent_}};
}

// ---------------------------------------------------------------- internals

// A batch as the source laid it out: `rows` samples, row i for the rank's i-th sample of it.
// Immutable once made; shared by the work items that write into it and the collator.
struct Pipeline::Provisional {
  BatchMemory memory;
  uint64_t index = 0;  // provisional batch number within the rank
  uint32_t epoch = 0;
  int rows = 0;
};

constexpr int kMaxOutputs = 16;  // tensors per stage (the ring holds 16 per batch anyway)

// One sample's field on its way through one branch, and back to the join. The source also
// sends one marker per rank to the join (branch -2): "rank `rank` was dealt `rank_seq`
// samples in all".
struct Pipeline::WorkItem {
  uint64_t seq = 0;       // dealing order on this node, across epochs
  uint64_t rank_seq = 0;  // order within the rank, across epochs
  uint32_t epoch = 0;
  uint32_t rank = 0;
  uint32_t entry = 0;  // catalog index
  int branch = -1;
  bool last_in_epoch = false;  // the rank's last sample of the epoch
  std::shared_ptr<const Provisional> batch;
  int row = 0;
  std::array<uint8_t*, kMaxOutputs> out{};
  Status status;
};

class JoinBox : public Mailbox<std::unique_ptr<Pipeline::WorkItem>> {
 public:
  using Mailbox::Mailbox;
};

struct Pipeline::Branch {
  explicit Branch(size_t capacity) : inbox(capacity) {}
  const StageConfig* cfg = nullptr;
  std::vector<TensorSpec> specs;
  Mailbox<std::unique_ptr<WorkItem>> inbox;
  StageCounters counters;
  std::vector<int> cpus;
};

Result<std::unique_ptr<Pipeline>> Pipeline::Create(const PipelineConfig& cfg, std::vector<BatchSink*> sinks) {
  std::unique_ptr<Pipeline> p(new Pipeline());
  p->cfg_ = cfg;
  p->sinks_ = std::move(sinks);
  if (static_cast<int>(p->sinks_.size()) != cfg.consumers)
    return Status::Invalid("one batch sink per consumer rank is required");
  // Branches point into the pipeline's own copy of the config.
  const std::vector<StageConfig>& stages = p->cfg_.stages;
  std::set<std::string> needed, path_fields;
  for (const std::string& in : stages[cfg.batch_stage].inputs) {
    auto it = std::find_if(stages.begin(), stages.end(), [&](const StageConfig& s) { return s.name == in; });
    auto b = std::make_unique<Branch>(it->queue ? it->queue : std::max(8, 4 * it->workers));
    b->cfg = &*it;
    b->specs = it->stage->OutputSpecs();
    Result<std::vector<int>> cpus = CpusFor(it->placement);
    if (!cpus.ok()) return cpus.status().WithContext(fmt::format("stage '{}'", it->name));
    b->cpus = *cpus;
    needed.insert(it->field);
    if (it->schema->field_is_path) path_fields.insert(it->field);
    if (b->specs.size() > static_cast<size_t>(kMaxOutputs))
      return Status::Invalid(fmt::format("stage '{}' declares {} outputs, at most {}", it->name, b->specs.size(), kMaxOutputs));
    p->first_tensor_.push_back(p->first_tensor_.empty() ? 0 : p->first_tensor_.back() + p->branches_.back()->specs.size());
    p->branches_.push_back(std::move(b));
  }
  p->specs_ = BatchSpecs(p->cfg_);
  Result<Catalog> cat = LoadCatalog(cfg.source, needed, path_fields);
  if (!cat.ok()) return cat.status();
  for (const LoadError& e : cat->errors) {
    if (cfg.on_error == ErrorPolicy::kFail)
      return Status::Corrupt(fmt::format("{}: {} (on_error: fail)", e.origin, e.reason));
    p->errors_.Add(e.origin, "source", "corrupt", e.reason);
  }
  if (cat->entries.empty()) return Status::Invalid(fmt::format("{}: no usable samples", cfg.source.path));
  if (cat->entries.size() > UINT32_MAX) return Status::TooLarge("more than 4G samples in one source");
  if (cat->entries.size() / cfg.source.num_nodes < static_cast<size_t>(cfg.consumers))
    return Status::Invalid(fmt::format("{} samples cannot be dealt to {} node(s) x {} consumer(s)",
                                       cat->entries.size(), cfg.source.num_nodes, cfg.consumers));
  p->catalog_ = std::make_shared<Catalog>(std::move(cat.value()));
  p->join_ = std::make_unique<JoinBox>(256);
  return p;
}

Pipeline::~Pipeline() {
  RequestStop();
  Wait();
}

Status Pipeline::Start() {
  start_ns_ = NowNs();
  spdlog::info("pipeline '{}': {} samples, {} consumer rank(s), batch {}", cfg_.name, catalog_->entries.size(),
               cfg_.consumers, cfg_.batch_size);
  threads_.emplace_back([this] { BatchLoop(); });
  for (auto& b : branches_) live_workers_ += b->cfg->workers;
  for (auto& b : branches_) {
    for (int w = 0; w < b->cfg->workers; ++w) threads_.emplace_back([this, br = b.get(), w] { WorkerLoop(br, w); });
  }
  threads_.emplace_back([this] { SourceLoop(); });
  return Status::Ok();
}

void Pipeline::RequestStop() { stop_.store(true, std::memory_order_release); }

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
  spdlog::error("stopping (on_error: fail): {}", st.message());
  RequestStop();
}

void Pipeline::SourceLoop() {
  PinAndNameThisThread({}, "mmf:source");
  const int consumers = cfg_.consumers;
  const int64_t bs = cfg_.batch_size;
  uint64_t seq = 0;
  std::vector<uint64_t> rank_seq(consumers, 0), batches(consumers, 0);
  std::vector<std::shared_ptr<const Provisional>> open(consumers);
  std::vector<int> next_row(consumers, 0);
  for (uint32_t epoch = 0; cfg_.source.epochs == 0 || epoch < static_cast<uint32_t>(cfg_.source.epochs); ++epoch) {
    std::vector<uint32_t> order = EpochOrder(catalog_->entries.size(), cfg_.source, epoch, consumers);
    const size_t per_rank = order.size() / consumers;
    for (size_t i = 0; i < order.size(); ++i) {
      if (stop_.load(std::memory_order_acquire)) goto done;
      uint64_t t0 = NowNs();
      const uint32_t rank = static_cast<uint32_t>(i % consumers);
      const size_t pos = i / consumers;  // position within the rank's share of the epoch
      if (pos % bs == 0) {  // first sample of a batch: reserve its memory
        auto pb = std::make_shared<Provisional>();
        pb->index = batches[rank]++;
        pb->epoch = epoch;
        pb->rows = static_cast<int>(std::min<size_t>(bs, per_rank - pos));
        source_counters_.busy_ns.fetch_add(NowNs() - t0, std::memory_order_relaxed);
        uint64_t w0 = NowNs();
        bool ok = sinks_[rank]->Reserve(&pb->memory);
        source_counters_.blocked_ns.fetch_add(NowNs() - w0, std::memory_order_relaxed);
        t0 = NowNs();
        if (!ok) goto done;
        open[rank] = std::move(pb);
        next_row[rank] = 0;
      }
      const int row = next_row[rank]++;
      for (size_t b = 0; b < branches_.size(); ++b) {
        auto item = std::make_unique<WorkItem>();
        item->seq = seq;
        item->rank_seq = rank_seq[rank];
        item->epoch = epoch;
        item->rank = rank;
        item->entry = order[i];
        item->branch = static_cast<int>(b);
        item->last_in_epoch = pos + 1 == per_rank;
        item->batch = open[rank];
        item->row = row;
        for (size_t k = 0; k < branches_[b]->specs.size(); ++k) {
          size_t t = first_tensor_[b] + k;
          item->out[k] = open[rank]->memory.base[t] + row * specs_[t].NumBytes();
        }
        source_counters_.busy_ns.fetch_add(NowNs() - t0, std::memory_order_relaxed);
        branches_[b]->inbox.Push(std::move(item), &source_counters_.blocked_ns);
        t0 = NowNs();
      }
      source_counters_.items.fetch_add(1, std::memory_order_relaxed);
      ++seq;
      ++rank_seq[rank];
    }
  }
done:
  // Tell the collator how many samples each rank got, so it can close partial batches.
  for (int r = 0; r < consumers; ++r) {
    auto end = std::make_unique<WorkItem>();
    end->branch = -2;
    end->rank = static_cast<uint32_t>(r);
    end->rank_seq = rank_seq[r];
    join_->Push(std::move(end), &source_counters_.blocked_ns);
  }
  for (auto& b : branches_) b->inbox.Close(b->cfg->workers);
}

void Pipeline::WorkerLoop(Branch* b, int worker) {
  Status pin = PinAndNameThisThread(b->cpus, fmt::format("mmf:{}:{}", b->cfg->name, worker));
  if (!pin.ok()) spdlog::warn("{}", pin.message());
  std::unique_ptr<StageWorker> impl = b->cfg->stage->NewWorker();
  while (true) {
    std::unique_ptr<WorkItem> item = b->inbox.Pop(&b->counters.starved_ns);
    if (!item) break;
    b->counters.fill_sum.fetch_add(b->inbox.SizeApprox(), std::memory_order_relaxed);
    b->counters.fill_samples.fetch_add(1, std::memory_order_relaxed);
    uint64_t t0 = NowNs(), c0 = ThreadCpuNs();
    const CatalogEntry& e = catalog_->entries[item->entry];
    const FieldValue* field = nullptr;
    for (const auto& kv : e.fields)
      if (kv.first == b->cfg->field) field = &kv.second;
    SampleContext ctx{cfg_.source.seed, item->epoch, e.id, e.origin};
    if (!field) item->status = Status::NotFound(fmt::format("sample has no field '{}'", b->cfg->field));
    else item->status = impl->Process(ctx, *field, OutputRow(item->out.data(), b->specs.size()));
    b->counters.busy_ns.fetch_add(NowNs() - t0, std::memory_order_relaxed);
    b->counters.cpu_ns.fetch_add(ThreadCpuNs() - c0, std::memory_order_relaxed);
    b->counters.items.fetch_add(1, std::memory_order_relaxed);
    if (!item->status.ok()) b->counters.errors.fetch_add(1, std::memory_order_relaxed);
    join_->Push(std::move(item), &b->counters.blocked_ns);
  }
  if (live_workers_.fetch_sub(1, std::memory_order_acq_rel) == 1) join_->Close(1);  // the last worker of all
}

// Turns one rank's samples, taken in the rank's order, into committed batches. Samples were
// written into their provisional rows by the workers; a failed sample leaves a hole, which the
// next successful sample of the rank fills (one row copy, only after an error). Batches are
// committed in order; a batch's content depends only on the data, never on timing.
// Runs on the batch thread only.
class Pipeline::Collator {
 public:
  Collator(Pipeline* p, uint32_t rank) : p_(p), rank_(rank) {}

  // Takes the rank's next sample (in rank order).
  void Add(const WorkItem& s, const Status& status, const std::string& failed_stage) {
    ++taken_;
    Open& own = Get(s.batch);
    ++own.processed;
    Open& front = open_.begin()->second;
    const CatalogEntry& e = p_->catalog_->entries[s.entry];
    if (!status.ok()) {
      own.holes.insert(s.row);
      p_->SampleFailed(e, failed_stage, status);
    } else if (&own == &front || front.holes.empty()) {
      own.ids[s.row] = e.id;
    } else {  // an earlier batch still has a hole: this sample fills it
      int hole = *front.holes.begin();
      front.holes.erase(front.holes.begin());
      MoveRow(*own.batch, s.row, *front.batch, hole);
      front.ids[hole] = e.id;
      own.holes.insert(s.row);
    }
    while (!open_.empty()) {
      Open& f = open_.begin()->second;
      if (f.processed < f.batch->rows || !f.holes.empty()) break;
      CommitFront(f.batch->rows);
    }
    if (s.last_in_epoch) Close();
  }

  // Closes every open batch once `total` samples were taken (the source stopped early).
  void EndAt(uint64_t total) { end_at_ = total; }
  bool AtEnd() const { return end_at_ != UINT64_MAX && taken_ == end_at_; }

  // No more samples for these open batches: move rows from the last ones into the first
  // ones' holes, then commit them short (or discard if empty, or short under drop_last).
  void Close() {
    while (!open_.empty()) {
      Open& f = open_.begin()->second;
      // Only rows below `processed` were written; the rest of a partly dealt batch are holes.
      for (int r = f.processed; r < f.batch->rows; ++r) f.holes.insert(r);
      // Pull rows from later batches (last first) into this one's holes.
      for (auto it = std::prev(open_.end()); it != open_.begin() && !f.holes.empty();) {
        Open& src = it->second;
        int r = LastFilled(src);
        if (r < 0) {
          --it;
          continue;
        }
        int hole = *f.holes.begin();
        f.holes.erase(f.holes.begin());
        MoveRow(*src.batch, r, *f.batch, hole);
        f.ids[hole] = std::move(src.ids[r]);
        src.holes.insert(r);
      }
      // Compact within the batch: its last rows into its first holes.
      int n = f.batch->rows - static_cast<int>(f.holes.size());
      for (int last = f.batch->rows - 1; !f.holes.empty() && *f.holes.begin() < n; --last) {
        if (f.holes.count(last)) continue;
        int hole = *f.holes.begin();
        f.holes.erase(f.holes.begin());
        MoveRow(*f.batch, last, *f.batch, hole);
        f.ids[hole] = std::move(f.ids[last]);
        f.holes.insert(last);
      }
      if (n == 0 || (p_->cfg_.drop_last && n < p_->cfg_.batch_size)) {
        p_->sinks_[rank_]->Discard(f.batch->memory);
        open_.erase(open_.begin());
      } else {
        CommitFront(n);
      }
    }
  }

  // Gives every open batch back unpublished (after on_error: fail).
  void DiscardAll() {
    for (auto& [index, o] : open_) p_->sinks_[rank_]->Discard(o.batch->memory);
    open_.clear();
  }

 private:
  struct Open {
    std::shared_ptr<const Provisional> batch;
    std::vector<std::string> ids;
    std::set<int> holes;
    int processed = 0;  // own samples taken so far
  };

  Open& Get(const std::shared_ptr<const Provisional>& b) {
    auto it = open_.find(b->index);
    if (it != open_.end()) return it->second;
    Open& o = open_[b->index];
    o.batch = b;
    o.ids.resize(b->rows);
    return o;
  }

  static int LastFilled(const Open& o) {
    for (int r = o.processed - 1; r >= 0; --r)
      if (!o.holes.count(r)) return r;
    return -1;
  }

  void MoveRow(const Provisional& from, int from_row, const Provisional& to, int to_row) {
    for (size_t k = 0; k < p_->specs_.size(); ++k) {
      size_t n = p_->specs_[k].NumBytes();
      std::memmove(to.memory.base[k] + to_row * n, from.memory.base[k] + from_row * n, n);
    }
  }

  void CommitFront(int n) {
    Open& f = open_.begin()->second;
    BatchInfo info;
    info.rank = rank_;
    info.seq = committed_++;
    info.epoch = f.batch->epoch;
    info.rows = static_cast<uint32_t>(n);
    info.ids.assign(std::make_move_iterator(f.ids.begin()), std::make_move_iterator(f.ids.begin() + n));
    uint64_t t0 = NowNs();
    p_->sinks_[rank_]->Commit(f.batch->memory, info);
    p_->batch_counters_.blocked_ns.fetch_add(NowNs() - t0, std::memory_order_relaxed);
    open_.erase(open_.begin());
  }

  Pipeline* p_;
  uint32_t rank_;
  std::map<uint64_t, Open> open_;  // by provisional index; the first is the one being filled
  uint64_t taken_ = 0, committed_ = 0, end_at_ = UINT64_MAX;
};

void Pipeline::SampleFailed(const CatalogEntry& e, const std::string& stage, const Status& st) {
  batch_counters_.errors.fetch_add(1, std::memory_order_relaxed);
  if (cfg_.on_error == ErrorPolicy::kFail) Fail(st.WithContext(fmt::format("{} ({})", e.origin, stage)));
  else errors_.Add(e.origin, stage, st.CodeName(), st.message());
}

void Pipeline::BatchLoop() {
  PinAndNameThisThread({}, "mmf:batch");
  const size_t nb = branches_.size();
  struct Pending {
    int arrived = 0;
    Status status;
    std::string failed_stage;
    std::unique_ptr<WorkItem> first;
  };
  std::unordered_map<uint64_t, Pending> pending;                 // by seq: branches so far
  std::vector<std::map<uint64_t, Pending>> reorder(cfg_.consumers);  // by rank_seq: joined
  std::vector<uint64_t> next(cfg_.consumers, 0);
  std::vector<Collator> collators;
  for (int r = 0; r < cfg_.consumers; ++r) collators.emplace_back(this, static_cast<uint32_t>(r));
  bool failed = false;

  auto drain_rank = [&](uint32_t rank) {
    auto& ro = reorder[rank];
    while (!ro.empty() && ro.begin()->first == next[rank]) {
      Pending j = std::move(ro.begin()->second);
      ro.erase(ro.begin());
      ++next[rank];
      if (failed) continue;
      collators[rank].Add(*j.first, j.status, j.failed_stage);
      batch_counters_.items.fetch_add(1, std::memory_order_relaxed);
      failed = !status().ok();
    }
    if (!failed && collators[rank].AtEnd()) collators[rank].Close();
  };

  while (std::unique_ptr<WorkItem> item = join_->Pop(&batch_counters_.starved_ns)) {
    uint64_t t0 = NowNs(), c0 = ThreadCpuNs();
    if (item->branch == -2) {
      collators[item->rank].EndAt(item->rank_seq);
      drain_rank(item->rank);
    } else {
      batch_counters_.fill_sum.fetch_add(join_->SizeApprox(), std::memory_order_relaxed);
      batch_counters_.fill_samples.fetch_add(1, std::memory_order_relaxed);
      Pending& p = pending[item->seq];
      if (!item->status.ok() && p.status.ok()) {
        p.status = item->status;
        p.failed_stage = branches_[item->branch]->cfg->name;
      }
      if (!p.first) p.first = std::move(item);
      if (++p.arrived == static_cast<int>(nb)) {
        uint32_t rank = p.first->rank;
        uint64_t key = p.first->rank_seq, seq = p.first->seq;
        reorder[rank].emplace(key, std::move(p));
        pending.erase(seq);
        drain_rank(rank);
      }
    }
    batch_counters_.busy_ns.fetch_add(NowNs() - t0, std::memory_order_relaxed);
    batch_counters_.cpu_ns.fetch_add(ThreadCpuNs() - c0, std::memory_order_relaxed);
  }
  for (Collator& c : collators) {
    if (failed) c.DiscardAll();
    else c.Close();
  }
  for (BatchSink* s : sinks_) s->Finish();
  end_ns_.store(NowNs());
  finished_.store(true, std::memory_order_release);
}

nlohmann::json Pipeline::Profile() const {
  std::vector<StageInfo> infos;
  infos.push_back({"source", cfg_.source.type, 1, 0, &source_counters_});
  for (const auto& b : branches_)
    infos.push_back({b->cfg->name, b->cfg->type, b->cfg->workers, b->inbox.capacity(), &b->counters, b->cfg->stage->Metrics()});
  infos.push_back({cfg_.stages[cfg_.batch_stage].name, "batch", 1, join_->capacity(), &batch_counters_});
  infos.insert(infos.end(), extra_infos_.begin(), extra_infos_.end());
  uint64_t end = end_ns_.load();
  double wall = ((end ? end : NowNs()) - start_ns_) / 1e9;
  nlohmann::json j = BuildProfile(infos, wall);
  j["errors"] = errors_.ToJson();
  j["samples_in_catalog"] = catalog_->entries.size();
  return j;
}

}  // namespace mmfeed
