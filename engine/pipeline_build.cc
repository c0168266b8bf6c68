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
  if (static_cast<int>(p->sinks_.size()) != cfg.consumers)
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
  p->Fingerprint();
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
      if (!s.remote) roots.push_back(std::filesystem::path(s.path).parent_path().string());
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
  per_rank_ = catalog_->mixture ? catalog_->mixture->per_lane()
                                : catalog_->size() / cfg_.source.num_nodes / cfg_.consumers;
  const uint64_t bs = static_cast<uint64_t>(cfg_.batch_size);
  batches_per_epoch_ = BatchesOf(per_rank_);
  if (cfg_.budgeted()) {
    budget_ = {cfg_.batch_size, cfg_.max_tokens, cfg_.max_patches};
    MMFEED_RETURN_IF_ERROR(MeasureCatalog());
    std::shared_ptr<const EpochPlan> first = PlanOf(0);
    if (!first->status.ok()) return first->status;
    batches_per_epoch_ = first->batches;
    // Every epoch has at least this many batches: its steps hold all but fewer than streams()
    // of the usable samples dealt, at most batch_size a stream each.
    const uint64_t usable = static_cast<uint64_t>(
        std::count_if(costs_.begin(), costs_.end(), [](auto& c) { return c.usable(); }));
    const uint64_t dealt = streams() * per_rank_,
                   left_out = catalog_->size() > dealt ? catalog_->size() - dealt : 0;
    const uint64_t stepped = usable > left_out + streams() ? usable - left_out - streams() : 0;
    min_epoch_batches_ = std::max<uint64_t>(1, stepped / streams() / bs);
  }
  if (batches_per_epoch_ == 0)
    return Status::Invalid(
        fmt::format("each rank gets {} samples per epoch, fewer than batch_size {} with drop_last",
                    per_rank_, bs));
  return Status::Ok();
}

