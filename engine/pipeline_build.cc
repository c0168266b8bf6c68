// Pipeline::Create: the graph from a validated config (branches, tensors, placement, the
// catalog and its epochs); and the stream position: origin, stream tags, cursors, epoch
// lengths, Rewind. See engine/pipeline_internal.h for how the pipeline's files divide.
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
#include "engine/pipeline.h"
#include "engine/pipeline_internal.h"
#include "engine/trace.h"
#include "source/catalog.h"

namespace mmfeed {

Pipeline::Pipeline() : refills_(std::make_unique<RefillQueue>()) {}

Result<std::unique_ptr<Pipeline>> Pipeline::Create(const PipelineConfig& cfg,
                                                   std::vector<BatchSink*> sinks,
                                                   std::vector<StreamCursor> start) {
  std::unique_ptr<Pipeline> p(new Pipeline());
  p->cfg_ = cfg;
  p->sinks_ = std::move(sinks);
  if (!p->sinks_.empty() && static_cast<int>(p->sinks_.size()) != cfg.consumers)
    return Status::Invalid("one batch sink per consumer rank is required");
  std::set<std::string> needed, path_fields;  // what the source loads; which fields are files
  MMFEED_RETURN_IF_ERROR(p->BuildBranches(&needed, &path_fields));
  MMFEED_ASSIGN_OR_RETURN(BatchPlan plan, PlanBatch(p->cfg_));
  p->plan_ = std::move(plan);
  MMFEED_RETURN_IF_ERROR(p->LinkReaders());
  MMFEED_RETURN_IF_ERROR(p->MakeCaches());
  MMFEED_RETURN_IF_ERROR(p->ApplyPolicies());
  MMFEED_RETURN_IF_ERROR(p->LoadSource(needed, path_fields));
  p->rewinds_.resize(cfg.consumers);
  p->next_commit_ = std::make_unique<std::atomic<uint64_t>[]>(cfg.consumers);
  if (start.empty()) start.assign(cfg.consumers, StreamCursor{});
  MMFEED_RETURN_IF_ERROR(p->SetStart(std::move(start)));
  // The batch thread is woken every half batch of finished items, or for a failed sample (its
  // row is refilled at once).
  const size_t items_per_batch = static_cast<size_t>(cfg.batch_size) * p->branches_.size();
  p->join_ = std::make_unique<JoinBox>(256, std::clamp<size_t>(items_per_batch / 2, 1, 64));
  return p;
}

// One branch per input of the batch stage, with its threads (workers: auto shares the
// cpu_budget) and CPUs; `needed` gets the fields the source must load, `path_fields` those
// that name files.
Status Pipeline::BuildBranches(std::set<std::string>* needed, std::set<std::string>* path_fields) {
  // Branches point into the pipeline's own copy of the config.
  const std::vector<StageConfig>& stages = cfg_.stages;
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
    cpu_budget_ = cfg_.cpu_budget;
    if (!cpu_budget_) {
      Result<std::vector<int>> cpus = CpusFor(cfg_.placement);
      if (!cpus.ok()) return cpus.status().WithContext("placement");
      cpu_budget_ = static_cast<int>(cpus->size());
    }
    if (cpu_budget_ < fixed + autos)
      return Status::Invalid(fmt::format(
          "cpu_budget {}{} is less than the {} fixed worker(s) plus one for each of the {} "
          "stage(s) with workers: auto",
          cpu_budget_, cfg_.cpu_budget ? "" : " (the placement's CPUs)", fixed, autos));
  }
  const int shared = cpu_budget_ - fixed;
  int auto_index = 0;
  for (const std::string& in : stages[cfg_.batch_stage].inputs) {
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
    needed->insert(it->field);
    if (it->schema->field_is_path) path_fields->insert(it->field);
    b->read_fields = it->stage->ExtraInputs().fields;
    needed->insert(b->read_fields.begin(), b->read_fields.end());
    if (b->specs.size() > static_cast<size_t>(kMaxOutputs))
      return Status::Invalid(fmt::format("stage '{}' declares {} outputs, at most {}", it->name,
                                         b->specs.size(), kMaxOutputs));
    branches_.push_back(std::move(b));
  }
  return Status::Ok();
}

