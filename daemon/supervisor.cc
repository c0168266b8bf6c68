#include "daemon/supervisor.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <asio.hpp>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "base/atomic_file.h"
#include "base/clock.h"
#include "base/rng.h"
#include "client/report_text.h"
#include "daemon/control_server.h"
#include "daemon/metrics.h"
#include "daemon/ring_sink.h"
#include "daemon/service_notify.h"
#include "daemon/stream_state.h"
#include "engine/autotune.h"
#include "engine/config_diff.h"
#include "engine/pipeline.h"
#include "engine/trace.h"
#include "engine/window_profile.h"
#include "source/catalog.h"
#include "stages/text/packing_sink.h"

namespace mmfeed {
namespace {

constexpr int kExitConfig = 2;
// What a refused reload says when a restart applies the change.
constexpr char kRestartHint[] = "; restart the daemon with the new config to apply it";
constexpr int kExitLost = 3;  // the drain timed out (batches no trainer took are dropped)

// Stands in for the rings when a pipeline is only built (--check): takes nothing.
class UnusedSink : public BatchSink {
 public:
  Reservation Reserve(BatchMemory*, int) override { return Reservation::kClosed; }
  void Commit(const BatchMemory&, const BatchInfo&) override {}
  void Discard(const BatchMemory&) override {}
  void Finish(bool) override {}
};

// A pipeline of `cfg` built and not started (--check, and a restart's kept config).
Result<std::unique_ptr<Pipeline>> BuildOnly(const PipelineConfig& cfg,
                                            std::vector<std::unique_ptr<UnusedSink>>* owned) {
  std::vector<BatchSink*> sinks;
  for (int r = 0; r < cfg.consumers; ++r) {
    owned->push_back(std::make_unique<UnusedSink>());
    sinks.push_back(owned->back().get());
  }
  return Pipeline::Create(cfg, sinks);
}

class Supervisor {
 public:
  Supervisor(PipelineConfig cfg, SupervisorOptions opt)
      : cfg_(std::move(cfg)), opt_(std::move(opt)), timer_(io_) {}

  int Run() {
    // --state-dir: the stream the trainers are in. A restart on an edited config continues it
    // with the config it was made from, then switches as a reload would (`then_reload`).
    std::optional<StreamState> saved;
    std::string then_reload;
    if (!opt_.state_dir.empty()) {
      Result<std::optional<StreamState>> read = ReadState();
      if (!read.ok()) {
        spdlog::error("{}", read.status().message());
        return kExitConfig;
      }
      saved = std::move(read.value());
      if (saved && !saved->config_text.empty() &&
          (saved->config_text != cfg_.text || saved->config_file != cfg_.file)) {
        Result<PipelineConfig> kept = KeptConfig(*saved);
        if (kept.ok()) {
          spdlog::info(
              "{} differs from the config the saved stream in {} was made with: continuing the "
              "stream with that config, then reloading {} (applied as a reload would: at once or "
              "at the next epoch boundary)",
              cfg_.file, StatePath(), cfg_.file);
          then_reload = cfg_.file;
          cfg_ = std::move(kept.value());
        } else {
          spdlog::warn("{}: the saved stream cannot be continued ({}): starting fresh", StatePath(),
                       kept.status().message());
          saved.reset();
        }
      }
    }
    // Rings first: their size is known from the stage specs, and running out of memory
    // must be an error now, not later.
    RingPlan plan = PlanRings(cfg_);
    Status fits = CheckMemory(plan);
    if (!fits.ok()) {
      spdlog::error("{}", fits.message());
      return 1;
    }
    const shm::SlotLayout& layout = plan.layout;
    ring_bytes_ = plan.total_bytes;
    const StageConfig* packed = cfg_.packed_stage >= 0 ? &cfg_.stages[cfg_.packed_stage] : nullptr;
    std::vector<BatchSink*>& sinks = pipeline_sinks_;
    auto rings = MakeRings(cfg_, plan);
    if (!rings.ok()) {
      spdlog::error("{}", rings.status().message());
      return 1;
    }
    sinks_ = std::move(rings.value());
    moved_from_.resize(cfg_.consumers);
    awaiting_reattach_.resize(cfg_.consumers);
    for (int r = 0; r < cfg_.consumers; ++r) {
      sinks.push_back(sinks_[r].get());
      if (packed) {
        packers_.push_back(std::make_unique<PackingSink>(
            sinks.back(), packed->params.GetInt("max_len"), cfg_.batch_size,
            static_cast<int32_t>(packed->params.GetInt("pad_id"))));
        sinks.back() = packers_.back().get();
      }
    }
    spdlog::info("{} ring(s) of {} slots x {:.1f} MiB: {:.2f} GiB of ring memory", cfg_.consumers,
                 cfg_.ring_slots, layout.slot_bytes / 1048576.0, plan.total_bytes / 1073741824.0);
    auto pipeline = Pipeline::Create(cfg_, sinks);
    if (!pipeline.ok()) {
      spdlog::error("{}", pipeline.status().message());
      return kExitConfig;
    }
    pipeline_ = std::move(pipeline.value());
    for (auto& s : sinks_) pipeline_->AddProfiledStage(s->info());
    if (!opt_.state_dir.empty()) {
      Status st = LoadState(saved);
      // The state is written once now: a --state-dir that cannot be written is an error at
      // start, not a stale file found by the next restart.
      if (st.ok()) st = SaveState();
      if (!st.ok()) {
        spdlog::error("{}", st.message());
        return kExitConfig;
      }
    }
    holders_.resize(cfg_.consumers);
    rates_.resize(cfg_.consumers);
    config_hash_ = HashFile(cfg_.file);
    if (!cfg_.metrics_listen.empty()) {
      auto m = MetricsServer::Start(io_, cfg_.metrics_listen);
      if (!m.ok()) {
        spdlog::error("{}:{}:{}: {}", cfg_.file, cfg_.metrics_mark.line, cfg_.metrics_mark.column,
                      m.status().message());
        return kExitConfig;
      }
      metrics_ = std::move(m.value());
      metrics_->Publish(MetricsText());  // before the first scrape can come
      spdlog::info("serving Prometheus metrics on http://{}/metrics", cfg_.metrics_listen);
    }

    server_ = std::make_unique<ControlServer>(
        io_, opt_.socket, opt_.socket_group,
        ControlServer::Handler{
            [this](int rank, int pid, int pidfd, const std::optional<StreamCursor>& resume) {
              return Attach(rank, pid, pidfd, resume);
            },
            [this](int rank, int pid, uint32_t generation) { Detach(rank, pid, generation); },
            [this] { return StatusJson(); },
            [this] { BeginDrain("stop requested"); },
            [this](const std::string& file, ReloadDone done) { Reload(file, std::move(done)); },
            [this](double seconds, bool trace, std::function<void(Result<nlohmann::json>)> done) {
              Profile(seconds, trace, std::move(done));
            },
        });
    Status st = server_->Listen();
    if (!st.ok()) {
      spdlog::error("{}", st.message());
      return st.code() == Status::Code::kInvalid ? kExitConfig : 1;  // a bad --socket
    }
    asio::signal_set signals(io_, SIGINT, SIGTERM, SIGHUP);
    WaitSignal(signals);
    st = pipeline_->Start();
    if (!st.ok()) {
      spdlog::error("{}", st.message());
      return 1;
    }
    spdlog::info("serving on {}", opt_.socket);
    notify_.Ready(StatusLine());
    // The edited config is reloaded once every rank's trainer is back: their cursors, possibly
    // ahead of the saved ones, decide where the epoch boundary of the switch is.
    then_reload_ = then_reload;
    back_since_start_.assign(cfg_.consumers, false);
    Tick();
    io_.run();
    timer_.cancel();
    for (const auto& w : windows_) w->cancel();  // their requests get an error
    server_->Shutdown();
    bool reload_stuck = false;
    if (reload_thread_.joinable()) {
      if (!reload_built_.load()) {
        // A reload still building its pipeline (its catalog waiting on storage): not waited for.
        spdlog::warn("a reload was still building its pipeline: exiting without it");
        reload_stuck = true;
      } else {  // built: its completion is refused now (the run has ended)
        reload_thread_.join();
        io_.restart();
        io_.poll();
      }
    }
    if (threads_abandoned_) {  // they cannot be joined: the process ends under them
      (void)SaveState();       // logged
      std::fprintf(stderr, "mmfeedd: the drain timed out with pipeline threads stuck\n");
      std::fflush(nullptr);
      std::_Exit(kExitLost);
    }

    pipeline_->Wait();
    (void)SaveState();  // logged
    const int code = Report();
    if (reload_stuck) {  // its thread cannot be joined: the process ends under it
      std::fflush(nullptr);
      std::_Exit(code);
    }
    return code;
  }

