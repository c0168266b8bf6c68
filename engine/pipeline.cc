// The pipeline's threads: start, stop and quiesce; the source thread, which deals batches and
// asks remote storage for what comes next; the stage workers; and what the profile reads of
// them. See engine/pipeline_internal.h for how the pipeline's files divide.
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
#include <limits>
#include <map>
#include <set>
#include <thread>
#include <unordered_map>

#include "base/rng.h"
#include "engine/mailbox.h"
#include "engine/numa.h"
#include "engine/pipeline_internal.h"
#include "engine/trace.h"
#include "source/catalog.h"

namespace mmfeed {

// ---------------------------------------------------------------- errors

void ErrorLog::Add(const std::string& origin, const std::string& stage,
                   const std::string& reason_code, const std::string& message) {
  const uint64_t now = NowNs();
  // The file: "manifest.jsonl:12" -> "manifest.jsonl", ".../shard-003.tar:key" -> the shard.
  const size_t colon = origin.rfind(':');
  const std::string file = colon == std::string::npos ? origin : origin.substr(0, colon);
  std::lock_guard<std::mutex> lock(mu_);
  ++total_;
  Reason& r = reasons_[reason_code];
  ++r.count;
  r.latest = fmt::format("{} ({}): {}", origin, stage, message);
  Source& s = sources_[{reason_code, file}];
  if (s.logged < kLoggedPerSource && logged_ < kLoggedInAll) {
    spdlog::warn("skipped {}", r.latest);
    ++logged_;
    if (++s.logged == kLoggedPerSource || logged_ == kLoggedInAll)
      spdlog::warn("further samples skipped as {} from {} are counted in one line every {:.0f} s",
                   reason_code, logged_ == kLoggedInAll ? "any file" : file, kSummaryEverySeconds);
    s.summary_ns = now;
  } else if (++s.held, now - s.summary_ns >= kSummaryEverySeconds * 1e9) {
    spdlog::warn("skipped {} more samples ({}) from {} in {:.0f} s, {} {} in all; the latest: {}",
                 s.held, reason_code, file, (now - s.summary_ns) / 1e9, r.count, reason_code,
                 r.latest);
    s.held = 0;
    s.summary_ns = now;
  }
  if (recent_.size() >= 100) recent_.erase(recent_.begin());
  recent_.push_back(
      {{"origin", origin}, {"stage", stage}, {"reason", reason_code}, {"message", message}});
}

nlohmann::json ErrorLog::ToJson() const {
  std::lock_guard<std::mutex> lock(mu_);
  nlohmann::json by_reason = nlohmann::json::object();
  for (const auto& [code, r] : reasons_) by_reason[code] = r.count;
  return {{"total", total_}, {"by_reason", by_reason}, {"recent", recent_}};
}

std::string ErrorLog::Summary(size_t reasons) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::pair<uint64_t, std::string>> order;
  for (const auto& [code, r] : reasons_) order.push_back({r.count, code});
  std::sort(order.rbegin(), order.rend());
  std::string out;
  for (size_t k = 0; k < order.size() && k < reasons; ++k)
    out += fmt::format("{}{} {} (latest: {})", out.empty() ? "" : "; ", order[k].first,
                       order[k].second, reasons_.at(order[k].second).latest);
  return out;
}

Pipeline::~Pipeline() {
  RequestStop();
  Wait();
}