// The fingerprint: the order's version ("order 2": the shuffle is a Feistel permutation; a
// cursor saved by a daemon that shuffled with a table is for another stream), every catalog
// id in order, then the settings (each stage's full config stands in for its sample-changing
// parameters).
void Pipeline::Fingerprint() {
  uint64_t h =
      HashString(fmt::format("order 2|{}|{}|{}|{}|{}|{}|{}|{}", cfg_.source.seed,
                             cfg_.source.shuffle, cfg_.source.node_rank, cfg_.source.num_nodes,
                             cfg_.consumers, cfg_.batch_size, cfg_.drop_last, cfg_.source.epochs));
  if (cfg_.source.shuffle_window > 0)  // window mode: another order
    h = HashString(fmt::format("windows {}", cfg_.source.shuffle_window), h);
  for (const auto& [field, key] : cfg_.source.keys)  // a manifest's fields read from other keys
    h = HashString(fmt::format("key {}={}", field, key), h);
  if (catalog_->indexed())  // an indexed source: its contents (size, mtime, inode, ends)
    h = HashString(fmt::format("index {:016x}", catalog_->index_fingerprint()), h);
  if (cfg_.budgeted()) {  // the budgets and every sample's cost decide the batches
    h = HashString(fmt::format("budget {}|{}", cfg_.max_tokens, cfg_.max_patches), h);
    h = HashString(std::string_view(reinterpret_cast<const char*>(costs_.data()),
                                    costs_.size() * sizeof(SampleCost)),
                   h);
  }
  // The order tag: what decides the epochs' global order, without the shape.
  uint64_t o = HashString(fmt::format("position 1|{}|{}|{}", cfg_.source.seed, cfg_.source.shuffle,
                                      cfg_.source.epochs));
  if (catalog_->InWindows(cfg_.source))
    o = HashString(fmt::format("windows {}", cfg_.source.shuffle_window), o);
  for (const auto& [field, key] : cfg_.source.keys)
    o = HashString(fmt::format("key {}={}", field, key), o);
  if (catalog_->indexed())
    o = HashString(fmt::format("index {:016x}", catalog_->index_fingerprint()), o);
  for (const CatalogEntry& e : catalog_->entries) {
    h = HashString(e.id, HashString("\n", h));
    o = HashString(e.id, HashString("\n", o));
  }
  order_tag_ = static_cast<uint32_t>(o) | 1;  // never 0
  order_fingerprint_ = fmt::format("{:016x}", h);
  origin_.stream = FirstStreamTag(order_fingerprint_);
  for (const StageConfig& s : cfg_.stages)
    h = HashString(fmt::format("{}|{}|{}|{}", s.name, s.type, s.field, s.params.Canonical()), h);
  fingerprint_ = fmt::format("{:016x}", h);
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

Result<std::shared_ptr<const Mixture>> Pipeline::NumberingOf(uint64_t base, uint32_t lanes,
                                                             uint32_t nodes) const {
  const std::shared_ptr<const Mixture>& own = catalog_->mixture;
  if (!own || base == 0) return std::shared_ptr<const Mixture>();
  if (lanes == 0)
    return Status::Invalid(
        "the cursor does not name the shape its mixture position counts in (its \"lanes\"; a "
        "cursor saved by an older client)");
  // A source in shard windows numbers its draws node by node: the nodes count too.
  const bool by_node = WindowedSource() != nullptr;
  if (by_node && (nodes == 0 || lanes % nodes != 0))
    return Status::Invalid(fmt::format(
        "the cursor does not name the nodes its mixture position counts in (its \"nodes\", "
        "which a mixture with a source in shard windows needs besides its {} lanes)",
        lanes));
  if (lanes == own->lanes() && (!by_node || nodes == static_cast<uint32_t>(cfg_.source.num_nodes)))
    return own;
  Result<Mixture> m = own->WithLanes(lanes, by_node ? lanes / nodes : 0);
  if (!m.ok())
    return m.status().WithContext(
        fmt::format("the mixture dealt to the cursor's {} consumer rank(s)", lanes));
  return std::make_shared<const Mixture>(std::move(m.value()));
}

Status Pipeline::SetOrigin(Origin origin) {
  MMFEED_ASSIGN_OR_RETURN(numbering_, NumberingOf(origin.base, origin.lanes, origin.nodes));
  origin.lanes = LanesOf(origin.base, origin.lanes);
  origin.nodes = NodesOf(numbering_.get(), origin.nodes);
  origin_ = origin;
  {  // the origin epoch's plan depends on the base
    std::lock_guard<std::mutex> lock(plans_mu_);
    epoch_starts_.clear();
    plans_.clear();
    epoch_batches_.clear();
  }
  start_.assign(cfg_.consumers, CursorAt(origin.seq));
  for (int r = 0; r < cfg_.consumers; ++r) next_commit_[r] = origin.seq;
  return Status::Ok();
}

uint32_t Pipeline::LanesOf(uint64_t base, uint32_t lanes) const {
  if (catalog_->mixture) return lanes;
  // Shard windows: the nodes whose parts the base's order interleaves (a cursor without them is
  // of one node's windows, the only windowed order with positions before they were named).
  if (base && catalog_->InWindows(cfg_.source)) return std::max(lanes, 1u);
  return 0;
}

uint32_t Pipeline::NodesOf(const Mixture* numbering, uint32_t nodes) const {
  return numbering && WindowedSource() ? nodes : 0;
}

uint64_t Pipeline::PositionsOf(const Mixture* numbering, uint32_t lanes) const {
  uint64_t n = catalog_->size();
  if (numbering)
    n = numbering->per_lane() * numbering->lanes();
  else if (lanes)
    n = n / lanes * lanes;  // shard windows: the lanes' equal parts
  return n;
}

uint64_t Pipeline::PerRankFrom(uint64_t base, const Mixture* numbering, uint32_t lanes) const {
  const uint64_t n = PositionsOf(numbering, lanes);
  return (n - std::min(base, n)) / streams();
}

EpochOrder Pipeline::OrderOf(uint32_t epoch) const {
  const uint64_t base = BaseOf(epoch);
  return EpochOrder(*catalog_, cfg_.source, epoch, cfg_.consumers, base,
                    base ? numbering_.get() : nullptr, base ? origin_.lanes : 0);
}

struct Pipeline::EpochInverse {
  explicit EpochInverse(EpochOrder o) : order(std::move(o)) {}
  EpochOrder order;
  std::vector<uint32_t> at;  // not invertible(): per entry its first position (UINT32_MAX: none)
  uint64_t PositionOf(uint32_t entry) const {
    if (order.invertible()) return order.PositionOf(entry);
    return entry < at.size() && at[entry] != UINT32_MAX ? at[entry] : EpochOrder::kNowhere;
  }
};

std::shared_ptr<const Pipeline::EpochInverse> Pipeline::InverseOf(uint32_t epoch) const {
  {
    std::lock_guard<std::mutex> lock(inverse_mu_);
    auto it = inverses_.find(epoch);
    if (it != inverses_.end()) return it->second;
  }
  auto inv = std::make_shared<EpochInverse>(OrderOf(epoch));
  if (!inv->order.invertible()) {
    inv->at.assign(catalog_->size(), UINT32_MAX);
    for (size_t i = inv->order.size(); i-- > 0;) inv->at[inv->order[i]] = static_cast<uint32_t>(i);
  }
  std::lock_guard<std::mutex> lock(inverse_mu_);
  auto& kept = inverses_[epoch];
  if (!kept) kept = std::move(inv);
  while (inverses_.size() > 8) inverses_.erase(inverses_.begin());  // the oldest epochs
  return kept;
}

uint64_t Pipeline::NextUse(uint32_t entry, uint32_t after) const {
  for (uint32_t e = after + 1; e <= after + kFutureEpochs; ++e) {
    if (cfg_.source.epochs > 0 && e >= static_cast<uint32_t>(cfg_.source.epochs)) break;
    const uint64_t pos = InverseOf(e)->PositionOf(entry);
    if (pos != EpochOrder::kNowhere) return (uint64_t{e} << 32) | pos;
  }
  return SampleCache::kNever;
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
        [this](uint32_t entry, uint32_t after) { return NextUse(entry, after); }, std::move(disk),
        b->cfg->cache_disk_max_bytes);
  }
  return Status::Ok();
}

