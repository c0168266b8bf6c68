// Supervisor: reloads. A config is checked and its pipeline built on a thread of its own,
// then takes over at once or at an epoch boundary; ranks move to new rings. See
// daemon/supervisor_internal.h and docs/design/threads.md.
#include "base/malloc_tuning.h"
#include "daemon/supervisor_internal.h"

namespace mmfeed {

void Supervisor::Reload(const std::string& file, ReloadDone done, bool at_batch) {
  const std::string path = file.empty() ? cfg_.file : file;
  notify_.Reloading();  // READY=1 ends it, refused or not (EndReload)
  Result<std::shared_ptr<PreparedReload>> prep = PrepareReload(path);
  if (!prep.ok()) return EndReload(path, prep.status(), std::move(done));
  (*prep)->at_batch = at_batch;
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

void Supervisor::EndReload(const std::string& path, Result<nlohmann::json> r, ReloadDone done) {
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

Result<std::shared_ptr<Supervisor::PreparedReload>> Supervisor::PrepareReload(
    const std::string& file) {
  if (draining_) return Status::Unavailable("the daemon is draining");
  if (reload_thread_.joinable())
    return Status::Unavailable("the previous reload is still building its pipeline");
  if (pending_)
    return Status::Unavailable(
        pending_->boundary_deferred
            ? fmt::format("the previous reload is waiting for the {}, chosen once the "
                          "trainers of rank(s) {} are back after the restart",
                          pending_->Boundary(), UnseenRanks())
            : "the previous reload is waiting for the " + pending_->Boundary());
  if (!pipeline_)
    return Status::Unavailable(
        "no trainer has declared the job's shape yet (consumers: auto): nothing runs to reload; "
        "restart the daemon to start on another config");
  if (pipeline_->Finished()) return Status::Closed("the run has ended");
  Result<PipelineConfig> cfg = LoadDaemonConfig(file, opt_);
  if (!cfg.ok()) return cfg.status();
  // What is auto keeps the shape in force (the trainers' job, or the config's before).
  MMFEED_RETURN_IF_ERROR(cfg->AdoptShape(cfg_.trainers(), cfg_.source.node_rank,
                                         cfg_.source.num_nodes,
                                         cfg->replicas_auto ? cfg_.replicas : 0));
  // The weights earlier reloads switched at batch boundaries stay part of the stream (dropped
  // by the build where they no longer fit the sources: the order then changes at an epoch).
  cfg->mix.switches = pipeline_->MixSwitches();
  auto p = std::make_shared<PreparedReload>();
  p->changes = DiffConfigs(cfg_, *cfg);
  if (!p->changes.needs_restart.empty())
    return Status::Unsupported(p->changes.needs_restart + kRestartHint);
  Result<RingPlan> plan = PlanRings(*cfg);
  if (!plan.ok()) return plan.status();
  if (cfg->CacheBytes() > cfg_.CacheBytes()) {  // the old caches' memory is freed at the switch
    Status memory = CheckMemory(RingPlan{}, cfg->CacheBytes() - cfg_.CacheBytes());
    if (!memory.ok()) return memory.WithContext("the stages' caches grow");
  }
  p->plan = std::move(plan.value());
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

Result<nlohmann::json> Supervisor::ApplyReload(PreparedReload& p) {
  if (!p.next.ok()) return p.next.status();
  if (draining_) return Status::Unavailable("the daemon is draining");
  if (pipeline_->Finished()) return Status::Closed("the run has ended");
  std::unique_ptr<Pipeline>& next = p.next.value();
  const bool new_ranks = p.cfg.consumers != cfg_.consumers;
  // Another number of batches per epoch (batch size, drop_last, the source's size; with a
  // token budget, any change of which samples go where): every rank switches at one epoch
  // boundary, where the new numbering starts.
  const bool renumber =
      new_ranks || next->stream().batches_per_epoch() != pipeline_->stream().batches_per_epoch() ||
      ((next->stream().budgeted() || pipeline_->stream().budgeted()) &&
       next->stream().order_fingerprint() != pipeline_->stream().order_fingerprint());
  if (renumber && p.cfg.packed_stage >= 0)
    return Status::Unsupported(std::string("a packed text stream's batch numbering cannot change") +
                               kRestartHint);
  bool at_epoch =
      renumber || next->stream().order_fingerprint() != pipeline_->stream().order_fingerprint();
  // Asked for: only the mixture's weights change, and every rank switches at one batch
  // boundary, each source going on from where it stood.
  const bool at_batch = p.at_batch && at_epoch;
  if (at_batch) {
    const WhyNot why_not =
        renumber || !p.changes.weights_only
            ? fmt::format("it changes more than a weighted mixture's weights ({})",
                          p.changes.Summary())
            : next->WhyNotSwitchWeights(*pipeline_);
    if (why_not)
      return Status::Unsupported(fmt::format(
          "reload at a batch boundary refused: {}; reload without --at batch to switch at the "
          "next epoch boundary",
          *why_not));
    at_epoch = false;
  }
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
  // After a restart from saved cursors a trainer may be past them: the boundary is the
  // furthest rank's once every trainer has said where it is.
  const std::string unseen = at_epoch || at_batch ? UnseenRanks() : std::string();
  // When an epoch boundary is waited for: why, and the changes that would have applied at once
  // but wait for it too (the whole pipeline is swapped there).
  const std::string epoch_why =
      !at_epoch  ? ""
      : renumber ? "the batches per epoch or the ranks change"
                 : "the order of the samples changes (seed, shuffle, weights or the data)";
  std::string others;
  for (const char* key : {"stages_changed", "workers", "stages_added", "stages_removed"})
    if (at_epoch && p.changes.json.contains(key) && !p.changes.json[key].empty())
      others = " the other changes (stages, workers) wait for that boundary too";
  // The furthest rank's next epoch: the boundary is there or, if ranks move on before the
  // stages stop, later.
  uint64_t boundary = 0;
  for (int r = 0; r < cfg_.consumers; ++r) {
    const StreamCursor c = pipeline_->stream().CursorAt(pipeline_->NextCommit(r));
    boundary = std::max<uint64_t>(boundary, c.epoch + (c.batch ? 1 : 0));
  }
  nlohmann::json reply = {
      {"config", p.cfg.file},
      {"changes", p.changes.json},
      {"summary", p.changes.Summary()},
      {"applied", std::string(at_batch    ? "at the next batch boundary, for every rank at once "
                                            "(only the mixture's weights change: each source goes "
                                            "on from where it stood)"
                              : !at_epoch ? "now"
                              : renumber  ? "at the next epoch boundary, for every rank at once "
                                            "(the batches per epoch or the ranks change)"
                              : p.changes.weights_only
                                  ? "at the next epoch boundary (mmfeedctl reload --at batch "
                                    "switches weights at the next batch boundary)"
                                  : "at the next epoch boundary") +
                      (unseen.empty() ? ""
                                      : fmt::format(", chosen once the trainers of rank(s) {} "
                                                    "are back after the restart",
                                                    unseen))},
      // When the trainers see it, in words (the plain-text reply prints it).
      {"when", at_epoch ? fmt::format("from batch 0 of epoch {}{}, for every rank at once, "
                                      "because {};{}",
                                      boundary, unseen.empty() ? "" : " or later", epoch_why,
                                      others.empty() ? " nothing else changes" : others)
                        : std::string()},
      {"rings", !grow ? "unchanged"
                : new_ranks
                    ? fmt::format("re-made for {} consumer rank(s); trainers attach to them by "
                                  "themselves",
                                  p.cfg.trainers())
                    : fmt::format("re-made {}; trainers attach to them by themselves",
                                  p.plan.total_bytes >= ring_bytes_ ? "larger" : "smaller")},
      {"ring_bytes",
       {{"before", ring_bytes_}, {"after", grow ? p.plan.total_bytes : ring_bytes_}}}};
  if (at_epoch) reply["boundary"] = {{"epoch", boundary}, {"why", epoch_why}};
  pending_ = std::make_unique<PendingReload>(PendingReload{std::move(next), std::move(p.cfg),
                                                           std::move(p.plan), std::move(p.rings),
                                                           at_epoch, at_batch, !unseen.empty()});
  if (at_epoch || at_batch) {
    // Every rank switches at one boundary, the furthest rank's next: a rank an epoch behind
    // the others must not make that epoch in another order than they did.
    if (unseen.empty()) QuiesceForPending();
  } else {
    pipeline_->Quiesce();
    pipeline_->Wait();
    // Where the new config starts: each rank's next batch. Its trainer sees it after the
    // batches its ring already holds.
    nlohmann::json first = nlohmann::json::array();
    std::string text;
    for (int r = 0; r < cfg_.consumers; ++r) {
      const uint64_t seq = pipeline_->NextCommit(r), ahead = sinks_[r]->ring().Unfinished(0);
      first.push_back({{"stream", r}, {"seq", seq}, {"ahead_in_ring", ahead}});
      text += fmt::format(
          "{}{} {} (after {} in its ring)", r ? ", " : "",
          cfg_.replicas > 1 ? "stream " + std::to_string(r) : "rank " + std::to_string(r), seq,
          ahead);
    }
    CompleteReload();
    reply["first_batches"] = std::move(first);
    reply["when"] = fmt::format(
        "the first batch made with it is seq {}: the trainers see it after the batches their "
        "rings already hold",
        text);
  }
  return reply;
}

bool Supervisor::ReadyToSwap() {
  if (!pending_ || !pipeline_->Finished()) return false;
  if (!pending_->at_epoch || !pipeline_->status().ok() || draining_) return true;
  for (int r = 0; r < cfg_.consumers; ++r) {
    if (sinks_[r]->ring().MinReadySeq() < pipeline_->NextCommit(r)) return false;
    if (moved_from_[r] && moved_from_[r]->ring().MinReadySeq() < pipeline_->NextCommit(r))
      return false;
  }
  return true;
}

void Supervisor::QuiesceForPending() {
  if (pending_->at_batch)
    pipeline_->QuiesceAtBatch();
  else
    pipeline_->QuiesceAtEpochEnd(/*together=*/true);
}

std::string Supervisor::UnseenRanks() const {
  std::string out;
  for (size_t r = 0; r < unseen_since_restart_.size(); ++r)
    if (unseen_since_restart_[r]) out += fmt::format("{}{}", out.empty() ? "" : ", ", r);
  return out;
}

void Supervisor::EveryRankBack() {
  unseen_since_restart_.clear();
  if (pending_ && pending_->boundary_deferred) {
    pending_->boundary_deferred = false;
    spdlog::info(
        "every rank's trainer is back after the restart: the pending reload switches at the "
        "furthest rank's next {}",
        pending_->Boundary());
    QuiesceForPending();
  }
  if (!then_reload_.empty())
    asio::post(io_, [this, file = std::exchange(then_reload_, std::string())] {
      Reload(file, [](Result<nlohmann::json>) {});  // logged
    });
}

StreamCursor Supervisor::AckedOf(int r) {
  StreamCursor acked = sinks_[r]->ring().acked();
  if (moved_from_[r] && moved_from_[r]->ring().acked().seq > acked.seq)
    acked = moved_from_[r]->ring().acked();
  return acked;
}

void Supervisor::CompleteReload() {
  std::unique_ptr<PendingReload> p = std::move(pending_);
  pipeline_->Wait();
  Status st = pipeline_->status();
  if (!st.ok() || draining_) {  // no successor: the sinks end with this pipeline
    if (!st.ok()) spdlog::error("the reload is abandoned: {}", st.message());
    for (BatchSink* s : pipeline_sinks_) s->Finish(false);
    return;
  }
  // At an epoch or a batch boundary, every rank stopped at the same batch.
  const uint64_t stop = pipeline_->NextCommit(0);
  bool together = true;
  for (int r = 1; r < cfg_.consumers; ++r) together &= pipeline_->NextCommit(r) == stop;
  if (p->at_epoch) {
    // Every rank stands at the same epoch boundary: the new order or numbering starts there,
    // and cursors before it are refused (the batches before it came from another config).
    StreamCursor at = pipeline_->stream().CursorAt(stop);
    if (!together || at.batch != 0) {  // QuiesceAtEpochEnd(true) guarantees it: a bug
      spdlog::error("the reload is abandoned: the ranks did not stop at one epoch boundary");
      for (BatchSink* s : pipeline_sinks_) s->Finish(false);
      return;
    }
    const Pipeline::Origin& before = pipeline_->stream().origin();
    // At a resumed origin itself (no batch since the job resumed mid-epoch there), a config of
    // the same order (another batch size or consumer count) deals the same rest of that epoch.
    const bool at_base = at.epoch == before.epoch && at.seq == before.seq && before.base &&
                         p->pipeline->stream().positional() &&
                         p->pipeline->stream().order_tag() == pipeline_->stream().order_tag();
    const Status st = p->pipeline->SetOrigin(
        {at.epoch, at.seq,
         StreamPlan::NextStreamTag(before, at.seq, p->pipeline->stream().order_fingerprint()),
         before.stream, at_base ? before.base : 0, at_base ? before.lanes : 0,
         at_base ? before.nodes : 0});
    if (!st.ok()) {  // the same order deals to the lanes it dealt to before: a bug
      spdlog::error("the reload is abandoned: {}", st.message());
      for (BatchSink* s : pipeline_sinks_) s->Finish(false);
      return;
    }
  } else {
    if (p->at_batch) {
      // Every rank stands at the same batch: the new weights start there.
      Status switched = together ? p->pipeline->SwitchWeightsAt(*pipeline_, stop)
                                 : Status::Invalid("the ranks did not stop at one batch");
      if (!switched.ok()) {  // QuiesceAtBatch and WhyNotSwitchWeights guarantee it: a bug
        spdlog::error("the reload is abandoned: {}", switched.message());
        for (BatchSink* s : pipeline_sinks_) s->Finish(false);
        return;
      }
      const MixSwitch at = p->pipeline->MixSwitches().back();
      spdlog::info("the mixture's weights change at batch {} (epoch {}, position {} of each rank)",
                   stop, at.epoch, at.position);
    }
    // The same numbering goes on (a mixture's switch waits for an epoch boundary while the
    // origin has a base: WhyNotSwitchWeights).
    if (const Status st = p->pipeline->SetOrigin(pipeline_->stream().origin());
        !st.ok()) {  // a bug
      spdlog::error("the reload is abandoned: {}", st.message());
      for (BatchSink* s : pipeline_sinks_) s->Finish(false);
      return;
    }
  }
  // Ranks a smaller consumer count removes: their trainers take what their rings hold, then
  // see the end of their data. Added ranks start where the others are.
  for (int r = p->cfg.consumers; r < cfg_.consumers; ++r) {
    sinks_[r]->Finish(true);
    spdlog::warn(
        "{} no longer served (consumers {} -> {}): its trainer(s) get the batches its ring "
        "holds, then the end of its data",
        cfg_.replicas == 1 ? fmt::format("rank {} is", r)
                           : fmt::format("stream {} (ranks {} to {}) is", r, r * cfg_.replicas,
                                         (r + 1) * cfg_.replicas - 1),
        cfg_.trainers(), p->cfg.trainers());
  }
  std::vector<StreamCursor> start;
  for (int r = 0; r < p->cfg.consumers; ++r) {
    uint64_t seq =
        r < cfg_.consumers ? pipeline_->NextCommit(r) : p->pipeline->stream().origin().seq;
    start.push_back(p->pipeline->stream().CursorAt(seq));
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
  totals_.Retire(pipeline_->Profile());
  // The old pipeline's stage caches are freed with it, and given back to the system.
  if (cfg_.CacheBytes() > 0)
    FreeAndGiveBack([&] { pipeline_ = std::move(p->pipeline); });
  else
    pipeline_ = std::move(p->pipeline);
  ++pipeline_id_;
  cfg_ = std::move(p->cfg);
}

void Supervisor::MoveRank(int r, std::unique_ptr<RingSink> ring, const StreamCursor& next) {
  if (r == ranks()) {  // a rank a larger consumer count adds
    ring->ring().set_acked(next);
    sinks_.push_back(std::move(ring));
    holders_.resize(holders_.size() + cfg_.replicas);
    awaiting_reattach_.resize(holders_.size(), false);
    rates_.emplace_back();
    moved_from_.emplace_back();
    spdlog::info("rank {}: added, starting at batch {}", r, next.seq);
    return;
  }
  std::unique_ptr<RingSink> old = std::move(sinks_[r]);
  for (int t : GroupOf(r)) {
    // Its trainers come back by themselves: the daemon does not end before they have (the new
    // ring may hold nothing but the end of the data).
    awaiting_reattach_[t] = holders_[t].pid != 0;
    if (holders_[t].pid) {
      // The trainer keeps its connection to the old ring until it attaches again: its later
      // close is then a stale generation and changes nothing.
      if (holders_[t].pidfd >= 0) ::close(holders_[t].pidfd);
      holders_[t] = Holder{};
    }
  }
  ring->ring().set_acked(old->ring().acked());
  old->ring().CloseMoved();
  totals_.RetireStage(old->info().name, BuildProfile({old->info()}, 1)["stages"][0]);
  moved_published_ += old->ring().published();
  sinks_[r] = std::move(ring);
  moved_from_[r] = std::move(old);
  spdlog::info("rank {}: moved to a new ring ({:.1f} MiB slots), continuing at batch {}", r,
               sinks_[r]->ring().layout().slot_bytes / 1048576.0, next.seq);
}

}  // namespace mmfeed
