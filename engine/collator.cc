// The batch thread (Pipeline::BatchLoop) and its collators: joins the branches of each sample,
// refills the rows of failed samples, packs ragged tensors and commits complete batches in
// order. Also the `batch` stage's schema, which configures it.
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

// Completes one rank's batches and commits them in order. A batch is complete when every row
// holds a good sample. The rows of failed samples are refilled in rounds: once every
// outstanding sample of the batch is resolved, each empty row (in row order) draws one
// catalog entry from the rank's share of the epoch with the batch's own random stream, seeded
// by (seed, epoch, node, rank, batch index). The draws' outcomes decide the bytes, never
// their timing: a draw of an entry already known to be bad fails at once, exactly as it
// would have after decoding. Runs on the batch thread only.
namespace {

// What to do about the reasons ErrorLog::Summary names, where one is known.
std::string UnusableDataHint(const std::string& reasons) {
  if (reasons.find("outside the data roots") != std::string::npos)
    return ". Files outside the data roots: `mmfeedd --check` on the config names the "
           "data_roots line to add (docs/guide/data.md, \"data_roots\")";
  if (reasons.find("no such file") != std::string::npos)
    return ". Missing files: a manifest's relative paths are read from its folder";
  return "";
}

}  // namespace

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
    if (status.ok() && p_->cfg_.budgeted()) {  // the plan counted what was measured at start
      const Provisional& b = *s.batch;
      const SampleCost got = p_->CostOf(
          [&](size_t t) { return b.memory.base[t] + s.row * p_->plan_.specs[t].NumBytes(); });
      const SampleCost& want = p_->stream_->costs()[s.entry];
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
      o.entries[s.row] = s.entry;
      if (s.refill) {
        p_->refills_ok_.fetch_add(1, std::memory_order_relaxed);
        o.failed_run = 0;
      }
    } else if (status.code() == Status::Code::kResourceExhausted) {
      o.holes.push_back(s.row);  // not the sample's fault: never counted (the pipeline stops)
    } else {
      o.entries[s.row] = s.entry;  // a mixture refills the row from the same source
      (*known_bad_)[s.entry] = true;
      if (p_->source_counts_) {
        Pipeline::SourceCounts& c = p_->CountsOf(s.entry);
        c.errors.fetch_add(1, std::memory_order_relaxed);
        c.by_code[static_cast<size_t>(status.code())].fetch_add(1, std::memory_order_relaxed);
      }
      if (p_->cfg_.budgeted()) {  // its cost leaves the batch with it
        o.tokens -= p_->stream_->costs()[s.entry].tokens;
        o.patches -= p_->stream_->costs()[s.entry].patches;
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
    std::vector<uint32_t> entries;  // each row's catalog entry (a failed row: the failed one)
    std::vector<uint16_t> tries;    // a mixture: per row, refills from its source that failed
    std::vector<int> holes;         // rows whose sample failed, not yet redrawn
    int outstanding = 0;            // samples dispatched and not yet resolved
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
  static constexpr uint16_t kSameSourceTries = 16;

  Open& Get(const std::shared_ptr<const Provisional>& b) {
    auto it = open_.find({b->gen, b->seq});
    if (it != open_.end()) return it->second;
    Open& o = open_[{b->gen, b->seq}];
    o.batch = b;
    o.ids.resize(b->rows);
    o.entries.resize(b->rows);
    o.tries.resize(b->rows);
    o.outstanding = b->rows;
    o.tokens = b->tokens;
    o.patches = b->patches;
    o.draws = Rng(p_->cfg_.source.seed, b->epoch,
                  fmt::format("{}/{}/{}", p_->cfg_.source.node_rank, rank_, b->index), "refill");
    return o;
  }

  void Refill(Open& o) {
    const uint64_t limit = 4 * p_->stream_->per_rank() + 256;
    const uint32_t epoch = o.batch->epoch;
    const EpochOrder order = p_->stream_->OrderOf(epoch);
    const uint64_t per_rank = p_->stream_->PerRank(epoch);
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
          const std::string reasons = p_->errors_.Summary();
          p_->Fail(Status::Corrupt(fmt::format(
              "rank {}, epoch {}, batch {}: {} draws in a row from the rank's {} samples failed; "
              "the data has (almost) no usable sample. Why they failed: {}{}",
              rank_, o.batch->epoch, o.batch->index, o.failed_run, p_->stream_->per_rank(), reasons,
              UnusableDataHint(reasons))));
        }
        if (give_up) {
          o.holes.push_back(row);
          continue;
        }
        // A mixture draws from the failed sample's source, so that the realised shares hold;
        // after kSameSourceTries failures in a row (a broken source) from the whole mix.
        uint32_t entry;
        if (order.mixed() && o.tries[row] < kSameSourceTries) {
          ++o.tries[row];
          entry = order.SameSource(o.entries[row], static_cast<int>(rank_), o.draws.Next());
        } else {
          uint64_t pos = o.draws.Below(per_rank);
          entry = order[pos * p_->cfg_.consumers + rank_];
        }
        if ((*known_bad_)[entry]) {
          o.entries[row] = entry;
          p_->refills_failed_.fetch_add(1, std::memory_order_relaxed);
          ++o.failed_run;
          o.holes.push_back(row);
          continue;
        }
        if (p_->cfg_.budgeted()) {
          const SampleCost& c = p_->stream_->costs()[entry];
          if (!p_->stream_->budget().Fits(1, o.tokens + c.tokens, o.patches + c.patches)) {
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
    if (p_->source_counts_) {  // a mixture: each row's source, and what each source gave
      const int column = p_->plan_.source;
      for (int row = 0; row < f.batch->rows; ++row) {
        const int32_t source = static_cast<int32_t>(p_->catalog_->PartOf(f.entries[row]));
        if (column >= 0)
          std::memcpy(f.batch->memory.base[column] + row * sizeof(int32_t), &source,
                      sizeof(source));
        if (std::find(f.dropped.begin(), f.dropped.end(), row) == f.dropped.end())
          p_->source_counts_[source].samples.fetch_add(1, std::memory_order_relaxed);
      }
    }
    if (!f.dropped.empty()) DropRows(f);
    info.rows = static_cast<uint32_t>(f.batch->rows - f.dropped.size());
    info.ids = std::move(f.ids);
    info.next = p_->stream_->CursorAt(info.seq + 1);
    info.next.stream = p_->stream_->origin().stream;
    if (p_->cfg_.budgeted()) info.next.position = p_->stream_->StepStart(info.next);
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
        for (size_t t = 0; t < p_->plan_.specs.size(); ++t) {
          const size_t bytes = p_->plan_.specs[t].NumBytes();
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

// Each row of a ragged tensor was written at row * (its most rows); the rows it used move down
// to follow the previous row's (towards lower addresses: memmove is safe). Every count is
// taken before anything moves: one ragged tensor may count another's rows (images' grids).
std::vector<int64_t> Pipeline::PackRagged(const BatchMemory& memory, uint32_t rows) const {
  if (std::all_of(plan_.rows_from.begin(), plan_.rows_from.end(), [](int f) { return f < 0; }))
    return {};
  std::vector<std::vector<int64_t>> used(plan_.specs.size());
  for (size_t t = 0; t < plan_.specs.size(); ++t) {
    if (plan_.rows_from[t] < 0) continue;
    const TensorSpec& from = plan_.specs[plan_.rows_from[t]];
    for (uint32_t i = 0; i < rows; ++i)
      used[t].push_back(
          RaggedRows(plan_.specs[t], from, memory.base[plan_.rows_from[t]] + i * from.NumBytes()));
  }
  std::vector<int64_t> out;
  for (size_t t = 0; t < plan_.specs.size(); ++t) {
    if (plan_.rows_from[t] < 0) continue;
    if (out.empty()) out.assign(plan_.specs.size(), rows);
    const size_t per_row = plan_.specs[t].NumBytes(), row_bytes = per_row / plan_.specs[t].shape[0];
    int64_t total = 0;
    for (uint32_t i = 0; i < rows; ++i) {
      std::memmove(memory.base[t] + total * row_bytes, memory.base[t] + i * per_row,
                   used[t][i] * row_bytes);
      total += used[t][i];
    }
    out[t] = total;
  }
  for (size_t t = 0; t < plan_.specs.size(); ++t) {  // starts: [rows + 1] in [rows][2] of memory
    if (plan_.starts_of[t] < 0) continue;
    // Block sizes: each sample's rows, or for a grid (packed above) h * w, t times per row.
    std::vector<int64_t> blocks;
    const int of = plan_.starts_of[t];
    if (IsGrid(plan_.specs[of])) {
      for (int64_t g = 0; g < out[of]; ++g) {
        int32_t thw[3];
        std::memcpy(thw, memory.base[of] + g * sizeof thw, sizeof thw);
        blocks.insert(blocks.end(), std::max(thw[0], 0), int64_t{thw[1]} * thw[2]);
      }
    } else {
      blocks = used[of];
    }
    // Bounded by its memory (a stage's bug stays in bounds).
    blocks.resize(std::min<size_t>(blocks.size(), rows * plan_.specs[t].NumBytes() / 4 - 1));
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
    const int from = plan_.rows_from[t];
    patches += RaggedRows(plan_.specs[t], plan_.specs[from], row(from));
  }
  SampleCost c;
  c.tokens = static_cast<uint32_t>(std::min<int64_t>(tokens, SampleCost::kUnusable - 1));
  c.patches = static_cast<uint32_t>(std::min<int64_t>(patches, UINT32_MAX));
  return c;
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
  const std::vector<SampleCost>& costs = stream_->costs();
  for (size_t i = 0; i < costs.size(); ++i) known_bad[i] = !costs[i].usable();
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

// The `batch` stage: joins its input stages by sample sequence number, restores each consumer
// rank's order and collates batches; the batch thread above does the work.
StageSchema BatchStageSchema() {
  return StageSchema{
      "batch",
      "join the input stages per sample, restore the deterministic order, collate batches of "
      "batch_size "
      "samples, or of whole samples within a token/patch budget (every rank the same number per "
      "epoch)",
      StageKind::kBatch,
      /*field_is_path=*/false,
      {
          Ranged({"batch_size", ParamType::kInt, std::nullopt,
                  "samples per batch (with a budget: the most; the ring holds this many)"},
                 1, std::nullopt),
          {"drop_last", ParamType::kBool, false, "drop a short last batch at the end of an epoch"},
          Ranged(
              {"max_tokens", ParamType::kInt, int64_t{0},
               "token budget: whole samples until their text tokens (the text or qwen_chat stage's "
               "<name>_lengths, vision pads included) would pass this; 0: none"},
              0, 4294967295),
          Ranged({"max_patches", ParamType::kInt, int64_t{0},
                  "patch budget: whole samples until their vision patches (qwen_vision, "
                  "qwen_video) would "
                  "pass this; 0: none"},
                 0, 4294967295),
      },
      nullptr};
}

}  // namespace mmfeed