uint64_t Pipeline::BatchesOf(uint64_t per_rank) const {
  const uint64_t bs = static_cast<uint64_t>(cfg_.batch_size);
  return cfg_.drop_last ? per_rank / bs : (per_rank + bs - 1) / bs;
}

uint64_t Pipeline::PerRank(uint32_t epoch) const {
  return BaseOf(epoch) ? PerRankFrom(BaseOf(epoch), numbering_.get(), origin_.lanes) : per_rank_;
}

int Pipeline::RowsOf(uint32_t epoch, uint64_t index) const {
  const uint64_t bs = static_cast<uint64_t>(cfg_.batch_size);
  return static_cast<int>(std::min(bs, PerRank(epoch) - index * bs));
}

WhyNot Pipeline::why_not_positional() const {
  if (catalog_->mixture && !catalog_->mixture->switches().empty())
    return "the mixture's weights changed at a batch boundary";
  if (cfg_.packed_stage >= 0) return "a packed text stream's rows cross batches";
  if (budgeted() && catalog_->mixture &&
      catalog_->mixture->per_lane() * catalog_->mixture->lanes() > UINT32_MAX)
    return "a token-budget mixture's epoch holds 4G draws or more (the rings carry a budgeted "
           "position in 32 bits)";
  return std::nullopt;
}

uint64_t Pipeline::StepStart(const StreamCursor& c) const {
  if (c.batch == 0) return BaseOf(c.epoch);
  const std::shared_ptr<const EpochPlan> plan = PlanOf(c.epoch);
  return c.batch < plan->steps.size() ? plan->steps[c.batch] : 0;
}

const SourceConfig* Pipeline::WindowedSource() const {
  for (size_t k = 0; k < catalog_->parts.size(); ++k)
    if (catalog_->windowed(k)) return &cfg_.sources[k];
  return nullptr;
}

Result<Pipeline::Origin> Pipeline::Rebased(uint32_t epoch, uint64_t position, uint32_t lanes,
                                           uint32_t nodes) const {
  MMFEED_ASSIGN_OR_RETURN(const std::shared_ptr<const Mixture> numbering,
                          NumberingOf(position, lanes, nodes));
  Origin o;
  o.epoch = epoch;
  o.base = position;
  o.lanes = LanesOf(position, lanes);
  o.nodes = NodesOf(numbering.get(), nodes);
  // A position past the epoch's end belongs to no order of this data: never read as "the
  // epoch is done" (an edited cursor once skipped the rest of the job that way).
  if (const uint64_t end = PositionsOf(numbering.get(), o.lanes); position > end)
    return Status::Invalid(fmt::format(
        "its \"position\" {} is past the end of epoch {}'s order, which has positions 0 to {}: "
        "the cursor was edited, or is of other data",
        position, epoch, end));
  // Nothing a rank could have (no full row, or too few samples for a budgeted step): the next
  // epoch.
  const bool none_left =
      budgeted()
          ? position &&
                PlanFrom(epoch, /*with_ranks=*/false, position, numbering.get(), o.lanes).batches ==
                    0
          : BatchesOf(PerRankFrom(position, numbering.get(), o.lanes)) == 0;
  if (position == 0 || none_left) {
    o.epoch = position == 0 ? epoch : epoch + 1;
    o.base = 0;
    o.lanes = 0;
    o.nodes = 0;
  }
  // A mixture's tag names the lanes its base counts in (and their nodes where those count),
  // shard windows' when they are several.
  const std::string tagged = (numbering || o.lanes > 1 ? fmt::format("{}|", o.lanes) : "") +
                             (o.nodes ? fmt::format("{}|", o.nodes) : "");
  o.stream = o.base == 0
                 ? FirstStreamTag(order_fingerprint_)
                 : static_cast<uint32_t>(HashString(fmt::format(
                       "rebased|{}|{}|{}{}", o.epoch, o.base, tagged, order_fingerprint_))) |
                       1;
  return o;
}

