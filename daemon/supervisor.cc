// Supervisor: the daemon's lifecycle (daemon/supervisor.h), and ring planning and --check.
// The class and how its files divide: daemon/supervisor_internal.h.
#include "daemon/supervisor.h"

#include "daemon/supervisor_internal.h"

namespace mmfeed {

int Supervisor::Run() {
  if (state_.enabled()) {
    Result<std::optional<StreamState>> read = SavedStream();
    if (!read.ok()) {
      spdlog::error("{}", read.status().message());
      return kExitConfig;
    }
    saved_ = std::move(read.value());
    KeepSavedConfig(nullptr);
  }
  if (!cfg_.shape_from_trainers()) {
    std::string why;
    if (int failed = Build(&why)) {
      spdlog::error("{}", why);
      return failed;
    }
  }
  server_ = std::make_unique<ControlServer>(
      io_, opt_.socket, opt_.socket_group,
      ControlServer::Handler{
          [this](int rank, int pid, int pidfd, const std::optional<StreamCursor>& resume,
                 const std::optional<JobShape>& job) {
            return Attach(rank, pid, pidfd, resume, job);
          },
          [this](int rank, int pid, uint32_t generation) { Detach(rank, pid, generation); },
          [this] { return StatusJson(); },
          [this] { BeginDrain("stop requested"); },
          [this](const std::string& file, bool at_batch, ReloadDone done) {
            Reload(file, std::move(done), at_batch);
          },
          [this](double seconds, bool trace, std::function<void(Result<nlohmann::json>)> done) {
            Profile(seconds, trace, std::move(done));
          },
          [this](JobEnded done) { EndJob(std::move(done)); },
      });
  Status st = server_->Listen();
  if (!st.ok()) {
    spdlog::error("{}", st.message());
    return st.code() == Status::Code::kInvalid ? kExitConfig : 1;  // a bad --socket
  }
  asio::signal_set signals(io_, SIGINT, SIGTERM, SIGHUP);
  WaitSignal(signals);
  if (pipeline_) {
    if (int failed = Serve()) return failed;
  } else {
    spdlog::info(
        "serving on {}; the job's shape comes from the first trainer to attach ({}: "
        "consumers: auto{})",
        opt_.socket, cfg_.file, cfg_.source.node_auto ? ", node_rank/num_nodes: auto" : "");
    notify_.Ready("waiting for the first trainer to declare the job's shape");
  }
  Tick();
  io_.run();
  return Exit();
}

int Supervisor::Build(std::string* why) {
  auto fail = [why](int code, std::string message) {
    *why = std::move(message);
    return code;
  };
  // Rings first: their size is known from the stage specs, and running out of memory
  // must be an error now, not later.
  Result<RingPlan> planned = PlanRings(cfg_);
  if (!planned.ok()) return fail(kExitConfig, planned.status().message());
  const RingPlan& plan = *planned;
  Status fits = CheckMemory(plan, cfg_.CacheBytes());
  if (!fits.ok()) return fail(1, fits.message());
  const shm::SlotLayout& layout = plan.layout;
  ring_bytes_ = plan.total_bytes;
  std::vector<BatchSink*>& sinks = pipeline_sinks_;
  auto rings = MakeRings(cfg_, plan);
  if (!rings.ok()) return fail(1, rings.status().message());
  sinks_ = std::move(rings.value());
  moved_from_.resize(cfg_.consumers);
  awaiting_reattach_.resize(cfg_.trainers());
  for (int r = 0; r < cfg_.consumers; ++r) {
    sinks.push_back(sinks_[r].get());
    if (std::unique_ptr<PackingSink> packer = PackingSink::For(cfg_, sinks.back())) {
      packers_.push_back(std::move(packer));
      sinks.back() = packers_.back().get();
    }
  }
  spdlog::info("{} ring(s) of {} slots x {:.1f} MiB: {:.2f} GiB of ring memory{}", cfg_.consumers,
               cfg_.ring_slots, layout.slot_bytes / 1048576.0, plan.total_bytes / 1073741824.0,
               cfg_.replicas > 1
                   ? fmt::format(", each read by {} trainer ranks (replicas)", cfg_.replicas)
                   : "");
  auto pipeline = Pipeline::Create(cfg_, sinks);
  if (pipeline.ok() && saved_ && !cfg_.mix.switches.empty() &&
      (*pipeline)->stream().fingerprint() != saved_->fingerprint) {
    // The saved weight switches belong to the saved stream: a stream started fresh (LoadState
    // says why) has the config's own weights.
    cfg_.mix.switches.clear();
    pipeline = Pipeline::Create(cfg_, sinks);
  }
  if (!pipeline.ok()) return fail(kExitConfig, pipeline.status().message());
  pipeline_ = std::move(pipeline.value());
  // What --check refuses is only warned of here: the run counts and skips those samples.
  Status files = CheckSampleFiles(cfg_, pipeline_->CheckSamplePaths(kCheckedSamples));
  if (!files.ok()) spdlog::warn("{}", files.message());
  for (auto& s : sinks_) pipeline_->AddProfiledStage(s->info());
  if (state_.enabled()) {
    Status st = LoadState(saved_);
    // The state is written once now: a --state-dir that cannot be written is an error at
    // start, not a stale file found by the next restart.
    if (st.ok()) st = SaveState();
    if (!st.ok()) return fail(kExitConfig, st.message());
  }
  holders_.resize(cfg_.trainers());
  rates_.resize(cfg_.consumers);
  config_hash_ = HashFile(cfg_.file);
  if (!cfg_.metrics_listen.empty()) {
    auto m = MetricsServer::Start(io_, cfg_.metrics_listen);
    if (!m.ok())
      return fail(kExitConfig, fmt::format("{}:{}:{}: {}", cfg_.file, cfg_.metrics_mark.line,
                                           cfg_.metrics_mark.column, m.status().message()));
    metrics_ = std::move(m.value());
    metrics_->Publish(MetricsText());  // before the first scrape can come
    spdlog::info("serving Prometheus metrics on http://{}/metrics", cfg_.metrics_listen);
  }
  return 0;
}

int Supervisor::Serve() {
  Status st = pipeline_->Start();
  if (!st.ok()) {
    spdlog::error("{}", st.message());
    return 1;
  }
  spdlog::info("serving on {}", opt_.socket);
  notify_.Ready(StatusLine());
  // The edited config is reloaded once every rank's trainer is back: their cursors, possibly
  // ahead of the saved ones, decide where the epoch boundary of the switch is.
  if (!then_reload_.empty() && unseen_since_restart_.empty()) EveryRankBack();  // started fresh
  return 0;
}

Status Supervisor::AdoptJob(const JobShape& job, int pid,
                            const std::optional<StreamCursor>& resume) {
  const PipelineConfig before = cfg_;
  MMFEED_RETURN_IF_ERROR(
      cfg_.AdoptShape(job.local_world_size, job.node_rank, job.num_nodes, job.replicas));
  const bool kept_waited = kept_waits_for_job_;
  if (kept_waited) KeepSavedConfig(&job);
  const std::string from =
      fmt::format("pid {} ({})", pid, job.from.empty() ? "declared" : job.from);
  spdlog::info("the job, as {} declares it: {}; serving {} consumer rank(s) as node {} of {}", from,
               job.Describe(), cfg_.trainers(), cfg_.source.node_rank, cfg_.source.num_nodes);
  // Refused, and the daemon waits on for a job it can serve: a trainer's wrong shape or an
  // edited cursor must not end a node's service, nor fix its job's shape.
  const auto refuse = [&](const std::string& why) {
    spdlog::error("the job {} cannot be served: {}", job.Describe(), why);
    DropJobParts();
    cfg_ = before;
    then_reload_.clear();
    kept_waits_for_job_ = kept_waited && saved_.has_value();
    return Status::Invalid(fmt::format("the job {} cannot be served: {}", job.Describe(), why));
  };
  std::string why;
  if (Build(&why) != 0) return refuse(why);
  if (resume) {
    if (Status st = ResumeJobAt(*resume, pid); !st.ok()) return refuse(st.message());
  }
  job_ = job;
  job_from_ = from;
  job_adopted_ = true;
  trainers_gone_since_.reset();
  if (int failed = Serve()) {  // the pipeline's threads did not start: the daemon cannot go on
    failed_exit_ = failed;
    io_.stop();
    return Status::Unavailable("mmfeedd could not start its pipeline (its log says why); it stops");
  }
  return Status::Ok();
}

Status Supervisor::ResumeJobAt(const StreamCursor& c, int pid) {
  const uint32_t epochs = static_cast<uint32_t>(cfg_.source.epochs);
  if (!c.stream || !OfAnotherStreamOfOurOrder(c) || !pipeline_->stream().positional() ||
      c.epoch >= (epochs ? epochs : UINT32_MAX - 1))
    return Status::Ok();  // this stream's own cursor, or one Attach refuses (CheckResume says why)
  Result<Pipeline::Origin> rebased =
      pipeline_->stream().Rebased(c.epoch, c.position, c.lanes, c.nodes);
  Status st = rebased.ok() ? pipeline_->SetOrigin(*rebased) : rebased.status();
  if (!st.ok())
    return Status::Invalid(
        fmt::format("pid {}'s cursor (epoch {}, position {}) cannot resume it: {}", pid, c.epoch,
                    c.position, st.message()));
  const Pipeline::Origin o = *rebased;
  const StreamCursor start = pipeline_->stream().CursorAt(o.seq);
  for (auto& s : sinks_) s->ring().set_acked(start);
  unseen_since_restart_.clear();  // saved cursors of another stream no longer apply
  resumed_ = Resumed{c.epoch, c.position, fmt::format("pid {}", pid)};
  spdlog::info(
      "pid {}'s cursor is at epoch {}, position {} of the job's order (taken at another shape or "
      "in another run): the job resumes there, {} batch(es) a rank left in epoch {}",
      pid, c.epoch, c.position, pipeline_->stream().EpochBatches(o.epoch), o.epoch);
  (void)SaveState();  // its failure is logged; the run goes on
  return Status::Ok();
}

Status Supervisor::CheckJob(const JobShape& job, int pid) {
  // A model-parallel group of another size would receive other batches than its peers: refused.
  if (job.replicas && job.replicas != cfg_.replicas)
    return Status::Invalid(fmt::format(
        "the trainer's job ({}: {}) declares groups of {} ranks receiving the same batches, but "
        "this daemon serves replicas: {} ({}); a node's trainers must belong to one job",
        job.from.empty() ? "declared" : job.from, job.Describe(), job.replicas, cfg_.replicas,
        cfg_.replicas_auto ? fmt::format("adopted from {}", job_from_) : cfg_.file));
  // Adopted from the first trainer's (a config reloaded to `auto` keeps the shape in force,
  // which no trainer declared: compared with the config's values below).
  if (job_ && cfg_.shape_from_trainers()) {
    if (job == *job_) return Status::Ok();
    return Status::Invalid(fmt::format(
        "the trainer's job ({}: {}) conflicts with the job this daemon serves ({}: {}); a node's "
        "trainers must belong to one job: {}",
        job.from.empty() ? "declared" : job.from, job.Describe(), job_from_, job_->Describe(),
        job_adopted_ ? WhenJobFrees() : "restart the daemon for another"));
  }
  const bool consumers_differ = job.local_world_size != cfg_.trainers();
  const bool node_differs =
      job.node_rank != cfg_.source.node_rank || job.num_nodes != cfg_.source.num_nodes;
  if ((consumers_differ || node_differs) && job_warned_.insert(job.Describe()).second)
    spdlog::warn(
        "pid {}'s job ({}) is not the shape {} sets ({} consumer rank(s), node {} of {}); the "
        "config's values are served. `consumers: auto` and `node_rank: auto` take the "
        "trainers' shape instead",
        pid, job.Describe(), cfg_.file, cfg_.trainers(), cfg_.source.node_rank,
        cfg_.source.num_nodes);
  return Status::Ok();
}

nlohmann::json Supervisor::JobJson() const {
  nlohmann::json j = {{"consumers", cfg_.trainers()},
                      {"replicas", cfg_.replicas},
                      {"node_rank", cfg_.source.node_rank},
                      {"num_nodes", cfg_.source.num_nodes},
                      {"from", job_        ? job_from_
                               : pipeline_ ? "config"
                                           : "waiting for the first trainer"}};
  if (job_) j["declared"] = job_->ToJson();
  if (job_adopted_) j["frees"] = WhenJobFrees();
  if (resumed_)
    j["resumed"] = {
        {"epoch", resumed_->epoch}, {"position", resumed_->position}, {"from", resumed_->from}};
  return j;
}

void Supervisor::WarnRanksWithoutTrainers() {
  if (warned_missing_trainers_) return;
  std::vector<int> idle;
  int busy = -1;
  uint64_t taken = 0;
  for (int t = 0; t < cfg_.trainers(); ++t) {
    const uint64_t released = sinks_[StreamOf(t)]->ring().released();
    if (released == 0 && !holders_[t].pid) idle.push_back(t);
    if (released > taken) taken = released, busy = t;
  }
  // Replicas: a group's slots are freed once every rank of it released them, so a rank without
  // a trainer stops its peers as soon as their ring is full.
  int waiting_peer = -1;
  for (int t : idle) {
    const int s = StreamOf(t);
    if (!sinks_[s]->WaitingForTrainer()) continue;
    for (int peer : GroupOf(s))
      if (peer != t && sinks_[s]->ring().backlog(MemberOf(peer)).seconds_since_take >= 0)
        waiting_peer = peer;
  }
  if (waiting_peer >= 0) {
    warned_missing_trainers_ = true;
    spdlog::warn(
        "rank(s) {} have had no trainer while rank {} of the same group (replicas: {} in {}) "
        "waits for them: a group's ring frees a slot once every rank of the group released it. "
        "Start a trainer for every rank, 0 to {}",
        fmt::join(idle, ", "), waiting_peer, cfg_.replicas, cfg_.file, cfg_.trainers() - 1);
    return;
  }
  if (idle.empty() || taken <= static_cast<uint64_t>(cfg_.ring_slots)) return;
  warned_missing_trainers_ = true;
  spdlog::warn(
      "rank(s) {} have had no trainer while rank {} took {} batches: `consumers: {}` in {} "
      "makes one ring per trainer process, each attaching with its own rank (e.g. "
      "$LOCAL_RANK); a rank no trainer takes from keeps its ring full and the run cannot end. "
      "Start a trainer for every rank, or set `consumers:` to the number of trainers",
      fmt::join(idle, ", "), busy, taken, cfg_.trainers(), cfg_.file);
}

// --state-dir: the stream the trainers are in. A restart on an edited config continues it
// with the config it was made from, then switches as a reload would (KeepSavedConfig).
Result<std::optional<StreamState>> Supervisor::SavedStream() {
  MMFEED_ASSIGN_OR_RETURN(std::optional<StreamState> saved, state_.Read());
  // The weights reloads switched at batch boundaries are part of the saved stream.
  if (saved) cfg_.mix.switches = saved->mix_switches;
  return saved;
}

void Supervisor::KeepSavedConfig(const JobShape* job) {
  kept_waits_for_job_ = false;
  if (!saved_ || saved_->config_text.empty() ||
      (saved_->config_text == cfg_.text && saved_->config_file == cfg_.file))
    return;
  if (!job && cfg_.shape_from_trainers()) {
    kept_waits_for_job_ = true;
    spdlog::info(
        "{} differs from the config the saved stream in {} was made with: whether that config "
        "continues the stream is decided when the first trainer declares the job",
        cfg_.file, state_.path());
    return;
  }
  Result<PipelineConfig> kept = KeptConfig(*saved_, job);
  if (kept.ok()) {
    spdlog::info(
        "{} differs from the config the saved stream in {} was made with: continuing the "
        "stream with that config, then reloading {} (applied as a reload would: at once or "
        "at the next epoch boundary)",
        cfg_.file, state_.path(), cfg_.file);
    then_reload_ = cfg_.file;
    cfg_ = std::move(kept.value());
  } else {
    spdlog::warn("{}: the saved stream cannot be continued ({}): starting fresh", state_.path(),
                 kept.status().message());
    saved_.reset();
    cfg_.mix.switches.clear();
  }
}

// After the io_context stopped (drained or failed): shuts the servers, waits for the pipeline
// (not for a reload still building, nor for threads stuck past the drain), saves the state
// and reports. Returns the exit status; exits the process itself when a thread cannot be
// joined.
int Supervisor::Exit() {
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

  if (!pipeline_) return failed_exit_;  // stopped before a trainer declared the job
  pipeline_->Wait();
  (void)SaveState();  // logged
  const int code = Report();
  if (reload_stuck) {  // its thread cannot be joined: the process ends under it
    std::fflush(nullptr);
    std::_Exit(code);
  }
  return code;
}

Result<std::vector<std::unique_ptr<RingSink>>> Supervisor::MakeRings(const PipelineConfig& cfg,
                                                                     const RingPlan& plan) {
  std::vector<std::unique_ptr<RingSink>> rings;
  for (int r = 0; r < cfg.consumers; ++r) {
    auto ring = shm::RingWriter::Create(r, cfg.consumers, cfg.ring_slots, plan.layout,
                                        cfg.placement.numa_node, cfg.replicas);
    if (!ring.ok()) return ring.status();
    rings.push_back(std::make_unique<RingSink>(r, plan.specs, std::move(ring.value())));
  }
  return rings;
}

void Supervisor::WaitSignal(asio::signal_set& signals) {
  signals.async_wait([this, &signals](std::error_code ec, int sig) {
    if (ec) return;
    if (sig == SIGHUP)
      Reload("", [](Result<nlohmann::json>) {});  // logged either way
    else
      BeginDrain(sig == SIGINT ? "SIGINT" : "SIGTERM");
    WaitSignal(signals);
  });
}

void Supervisor::BeginDrain(const std::string& why) {
  if (draining_) return;
  draining_ = true;
  notify_.Stopping();
  if (!pipeline_) {  // no trainer declared the job yet: nothing to drain
    spdlog::info("{}: stopping (no trainer declared the job's shape yet)", why);
    io_.stop();
    return;
  }
  drain_deadline_ = std::chrono::steady_clock::now() +
                    std::chrono::milliseconds(static_cast<int>(opt_.drain_timeout * 1000));
  spdlog::info("{}: draining (up to {:.0f}s for trainers to take the produced batches)", why,
               opt_.drain_timeout);
  pipeline_->RequestStop();
}

void Supervisor::Tick() {
  timer_.expires_after(std::chrono::milliseconds(100));
  timer_.async_wait([this](std::error_code ec) {
    if (ec) return;
    if (!pipeline_) {  // waiting for the first trainer's job: alive, nothing to watch yet
      notify_.Watchdog(true);
      return Tick();
    }
    if (ending_) {  // the job's pipeline stops; then the daemon waits for the next job
      notify_.Watchdog(true);
      if (pipeline_->Finished()) CompleteEndJob();
      return Tick();
    }
    if (ReadyToSwap()) CompleteReload();
    (void)SaveState();  // logged
    Heartbeat();
    Tune();
    WarnRanksWithoutTrainers();
    for (int t = 0; t < static_cast<int>(holders_.size()); ++t) {
      if (!holders_[t].pid) continue;
      std::string why = holders_[t].sink->ring().TakeViolation(MemberOf(t));
      if (why.empty()) continue;
      spdlog::error("rank {}: cutting off pid {}: {}; the rank is rebuilt for the next attach", t,
                    holders_[t].pid, why);
      server_->Disconnect(holders_[t].generation);
      Detach(t, holders_[t].pid, holders_[t].generation);
    }
    WatchJobLease();
    if (ending_) return Tick();
    bool all_done = pipeline_->Finished();
    for (auto& s : sinks_) all_done = all_done && s->ring().Drained();
    for (bool awaited : awaiting_reattach_) all_done = all_done && !awaited;
    if (all_done) {
      io_.stop();
      return;
    }
    if (!pipeline_->status().ok() && !draining_) BeginDrain("on_error: fail");
    // Nobody to drain for: with no trainer attached, the published batches wait for no one.
    // They are not lost: a trainer resuming from its cursor gets them again (the stream is a
    // function of the config and the data). So the stop completes now, exit 0.
    if (draining_ && !drain_timed_out_ && !drained_unattended_ && pipeline_->status().ok()) {
      // Waiting is for attached trainers only: one that still has batches to take, or may get
      // more while the stages finish.
      bool waiting = false;
      for (int t = 0; t < static_cast<int>(holders_.size()); ++t)
        waiting = waiting ||
                  (holders_[t].pid != 0 && (!pipeline_->Finished() ||
                                            holders_[t].sink->ring().Unfinished(MemberOf(t)) > 0));
      if (!waiting) {
        spdlog::info(
            "no attached trainer has batches left to take: stopping now rather than waiting "
            "for one");
        drained_unattended_ = true;
        for (auto& s : sinks_) s->Abort();
        pipeline_->RequestStop();
      }
    }
    if (drained_unattended_ && pipeline_->Finished()) {
      io_.stop();
      return;
    }
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

void Supervisor::Heartbeat() {
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

std::string Supervisor::HashFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return "";
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return fmt::format("{:016x}", HashString(text));
}

Result<RingPlan> PlanRings(const PipelineConfig& cfg) {
  MMFEED_ASSIGN_OR_RETURN(BatchPlan batch, PlanBatch(cfg));
  return RingPlan{batch.slot_specs, batch.slot,
                  static_cast<uint64_t>(cfg.consumers) * batch.ring_bytes};
}

Status CheckMemory(const RingPlan& plan, uint64_t cache_bytes) {
  constexpr uint64_t kMargin = 512ull << 20;  // for the daemon's own heap and the page cache
  const uint64_t avail = AvailableBytes();
  if (plan.total_bytes + cache_bytes + kMargin > avail)
    return Status::TooLarge(fmt::format(
        "the rings need {:.2f} GiB{}, {:.2f} GiB available (MemAvailable and the cgroup's "
        "memory.max, less a 0.5 GiB margin): lower output.ring_slots, batch_size or "
        "consumers{}",
        plan.total_bytes / 1073741824.0,
        cache_bytes
            ? fmt::format(" and the stages' caches up to {:.2f} GiB", cache_bytes / 1073741824.0)
            : "",
        avail / 1073741824.0, cache_bytes ? ", or the caches' max_bytes (cache_budget)" : ""));
  return Status::Ok();
}

Status CheckSampleFiles(const PipelineConfig& cfg, const PathCheck& c) {
  const std::string where = cfg.mixed()
                                ? fmt::format("{} (sources:)", cfg.file)
                                : fmt::format("{}:{}:{}", cfg.file, cfg.source.path_mark.line,
                                              cfg.source.path_mark.column);
  const std::string how =
      c.samples == c.catalog_size
          ? "all samples"
          : fmt::format("{} of the {} samples, spread over the catalog", c.samples, c.catalog_size);
  if (c.outside.count > 0) {
    std::vector<std::string> in_force, wanted = cfg.data_roots;
    for (const std::string& r : c.roots)
      in_force.push_back(r.size() > 1 && r.back() == '/' ? r.substr(0, r.size() - 1) : r);
    wanted.insert(wanted.end(), c.suggested_roots.begin(), c.suggested_roots.end());
    return Status::Invalid(fmt::format(
        "{}: {} of the {} sample files checked ({}) lie outside the data roots ({}), e.g. {}: "
        "the daemon opens only files inside them and would skip every such sample. Add this "
        "line to {} (docs/guide/data.md, \"data_roots\"):\n  data_roots: [{}]\nor `data_roots: "
        "any` to let "
        "samples name any file the daemon's user can read",
        where, c.outside.count, c.files, how, fmt::join(in_force, ", "), c.outside.example,
        cfg.file, fmt::join(wanted, ", ")));
  }
  const size_t bad = c.missing.count + c.unreadable.count;
  if (bad == 0) return Status::Ok();
  std::string what;
  if (c.missing.count)
    what = fmt::format("{} do not exist (e.g. {})", c.missing.count, c.missing.example);
  if (c.unreadable.count)
    what += fmt::format("{}{} cannot be read by this user (e.g. {})", what.empty() ? "" : ", ",
                        c.unreadable.count, c.unreadable.example);
  const std::string text = fmt::format(
      "{}: {} of the {} sample files checked ({}): {}; a manifest's relative paths are read "
      "from its folder",
      where, bad, c.files, how, what);
  // A mixture goes on from its other sources (a broken source's rows are refilled from them).
  if (bad == c.files && !cfg.mixed()) return Status::Invalid(text + "; no sample could be read");
  spdlog::warn(
      "{}; those samples will be skipped{}", text,
      cfg.mixed() ? ", their rows refilled from their source or, failing that, the mix" : "");
  return Status::Ok();
}

// What the pipeline will do, defaults included, for `--check`: the epochs, order, workers and
// ring sizes in force, so that no one needs the source to know them.
std::string SettingsInForce(const PipelineConfig& cfg, const Pipeline& p, const RingPlan& plan) {
  const SourceConfig& s = cfg.source;
  std::string out = "in force:\n";
  out += fmt::format(
      "  order: {} (seed {}), {} ({}){}\n",
      s.shuffle ? "shuffled every epoch" : "the data's own order, the same every epoch", s.seed,
      s.epochs ? fmt::format("{} epoch(s)", s.epochs) : std::string("epochs: 0, until stopped"),
      s.shuffle ? "shuffle: true" : "shuffle: false: add `shuffle: true` to `source:` to shuffle",
      cfg.mixed() ? "; a mixture's `mix:` shuffles unless `shuffle: false`" : "");
  if (const Catalog& cat = *p.stream().catalog(); cat.parquet) {
    std::string fields;
    for (const ParquetField& f : cat.parquet_fields)
      fields += fmt::format("{}{} <- {}", fields.empty() ? "" : ", ", f.name, f.column);
    out += fmt::format(
        "  source: {} Parquet file(s){}, {} rows; fields: {}; row groups decoded when dealt, up "
        "to {:.1f} MiB kept (row_group_cache_bytes)\n",
        cat.parquet->file_count(),
        std::filesystem::is_directory(s.path) ? fmt::format(" of split '{}'", s.split) : "",
        cat.parquet->size(), fields, s.row_group_cache_bytes / 1048576.0);
  }
  if (s.num_nodes > 1 || s.node_auto)
    out += fmt::format("  nodes: node {} of {}{}\n", s.node_rank, s.num_nodes,
                       s.node_auto ? " (auto: from the first trainer's job)" : "");
  std::string stages;
  for (const StageConfig& sc : cfg.stages) {
    if (&sc == &cfg.stages[cfg.batch_stage]) continue;
    stages += fmt::format(
        "{}{} {}", stages.empty() ? "" : ", ", sc.name,
        sc.workers_auto ? std::string("workers: auto") : fmt::format("{} worker(s)", sc.workers));
    if (sc.cache_max_bytes)
      stages += fmt::format(" (cache {:.1f} MiB)", sc.cache_max_bytes / 1048576.0);
  }
  out += fmt::format("  stages: {}{}\n", stages,
                     cfg.cpu_budget ? fmt::format("; cpu_budget {}", cfg.cpu_budget) : "");
  out += fmt::format(
      "  batches: {} sample(s){}{}, drop_last {}, {} per rank per epoch; on_error {}; "
      "sample_timeout_s {}\n",
      cfg.batch_size, cfg.budgeted() ? " at most (token budget)" : "",
      cfg.packed_stage >= 0 ? " (packed rows)" : "", cfg.drop_last ? "true" : "false",
      p.stream().batches_per_epoch(), cfg.on_error == ErrorPolicy::kSkip ? "skip" : "fail",
      cfg.sample_timeout_s);
  out += fmt::format("  rings: {} ring(s) x {} slots of {:.1f} MiB = {:.1f} MiB\n", cfg.consumers,
                     cfg.ring_slots,
                     cfg.consumers && cfg.ring_slots
                         ? plan.total_bytes / 1048576.0 / cfg.consumers / cfg.ring_slots
                         : 0.0,
                     plan.total_bytes / 1048576.0);
  return out;
}

Result<std::string> CheckPipeline(const PipelineConfig& cfg) {
  MMFEED_ASSIGN_OR_RETURN(std::unique_ptr<Pipeline> p, Pipeline::Create(cfg, {}));
  MMFEED_ASSIGN_OR_RETURN(RingPlan plan, PlanRings(cfg));
  MMFEED_RETURN_IF_ERROR(CheckMemory(plan, cfg.CacheBytes()));
  const PathCheck files = p->CheckSamplePaths(kCheckedSamples);
  MMFEED_RETURN_IF_ERROR(CheckSampleFiles(cfg, files));
  return fmt::format(
      "({} stages, {} consumer rank(s){}{}, {} batches per rank {}, rings {:.2f} GiB, {} sample "
      "files checked){}",
      cfg.stages.size(), cfg.trainers(),
      cfg.replicas > 1
          ? fmt::format(" in groups of {} (replicas), {} stream(s)", cfg.replicas, cfg.consumers)
          : "",
      cfg.shape_from_trainers()
          ? fmt::format(" of node {} of {} as checked: consumers: auto takes the first "
                        "trainer's job{}",
                        cfg.source.node_rank, cfg.source.num_nodes,
                        cfg.replicas_auto ? ", replicas: auto its declared group size" : "")
          : "",
      p->stream().batches_per_epoch(),
      p->stream().budgeted() ? "in epoch 0 (token budget: the count varies by epoch)" : "per epoch",
      plan.total_bytes / 1073741824.0, files.files,
      "\n" + SettingsInForce(cfg, *p, plan) +
          (cfg.mixed() ? "the mixture, per epoch:\n" + p->MixPlan() : ""));
}

Result<PipelineConfig> LoadDaemonConfig(const std::string& file, const SupervisorOptions& options) {
  Result<PipelineConfig> cfg = LoadConfigFile(file);
  if (!cfg.ok()) return cfg;
  MMFEED_RETURN_IF_ERROR(CheckFaultsAllowed(*cfg, options.allow_faults));
  cfg->SetIndexDir(options.state_dir);  // manifest indexes live with the cursors
  return cfg;
}

int RunSupervisor(PipelineConfig cfg, SupervisorOptions options) {
  Supervisor s(std::move(cfg), std::move(options));
  return s.Run();
}

}  // namespace mmfeed