 private:
  // Ranks with a ring: the config's consumers, then any a reload removed (their rings end).
  int ranks() const { return static_cast<int>(sinks_.size()); }

  // The process attached for a rank: its pid, a pidfd on it, and the attach's generation.
  struct Holder {
    int pid = 0;
    int pidfd = -1;
    uint32_t generation = 0;
    RingSink* sink = nullptr;  // the rank's ring, or the one a reload replaced
  };

  Result<AttachGrant> Attach(int rank, int pid, int pidfd,
                             const std::optional<StreamCursor>& resume) {
    // A rank a reload removed is still served the batches its ring holds.
    if (rank >= ranks() || (rank >= cfg_.consumers && sinks_[rank]->ring().unreleased() == 0))
      return Status::Invalid(fmt::format(
          "rank {} out of range: this pipeline has {} consumer rank(s)", rank, cfg_.consumers));
    Holder& h = holders_[rank];
    if (h.pid) {
      pollfd p{h.pidfd, POLLIN, 0};
      // The holder attaching again has drained the ring a reload replaced: it moves on.
      const bool moves_on = h.pid == pid && h.sink != sinks_[rank].get();
      if (!moves_on && (h.pidfd < 0 || poll(&p, 1, 0) == 0))
        return Status::Invalid(fmt::format("rank {} is already attached (pid {})", rank, h.pid));
      if (!moves_on)
        spdlog::info("rank {}: its holder pid {} is dead; pid {} takes over", rank, h.pid, pid);
      server_->Disconnect(h.generation);
      Detach(rank, h.pid, h.generation);
    }
    if (ReadyToSwap()) CompleteReload();
    awaiting_reattach_[rank] = false;
    RingSink* sink = sinks_[rank].get();
    if (std::unique_ptr<RingSink>& old = moved_from_[rank]) {
      // A reload replaced the rank's ring. Its batches the trainer has not finished are served
      // from it first (the trainer then attaches again by itself); unless the trainer asks for
      // earlier ones, which the running pipeline makes again.
      if (resume) {
        MMFEED_RETURN_IF_ERROR(CheckResume(rank, old->ring(), *resume));
        old->ring().DropReady(resume->seq);
      }
      uint64_t first = old->ring().MinReadySeq();
      if (old->ring().unreleased() > 0 && (!resume || resume->seq == first)) {
        sink = old.get();
      } else {
        old.reset();
      }
    }
    if (resume && sink == sinks_[rank].get()) MMFEED_RETURN_IF_ERROR(Resume(rank, *resume));
    shm::RingWriter& ring = sink->ring();
    Result<int> control = ring.Attach(++last_generation_);
    if (!control.ok()) return control.status();
    h = {pid, pidfd >= 0 ? fcntl(pidfd, F_DUPFD_CLOEXEC, 0) : -1, last_generation_, sink};
    spdlog::info("rank {} attached (pid {}, generation {}{})", rank, pid, h.generation,
                 sink == sinks_[rank].get() ? "" : ", to the ring a reload replaced");
    if (!then_reload_.empty() && rank < static_cast<int>(back_since_start_.size())) {
      back_since_start_[rank] = true;
      if (std::all_of(back_since_start_.begin(), back_since_start_.end(), [](bool b) { return b; }))
        asio::post(io_, [this, file = std::exchange(then_reload_, std::string())] {
          Reload(file, [](Result<nlohmann::json>) {});  // logged
        });
    }
    return AttachGrant{{ring.data_fd(), *control},
                       {{"rank", rank},
                        {"generation", h.generation},
                        {"ring_bytes", ring.size()},
                        {"consumers", cfg_.consumers},
                        {"pipeline", cfg_.name}}};
  }

  // The trainer finished the batches before `cursor`: those in the ring are not delivered
  // again; if the rest starts at the cursor it is reused, else the rank is rewound there. A
  // cursor the rank cannot be served from (forged, past the data, before a reload's boundary
  // with its batches no longer in the ring) is refused before anything changes.
  Status Resume(int rank, const StreamCursor& c) {
    shm::RingWriter& ring = sinks_[rank]->ring();
    MMFEED_RETURN_IF_ERROR(CheckResume(rank, ring, c));
    int finished = ring.DropReady(c.seq);
    uint64_t next = ring.MinReadySeq();
    if (next == UINT64_MAX) next = pipeline_->NextCommit(rank);
    if (next != c.seq) {
      Status st = pipeline_->Rewind(rank, c.seq);
      if (st.code() == Status::Code::kClosed && ReadyToSwap()) {
        // The pipeline was handing over at the epoch boundary: its successor serves the rank.
        CompleteReload();
        st = pipeline_->Rewind(rank, c.seq);
      }
      MMFEED_RETURN_IF_ERROR(st);
    }
    if (c.seq >= pipeline_->origin().seq) ring.set_acked(pipeline_->CursorAt(c.seq));
    spdlog::info("rank {}: resuming at batch {} ({} finished batch(es) dropped from the ring, {})",
                 rank, c.seq, finished, next == c.seq ? "the rest reused" : "the rank rewound");
    return Status::Ok();
  }

  // Whether rank `rank` can be served from cursor `c` on, `ring` holding its published batches:
  // a cursor naming its stream must name this one; a seq from the ring's oldest batch to the
  // pipeline's next one is served from the ring; any other must be one the pipeline can make
  // (Pipeline::CheckCursor).
  Status CheckResume(int rank, shm::RingWriter& ring, const StreamCursor& c) {
    const uint64_t seq = c.seq;
    if (const uint32_t ours = pipeline_->StreamBefore(seq); c.stream && ours && c.stream != ours)
      return Status::Invalid(fmt::format(
          "rank {}: resume refused: the cursor (batch {}) is of stream {:08x}, but this "
          "daemon's batch {} is of stream {:08x}: the cursor was saved in another run or with "
          "another config or data (restart the daemon with that run's config and --state-dir, "
          "or attach without it to start the rank over)",
          rank, seq, c.stream, seq - 1, ours));
    const uint64_t first = ring.MinReadySeq(), next = pipeline_->NextCommit(rank);
    if (seq <= next && (first == UINT64_MAX ? seq == next : first <= seq)) return Status::Ok();
    Status st = pipeline_->CheckCursor(seq);
    return st.ok() ? st : st.WithContext(fmt::format("rank {}: resume refused", rank));
  }

  // SIGHUP, `mmfeedctl reload`: `file` (empty: the running config's) is checked as completely
  // as --check and, if good, a pipeline built from it takes over from each rank's next batch:
  // at once, or at every rank's next common epoch boundary when it changes which samples go
  // where (a new seed). A bad config, or one the running rings cannot serve, changes nothing.
  // The new pipeline is built on a thread of its own (its catalog may wait on storage): the
  // control thread goes on serving, and `done` gets the reply on it when the build is over.
  using ReloadDone = std::function<void(Result<nlohmann::json>)>;
  void Reload(const std::string& file, ReloadDone done) {
    const std::string path = file.empty() ? cfg_.file : file;
    notify_.Reloading();  // READY=1 ends it, refused or not (EndReload)
    Result<std::shared_ptr<PreparedReload>> prep = PrepareReload(path);
    if (!prep.ok()) return EndReload(path, prep.status(), std::move(done));
    reload_built_.store(false);
    reload_thread_ = std::thread([this, p = *prep, path, done = std::move(done)]() mutable {
      p->next = Pipeline::Create(p->cfg, p->sinks);
      reload_built_.store(true);
      asio::post(io_, [this, p, path, done = std::move(done)]() mutable {
        if (reload_thread_.joinable()) reload_thread_.join();
        EndReload(path, ApplyReload(*p), std::move(done));
      });
    });
  }

