#include "stages/runtime/pipeline.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cstring>
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

uint64_t ErrorLog::total() const {
  std::lock_guard<std::mutex> lock(mu_);
  return total_;
}

nlohmann::json ErrorLog::ToJson() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {{"total", total_}, {"by_reason", by_reason_}, {"recent", recent_}};
}

std::vector<int64_t> Batch::BatchShape(size_t k) const {
  std::vector<int64_t> shape = specs[k].shape;
  shape.insert(shape.begin(), static_cast<int64_t>(ids.size()));
  return shape;
}

Tensor Batch::Collate(size_t k) const {
  Tensor t = Tensor::Make({specs[k].name, specs[k].dtype, BatchShape(k)});
  size_t per = specs[k].NumBytes();
  for (size_t i = 0; i < rows.size(); ++i) std::memcpy(t.data.data() + i * per, rows[i][k].data.data(), per);
  return t;
}

// ---------------------------------------------------------------- internals

// One sample's field on its way through one branch, and back to the join.
struct Pipeline::WorkItem {
  uint64_t seq = 0;       // dealing order on this node, across epochs
  uint64_t rank_seq = 0;  // order within the rank, across epochs
  uint32_t epoch = 0;
  uint32_t rank = 0;
  uint32_t entry = 0;  // catalog index
  int branch = -1;     // -1 on the join mailbox: "branch `done_branch` has no more items"
  bool last_in_epoch = false;
  std::vector<Tensor> out;
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
  std::atomic<int> live_workers{0};
  std::vector<int> cpus;
};

uint64_t Pipeline::samples_in_catalog() const { return catalog_->entries.size(); }