// Stages that read other stages' outputs run after them; one level (a stage that reads others
// is read by none), so that a sample's branches still finish in two steps.
Status Pipeline::LinkReaders() {
  for (size_t b = 0; b < branches_.size(); ++b) {
    Branch& br = *branches_[b];
    for (const std::string& name : br.cfg->stage->ExtraInputs().tensors) {
      const int t = plan_.TensorIndex(name);
      if (t < 0)
        return Status::Invalid(
            fmt::format("stage '{}' reads '{}', which no input of the batch stage outputs",
                        br.cfg->name, name));
      if (t == plan_.source)
        return Status::Invalid(fmt::format(
            "stage '{}' reads 'source', which the batch fills once it is complete", br.cfg->name));
      const size_t from = plan_.InputOf(t);
      if (from == b)
        return Status::Invalid(
            fmt::format("stage '{}' reads its own output '{}'", br.cfg->name, name));
      br.read_tensors.push_back(t);
      br.read_branches.push_back(from);
      br.reads_others = true;
      branches_[from]->read_by_others = true;
    }
  }
  for (const auto& b : branches_) {
    if (b->reads_others && b->read_by_others)
      return Status::Invalid(fmt::format(
          "stage '{}' reads another stage's outputs and is read by another: one level only",
          b->cfg->name));
    read_stages_ += b->read_by_others ? 1 : 0;
  }
  return Status::Ok();
}

// What the branches' samples may open (the source's folder and data_roots, by real path; the
// injected faults), and their threads against the CPUs they may use.
Status Pipeline::ApplyPolicies() {
  FilePolicy files;
  files.max_bytes = cfg_.source.max_bytes;
  if (!cfg_.data_roots_any) {
    std::vector<std::string> roots = cfg_.data_roots;
    for (const SourceConfig& s : cfg_.mixed() ? cfg_.sources : std::vector{cfg_.source})
      if (!s.remote)  // the folder above the path's first brace list or glob
        roots.push_back(std::filesystem::path(s.path.substr(0, s.path.find_first_of("{*?[")))
                            .parent_path()
                            .string());
    for (const std::string& r : roots) {
      std::error_code ec;
      std::string real = std::filesystem::canonical(r.empty() ? "." : r, ec).string();
      if (ec) return Status::Invalid(fmt::format("data root {}: {}", r, ec.message()));
      files.roots.push_back(real == "/" ? real : real + "/");
    }
  }
  for (auto& b : branches_) {
    b->files = files;
    if (b->cfg->name == cfg_.faults.stage) {  // injected faults, for tests of the profile
      b->files.read_delay_ms = cfg_.faults.read_delay_ms;
      b->leak_bytes_per_item = cfg_.faults.leak_bytes_per_item;
    }
  }
  // Worker threads against the CPUs they may use, per set of CPUs: oversubscription only
  // adds context switches; warn, or refuse under `placement: {strict: true}`.
  std::map<std::vector<int>, std::pair<int, bool>> budget;  // cpus -> (workers, strict)
  for (const auto& b : branches_) {
    auto& [workers, strict] = budget[b->cpus];
    workers += b->active.load();
    strict |= b->cfg->placement.strict || cfg_.placement.strict;
  }
  for (const auto& [cpus, use] : budget) {
    if (use.first <= static_cast<int>(cpus.size())) continue;
    std::string msg = fmt::format("{} worker threads on {} usable CPU(s) ({})", use.first,
                                  cpus.size(), CpuList(cpus));
    if (use.second) return Status::Invalid(fmt::format("placement: strict: {}", msg));
    spdlog::warn("{}: more workers than CPUs only adds context switches", msg);
  }
  Result<std::vector<int>> control_cpus = CpusFor(cfg_.placement);  // the source and batch threads
  if (!control_cpus.ok()) return control_cpus.status().WithContext("placement");
  control_cpus_ = *control_cpus;
  return Status::Ok();
}