  void EndReload(const std::string& path, Result<nlohmann::json> r, ReloadDone done) {
    if (r.ok()) {
      ++reloads_ok_;
      spdlog::info("reload of {}: {}; applied {}", path, (*r)["summary"].get<std::string>(),
                   (*r)["applied"].get<std::string>());
    } else {
      ++reloads_failed_;
      spdlog::error("reload of {} refused, the running pipeline is unchanged: {}", path,
                    r.status().message());
    }
    notify_.Ready(r.ok() ? StatusLine() : "reload refused: " + r.status().message());
    if (metrics_) metrics_->Publish(MetricsText());
    done(std::move(r));
  }

  // What a reload has made before its pipeline is built.
  struct PreparedReload {
    PipelineConfig cfg;
    ConfigChanges changes;
    RingPlan plan;
    std::vector<std::unique_ptr<RingSink>> rings;  // empty, or the rings every rank moves to
    std::vector<BatchSink*> sinks;                 // what the new pipeline feeds
    Result<std::unique_ptr<Pipeline>> next = Status::Unavailable("not built");
  };

  // The checks and the rings, on the control thread (quick: no data is read).
  Result<std::shared_ptr<PreparedReload>> PrepareReload(const std::string& file) {
    if (draining_) return Status::Unavailable("the daemon is draining");
    if (reload_thread_.joinable())
      return Status::Unavailable("the previous reload is still building its pipeline");
    if (pending_)
      return Status::Unavailable("the previous reload is waiting for the epoch boundary");
    if (pipeline_->Finished()) return Status::Closed("the run has ended");
    Result<PipelineConfig> cfg = LoadDaemonConfig(file, opt_);
    if (!cfg.ok()) return cfg.status();
    auto p = std::make_shared<PreparedReload>();
    p->changes = DiffConfigs(cfg_, *cfg);
    if (!p->changes.needs_restart.empty())
      return Status::Unsupported(p->changes.needs_restart + kRestartHint);
    p->plan = PlanRings(*cfg);
    p->sinks = pipeline_sinks_;
    // Batches larger than the slots, or another number of ranks: every rank moves to a new
    // ring, made now, and trainers attach to it by themselves (kClosedMoved). The old rings
    // live on until then.
    if (cfg->consumers != cfg_.consumers || !sinks_[0]->ring().Fits(p->plan.layout).ok()) {
      if (cfg->packed_stage >= 0)
        return Status::Unsupported(std::string("a packed text stream's rings cannot be re-made") +
                                   kRestartHint);
      RingPlan both = p->plan;
      both.total_bytes += ring_bytes_;
      Status memory = CheckMemory(both);
      if (!memory.ok()) return memory.WithContext("the new rings are made beside the old ones");
      auto made = MakeRings(*cfg, p->plan);
      if (!made.ok()) return made.status();
      p->rings = std::move(made.value());
      p->sinks.clear();
      for (auto& ring : p->rings) p->sinks.push_back(ring.get());
    }
    p->cfg = std::move(cfg.value());
    return p;
  }

  // Back on the control thread with the built pipeline: how it takes over.
  Result<nlohmann::json> ApplyReload(PreparedReload& p) {
    if (!p.next.ok()) return p.next.status();
    if (draining_) return Status::Unavailable("the daemon is draining");
    if (pipeline_->Finished()) return Status::Closed("the run has ended");
    std::unique_ptr<Pipeline>& next = p.next.value();
    const bool new_ranks = p.cfg.consumers != cfg_.consumers;
    // Another number of batches per epoch (batch size, drop_last, the source's size; with a
    // token budget, any change of which samples go where): every rank switches at one epoch
    // boundary, where the new numbering starts.
    const bool renumber = new_ranks ||
                          next->batches_per_epoch() != pipeline_->batches_per_epoch() ||
                          ((next->budgeted() || pipeline_->budgeted()) &&
                           next->order_fingerprint() != pipeline_->order_fingerprint());
    if (renumber && p.cfg.packed_stage >= 0)
      return Status::Unsupported(
          std::string("a packed text stream's batch numbering cannot change") + kRestartHint);
    const bool at_epoch = renumber || next->order_fingerprint() != pipeline_->order_fingerprint();
    // A new metrics endpoint is listening before anything changes, or the reload is refused.
    const bool new_metrics = p.cfg.metrics_listen != cfg_.metrics_listen;
    std::unique_ptr<MetricsServer> metrics;
    if (new_metrics && !p.cfg.metrics_listen.empty()) {
      auto m = MetricsServer::Start(io_, p.cfg.metrics_listen);
      if (!m.ok()) return m.status();
      metrics = std::move(m.value());
      metrics->Publish(MetricsText());
    }
    if (new_metrics) metrics_ = std::move(metrics);
    const bool grow = !p.rings.empty();
    nlohmann::json reply = {
        {"config", p.cfg.file},
        {"changes", p.changes.json},
        {"summary", p.changes.Summary()},
        {"applied", !at_epoch  ? "now"
                    : renumber ? "at the next epoch boundary, for every rank at once (the batches "
                                 "per epoch or the ranks change)"
                               : "at the next epoch boundary"},
        {"rings", !grow       ? "unchanged"
                  : new_ranks ? fmt::format("re-made for {} consumer rank(s); trainers attach to "
                                            "them by themselves",
                                            p.cfg.consumers)
                              : "re-made larger; trainers attach to them by themselves"}};
    pending_ = std::make_unique<PendingReload>(PendingReload{
        std::move(next), std::move(p.cfg), std::move(p.plan), std::move(p.rings), at_epoch});
    if (at_epoch) {
      // Every rank switches at one boundary, the furthest rank's next: a rank an epoch behind
      // the others must not make that epoch in another order than they did.
      pipeline_->QuiesceAtEpochEnd(/*together=*/true);
    } else {
      pipeline_->Quiesce();
      pipeline_->Wait();
      CompleteReload();
    }
    return reply;
  }

  // Whether the pending reload can take over now. One that changes the order or the numbering
  // waits, after the running pipeline finished its epoch, until every trainer has taken the
  // batches before the boundary: from the swap on, the saved state names only the new config,
  // and a restart could not make a batch that only the ring held again. A batch a trainer
  // holds is the trainer's: it finishes it and resumes after it. (Waiting for the releases
  // instead would wait forever for a trainer that keeps its last batch while it asks for the
  // next, as mmfeed.torch's dataset and to_device do.)
  bool ReadyToSwap() {
    if (!pending_ || !pipeline_->Finished()) return false;
    if (!pending_->at_epoch || !pipeline_->status().ok() || draining_) return true;
    for (int r = 0; r < cfg_.consumers; ++r) {
      if (sinks_[r]->ring().MinReadySeq() < pipeline_->NextCommit(r)) return false;
      if (moved_from_[r] && moved_from_[r]->ring().MinReadySeq() < pipeline_->NextCommit(r))
        return false;
    }
    return true;
  }

  // The rank's acknowledged cursor: a trainer still draining the ring a reload replaced
  // acknowledges there.
  StreamCursor AckedOf(int r) {
    StreamCursor acked = sinks_[r]->ring().acked();
    if (moved_from_[r] && moved_from_[r]->ring().acked().seq > acked.seq)
      acked = moved_from_[r]->ring().acked();
    return acked;
  }