Status Pipeline::Start() {
  if (sinks_.empty()) return Status::Invalid("a pipeline only built (no batch sinks) cannot start");
  start_ns_ = NowNs();
  spdlog::info(
      "pipeline '{}': {} samples, {} consumer rank(s), batch {}{}", cfg_.name, catalog_->size(),
      cfg_.consumers, cfg_.batch_size,
      cfg_.budgeted()
          ? fmt::format(" at most, within max_tokens {} and max_patches {} (0: "
                        "none): {} batches per rank in epoch {}",
                        cfg_.max_tokens, cfg_.max_patches,
                        stream_->EpochBatches(stream_->origin().epoch), stream_->origin().epoch)
          : "");
  if (catalog_->mixture) spdlog::info("the mixture, per epoch:\n{}", MixPlan());
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

void Pipeline::QuiesceAtBatch() {
  finish_sinks_.store(false, std::memory_order_release);
  stop_at_batch_.store(true, std::memory_order_release);
}

WhyNot Pipeline::WhyNotSwitchWeights(const Pipeline& running) const {
  if (!catalog_->mixture || !running.catalog_->mixture) return "not a mixture";
  if (cfg_.budgeted()) return "token budgets plan whole epochs";
  if (cfg_.packed_stage >= 0) return "a packed text stream's rows cross batches";
  if (const SourceConfig* windowed = stream_->WindowedSource())
    return fmt::format("source '{}' is read in shard windows", windowed->name);
  if (const StreamOrigin& o = running.stream_->origin(); o.base)
    return fmt::format(
        "the job resumed at another shape in epoch {} (position {}), whose rest is dealt in the "
        "order of the shape it stood at; weights change at batch boundaries again after the "
        "next epoch-boundary reload",
        o.epoch, o.base);
  const Status st = Mixture::CanSwitch(*running.catalog_->mixture, *catalog_->mixture);
  if (st.ok()) return std::nullopt;
  return st.message();
}

Status Pipeline::SwitchWeightsAt(const Pipeline& running, uint64_t seq) {
  const StreamCursor at = running.stream_->CursorAt(seq);  // this one's origin is not set yet
  Result<Mixture> m = Mixture::Switched(running.catalog_->mixture, *catalog_->mixture, at.epoch,
                                        at.batch * static_cast<uint64_t>(cfg_.batch_size));
  if (!m.ok()) return m.status();
  auto cat = std::make_shared<Catalog>(*catalog_);
  cat->mixture = std::make_shared<const Mixture>(std::move(m.value()));
  cat->mix_fingerprint = HashMixSwitch(cat->mixture->switches().back(), cat->mix_fingerprint);
  catalog_ = std::move(cat);
  stream_ = stream_->WithCatalog(catalog_);
  return Status::Ok();
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
      size_t t = plan_.first_tensor[b] + k;
      item->out[k] = batch->memory.base[t] + row * plan_.specs[t].NumBytes();
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

// RemoteStore::Future of a source read in shard windows: epoch first + e's reads are
// reads[e] (a position per shard: its first read in the epoch's reading order); a time is
// epoch x span + position, the same whatever the first epoch foreseen (a store may compare a
// time taken from an earlier future), and the distance between two times counts reads.
class Pipeline::WindowFuture : public RemoteStore::Future {
 public:
  WindowFuture(std::shared_ptr<const std::unordered_map<std::string, uint32_t>> ids,
               std::vector<std::shared_ptr<const EpochReads>> reads, uint32_t first, uint64_t span)
      : ids_(std::move(ids)), reads_(std::move(reads)), first_(first), span_(span) {}
  // The time of epoch `epoch`'s read of `shard` (kNever: not read then, or past the horizon).
  uint64_t Time(uint32_t epoch, uint32_t shard) const {
    const uint64_t e = epoch - first_;
    if (epoch < first_ || e >= reads_.size() || reads_[e]->at[shard] == UINT32_MAX) return kNever;
    return epoch * span_ + reads_[e]->at[shard];
  }
  uint64_t NextAfter(const std::string& url, uint64_t t) const override {
    auto it = ids_->find(url);
    if (it == ids_->end() || t == kNever) return kNever;
    for (uint64_t e = std::max<uint64_t>(first_, t / span_) - first_; e < reads_.size(); ++e) {
      const uint32_t pos = reads_[e]->at[it->second];
      const uint64_t time = (first_ + e) * span_ + pos;
      if (pos != UINT32_MAX && time > t) return time;
    }
    return kNever;
  }
  uint64_t ReadsBetween(uint64_t a, uint64_t b) const override {
    if (a == kNever || b == kNever || b < a) return kNever;
    uint64_t n = 0;
    for (uint64_t e = a / span_; e < b / span_; ++e) {  // to the end of each epoch before b's
      const uint64_t k = e - first_;
      n += (e < first_ || k >= reads_.size() ? span_ : reads_[k]->count) -
           (e == a / span_ ? a % span_ : 0);
    }
    return n + b % span_ - (a / span_ == b / span_ ? a % span_ : 0);
  }

 private:
  std::shared_ptr<const std::unordered_map<std::string, uint32_t>> ids_;
  std::vector<std::shared_ptr<const EpochReads>> reads_;
  uint32_t first_;
  uint64_t span_;
};

std::shared_ptr<const Pipeline::WindowFuture> Pipeline::FutureFrom(uint32_t epoch, size_t part) {
  const ShardIndex& index = IndexOf(part);
  const size_t n = index.shard_count();
  ReadTables& tables = read_tables_[part];
  if (!tables.ids) {
    auto ids = std::make_shared<std::unordered_map<std::string, uint32_t>>();
    for (size_t k = 0; k < n; ++k) ids->emplace(*index.shard(k).path, static_cast<uint32_t>(k));
    tables.ids = std::move(ids);
  }
  std::vector<std::shared_ptr<const EpochReads>> reads;
  for (uint32_t e = epoch; e < epoch + StreamPlan::kFutureEpochs; ++e) {
    if (cfg_.source.epochs > 0 && e >= static_cast<uint32_t>(cfg_.source.epochs)) break;
    auto& table = tables.reads[e];
    if (!table) {
      auto t = std::make_shared<EpochReads>();
      t->at.assign(n, UINT32_MAX);
      const std::vector<uint32_t> order = stream_->ReadingOrder(e, part);
      t->count = order.size();
      for (size_t pos = 0; pos < order.size(); ++pos)
        if (t->at[order[pos]] == UINT32_MAX) t->at[order[pos]] = static_cast<uint32_t>(pos);
      table = std::move(t);
    }
    reads.push_back(table);
  }
  tables.reads.erase(tables.reads.begin(), tables.reads.lower_bound(epoch));
  // Above any position: a node reads each shard of a single source at most once an epoch, a
  // mixture's source at most once a pass.
  uint64_t span = n + 1;
  if (catalog_->mixture)
    span =
        n * (catalog_->mixture->dealt()[part] / std::max<size_t>(1, catalog_->parts[part]->size()) +
             2) +
        1;
  return std::make_shared<WindowFuture>(tables.ids, std::move(reads), epoch, span);
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
  std::vector<RankWants> per_rank(consumers);
  std::vector<uint32_t> key;
  uint32_t oldest_epoch = UINT32_MAX;
  for (int r = 0; r < consumers; ++r) {
    if (done[r]) continue;
    const StreamCursor oldest = stream_->CursorAt(std::min(next[r].seq, NextCommit(r)));
    const EpochOrder from = stream_->OrderOf(oldest.epoch), to = stream_->OrderOf(next[r].epoch);
    const uint64_t a = oldest.batch * bs * consumers + r, b = next[r].batch * bs * consumers + r;
    if (!from.windowed() || a >= from.size()) continue;
    const size_t first = from.WindowOf(a);
    int more = kMostWindows;
    if (oldest.epoch == next[r].epoch)
      more = static_cast<int>(std::min<uint64_t>(
          kMostWindows, to.WindowOf(std::min<uint64_t>(b, to.size() - 1)) - first + kAhead));
    for (uint32_t shard : from.WindowShards(a, more)) per_rank[r].emplace_back(shard, oldest.epoch);
    // Across an epoch's end: the rest of the earlier epoch, then the next one's first windows.
    if (oldest.epoch != next[r].epoch && b < to.size())
      for (uint32_t shard : to.WindowShards(b, kAhead))
        per_rank[r].emplace_back(shard, next[r].epoch);
    oldest_epoch = std::min(oldest_epoch, oldest.epoch);
    key.insert(key.end(), {oldest.epoch, static_cast<uint32_t>(first), next[r].epoch,
                           static_cast<uint32_t>(b < to.size() ? to.WindowOf(b) : UINT32_MAX)});
  }
  if (key == *last) return;
  *last = key;
  AskStore(0, oldest_epoch, per_rank);
}

RemoteStore* Pipeline::StoreOf(size_t part) const {
  return catalog_->mixture ? catalog_->parts[part]->remote.get() : catalog_->remote.get();
}

const ShardIndex& Pipeline::IndexOf(size_t part) const {
  return catalog_->mixture ? *catalog_->parts[part]->shards : *catalog_->shards;
}

void Pipeline::AskStore(size_t part, uint32_t oldest_epoch,
                        const std::vector<RankWants>& per_rank) {
  RemoteStore* store = StoreOf(part);
  const ShardIndex& index = IndexOf(part);
  // Each shard with the time of the read it is wanted for, on the future's clock.
  std::shared_ptr<const WindowFuture> future;
  if (oldest_epoch != UINT32_MAX) {  // else no rank reads on: nothing is wanted
    future = FutureFrom(oldest_epoch, part);
    store->SetFuture(future);
  }
  // Round-robin over the ranks, shard by shard: every rank's oldest window comes first.
  std::vector<RemoteStore::Want> want;
  for (size_t k = 0;; ++k) {
    bool any = false;
    for (const RankWants& shards : per_rank) {
      if (k >= shards.size()) continue;
      any = true;
      const auto [shard, epoch] = shards[k];
      const ShardIndex::ShardSpan s = index.shard(shard);
      want.push_back({*s.path, s.bytes, future->Time(epoch, shard)});
    }
    if (!any) break;
  }
  store->SetWanted(want);
}

// WantShards for a mixture's remote sources (each read in windows through its own store):
// per rank, the windows of each source's draws from the rank's oldest batch not yet committed
// through the batch it deals next, and kAhead windows after that. A rank's draws of a source
// before position p are about p x its share (close enough to find their windows).
void Pipeline::WantMixShards(const std::vector<StreamCursor>& next, const std::vector<bool>& done,
                             std::vector<uint32_t>* last) {
  constexpr int kAhead = 2, kMostWindows = 64;
  const Mixture& mix = *catalog_->mixture;
  const uint64_t bs = static_cast<uint64_t>(cfg_.batch_size), len = mix.per_lane();
  std::vector<std::vector<RankWants>> per_part(catalog_->parts.size());
  std::vector<uint32_t> key;
  uint32_t oldest_epoch = UINT32_MAX;
  for (size_t k = 0; k < catalog_->parts.size(); ++k) {
    const Catalog& part = *catalog_->parts[k];
    if (!part.remote) continue;
    const SourceConfig& source = catalog_->part_sources[k];
    const uint32_t src = static_cast<uint32_t>(k);
    for (int r = 0; r < cfg_.consumers; ++r) {
      if (done[r]) continue;
      const uint32_t lane = static_cast<uint32_t>(cfg_.source.node_rank * cfg_.consumers + r);
      const uint64_t q = mix.LaneQuota(src, lane);
      if (q == 0) continue;
      // The rank's draw of the source about position p of `epoch`.
      auto draw_at = [&](uint32_t epoch, uint64_t p) {
        const uint64_t c = static_cast<uint64_t>(static_cast<unsigned __int128>(p) * q / len);
        return mix.DrawOf(epoch, lane, src, std::min(c, q - 1)).draw;
      };
      const StreamCursor oldest = stream_->CursorAt(std::min(next[r].seq, NextCommit(r)));
      const uint64_t a = draw_at(oldest.epoch, oldest.batch * bs),
                     b = draw_at(next[r].epoch, next[r].batch * bs);
      // Its last draw of the epoch: windows ahead stop at its node's part of the source.
      const uint64_t a_end = draw_at(oldest.epoch, len), b_end = draw_at(next[r].epoch, len);
      auto& shards = per_part[k].emplace_back();
      if (oldest.epoch == next[r].epoch) {
        for (uint32_t shard : part.PassShards(source, a, b, b_end, kAhead, kMostWindows))
          shards.emplace_back(shard, oldest.epoch);
      } else {  // the rest of the earlier epoch, then the next one's first windows
        for (uint32_t shard : part.PassShards(source, a, a_end, a_end, 0, kMostWindows))
          shards.emplace_back(shard, oldest.epoch);
        for (uint32_t shard : part.PassShards(source, b, b, b_end, kAhead, kMostWindows))
          shards.emplace_back(shard, next[r].epoch);
      }
      oldest_epoch = std::min(oldest_epoch, oldest.epoch);
      for (const auto& [shard, epoch] : shards) key.insert(key.end(), {shard, epoch});
      key.push_back(UINT32_MAX);
    }
  }
  if (key == *last) return;
  *last = key;
  for (size_t k = 0; k < per_part.size(); ++k)
    if (StoreOf(k)) AskStore(k, oldest_epoch, per_part[k]);
}

// Fills in batch `at` of rank `r` (its sink's memory reserved in `pb`) and dispatches its
// samples: the rank's share of the epoch's order is at positions r, r + consumers, ...; batch
// `index` holds the share's positions index * batch_size ..., or (a budget) what `plan` says.
void Pipeline::Deal(const std::shared_ptr<Provisional>& pb, int r, const StreamCursor& at,
                    uint64_t gen, const EpochPlan* plan) {
  pb->gen = gen;
  pb->rank = static_cast<uint32_t>(r);
  pb->epoch = at.epoch;
  pb->index = at.batch;
  pb->seq = at.seq;
  const std::vector<uint32_t> entries = stream_->BatchEntries(r, at, plan);
  if (const std::vector<SampleCost>& costs = stream_->costs(); !costs.empty()) {
    for (uint32_t entry : entries) {
      pb->tokens += costs[entry].tokens;
      pb->patches += costs[entry].patches;
    }
  }
  pb->rows = static_cast<int>(entries.size());
  open_batches_.fetch_add(1, std::memory_order_acq_rel);
  for (int row = 0; row < pb->rows; ++row) Dispatch(pb, row, entries[row], false);
}

// No more input: every stage's parked threads wake to drain their mailbox, then all exit.
void Pipeline::CloseBranches() {
  for (auto& b : branches_) {
    {
      std::lock_guard<std::mutex> lock(b->park_mu);
      b->closing.store(true, std::memory_order_release);
    }
    b->park_cv.notify_all();
    b->inbox.Close(b->threads);
  }
}

// Deals whole batches, each rank from its own cursor, to whichever rank's sink has room, and
// dispatches the refills the batch thread asks for. After a stop it deals no new batch but
// keeps serving refills until every dealt batch is committed or discarded.
void Pipeline::SourceLoop() {
  Status pin = PinAndNameThisThread(control_cpus_, "mmf:source");
  if (!pin.ok()) spdlog::warn("{}", pin.message());
  ThreadTag tag(this, "source");
  const int consumers = cfg_.consumers;
  std::vector<StreamCursor> next = start_;
  auto past_end = [&](const StreamCursor& c) {
    return cfg_.source.epochs != 0 && c.epoch >= static_cast<uint32_t>(cfg_.source.epochs);
  };
  // QuiesceAtEpochEnd: each rank stops at the first epoch boundary at or after where it is.
  std::vector<uint32_t> last_epoch(consumers, UINT32_MAX);
  bool at_epoch_end = false;
  // QuiesceAtBatch: every rank stops at the furthest rank's next batch.
  uint64_t last_seq = UINT64_MAX;
  std::vector<bool> done(consumers);
  std::vector<uint64_t> gen(consumers, 0);
  auto is_done = [&](int r) {
    return past_end(next[r]) || next[r].epoch >= last_epoch[r] || next[r].seq >= last_seq;
  };
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
    if (last_seq == UINT64_MAX && stop_at_batch_.load(std::memory_order_acquire)) {
      last_seq = 0;
      for (int r = 0; r < consumers; ++r) last_seq = std::max(last_seq, next[r].seq);
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
        if (last_seq != UINT64_MAX && next[r].seq > last_seq) {  // the same for a batch
          last_seq = next[r].seq;
          for (int q = 0; q < consumers; ++q) done[q] = is_done(q);
        }
        done[r] = is_done(r);
      }
    }
    if (catalog_->remote) WantShards(next, done, &wanted_windows);
    if (catalog_->router) WantMixShards(next, done, &wanted_windows);
    bool progressed = false, any_full = false;
    for (Refill& f : refills_->Take()) {
      Dispatch(f.batch, f.row, f.entry, true);
      progressed = true;
    }
    for (int i = 0; i < consumers && !stop_.load(std::memory_order_acquire); ++i) {
      const int r = (turn + i) % consumers;
      if (done[r]) continue;
      std::shared_ptr<const EpochPlan> plan;
      if (cfg_.budgeted()) {
        const uint32_t epoch = next[r].epoch;
        if (planner.joinable() && planning == epoch) planner.join();
        plan = stream_->PlanOf(epoch);
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
          planner = std::thread([this, epoch] { stream_->PlanOf(epoch + 1); });
        }
      }
      auto pb = std::make_shared<Provisional>();
      Reservation res = sinks_[r]->Reserve(&pb->memory, 0);
      if (res == Reservation::kClosed) done[r] = true;
      any_full |= res == Reservation::kFull;
      if (res != Reservation::kReserved) continue;
      Deal(pb, r, next[r], gen[r], plan.get());
      next[r] = stream_->CursorAt(next[r].seq + 1);
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
  CloseBranches();
}

namespace {

// A stage's own use of its cache (Stage::OwnCache) for one sample.
class Memo : public SampleMemo {
 public:
  Memo(SampleCache* cache, uint32_t entry, uint32_t epoch)
      : cache_(cache), entry_(entry), epoch_(epoch) {}
  std::shared_ptr<const std::string> Find() override { return cache_->Find(entry_, epoch_); }
  std::shared_ptr<const std::string> Keep(std::string bytes) override {
    return cache_->Offer(entry_, epoch_, std::move(bytes));
  }

 private:
  SampleCache* cache_;
  uint32_t entry_, epoch_;
};

}  // namespace

void Pipeline::WorkerLoop(Branch* b, int worker) {
  Status pin = PinAndNameThisThread(b->cpus, fmt::format("mmf:{}:{}", b->cfg->name, worker));
  if (!pin.ok()) spdlog::warn("{}", pin.message());
  ThreadTag tag(this, b->cfg->name);
  std::unique_ptr<StageWorker> impl = b->cfg->stage->NewWorker();
  ScopedFilePolicy files(&b->files);
  std::vector<const FieldValue*> read_fields;  // the sample's, for SampleContext
  std::vector<const uint8_t*> read_tensors;
  std::vector<const TensorSpec*> read_specs;
  for (size_t t : b->read_tensors) read_specs.push_back(&plan_.specs[t]);
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
    // The sample's field `name`, or nullptr (then `missing` names it). A mixture's sample may
    // lack fields: a stage with a mask gives zero rows without running, others read an empty
    // list (kAbsentField).
    std::string missing, absent;
    const int present = plan_.present[item->branch];
    auto find = [&](const std::string& name) {
      const FieldValue* f = FieldOrAbsent(*catalog_, e, name);
      if (f == &kAbsentField) absent = name;
      if (!f) missing = name;
      return f;
    };
    const FieldValue* field = find(b->cfg->field);
    const bool zero_rows = present >= 0 && field == &kAbsentField;
    if (present >= 0) item->batch->memory.base[present][item->row] = zero_rows ? 0 : 1;
    SampleContext ctx{cfg_.source.seed, item->batch->epoch, e.id, e.origin};
    read_fields.clear();
    for (const std::string& name : b->read_fields) read_fields.push_back(find(name));
    read_tensors.clear();
    for (size_t t : b->read_tensors)
      read_tensors.push_back(item->batch->memory.base[t] + item->row * plan_.specs[t].NumBytes());
    Memo memo(b->own_cache ? b->cache.get() : nullptr, item->entry, item->batch->epoch);
    if (b->own_cache) ctx.memo = &memo;
    ctx.fields = read_fields.data();
    ctx.tensors = read_tensors.data();
    ctx.tensor_specs = read_specs.data();
    if (!missing.empty()) {
      item->status = Status::NotFound(fmt::format("sample has no field '{}'", missing));
    } else if (zero_rows) {
      for (size_t k = 0; k < b->specs.size(); ++k)
        std::memset(item->out[k], 0, b->specs[k].NumBytes());
    } else if (b->cache && !b->own_cache && FromCache(b, item.get())) {
      // the stage's outputs for this sample, made in an earlier epoch
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
      if (!item->status.ok() && !absent.empty() &&
          item->status.code() != Status::Code::kResourceExhausted)
        item->status = Status::NotFound(
            fmt::format("sample has no field '{}', and stage '{}' cannot take it as empty ({})",
                        absent, name, item->status.message()));
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
      if (b->cache && !b->own_cache && item->status.ok()) ToCache(b, *item);
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

// A cached sample is its outputs' byte counts (uint64 each), then those bytes one after another.
bool Pipeline::FromCache(Branch* b, WorkItem* item) {
  std::shared_ptr<const std::string> kept = b->cache->Find(item->entry, item->batch->epoch);
  if (!kept) return false;
  const size_t n = b->specs.size();
  size_t at = n * sizeof(uint64_t);
  for (size_t k = 0; k < n; ++k) {
    uint64_t used;
    std::memcpy(&used, kept->data() + k * sizeof used, sizeof used);
    std::memcpy(item->out[k], kept->data() + at, used);
    at += used;
  }
  return true;
}

void Pipeline::ToCache(Branch* b, const WorkItem& item) {
  const size_t n = b->specs.size();
  std::array<uint64_t, kMaxOutputs> used{};
  uint64_t total = n * sizeof(uint64_t);
  for (size_t k = 0; k < n; ++k) {
    const TensorSpec& s = b->specs[k];
    used[k] = s.NumBytes();
    const int from = b->cache_rows_from[k];
    if (from >= 0 && !s.shape.empty() && s.shape[0] > 0)
      used[k] = static_cast<uint64_t>(RaggedRows(s, b->specs[from], item.out[from])) *
                (used[k] / static_cast<uint64_t>(s.shape[0]));
    total += used[k];
  }
  std::string bytes;
  bytes.reserve(total);
  bytes.append(reinterpret_cast<const char*>(used.data()), n * sizeof(uint64_t));
  for (size_t k = 0; k < n; ++k) bytes.append(reinterpret_cast<const char*>(item.out[k]), used[k]);
  b->cache->Offer(item.entry, item.batch->epoch, std::move(bytes));
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
                   catalog_->remote_reader() ? StorageMetrics(StorageStats())
                                             : std::vector<std::pair<std::string, double>>{}});
  for (const auto& b : branches_) {
    infos.push_back({b->cfg->name, b->cfg->type, b->active.load(), b->inbox.capacity(),
                     &b->counters, b->cfg->stage->Metrics(), b->inbox.SizeApprox(), b->threads,
                     b->cfg->workers_auto});
    const Stage& stage = *b->cfg->stage;
    infos.back().tuning = {
        {"cpu_advice", stage.CpuAdvice()},
        {"cache_entry_bytes", stage.CacheEntryBytes()},
        {"cacheable", !stage.WhyNotCacheable() || stage.OwnCache().has_value()},
        {"epoch_samples", stream_->batches_per_epoch() * static_cast<uint64_t>(cfg_.batch_size) *
                              static_cast<uint64_t>(cfg_.consumers)},
        {"cache_max_bytes", b->cache ? b->cfg->cache_max_bytes : 0}};
    if (b->cache) {
      const SampleCache::Stats c = b->cache->stats();
      infos.back().cache = {
          {"hits", c.hits},
          {"misses", c.misses},
          {"hit_rate", c.hits + c.misses ? static_cast<double>(c.hits) / (c.hits + c.misses) : 0.0},
          {"bytes", c.bytes},
          {"max_bytes", c.max_bytes},
          {"fill", c.max_bytes ? static_cast<double>(c.bytes) / c.max_bytes : 0.0},
          {"samples", c.samples},
          {"evicted_bytes", c.evicted_bytes},
          {"not_kept", c.not_kept}};
      if (b->cache->has_disk())
        infos.back().cache["disk"] = {
            {"hits", c.disk_hits},
            {"bytes", c.disk_bytes},
            {"max_bytes", c.disk_max_bytes},
            {"fill", c.disk_max_bytes ? static_cast<double>(c.disk_bytes) / c.disk_max_bytes : 0.0},
            {"samples", c.disk_samples},
            {"written_bytes", c.disk_written_bytes},
            {"damaged", c.disk_damaged},
            {"write_failures", c.disk_write_failures}};
    }
  }
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
  if (catalog_->remote_reader()) j["storage"] = StorageStats();
  if (catalog_->mixture) {  // the realised mixture, and the plan's shares to compare with
    j["sources"] = nlohmann::json::array();
    uint64_t planned = 0;
    for (uint64_t d : catalog_->mixture->dealt()) planned += d;
    for (size_t k = 0; k < catalog_->parts.size(); ++k) {
      const SourceCounts& c = source_counts_[k];
      nlohmann::json reasons = nlohmann::json::object();
      for (size_t code = 0; code < Status::kCodes; ++code)
        if (const uint64_t n = c.by_code[code].load())
          reasons[Status(static_cast<Status::Code>(code), "").CodeName()] = n;
      const uint64_t samples = c.samples.load(), size = catalog_->parts[k]->size();
      j["sources"].push_back({{"name", cfg_.sources[k].name},
                              {"samples", samples},
                              {"errors", c.errors.load()},
                              {"errors_by_reason", std::move(reasons)},
                              {"size", size},
                              {"passes", static_cast<double>(samples) / static_cast<double>(size)},
                              {"planned_share", static_cast<double>(catalog_->mixture->dealt()[k]) /
                                                    static_cast<double>(planned)}});
    }
  }
  return j;
}

Pipeline::SourceCounts& Pipeline::CountsOf(uint32_t entry) const {
  return source_counts_[catalog_->PartOf(entry)];
}

std::string Pipeline::MixPlan() const {
  if (!catalog_->mixture) return "";
  std::vector<std::string> names;
  for (const SourceConfig& s : cfg_.sources) names.push_back(s.name);
  std::string plan = catalog_->mixture->Describe(names);
  for (size_t k = 0; k < catalog_->parts.size(); ++k)
    if (catalog_->windowed(k))
      plan += fmt::format(
          "\n  {} is read in windows of {} {}(s) (shuffle_window), each node its own part "
          "of the {} order{}",
          names[k], catalog_->part_sources[k].shuffle_window,
          catalog_->parts[k]->parquet ? "row group" : "shard",
          catalog_->parts[k]->parquet ? "row group" : "shard",
          catalog_->parts[k]->remote ? ", fetched ahead within its prefetch_bytes" : "");
  for (const std::string& lacks : catalog_->part_lacks)
    if (!lacks.empty())
      plan += fmt::format(
          "\n  {} (its rows of fixed-shape stages are zeros, their "
          "<stage>_present 0; other stages read an empty list)",
          lacks);
  return plan;
}

PathCheck Pipeline::CheckSamplePaths(size_t max_samples) const {
  return CheckCatalogPaths(*catalog_, branches_[0]->files, max_samples);
}

nlohmann::json Pipeline::StorageStats() const {
  if (catalog_->remote) return catalog_->remote->Stats();
  // A mixture's remote sources: their sum, and each one's by name.
  std::vector<nlohmann::json> parts;
  nlohmann::json by_source = nlohmann::json::object();
  for (size_t k = 0; k < catalog_->parts.size(); ++k)
    if (catalog_->parts[k]->remote)
      by_source[cfg_.sources[k].name] = parts.emplace_back(catalog_->parts[k]->remote->Stats());
  nlohmann::json sum = SumStorageStats(parts);
  if (!sum.is_null()) sum["sources"] = std::move(by_source);
  return sum;
}

}  // namespace mmfeed