// The catalog (its bad entries counted, or fatal under on_error: fail), each rank's share and
// the epoch's batches; with a token budget, every sample's cost and epoch 0's plan.
Status Pipeline::LoadSource(const std::set<std::string>& needed,
                            const std::set<std::string>& path_fields) {
  MMFEED_ASSIGN_OR_RETURN(Catalog cat, cfg_.mixed()
                                           ? LoadMixture(cfg_.sources, cfg_.mix, cfg_.source,
                                                         cfg_.consumers, needed, path_fields)
                                           : LoadCatalog(cfg_.source, needed, path_fields));
  for (const LoadError& e : cat.errors) {
    if (cfg_.on_error == ErrorPolicy::kFail)
      return Status::Corrupt(fmt::format("{}: {} (on_error: fail)", e.origin, e.reason));
    errors_.Add(e.origin, "source", "corrupt", e.reason);
  }
  if (cat.size() == 0)
    return Status::Invalid(fmt::format("{}: no usable samples{}", cfg_.source.path,
                                       cat.errors.empty() ? "" : ": " + errors_.Summary()));
  if (cat.size() > UINT32_MAX) return Status::TooLarge("more than 4G samples in one source");
  if (!cat.mixture && cat.size() / cfg_.source.num_nodes < static_cast<size_t>(cfg_.consumers))
    return Status::Invalid(fmt::format("{} samples cannot be dealt to {} node(s) x {} consumer(s)",
                                       cat.size(), cfg_.source.num_nodes, cfg_.consumers));
  catalog_ = std::make_shared<Catalog>(std::move(cat));
  if (catalog_->mixture) source_counts_ = std::make_unique<SourceCounts[]>(catalog_->parts.size());
  for (auto& b : branches_) b->files.remote = catalog_->remote_reader();
  std::vector<SampleCost> costs;  // token budgets: every sample's, measured
  if (cfg_.budgeted()) {
    MMFEED_ASSIGN_OR_RETURN(costs, MeasureCatalog());
  }
  MMFEED_ASSIGN_OR_RETURN(StreamPlan stream, StreamPlan::Make(cfg_, catalog_, std::move(costs)));
  stream_ = std::move(stream);
  return Status::Ok();
}

Status Pipeline::SetStart(std::vector<StreamCursor> start) {
  if (static_cast<int>(start.size()) != cfg_.consumers)
    return Status::Invalid(
        fmt::format("{} start cursor(s) for {} consumer rank(s)", start.size(), cfg_.consumers));
  const StreamPlan& plan = *stream_;
  const StreamOrigin& origin = plan.origin();
  for (size_t r = 0; r < start.size(); ++r) {
    StreamCursor c = start[r];
    c.stream = 0;  // the position only (a resume's stream is the supervisor's to check)
    Status st = plan.CheckCursor(c.seq);
    if (st.ok() && (c.epoch < origin.epoch || c.batch >= plan.EpochBatches(c.epoch) ||
                    c != plan.CursorAt(c.seq)))
      st = Status::Invalid(fmt::format(
          "cursor (epoch {}, batch {}, seq {}) is not where seq {} stands (epoch {}, batch {}; "
          "{} batches per epoch from epoch {}, seq {})",
          c.epoch, c.batch, c.seq, c.seq, plan.CursorAt(c.seq).epoch, plan.CursorAt(c.seq).batch,
          plan.budgeted() ? "this pipeline's" : std::to_string(plan.batches_per_epoch()),
          origin.epoch, origin.seq));
    if (!st.ok()) return st.WithContext(fmt::format("rank {}", r));
  }
  start_ = std::move(start);
  for (int r = 0; r < cfg_.consumers; ++r) next_commit_[r] = start_[r].seq;
  return Status::Ok();
}