  // The running pipeline has quiesced: the pending one continues every rank from its next
  // batch, into the same sinks, reshaped for its tensors.
  void CompleteReload() {
    std::unique_ptr<PendingReload> p = std::move(pending_);
    pipeline_->Wait();
    Status st = pipeline_->status();
    if (!st.ok() || draining_) {  // no successor: the sinks end with this pipeline
      if (!st.ok()) spdlog::error("the reload is abandoned: {}", st.message());
      for (BatchSink* s : pipeline_sinks_) s->Finish(false);
      return;
    }
    if (p->at_epoch) {
      // Every rank stands at the same epoch boundary: the new order or numbering starts there,
      // and cursors before it are refused (the batches before it came from another config).
      StreamCursor at = pipeline_->CursorAt(pipeline_->NextCommit(0));
      bool together = at.batch == 0;
      for (int r = 1; r < cfg_.consumers; ++r) together &= pipeline_->NextCommit(r) == at.seq;
      if (!together) {  // QuiesceAtEpochEnd(true) guarantees it: a bug
        spdlog::error("the reload is abandoned: the ranks did not stop at one epoch boundary");
        for (BatchSink* s : pipeline_sinks_) s->Finish(false);
        return;
      }
      const Pipeline::Origin& before = pipeline_->origin();
      p->pipeline->SetOrigin(
          {at.epoch, at.seq,
           Pipeline::NextStreamTag(before, at.seq, p->pipeline->order_fingerprint()),
           before.stream});
    } else {
      p->pipeline->SetOrigin(pipeline_->origin());  // the same numbering goes on
    }
    // Ranks a smaller consumer count removes: their trainers take what their rings hold, then
    // see the end of their data. Added ranks start where the others are.
    for (int r = p->cfg.consumers; r < cfg_.consumers; ++r) {
      sinks_[r]->Finish(true);
      spdlog::warn(
          "rank {} is no longer served (consumers {} -> {}): its trainer gets the "
          "batches its ring holds, then the end of its data",
          r, cfg_.consumers, p->cfg.consumers);
    }
    std::vector<StreamCursor> start;
    for (int r = 0; r < p->cfg.consumers; ++r) {
      uint64_t seq = r < cfg_.consumers ? pipeline_->NextCommit(r) : p->pipeline->origin().seq;
      start.push_back(p->pipeline->CursorAt(seq));
      if (!p->rings.empty()) MoveRank(r, std::move(p->rings[r]), start.back());
    }
    if (!p->rings.empty()) {
      pipeline_sinks_.clear();
      for (int r = 0; r < p->cfg.consumers; ++r) pipeline_sinks_.push_back(sinks_[r].get());
      ring_bytes_ = p->plan.total_bytes;
    }
    st = p->pipeline->SetStart(start);
    for (int r = 0; r < p->cfg.consumers; ++r) {
      if (st.ok()) st = sinks_[r]->Reshape(p->plan.specs, p->plan.layout);
      p->pipeline->AddProfiledStage(sinks_[r]->info());
    }
    if (st.ok()) st = p->pipeline->Start();
    if (!st.ok()) {  // checked before the swap: a bug, and the run cannot go on
      spdlog::error("reload failed after the running pipeline stopped: {}", st.message());
      for (BatchSink* s : pipeline_sinks_) s->Finish(false);
      return;
    }
    std::string at;
    for (const StreamCursor& c : start) at += fmt::format(" {}", c.seq);
    spdlog::info("the reloaded pipeline took over: ranks at batch{}", at);
    config_hash_ = HashFile(p->cfg.file);
    Retire(pipeline_->Profile());
    pipeline_ = std::move(p->pipeline);
    ++pipeline_id_;
    cfg_ = std::move(p->cfg);
  }

  // Makes one ring per rank of `cfg` for `plan`.
  static Result<std::vector<std::unique_ptr<RingSink>>> MakeRings(const PipelineConfig& cfg,
                                                                  const RingPlan& plan) {
    std::vector<std::unique_ptr<RingSink>> rings;
    for (int r = 0; r < cfg.consumers; ++r) {
      auto ring = shm::RingWriter::Create(r, cfg.consumers, cfg.ring_slots, plan.layout,
                                          cfg.placement.numa_node);
      if (!ring.ok()) return ring.status();
      rings.push_back(std::make_unique<RingSink>(r, plan.specs, std::move(ring.value())));
    }
    return rings;
  }

  // Rank `r` goes on in `ring` (a reload needed larger slots or changed the ranks) from `next`,
  // the first batch not in the old ring. The old ring's batches are served first (see Attach): an
  // attached trainer drains it and attaches again by itself.
  void MoveRank(int r, std::unique_ptr<RingSink> ring, const StreamCursor& next) {
    if (r == ranks()) {  // a rank a larger consumer count adds
      ring->ring().set_acked(next);
      sinks_.push_back(std::move(ring));
      holders_.emplace_back();
      rates_.emplace_back();
      moved_from_.emplace_back();
      awaiting_reattach_.push_back(false);
      spdlog::info("rank {}: added, starting at batch {}", r, next.seq);
      return;
    }
    std::unique_ptr<RingSink> old = std::move(sinks_[r]);
    // Its trainer comes back by itself: the daemon does not end before it has (the new ring
    // may hold nothing but the end of the data).
    awaiting_reattach_[r] = holders_[r].pid != 0;
    if (holders_[r].pid) {
      // The trainer keeps its connection to the old ring until it attaches again: its later
      // close is then a stale generation and changes nothing.
      if (holders_[r].pidfd >= 0) ::close(holders_[r].pidfd);
      holders_[r] = Holder{};
    }
    ring->ring().set_acked(old->ring().acked());
    old->ring().CloseMoved();
    retired_stages_[old->info().name].Add(BuildProfile({old->info()}, 1)["stages"][0]);
    moved_published_ += old->ring().published();
    sinks_[r] = std::move(ring);
    moved_from_[r] = std::move(old);
    spdlog::info("rank {}: moved to a new ring ({:.1f} MiB slots), continuing at batch {}", r,
                 sinks_[r]->ring().layout().slot_bytes / 1048576.0, next.seq);
  }

  // --state-dir: the stream the trainers are in (daemon/stream_state.h).
  std::string StatePath() const { return opt_.state_dir + "/cursors.json"; }

  Result<std::optional<StreamState>> ReadState() {
    std::error_code ec;
    std::filesystem::create_directories(opt_.state_dir, ec);
    if (ec) return Status::Io(fmt::format("--state-dir {}: {}", opt_.state_dir, ec.message()));
    return ReadStreamState(StatePath());
  }

  // The config a saved stream was made with, loaded as the daemon loads its file (relative
  // paths from where that file was).
  Result<PipelineConfig> KeptConfig(const StreamState& s) const {
    Result<PipelineConfig> cfg = ParseConfig(s.config_text, s.config_file);
    if (!cfg.ok()) return cfg;
    MMFEED_RETURN_IF_ERROR(CheckFaultsAllowed(*cfg, opt_.allow_faults));
    cfg->source.index_dir = opt_.state_dir;
    ConfigChanges changes = DiffConfigs(*cfg, cfg_);
    if (!changes.needs_restart.empty())
      return Status::Unsupported(
          fmt::format("the edited config changes what a reload cannot: {}", changes.needs_restart));
    // It must still make the saved stream (its data may be gone or changed since).
    std::vector<std::unique_ptr<UnusedSink>> owned;
    Result<std::unique_ptr<Pipeline>> p = BuildOnly(*cfg, &owned);
    if (!p.ok()) return p.status().WithContext("the kept config cannot be built");
    if ((*p)->fingerprint() != s.fingerprint)
      return Status::Invalid("its data changed since the state was saved");
    return cfg;
  }

