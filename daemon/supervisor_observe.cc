// Supervisor: what the daemon says of itself: status, Prometheus metrics, profile windows,
// autotune, and the report at exit. See daemon/supervisor_internal.h.
#include "daemon/supervisor_internal.h"

namespace mmfeed {

nlohmann::json Supervisor::StatusJson() {
  if (!pipeline_)  // consumers: auto, before the first trainer
    return {{"pipeline", cfg_.name},
            {"config", cfg_.file},
            {"state", draining_ ? "draining" : "waiting for the job"},
            {"pid", getpid()},
            {"job", JobJson()},
            {"consumers", nlohmann::json::array()},
            {"sources", nlohmann::json::array()}};
  nlohmann::json ranks = nlohmann::json::array();
  // Per trainer rank; the ring's figures are its stream's (shared by its replicas).
  for (int t = 0; t < static_cast<int>(holders_.size()); ++t) {
    const int r = StreamOf(t);
    shm::RingWriter::Backlog b = sinks_[r]->ring().backlog(MemberOf(t));
    ranks.push_back({{"rank", t},
                     {"stream", r},
                     {"removed", r >= cfg_.consumers},
                     {"pid", holders_[t].pid},
                     {"attached", holders_[t].pid != 0},
                     {"generation", holders_[t].generation},
                     {"published", sinks_[r]->ring().published()},
                     {"released", sinks_[r]->ring().released()},
                     {"acked", CursorToJson(sinks_[r]->ring().acked())},
                     {"lag_batches", b.ready},
                     {"seconds_since_take", b.seconds_since_take},
                     {"samples_per_s", rates_[r].per_s}});
  }
  const ProcessSample p = SampleProcess();
  nlohmann::json profile = pipeline_->Profile();
  // A mixture: per source, what it gave since the start (over reloads) and its planned share.
  nlohmann::json sources = nlohmann::json::array();
  for (const auto& [name, n] : totals_.Sources(profile)) {
    nlohmann::json s = {{"name", name},
                        {"samples", n.samples},
                        {"errors", n.errors},
                        {"errors_by_reason", n.reasons},
                        {"passes", n.passes}};
    if (profile.contains("sources"))
      for (size_t k = 0; k < profile["sources"].size(); ++k)
        if (profile["sources"][k]["name"] == name) {  // in the config now: batches' `source` k
          s["index"] = k;
          s["planned_share"] = profile["sources"][k]["planned_share"];
        }
    sources.push_back(std::move(s));
  }
  // A store that answers no request (source.fetch_stall_s): named with its failing requests.
  nlohmann::json storage = nullptr;
  if (profile.contains("storage") && profile["storage"].value("stalled_seconds", 0.0) > 0)
    storage = {{"stalled_seconds", profile["storage"]["stalled_seconds"]},
               {"requests", profile["storage"]["stalled_requests"]}};
  const char* state = draining_               ? "draining"
                      : pipeline_->Finished() ? "finished"
                      : !storage.is_null()    ? "storage stalled"
                                              : "running";
  return {{"pipeline", cfg_.name},
          {"config", cfg_.file},
          {"config_hash", config_hash_},
          {"storage_stalled", storage},
          {"uptime_s",
           std::chrono::duration<double>(std::chrono::steady_clock::now() - started_at_).count()},
          {"process",
           {{"cpu_seconds", p.cpu_ns / 1e9},
            {"rss_bytes", p.rss_bytes},
            {"read_bytes", p.read_bytes},
            {"storage_read_bytes", p.storage_read_bytes}}},
          {"reloads",
           {{"ok", reloads_ok_},
            {"failed", reloads_failed_},
            {"pending", pending_ != nullptr},
            {"pending_at", pending_ ? pending_->Boundary() : ""},
            {"waiting_for_ranks", pending_ && pending_->boundary_deferred ? UnseenRanks() : ""}}},
          {"state", state},
          {"pid", getpid()},
          {"job", JobJson()},
          {"consumers", ranks},
          {"rings",
           {{"bytes", ring_bytes_},
            {"slots", cfg_.ring_slots},
            {"numa_node", cfg_.placement.numa_node}}},
          {"placement", pipeline_->PlacementJson()},
          {"workers", WorkersJson()},
          {"sources", std::move(sources)},
          {"profile", std::move(profile)}};
}

WindowSample Supervisor::SampleWindow() {
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
    w.storage.data_bytes = st["data_bytes"].get<uint64_t>();
    w.storage.stalled_s = st.value("stalled_seconds", 0.0);
    for (const auto& r : st.value("stalled_requests", nlohmann::json::array()))
      w.storage.stalled_requests.emplace_back(r["url"].get<std::string>(),
                                              r["error"].get<std::string>());
    if (st.contains("cache_hits")) {
      w.storage.cache = true;
      w.storage.cache_hits = st["cache_hits"].get<uint64_t>();
      w.storage.cache_misses = st["cache_misses"].get<uint64_t>();
      w.storage.cache_bytes = st["cache_bytes"].get<uint64_t>();
      w.storage.cache_max_bytes = st["cache_max_bytes"].get<uint64_t>();
    }
  }
  for (int t = 0; t < static_cast<int>(holders_.size()); ++t) {
    const int r = StreamOf(t);
    shm::RingWriter::Backlog b = sinks_[r]->ring().backlog(MemberOf(t));
    ConsumerSample c;
    c.rank = t;
    c.attached = holders_[t].pid != 0;
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

void Supervisor::Tune() {
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

void Supervisor::Profile(double seconds, bool trace,
                         std::function<void(Result<nlohmann::json>)> done) {
  if (!pipeline_)
    return done(Status::Unavailable(
        "no pipeline runs yet: it starts when the first trainer declares the job's shape"));
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

nlohmann::json Supervisor::WorkersJson() {
  nlohmann::json split = nlohmann::json::object();
  for (const StageSample& st : pipeline_->SampleStages())
    if (st.type != "ring" && st.type != "batch" && st.name != "source") split[st.name] = st.workers;
  nlohmann::json j = {{"split", split}};
  if (pipeline_->cpu_budget()) {
    j["cpu_budget"] = pipeline_->cpu_budget();
    j["decisions"] = tune_decisions_;
  }
  return j;
}

std::string Supervisor::StatusLine() {
  auto now = std::chrono::steady_clock::now();
  uint64_t published = 0;
  int attached = 0;
  for (int r = 0; r < ranks(); ++r) published += sinks_[r]->ring().published();
  for (int t = 0; t < cfg_.trainers(); ++t) attached += holders_[t].pid != 0;
  double seconds = std::chrono::duration<double>(now - status_at_).count();
  double rate = status_at_.time_since_epoch().count() && seconds > 0
                    ? (published - status_published_) * cfg_.batch_size / seconds
                    : 0;
  status_at_ = now;
  status_published_ = published;
  return fmt::format("{:.0f} samples/s, {} batches published, {}/{} trainers attached", rate,
                     published, attached, cfg_.trainers());
}

std::string Supervisor::MetricsText() {
  nlohmann::json profile = pipeline_->Profile();
  const std::map<std::string, RunTotals::Stage> stages = totals_.Stages(profile);
  std::map<std::string, double> depth;
  for (const auto& st : profile["stages"])
    depth[st["name"].get<std::string>()] = st["queue_depth"].get<double>();
  const std::map<std::string, uint64_t> errors = totals_.Errors(profile);

  PromText t;
  auto per_stage = [&](const char* name, const char* help, double RunTotals::Stage::*field) {
    t.Family(name, "counter", help);
    for (const auto& [stage, v] : stages) t.Sample(name, {{"stage", stage}}, v.*field);
  };
  per_stage("mmfeed_stage_items_total",
            "Items a stage finished: samples, or batches for a ring stage.",
            &RunTotals::Stage::items);
  per_stage("mmfeed_stage_errors_total", "Items a stage failed.", &RunTotals::Stage::errors);
  per_stage("mmfeed_stage_busy_seconds_total", "Thread time a stage spent working.",
            &RunTotals::Stage::busy);
  per_stage("mmfeed_stage_starved_seconds_total", "Thread time a stage waited for input.",
            &RunTotals::Stage::starved);
  per_stage("mmfeed_stage_blocked_seconds_total",
            "Thread time a stage waited for downstream (a ring: for trainers).",
            &RunTotals::Stage::blocked);
  t.Family("mmfeed_stage_queue_depth", "gauge", "Items in a stage's mailbox now.");
  for (const auto& [stage, v] : depth) t.Sample("mmfeed_stage_queue_depth", {{"stage", stage}}, v);
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
  // By trainer rank (replicas share their stream's ring figures).
  const int trainers = static_cast<int>(holders_.size());
  for (int r = 0; r < trainers; ++r) {
    shm::RingWriter& ring = sinks_[StreamOf(r)]->ring();
    StreamCursor acked = ring.acked();
    shm::RingWriter::Backlog b = ring.backlog(MemberOf(r));
    values.push_back({static_cast<double>(ring.published()), static_cast<double>(ring.released()),
                      static_cast<double>(acked.epoch), static_cast<double>(acked.seq),
                      static_cast<double>(b.ready), b.seconds_since_take,
                      holders_[r].pid ? 1.0 : 0.0, b.wait_ns / 1e9, b.hold_ns / 1e9});
  }
  for (size_t k = 0; k < std::size(rows); ++k) {
    t.Family(rows[k].name, rows[k].type, rows[k].help);
    for (int r = 0; r < trainers; ++r)
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
  if (const nlohmann::json st = pipeline_->StorageStats(); !st.is_null()) {
    const auto counter = [&](const char* name, const char* help, double v) {
      t.Family(name, "counter", help);
      t.Sample(name, v);
    };
    counter("mmfeed_storage_fetched_bytes_total",
            "Bytes fetched from object storage (whole shards and member reads).",
            st["bytes"].get<double>());
    counter("mmfeed_storage_wait_seconds_total",
            "Seconds worker threads waited for shards from object storage.",
            st["wait_seconds"].get<double>());
    t.Family("mmfeed_storage_stalled_seconds", "gauge",
             "Seconds object storage has answered no request, once past source.fetch_stall_s "
             "(0: it answers).");
    t.Sample("mmfeed_storage_stalled_seconds", st.value("stalled_seconds", 0.0));
    if (st.contains("cache_hits")) {
      counter("mmfeed_shard_cache_hits_total", "Shards read from the disk cache (source.cache).",
              st["cache_hits"].get<double>());
      counter("mmfeed_shard_cache_misses_total", "Shards the disk cache did not hold.",
              st["cache_misses"].get<double>());
      counter("mmfeed_shard_cache_evicted_bytes_total",
              "Bytes the disk cache removed to make room (the shards needed furthest ahead).",
              st["cache_evicted_bytes"].get<double>());
      t.Family("mmfeed_shard_cache_bytes", "gauge",
               "Bytes in the disk cache's folder, and its max_bytes.");
      t.Sample("mmfeed_shard_cache_bytes", {{"of", "held"}}, st["cache_bytes"].get<double>());
      t.Sample("mmfeed_shard_cache_bytes", {{"of", "max"}}, st["cache_max_bytes"].get<double>());
    }
  }
  if (const auto sources = totals_.Sources(profile); !sources.empty()) {
    t.Family("mmfeed_source_samples_total", "counter",
             "A mixture's samples committed in batches, by source.");
    for (const auto& [name, n] : sources)
      t.Sample("mmfeed_source_samples_total", {{"source", name}}, static_cast<double>(n.samples));
    t.Family("mmfeed_source_errors_total", "counter", "A mixture's failed samples, by source.");
    for (const auto& [name, n] : sources)
      t.Sample("mmfeed_source_errors_total", {{"source", name}}, static_cast<double>(n.errors));
    t.Family("mmfeed_source_errors_by_reason_total", "counter",
             "A mixture's failed samples, by source and reason.");
    for (const auto& [name, n] : sources)
      for (const auto& [reason, count] : n.reasons)
        t.Sample("mmfeed_source_errors_by_reason_total", {{"source", name}, {"reason", reason}},
                 static_cast<double>(count));
    t.Family("mmfeed_source_passes", "gauge",
             "A mixture's passes over a source: samples delivered over the source's size.");
    for (const auto& [name, n] : sources)
      t.Sample("mmfeed_source_passes", {{"source", name}}, n.passes);
  }
  t.Family("mmfeed_reloads_total", "counter", "Config reloads, applied or refused.");
  t.Sample("mmfeed_reloads_total", {{"result", "ok"}}, static_cast<double>(reloads_ok_));
  t.Sample("mmfeed_reloads_total", {{"result", "refused"}}, static_cast<double>(reloads_failed_));
  return t.text();
}

int Supervisor::Report() {
  nlohmann::json profile = pipeline_->Profile();
  Status st = pipeline_->status();
  // A run stopped on an error was limited by that, not by a stage: no bottleneck is named.
  if (!st.ok()) profile["bottleneck"] = nullptr;
  std::string text = FormatProfile(profile);
  if (!st.ok()) text += "bottleneck: none named: the run stopped on an error (below)\n";
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
  if (!st.ok()) {
    std::fprintf(stderr, "mmfeedd: stopped on error: %s\n", st.message().c_str());
    return pipeline_->stopped_on_unusable_data() ? kExitConfig : 1;
  }
  if (drained_unattended_ && !drain_timed_out_) {
    if (unreleased > 0)
      std::fprintf(stderr,
                   "mmfeedd: stopped: %lu published batch(es) were left in the rings of ranks "
                   "with no trainer attached; they are not lost: %s\n",
                   static_cast<unsigned long>(unreleased),
                   !state_.enabled()
                       ? "a trainer resuming from its cursor (state_dict, --cursor) gets them "
                         "again from the next daemon"
                       : "the next start continues from the saved cursors and makes them again");
    return 0;
  }
  if (drain_timed_out_ && unreleased > 0) {
    std::fprintf(
        stderr,
        "mmfeedd: the drain timed out: %lu published batch(es) were never taken by the "
        "attached trainer(s) within --drain-timeout and are dropped: %s\n",
        static_cast<unsigned long>(unreleased),
        !state_.enabled()
            ? "a trainer resuming from its cursor (state_dict, --cursor) gets them again from "
              "the next daemon; without a cursor, its rank starts over and they are lost"
            : "the next start regenerates them from the saved cursors");
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

}  // namespace mmfeed