Result<std::unique_ptr<Pipeline>> Pipeline::Create(const PipelineConfig& cfg, std::vector<BatchSink*> sinks) {
  std::unique_ptr<Pipeline> p(new Pipeline());
  p->cfg_ = cfg;
  p->sinks_ = std::move(sinks);
  if (static_cast<int>(p->sinks_.size()) != cfg.consumers)
    return Status::Invalid("one batch sink per consumer rank is required");
  const StageConfig& batch = cfg.stages[cfg.batch_stage];
  std::set<std::string> needed, path_fields;
  for (const std::string& in : batch.inputs) {
    auto it = std::find_if(cfg.stages.begin(), cfg.stages.end(), [&](const StageConfig& s) { return s.name == in; });
    auto b = std::make_unique<Branch>(it->queue ? it->queue : std::max(8, 4 * it->workers));
    b->cfg = &*it;
    b->specs = it->stage->OutputSpecs();
    Result<std::vector<int>> cpus = CpusFor(it->placement);
    if (!cpus.ok()) return cpus.status().WithContext(fmt::format("stage '{}'", it->name));
    b->cpus = *cpus;
    needed.insert(it->field);
    if (it->schema->field_is_path) path_fields.insert(it->field);
    p->branches_.push_back(std::move(b));
  }
  for (auto& b : p->branches_) b->cfg = &*std::find_if(p->cfg_.stages.begin(), p->cfg_.stages.end(),
                                                         [&](const StageConfig& s) { return s.name == b->cfg->name; });
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
  for (auto& b : branches_) {
    b->live_workers = b->cfg->workers;
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
  uint64_t seq = 0;
  std::vector<uint64_t> rank_seq(consumers, 0);
  for (uint32_t epoch = 0; cfg_.source.epochs == 0 || epoch < static_cast<uint32_t>(cfg_.source.epochs); ++epoch) {
    std::vector<uint32_t> order = EpochOrder(catalog_->entries.size(), cfg_.source, epoch, consumers);
    for (size_t i = 0; i < order.size(); ++i) {
      if (stop_.load(std::memory_order_acquire)) goto done;
      uint64_t t0 = NowNs();
      uint32_t rank = static_cast<uint32_t>(i % consumers);
      for (size_t b = 0; b < branches_.size(); ++b) {
        auto item = std::make_unique<WorkItem>();
        item->seq = seq;
        item->rank_seq = rank_seq[rank];
        item->epoch = epoch;
        item->rank = rank;
        item->entry = order[i];
        item->branch = static_cast<int>(b);
        item->last_in_epoch = i + consumers >= order.size();
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
    else item->status = impl->Process(ctx, *field, &item->out);
    if (item->status.ok() && item->out.size() != b->specs.size())
      item->status = Status::Invalid(fmt::format("stage produced {} tensors, declared {}", item->out.size(), b->specs.size()));
    b->counters.busy_ns.fetch_add(NowNs() - t0, std::memory_order_relaxed);
    b->counters.cpu_ns.fetch_add(ThreadCpuNs() - c0, std::memory_order_relaxed);
    b->counters.items.fetch_add(1, std::memory_order_relaxed);
    if (!item->status.ok()) b->counters.errors.fetch_add(1, std::memory_order_relaxed);
    join_->Push(std::move(item), &b->counters.blocked_ns);
  }
  if (b->live_workers.fetch_sub(1) == 1) {
    auto done = std::make_unique<WorkItem>();
    done->branch = -1;
    join_->Push(std::move(done), &b->counters.blocked_ns);
  }
}

// Per-rank reorder buffer and the batch being filled.
struct Pipeline::RankState {
  struct Ready {
    uint32_t entry;
    uint32_t epoch;
    bool last_in_epoch;
    Status status;
    std::string stage;  // stage that failed, if any
    std::vector<std::vector<Tensor>> outs;
  };
  std::map<uint64_t, Ready> reorder;
  uint64_t next = 0;
  uint64_t batch_seq = 0;
  std::unique_ptr<Batch> batch;
};

void Pipeline::BatchLoop() {
  PinAndNameThisThread({}, "mmf:batch");
  const size_t nb = branches_.size();
  const int64_t bs = cfg_.batch_size;
  struct Pending {
    int arrived = 0;
    RankState::Ready ready;
    uint32_t rank = 0;
    uint64_t rank_seq = 0;
  };
  std::unordered_map<uint64_t, Pending> pending;
  std::vector<RankState> ranks(cfg_.consumers);
  std::vector<TensorSpec> specs;  // batch tensor order: branches in `inputs` order
  for (auto& b : branches_) specs.insert(specs.end(), b->specs.begin(), b->specs.end());
  bool failed = false;

  auto emit = [&](uint32_t rank) {
    RankState& rs = ranks[rank];
    std::unique_ptr<Batch> batch = std::move(rs.batch);
    batch->seq = rs.batch_seq++;
    uint64_t t0 = NowNs();
    sinks_[rank]->Put(std::move(batch));
    batch_counters_.blocked_ns.fetch_add(NowNs() - t0, std::memory_order_relaxed);
  };

  auto add_sample = [&](uint32_t rank, RankState::Ready& r) {
    const CatalogEntry& e = catalog_->entries[r.entry];
    if (!r.status.ok()) {
      batch_counters_.errors.fetch_add(1, std::memory_order_relaxed);
      if (cfg_.on_error == ErrorPolicy::kFail) {
        Fail(r.status.WithContext(fmt::format("{} ({})", e.origin, r.stage)));
        failed = true;
      } else {
        errors_.Add(e.origin, r.stage, r.status.CodeName(), r.status.message());
      }
      return;
    }
    RankState& rs = ranks[rank];
    if (rs.batch && rs.batch->epoch != r.epoch) emit(rank);
    if (!rs.batch) {
      rs.batch = std::make_unique<Batch>();
      rs.batch->rank = rank;
      rs.batch->epoch = r.epoch;
      rs.batch->specs = specs;
      rs.batch->rows.reserve(bs);
    }
    std::vector<Tensor> row;
    row.reserve(specs.size());
    for (auto& outs : r.outs)
      for (Tensor& t : outs) row.push_back(std::move(t));
    rs.batch->rows.push_back(std::move(row));
    rs.batch->ids.push_back(e.id);
    batch_counters_.items.fetch_add(1, std::memory_order_relaxed);
    if (static_cast<int64_t>(rs.batch->ids.size()) == bs) emit(rank);
  };

  size_t done_branches = 0;
  while (done_branches < nb) {
    std::unique_ptr<WorkItem> item = join_->Pop(&batch_counters_.starved_ns);
    if (item->branch < 0) {
      ++done_branches;
      continue;
    }
    batch_counters_.fill_sum.fetch_add(join_->SizeApprox(), std::memory_order_relaxed);
    batch_counters_.fill_samples.fetch_add(1, std::memory_order_relaxed);
    uint64_t t0 = NowNs(), c0 = ThreadCpuNs();
    Pending& p = pending[item->seq];
    if (p.arrived == 0) {
      p.ready.entry = item->entry;
      p.ready.epoch = item->epoch;
      p.ready.last_in_epoch = item->last_in_epoch;
      p.ready.outs.resize(nb);
      p.rank = item->rank;
      p.rank_seq = item->rank_seq;
    }
    // Every branch's tensors must match its declared specs, or the sample fails.
    if (item->status.ok())
      for (size_t k = 0; k < item->out.size(); ++k)
        if (item->out[k].data.size() != branches_[item->branch]->specs[k].NumBytes())
          item->status = Status::Invalid(fmt::format("tensor '{}' has {} bytes, expected {}",
                                                     branches_[item->branch]->specs[k].name,
                                                     item->out[k].data.size(), branches_[item->branch]->specs[k].NumBytes()));
    if (!item->status.ok() && p.ready.status.ok()) {
      p.ready.status = item->status;
      p.ready.stage = branches_[item->branch]->cfg->name;
    }
    p.ready.outs[item->branch] = std::move(item->out);
    if (++p.arrived == static_cast<int>(nb)) {
      RankState& rs = ranks[p.rank];
      rs.reorder.emplace(p.rank_seq, std::move(p.ready));
      pending.erase(item->seq);
      uint32_t rank = p.rank;
      while (!rs.reorder.empty() && rs.reorder.begin()->first == rs.next) {
        RankState::Ready r = std::move(rs.reorder.begin()->second);
        rs.reorder.erase(rs.reorder.begin());
        ++rs.next;
        if (failed) continue;
        add_sample(rank, r);
        if (r.last_in_epoch && rs.batch && !failed) {
          if (cfg_.drop_last) rs.batch.reset();
          else emit(rank);
        }
      }
    }
    batch_counters_.busy_ns.fetch_add(NowNs() - t0, std::memory_order_relaxed);
    batch_counters_.cpu_ns.fetch_add(ThreadCpuNs() - c0, std::memory_order_relaxed);
  }
  // Stopped mid-epoch: deliver what was batched so far rather than drop it.
  for (uint32_t r = 0; r < ranks.size(); ++r)
    if (ranks[r].batch && !failed) emit(r);
  for (BatchSink* s : sinks_) s->Finish();
  end_ns_.store(NowNs());
  finished_.store(true, std::memory_order_release);
}

nlohmann::json Pipeline::Profile() const {
  std::vector<StageInfo> infos;
  infos.push_back({"source", cfg_.source.type, 1, 0, &source_counters_});
  for (const auto& b : branches_)
    infos.push_back({b->cfg->name, b->cfg->type, b->cfg->workers, b->inbox.capacity(), &b->counters});
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