  // Starts every rank from its saved cursor when `saved` is this pipeline's stream.
  Status LoadState(std::optional<StreamState> saved) {
    if (!saved) {
      spdlog::info("no saved cursors in {}: starting every rank at the beginning", StatePath());
      return Status::Ok();
    }
    if (saved->fingerprint != pipeline_->fingerprint()) {
      spdlog::warn(
          "{} is for another stream (fingerprint {}, this config makes {}: the data or the "
          "config changed): starting fresh",
          StatePath(), saved->fingerprint, pipeline_->fingerprint());
      return Status::Ok();
    }
    // A reload that changed the order or the numbering started this config's batches there.
    pipeline_->SetOrigin({saved->origin_epoch, saved->origin_seq,
                          saved->origin_stream ? saved->origin_stream : pipeline_->origin().stream,
                          saved->origin_previous});
    for (size_t r = 0; r < saved->ranks.size(); ++r) {
      StreamCursor& c = saved->ranks[r];
      if (c.seq < saved->origin_seq) {
        // The daemon stopped while this rank's trainer still had batches of the config before
        // that reload to take; this config cannot make them.
        spdlog::warn(
            "rank {}: batches {}-{} of the config before the last reload were not released by "
            "the rank's trainer and cannot be made again: the rank starts at batch {} (epoch "
            "{}); a trainer that finished them goes on there, one that resumes before it is "
            "refused",
            r, c.seq, saved->origin_seq - 1, saved->origin_seq, saved->origin_epoch);
        c = pipeline_->CursorAt(saved->origin_seq);
      }
    }
    Status valid = pipeline_->SetStart(saved->ranks);
    if (!valid.ok())
      return valid.WithContext(fmt::format(
          "{}: the saved cursors do not fit this config (move the file away to start every rank "
          "at the beginning)",
          StatePath()));
    for (int r = 0; r < cfg_.consumers; ++r) sinks_[r]->ring().set_acked(saved->ranks[r]);
    std::string at;
    for (const StreamCursor& c : saved->ranks) at += fmt::format(" {}", c.seq);
    spdlog::info("continuing from the saved cursors in {}: ranks at batch{}", StatePath(), at);
    return Status::Ok();
  }

  // Writes the stream's state when it changed (daemon/stream_state.h). A failure is logged
  // when it first happens and then once a minute with a count, not at every tick.
  Status SaveState() {
    if (opt_.state_dir.empty()) return Status::Ok();
    const Pipeline::Origin origin = pipeline_->origin();
    StreamState state{cfg_.name,     pipeline_->fingerprint(), origin.epoch, origin.seq,
                      origin.stream, origin.previous,          {},           cfg_.file,
                      cfg_.text};
    for (int r = 0; r < cfg_.consumers; ++r) state.ranks.push_back(AckedOf(r));
    std::string text = StreamStateToJson(state).dump() + "\n";
    if (text == saved_state_) return Status::Ok();
    Status st = WriteFileAtomically(StatePath(), text);
    const auto now = std::chrono::steady_clock::now();
    if (st.ok()) {
      if (state_failures_)
        spdlog::info("{} written again after {} failed attempt(s)", StatePath(), state_failures_);
      state_failures_ = 0;
      saved_state_ = std::move(text);
    } else if (state_failures_++ == 0 || now - state_warned_at_ >= std::chrono::minutes(1)) {
      spdlog::error("{} (the cursors a restart would continue from are {}; {} attempt(s) failed)",
                    st.message(), state_failures_ > 1 ? "stale" : "not saved", state_failures_);
      state_warned_at_ = now;
    }
    return st;
  }

  void Detach(int rank, int pid, uint32_t generation) {
    Holder& h = holders_[rank];
    if (h.generation != generation || !h.pid) return;  // already taken over
    if (h.pidfd >= 0) ::close(h.pidfd);
    RingSink* sink = h.sink;
    h = Holder{};
    int n = sink->ring().Detach();
    // A reader that scribbled over its control area and then died: its slots are taken back
    // all the same, and the next attach gets a fresh control area.
    if (std::string why = sink->ring().TakeViolation(); !why.empty())
      spdlog::warn(
          "rank {}: pid {} left its control area corrupt ({}); its batches are "
          "delivered again to the next attach",
          rank, pid, why);
    spdlog::info("rank {} detached (pid {}); {} unreleased batch(es) will be delivered again", rank,
                 pid, n);
  }

  nlohmann::json StatusJson() {
    nlohmann::json ranks = nlohmann::json::array();
    for (int r = 0; r < this->ranks(); ++r) {
      shm::RingWriter::Backlog b = sinks_[r]->ring().backlog();
      ranks.push_back({{"rank", r},
                       {"removed", r >= cfg_.consumers},
                       {"pid", holders_[r].pid},
                       {"attached", holders_[r].pid != 0},
                       {"generation", holders_[r].generation},
                       {"published", sinks_[r]->ring().published()},
                       {"released", sinks_[r]->ring().released()},
                       {"acked", CursorToJson(sinks_[r]->ring().acked())},
                       {"lag_batches", b.ready},
                       {"seconds_since_take", b.seconds_since_take},
                       {"samples_per_s", rates_[r].per_s}});
    }
    const ProcessSample p = SampleProcess();
    return {{"pipeline", cfg_.name},
            {"config", cfg_.file},
            {"config_hash", config_hash_},
            {"uptime_s",
             std::chrono::duration<double>(std::chrono::steady_clock::now() - started_at_).count()},
            {"process",
             {{"cpu_seconds", p.cpu_ns / 1e9},
              {"rss_bytes", p.rss_bytes},
              {"read_bytes", p.read_bytes},
              {"storage_read_bytes", p.storage_read_bytes}}},
            {"reloads",
             {{"ok", reloads_ok_}, {"failed", reloads_failed_}, {"pending", pending_ != nullptr}}},
            {"state", draining_               ? "draining"
                      : pipeline_->Finished() ? "finished"
                                              : "running"},
            {"pid", getpid()},
            {"consumers", ranks},
            {"rings",
             {{"bytes", ring_bytes_},
              {"slots", cfg_.ring_slots},
              {"numa_node", cfg_.placement.numa_node}}},
            {"placement", pipeline_->PlacementJson()},
            {"workers", WorkersJson()},
            {"profile", pipeline_->Profile()}};
  }

  // Everything the windowed profile compares, now.
  WindowSample SampleWindow() {
    WindowSample w;
    w.t_ns = NowNs();
    w.pipeline_id = pipeline_id_;
    w.stages = pipeline_->SampleStages();
    w.host = SampleHost(pipeline_->Threads());
    if (const nlohmann::json st = pipeline_->StorageStats(); !st.is_null()) {
      w.storage.remote = true;
      w.storage.bytes = st["bytes"].get<uint64_t>();
      w.storage.retries = st["retries"].get<uint64_t>();
      w.storage.wait_s = st["wait_seconds"].get<double>();
    }
    for (int r = 0; r < ranks(); ++r) {
      shm::RingWriter::Backlog b = sinks_[r]->ring().backlog();
      ConsumerSample c;
      c.rank = r;
      c.attached = holders_[r].pid != 0;
      c.removed = r >= cfg_.consumers;
      c.generation = b.generation;
      c.wait_ns = b.wait_ns;
      c.hold_ns = b.hold_ns;
      c.published = sinks_[r]->ring().published();
      c.released = sinks_[r]->ring().released();
      c.ready = b.ready;
      c.taken = b.taken;
      c.slots = static_cast<uint32_t>(cfg_.ring_slots);
      w.consumers.push_back(c);
    }
    return w;
  }