nlohmann::json Pipeline::PositionJson() const {
  if (!positional()) return nullptr;
  nlohmann::json j = {{"order", order_tag_},
                      {"epoch", origin_.epoch},
                      {"base", origin_.base},
                      {"streams", streams()},
                      {"batch_size", cfg_.batch_size}};
  if (catalog_->mixture || catalog_->InWindows(cfg_.source)) {
    j["lanes"] = catalog_->mixture ? catalog_->mixture->lanes()
                                   : static_cast<uint32_t>(cfg_.source.num_nodes);
    if (origin_.base) j["base_lanes"] = origin_.lanes;
  }
  if (catalog_->mixture && WindowedSource()) {  // its numbering counts nodes too
    j["nodes"] = cfg_.source.num_nodes;
    if (origin_.base) j["base_nodes"] = origin_.nodes;
  }
  return j;
}

StreamCursor Pipeline::CursorAt(uint64_t seq) const {
  StreamCursor c;
  c.seq = seq;
  if (!budgeted()) {
    uint64_t k = seq - origin_.seq;  // batches from the origin on
    const uint64_t first = EpochBatches(origin_.epoch);
    if (k < first) {
      c.epoch = origin_.epoch;
      c.batch = k;
      return c;
    }
    k -= first;
    c.epoch = origin_.epoch + 1 + static_cast<uint32_t>(k / batches_per_epoch_);
    c.batch = k % batches_per_epoch_;
    return c;
  }
  uint64_t first = origin_.seq;
  Locate(seq, &c.epoch, &first);
  c.batch = seq - first;
  return c;
}

EpochPlan Pipeline::PlanAt(uint32_t epoch, bool with_ranks) const {
  const uint64_t base = BaseOf(epoch);
  return PlanFrom(epoch, with_ranks, base, base ? numbering_.get() : nullptr,
                  base ? origin_.lanes : 0);
}

EpochPlan Pipeline::PlanFrom(uint32_t epoch, bool with_ranks, uint64_t base,
                             const Mixture* numbering, uint32_t lanes) const {
  return PlanEpoch(costs_, cfg_.source, epoch, cfg_.consumers, budget_, with_ranks, catalog_.get(),
                   base, numbering, lanes);
}

std::shared_ptr<const EpochPlan> Pipeline::PlanOf(uint32_t epoch) const {
  {
    std::lock_guard<std::mutex> lock(plans_mu_);
    auto it = plans_.find(epoch);
    if (it != plans_.end()) return it->second;
  }
  // Made outside the lock (O(samples)): cursors are looked up meanwhile.
  auto plan = std::make_shared<const EpochPlan>(PlanAt(epoch, /*with_ranks=*/true));
  std::lock_guard<std::mutex> lock(plans_mu_);
  epoch_batches_[epoch] = plan->batches;
  // Ranks run apart by at most their rings' depth, and rewinds are rare: a few epochs do.
  if (plans_.size() >= 4 && !plans_.count(epoch))
    plans_.erase(plans_.begin()->first < epoch ? plans_.begin() : std::prev(plans_.end()));
  return plans_.emplace(epoch, std::move(plan)).first->second;
}

uint64_t Pipeline::EpochBatches(uint32_t epoch) const {
  if (!budgeted()) {
    return BaseOf(epoch) ? BatchesOf(PerRank(epoch)) : batches_per_epoch_;
  }
  std::lock_guard<std::mutex> lock(plans_mu_);
  return EpochBatchesLocked(epoch);
}

uint64_t Pipeline::EpochBatchesLocked(uint32_t epoch) const {
  auto it = epoch_batches_.find(epoch);  // PlanOf also records its plans' counts
  if (it != epoch_batches_.end()) return it->second;
  const uint64_t k = PlanAt(epoch, /*with_ranks=*/false).batches;
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
    const uint64_t total = !epochs ? UINT64_MAX
                           : origin_.epoch < epochs
                               ? origin_.seq + EpochBatches(origin_.epoch) +
                                     (epochs - origin_.epoch - 1) * batches_per_epoch_
                               : origin_.seq;
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

}  // namespace mmfeed