Status Pipeline::SetOrigin(Origin origin) {
  MMFEED_ASSIGN_OR_RETURN(StreamPlan stream, stream_->WithOrigin(origin));
  stream_ = std::move(stream);
  start_.assign(cfg_.consumers, stream_->CursorAt(origin.seq));
  for (int r = 0; r < cfg_.consumers; ++r) next_commit_[r] = origin.seq;
  return Status::Ok();
}

// A cached stage's outputs must be the same in every epoch, and so must the tensors it reads.
Status Pipeline::MakeCaches() {
  for (auto& b : branches_) {
    if (!b->cfg->cache) continue;
    for (size_t from : b->read_branches) {
      const StageConfig& read = *branches_[from]->cfg;
      const WhyNot why = read.stage->WhyNotCacheable();
      if (why)
        return Status::Invalid(fmt::format(
            "{}:{}:{}: stage '{}' cannot be cached: it reads stage '{}', whose outputs change "
            "per epoch ({})",
            cfg_.file, b->cfg->cache_mark.line, b->cfg->cache_mark.column, b->cfg->name, read.name,
            *why));
    }
    // A ragged output keeps its rows only, unless another output counts its rows by it (an
    // image grid whose unused rows must stay zero: RaggedRows reads all of them).
    for (const TensorSpec& s : b->specs) {
      int from = -1;
      for (size_t j = 0; j < b->specs.size() && !s.rows_from.empty(); ++j)
        if (b->specs[j].name == s.rows_from) from = static_cast<int>(j);
      b->cache_rows_from.push_back(from);
    }
    for (int from : std::vector<int>(b->cache_rows_from))
      if (from >= 0) b->cache_rows_from[from] = -1;
    b->own_cache = b->cfg->stage->WhyNotCacheable().has_value();
    std::unique_ptr<SampleDisk> disk;
    if (!b->cfg->cache_disk_dir.empty()) {
      MMFEED_ASSIGN_OR_RETURN(disk, SampleDisk::Open(b->cfg->cache_disk_dir, b->cfg->name,
                                                     b->cfg->cache_disk_max_bytes));
    }
    b->cache = std::make_unique<SampleCache>(
        b->cfg->cache_max_bytes,
        [this](uint32_t entry, uint32_t after) { return stream_->NextUse(entry, after); },
        std::move(disk), b->cfg->cache_disk_max_bytes);
  }
  return Status::Ok();
}

Status Pipeline::Rewind(uint32_t rank, uint64_t from_seq) {
  if (cfg_.packed_stage >= 0)
    return Status::Unsupported(
        "a packed text stream cannot be resumed at a cursor (its rows cross batches)");
  if (rank >= static_cast<uint32_t>(cfg_.consumers))
    return Status::Invalid(fmt::format("rank {} out of range", rank));
  if (sinks_.empty()) return Status::Invalid("a pipeline only built serves no rank");
  MMFEED_RETURN_IF_ERROR(stream_->CheckCursor(from_seq));
  std::lock_guard<std::mutex> lock(rewind_mu_);
  if (source_exited_)
    return Status::Closed(fmt::format(
        "the run has ended; rank {} cannot be served from batch {} again", rank, from_seq));
  RankRewind& rw = rewinds_[rank];
  ++rw.gen;
  rw.to = stream_->CursorAt(from_seq);
  rw.source_pending = rw.collator_pending = true;
  rewind_pending_.store(true, std::memory_order_release);
  sinks_[rank]->DropPublished();
  next_commit_[rank].store(from_seq, std::memory_order_release);
  spdlog::info("rank {}: rewound to batch {} (epoch {}, batch {} of the epoch)", rank, from_seq,
               rw.to.epoch, rw.to.batch);
  return Status::Ok();
}

}  // namespace mmfeed