  // workers: auto: a window every kTuneWindow, after which the tuner may move one worker.
  void Tune() {
    if (!pipeline_->cpu_budget() || draining_ || pipeline_->Finished()) return;
    const auto now = std::chrono::steady_clock::now();
    if (tune_sample_ && now < tune_at_) return;
    WindowSample w = SampleWindow();
    if (!tuner_ || !tune_sample_ || tune_sample_->pipeline_id != w.pipeline_id) {
      int fixed = 0;
      for (const StageConfig& st : cfg_.stages)
        if (!st.field.empty() && !st.workers_auto) fixed += st.workers;
      tuner_ = std::make_unique<WorkerTuner>(pipeline_->cpu_budget(), fixed);
    } else if (std::optional<WorkerMove> m = tuner_->Observe(BuildWindowReport(*tune_sample_, w))) {
      std::map<std::string, int> workers;
      for (const StageSample& st : w.stages) workers[st.name] = st.workers;
      Status st =
          m->from.empty() ? Status::Ok() : pipeline_->SetWorkers(m->from, workers[m->from] - 1);
      if (st.ok()) st = pipeline_->SetWorkers(m->to, workers[m->to] + 1);
      if (!st.ok()) {
        spdlog::error("workers: auto: {}", st.message());
      } else {
        std::string from = m->from.empty() ? ""
                                           : fmt::format(", {} {} -> {}", m->from, workers[m->from],
                                                         workers[m->from] - 1);
        spdlog::info("workers: auto: {} {} -> {}{} ({})", m->to, workers[m->to], workers[m->to] + 1,
                     from, m->evidence);
        tune_decisions_.push_back(
            {{"uptime_s", std::chrono::duration<double>(now - started_at_).count()},
             {"to", m->to},
             {"from", m->from.empty() ? nlohmann::json() : nlohmann::json(m->from)},
             {"evidence", m->evidence}});
        if (tune_decisions_.size() > 20) tune_decisions_.erase(tune_decisions_.begin());
      }
    }
    tune_sample_ = std::move(w);
    tune_at_ = now + kTuneWindow;
  }

  // `mmfeedctl profile`: samples now and again after `seconds`, on this thread's timer; with
  // `trace`, records the window's spans too (one trace at a time).
  void Profile(double seconds, bool trace, std::function<void(Result<nlohmann::json>)> done) {
    if (trace) {
      Status st = trace::Start();
      if (!st.ok()) return done(st);
    }
    auto start = std::make_shared<WindowSample>(SampleWindow());
    auto window = std::make_shared<asio::steady_timer>(
        io_, std::chrono::microseconds(static_cast<int64_t>(seconds * 1e6)));
    windows_.insert(window);
    window->async_wait([this, window, start, trace, done = std::move(done)](std::error_code ec) {
      windows_.erase(window);
      if (ec) {
        if (trace) (void)trace::Stop({});
        return done(Status::Closed("mmfeedd stopped before the profile's window ended"));
      }
      WindowSample end = SampleWindow();
      nlohmann::json report = BuildWindowReport(*start, end);
      if (trace) {
        std::map<int, std::string> names;
        for (const ThreadSample& t : end.host.threads) names[t.tid] = t.name;
        report["trace"] = trace::Stop(names);
      }
      done(std::move(report));
    });
  }

  // Every field stage's workers now; with workers: auto, the budget and the tuner's last moves.
  nlohmann::json WorkersJson() {
    nlohmann::json split = nlohmann::json::object();
    for (const StageSample& st : pipeline_->SampleStages())
      if (st.type != "ring" && st.type != "batch" && st.name != "source")
        split[st.name] = st.workers;
    nlohmann::json j = {{"split", split}};
    if (pipeline_->cpu_budget()) {
      j["cpu_budget"] = pipeline_->cpu_budget();
      j["decisions"] = tune_decisions_;
    }
    return j;
  }

  void WaitSignal(asio::signal_set& signals) {
    signals.async_wait([this, &signals](std::error_code ec, int sig) {
      if (ec) return;
      if (sig == SIGHUP)
        Reload("", [](Result<nlohmann::json>) {});  // logged either way
      else
        BeginDrain(sig == SIGINT ? "SIGINT" : "SIGTERM");
      WaitSignal(signals);
    });
  }

  void BeginDrain(const std::string& why) {
    if (draining_) return;
    draining_ = true;
    notify_.Stopping();
    drain_deadline_ = std::chrono::steady_clock::now() +
                      std::chrono::milliseconds(static_cast<int>(opt_.drain_timeout * 1000));
    spdlog::info("{}: draining (up to {:.0f}s for trainers to take the produced batches)", why,
                 opt_.drain_timeout);
    pipeline_->RequestStop();
  }

  // Every 100 ms: exit once every produced batch was taken, or the drain timed out.
  void Tick() {
    timer_.expires_after(std::chrono::milliseconds(100));
    timer_.async_wait([this](std::error_code ec) {
      if (ec) return;
      if (ReadyToSwap()) CompleteReload();
      (void)SaveState();  // logged
      Heartbeat();
      Tune();
      for (int r = 0; r < ranks(); ++r) {
        if (!holders_[r].pid) continue;
        std::string why = holders_[r].sink->ring().TakeViolation();
        if (why.empty()) continue;
        spdlog::error("rank {}: cutting off pid {}: {}; the rank is rebuilt for the next attach", r,
                      holders_[r].pid, why);
        server_->Disconnect(holders_[r].generation);
        Detach(r, holders_[r].pid, holders_[r].generation);
      }
      bool all_done = pipeline_->Finished();
      for (auto& s : sinks_) all_done = all_done && s->ring().Drained();
      for (bool awaited : awaiting_reattach_) all_done = all_done && !awaited;
      if (all_done) {
        io_.stop();
        return;
      }
      if (!pipeline_->status().ok() && !draining_) BeginDrain("on_error: fail");
      const auto now = std::chrono::steady_clock::now();
      if (draining_ && now > drain_deadline_) {
        if (!drain_timed_out_) {  // once: the rest of the wait is bounded below
          spdlog::warn("drain timed out after {:.0f}s: untaken batches are dropped, stages stopped",
                       opt_.drain_timeout);
          drain_timed_out_ = true;
          for (auto& s : sinks_) s->Abort();
          pipeline_->RequestStop();
        }
        if (pipeline_->Finished()) {
          io_.stop();
          return;
        }
        // A stage stuck in a read that never returns (hung storage) or a decode without
        // sample_timeout_s: the exit is bounded all the same, without its threads.
        if (now > drain_deadline_ + kStuckGrace) {
          spdlog::error(
              "pipeline threads still busy {}s after the drain timed out (a stage stuck in IO or "
              "a long decode): exiting without them",
              kStuckGrace.count());
          threads_abandoned_ = true;
          io_.stop();
          return;
        }
      }
      Tick();
    });
  }

  // One line for systemd's STATUS=: throughput over the last interval and the trainers.
  std::string StatusLine() {
    auto now = std::chrono::steady_clock::now();
    uint64_t published = 0;
    int attached = 0;
    for (int r = 0; r < ranks(); ++r) {
      published += sinks_[r]->ring().published();
      attached += r < cfg_.consumers && holders_[r].pid != 0;
    }
    double seconds = std::chrono::duration<double>(now - status_at_).count();
    double rate = status_at_.time_since_epoch().count() && seconds > 0
                      ? (published - status_published_) * cfg_.batch_size / seconds
                      : 0;
    status_at_ = now;
    status_published_ = published;
    return fmt::format("{:.0f} samples/s, {} batches published, {}/{} trainers attached", rate,
                       published, attached, cfg_.consumers);
  }

  // Every tick: the watchdog is fed while the pipeline makes progress or is idle for a good
  // reason (finished, draining, or waiting for trainers to take batches); a pipeline stuck on
  // something else stops feeding it, and systemd restarts the service. STATUS= every 5 s.
  void Heartbeat() {
    uint64_t progress = pipeline_->Progress();
    for (auto& s : sinks_) progress += s->ring().published() + s->ring().released();
    bool idle_ok = pipeline_->Finished() || draining_;
    for (auto& s : sinks_) idle_ok = idle_ok || s->WaitingForTrainer();
    notify_.Watchdog(progress != watchdog_progress_ || idle_ok);
    watchdog_progress_ = progress;
    if (std::chrono::steady_clock::now() - status_at_ >= std::chrono::seconds(5))
      notify_.Status(StatusLine());
    if (metrics_ && ++ticks_ % 5 == 0) metrics_->Publish(MetricsText());
    // Each rank's trainer throughput: samples released over the last second or so.
    auto now = std::chrono::steady_clock::now();
    for (int r = 0; r < ranks(); ++r) {
      Rate& rate = rates_[r];
      double dt = std::chrono::duration<double>(now - rate.at).count();
      if (dt < 1) continue;
      uint64_t released = sinks_[r]->ring().released();
      if (rate.at.time_since_epoch().count())
        rate.per_s = (released - rate.released) * cfg_.batch_size / dt;
      rate.at = now;
      rate.released = released;
    }
  }

  // The config file's content hash, to tell which version runs ("" if unreadable).
  static std::string HashFile(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) return "";
    std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    return fmt::format("{:016x}", HashString(text));
  }

  // The counters of a pipeline a reload replaced: the metrics go on counting from them.
  void Retire(const nlohmann::json& profile) {
    for (const auto& st : profile["stages"]) {
      if (st["type"] == "ring") continue;  // the rings' counters outlive pipelines anyway
      retired_stages_[st["name"].get<std::string>()].Add(st);
    }
    for (const auto& [reason, n] : profile["errors"]["by_reason"].items())
      retired_errors_[reason] += n.get<uint64_t>();
  }

  // The /metrics page (Prometheus text format). Counters belong to the daemon: those of
  // pipelines replaced by reloads are included.
  std::string MetricsText() {
    nlohmann::json profile = pipeline_->Profile();
    std::map<std::string, StageTotals> stages = retired_stages_;
    std::map<std::string, double> depth;
    for (const auto& st : profile["stages"]) {
      const std::string name = st["name"].get<std::string>();
      stages[name].Add(st);
      depth[name] = st["queue_depth"].get<double>();
    }
    std::map<std::string, uint64_t> errors = retired_errors_;
    for (const auto& [reason, n] : profile["errors"]["by_reason"].items())
      errors[reason] += n.get<uint64_t>();

    PromText t;
    auto per_stage = [&](const char* name, const char* help, double StageTotals::*field) {
      t.Family(name, "counter", help);
      for (const auto& [stage, v] : stages) t.Sample(name, {{"stage", stage}}, v.*field);
    };
    per_stage("mmfeed_stage_items_total",
              "Items a stage finished: samples, or batches for a ring stage.", &StageTotals::items);
    per_stage("mmfeed_stage_errors_total", "Items a stage failed.", &StageTotals::errors);
    per_stage("mmfeed_stage_busy_seconds_total", "Thread time a stage spent working.",
              &StageTotals::busy);
    per_stage("mmfeed_stage_starved_seconds_total", "Thread time a stage waited for input.",
              &StageTotals::starved);
    per_stage("mmfeed_stage_blocked_seconds_total",
              "Thread time a stage waited for downstream (a ring: for trainers).",
              &StageTotals::blocked);
    t.Family("mmfeed_stage_queue_depth", "gauge", "Items in a stage's mailbox now.");
    for (const auto& [stage, v] : depth)
      t.Sample("mmfeed_stage_queue_depth", {{"stage", stage}}, v);
    t.Family("mmfeed_sample_errors_total", "counter", "Samples skipped, by reason.");
    for (const auto& [reason, n] : errors)
      t.Sample("mmfeed_sample_errors_total", {{"reason", reason}}, static_cast<double>(n));

    struct RankRow {
      const char* name;
      const char* type;
      const char* help;
    };
    const RankRow rows[] = {
        {"mmfeed_rank_batches_published_total", "counter", "Batches published to a rank's ring."},
        {"mmfeed_rank_batches_released_total", "counter", "Batches a rank's trainer released."},
        {"mmfeed_rank_cursor_epoch", "gauge", "Epoch of a rank's acknowledged cursor."},
        {"mmfeed_rank_cursor_seq", "gauge", "Batch seq of a rank's acknowledged cursor."},
        {"mmfeed_rank_lag_batches", "gauge", "Batches published and not yet taken."},
        {"mmfeed_rank_seconds_since_take", "gauge",
         "Seconds since the trainer last took a batch (-1: never)."},
        {"mmfeed_rank_attached", "gauge", "1 while a trainer is attached."},
        {"mmfeed_rank_wait_seconds_total", "counter",
         "Seconds the attached trainer waited for a batch, as its client reports (its data "
         "stall; restarts at each attach)."},
        {"mmfeed_rank_hold_seconds_total", "counter",
         "Seconds the attached trainer held batches, summed over batches, as its client reports "
         "(restarts at each attach)."}};
    std::vector<std::array<double, std::size(rows)>> values;
    for (int r = 0; r < ranks(); ++r) {
      shm::RingWriter& ring = sinks_[r]->ring();
      StreamCursor acked = ring.acked();
      shm::RingWriter::Backlog b = ring.backlog();
      values.push_back({static_cast<double>(ring.published()), static_cast<double>(ring.released()),
                        static_cast<double>(acked.epoch), static_cast<double>(acked.seq),
                        static_cast<double>(b.ready), b.seconds_since_take,
                        holders_[r].pid ? 1.0 : 0.0, b.wait_ns / 1e9, b.hold_ns / 1e9});
    }
    for (size_t k = 0; k < std::size(rows); ++k) {
      t.Family(rows[k].name, rows[k].type, rows[k].help);
      for (int r = 0; r < ranks(); ++r)
        t.Sample(rows[k].name, {{"rank", std::to_string(r)}}, values[r][k]);
    }

    const ProcessSample p = SampleProcess();
    t.Family("process_cpu_seconds_total", "counter", "User and system CPU time of the daemon.");
    t.Sample("process_cpu_seconds_total", p.cpu_ns / 1e9);
    t.Family("process_resident_memory_bytes", "gauge", "Resident memory of the daemon.");
    t.Sample("process_resident_memory_bytes", static_cast<double>(p.rss_bytes));
    t.Family("mmfeed_read_bytes_total", "counter",
             "Bytes the daemon read: all reads (rchar), and those that reached storage.");
    t.Sample("mmfeed_read_bytes_total", {{"source", "all"}}, static_cast<double>(p.read_bytes));
    t.Sample("mmfeed_read_bytes_total", {{"source", "storage"}},
             static_cast<double>(p.storage_read_bytes));
    t.Family("mmfeed_reloads_total", "counter", "Config reloads, applied or refused.");
    t.Sample("mmfeed_reloads_total", {{"result", "ok"}}, static_cast<double>(reloads_ok_));
    t.Sample("mmfeed_reloads_total", {{"result", "refused"}}, static_cast<double>(reloads_failed_));
    return t.text();
  }

  int Report() {
    nlohmann::json profile = pipeline_->Profile();
    std::string text = FormatProfile(profile);
    uint64_t written = moved_published_, unreleased = 0;
    for (auto& s : sinks_) {
      written += s->ring().published();
      unreleased += s->ring().unreleased();
    }
    for (auto& s : moved_from_)  // replaced rings whose trainer never came back
      if (s) unreleased += s->ring().unreleased();
    const auto& errors = profile["errors"];
    std::fprintf(stderr, "mmfeedd profile:\n%s", text.c_str());
    std::fprintf(stderr,
                 "batches: %lu published, %lu taken and released, %lu left in rings; samples "
                 "skipped: %lu, rows "
                 "refilled: %lu\n",
                 static_cast<unsigned long>(written),
                 static_cast<unsigned long>(written - unreleased),
                 static_cast<unsigned long>(unreleased),
                 static_cast<unsigned long>(errors["total"].get<uint64_t>()),
                 static_cast<unsigned long>(profile["samples"]["refilled"].get<uint64_t>()));
    Status st = pipeline_->status();
    if (!st.ok()) {
      std::fprintf(stderr, "mmfeedd: stopped on error: %s\n", st.message().c_str());
      return pipeline_->stopped_on_unusable_data() ? kExitConfig : 1;
    }
    if (drain_timed_out_ && unreleased > 0) {
      std::fprintf(
          stderr,
          "mmfeedd: the drain timed out: %lu published batch(es) were never taken by a trainer%s\n",
          static_cast<unsigned long>(unreleased),
          opt_.state_dir.empty() ? " and are lost"
                                 : " (the next start regenerates them from the saved cursors)");
      return kExitLost;
    }
    if (drain_timed_out_) {
      std::fprintf(stderr,
                   "mmfeedd: the drain timed out while a stage was still working (every published "
                   "batch was taken)\n");
      return kExitLost;
    }
    return 0;
  }

  PipelineConfig cfg_;
  SupervisorOptions opt_;
  asio::io_context io_;
  std::set<std::shared_ptr<asio::steady_timer>> windows_;  // profile windows under way
  uint64_t pipeline_id_ = 0;                               // bumped when a reload swaps
  // workers: auto (Tune): the tuner, the start of its window, and its moves (the last 20).
  static constexpr std::chrono::seconds kTuneWindow{2};
  std::unique_ptr<WorkerTuner> tuner_;
  std::optional<WindowSample> tune_sample_;
  std::chrono::steady_clock::time_point tune_at_;
  std::vector<nlohmann::json> tune_decisions_;
  asio::steady_timer timer_;
  std::vector<std::unique_ptr<RingSink>> sinks_;
  std::vector<std::unique_ptr<PackingSink>> packers_;  // in front of sinks_ when the text is packed
  std::vector<BatchSink*> pipeline_sinks_;             // what the pipeline feeds, one per rank
  std::unique_ptr<Pipeline> pipeline_;
  // A reload waiting for the running pipeline to quiesce (at the epoch boundary).
  struct PendingReload {
    std::unique_ptr<Pipeline> pipeline;
    PipelineConfig cfg;
    RingPlan plan;
    std::vector<std::unique_ptr<RingSink>> rings;  // empty, or larger rings to move to
    bool at_epoch = false;  // the order or numbering changes: all ranks switch at one epoch
  };
  // Per rank, the ring a reload replaced, until the rank's next attach.
  std::vector<std::unique_ptr<RingSink>> moved_from_;
  std::vector<bool> awaiting_reattach_;  // per rank: moved while a trainer was attached
  uint64_t moved_published_ = 0;  // batches published into replaced rings, less those dropped
  std::unique_ptr<PendingReload> pending_;
  uint64_t reloads_ok_ = 0, reloads_failed_ = 0;
  ServiceNotifier notify_;
  const std::chrono::steady_clock::time_point started_at_ = std::chrono::steady_clock::now();
  std::string config_hash_;
  struct Rate {
    std::chrono::steady_clock::time_point at{};
    uint64_t released = 0;
    double per_s = 0;
  };
  std::vector<Rate> rates_;  // per rank, updated by Heartbeat
  std::unique_ptr<MetricsServer> metrics_;
  int ticks_ = 0;
  // A stage's counters summed over pipelines, from their profile entries.
  struct StageTotals {
    double items = 0, errors = 0, busy = 0, starved = 0, blocked = 0;
    void Add(const nlohmann::json& stage) {
      items += stage["items"].get<double>();
      errors += stage["errors"].get<double>();
      busy += stage["busy_seconds"].get<double>();
      starved += stage["starved_seconds"].get<double>();
      blocked += stage["blocked_seconds"].get<double>();
    }
  };
  std::map<std::string, StageTotals> retired_stages_;  // of pipelines reloads replaced
  std::map<std::string, uint64_t> retired_errors_;
  uint64_t watchdog_progress_ = 0;                   // Heartbeat's last sign of life
  std::chrono::steady_clock::time_point status_at_;  // the last STATUS= line, and its count
  uint64_t status_published_ = 0;
  std::unique_ptr<ControlServer> server_;
  std::vector<Holder> holders_;
  uint32_t last_generation_ = 0;
  std::string saved_state_;      // the last state written to --state-dir
  uint64_t state_failures_ = 0;  // writes of it that failed in a row
  std::chrono::steady_clock::time_point state_warned_at_;
  uint64_t ring_bytes_ = 0;
  bool draining_ = false;
  bool drain_timed_out_ = false;
  // A restart on an edited config: the file to reload once every rank has attached again.
  std::string then_reload_;
  std::vector<bool> back_since_start_;
  // A reload building its pipeline (Reload): joinable until its completion ran on the control
  // thread; reload_built_ once the pipeline is built.
  std::thread reload_thread_;
  std::atomic<bool> reload_built_{false};
  bool threads_abandoned_ = false;  // stuck past kStuckGrace after the drain timed out
  static constexpr std::chrono::seconds kStuckGrace{5};
  std::chrono::steady_clock::time_point drain_deadline_;
};

// Bytes of memory the daemon may still use: MemAvailable, bounded by the cgroup's limit.
uint64_t AvailableBytes() {
  uint64_t avail = MemAvailableBytes();
  if (avail == 0) avail = UINT64_MAX;  // unknown
  std::ifstream max("/sys/fs/cgroup/memory.max"), cur("/sys/fs/cgroup/memory.current");
  std::string limit;
  uint64_t used = 0;
  if (max >> limit && limit != "max" && cur >> used) {
    uint64_t l = std::stoull(limit);
    avail = std::min(avail, l > used ? l - used : 0);
  }
  return avail;
}

}  // namespace

RingPlan PlanRings(const PipelineConfig& cfg) {
  RingPlan plan;
  plan.specs = BatchSpecs(cfg);
  const StageConfig* packed = cfg.packed_stage >= 0 ? &cfg.stages[cfg.packed_stage] : nullptr;
  if (packed) plan.specs = PackingSink::PackedSpecs(packed->name, packed->params.GetInt("max_len"));
  std::vector<uint64_t> tensor_bytes;
  for (const TensorSpec& t : plan.specs) tensor_bytes.push_back(t.NumBytes() * cfg.batch_size);
  // Room for every sample id of a batch; a packed batch lists each document it holds, at
  // most one per token (bounded at 64 Ki ids).
  uint64_t max_ids = cfg.batch_size;
  if (packed)
    max_ids = std::min<uint64_t>(cfg.batch_size * packed->params.GetInt("max_len"), 1 << 16);
  plan.layout = shm::PlanSlot((kMaxIdBytes + 1) * max_ids, tensor_bytes);
  const uint64_t stride =
      (plan.layout.slot_bytes + shm::kPageBytes - 1) / shm::kPageBytes * shm::kPageBytes;
  plan.total_bytes =
      static_cast<uint64_t>(cfg.consumers) * (shm::kPageBytes + stride * cfg.ring_slots);
  return plan;
}

Status CheckMemory(const RingPlan& plan) {
  constexpr uint64_t kMargin = 512ull << 20;  // for the daemon's own heap and the page cache
  const uint64_t avail = AvailableBytes();
  if (plan.total_bytes + kMargin > avail)
    return Status::TooLarge(
        fmt::format("the rings need {:.2f} GiB, {:.2f} GiB available (MemAvailable and the "
                    "cgroup's memory.max, less a 0.5 GiB margin): lower output.ring_slots, "
                    "batch_size or consumers",
                    plan.total_bytes / 1073741824.0, avail / 1073741824.0));
  return Status::Ok();
}

Result<std::string> CheckPipeline(const PipelineConfig& cfg) {
  RingPlan plan = PlanRings(cfg);
  std::vector<std::unique_ptr<UnusedSink>> owned;
  Result<std::unique_ptr<Pipeline>> p = BuildOnly(cfg, &owned);
  if (!p.ok()) return p.status();
  MMFEED_RETURN_IF_ERROR(CheckMemory(plan));
  return fmt::format(
      "{} stages, {} consumer rank(s), {} batches per rank {}, rings {:.2f} GiB", cfg.stages.size(),
      cfg.consumers, (*p)->batches_per_epoch(),
      (*p)->budgeted() ? "in epoch 0 (token budget: the count varies by epoch)" : "per epoch",
      plan.total_bytes / 1073741824.0);
}

Result<PipelineConfig> LoadDaemonConfig(const std::string& file, const SupervisorOptions& options) {
  Result<PipelineConfig> cfg = LoadConfigFile(file);
  if (!cfg.ok()) return cfg;
  MMFEED_RETURN_IF_ERROR(CheckFaultsAllowed(*cfg, options.allow_faults));
  cfg->source.index_dir = options.state_dir;  // manifest indexes live with the cursors
  return cfg;
}

int RunSupervisor(PipelineConfig cfg, SupervisorOptions options) {
  Supervisor s(std::move(cfg), std::move(options));
  return s.Run();
}

}  // namespace mmfeed
