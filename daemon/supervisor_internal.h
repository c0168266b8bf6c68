// The Supervisor class (daemon/supervisor.h runs it), shared by the files that implement it,
// one per role:
//   supervisor.cc           the lifecycle: start (rings, pipeline, state, servers), the tick,
//                           signals, drain, exit; ring planning and --check
//   supervisor_sessions.cc  trainers attaching, resuming and detaching
//   supervisor_reload.cc    reloads: prepare, apply, swap at a boundary, rank moves
//   supervisor_state.cc     --state-dir: the saved stream (cursors, origin, kept config)
//   supervisor_observe.cc   status, metrics, profile windows, autotune, the final report
//   supervisor_job.cc       the end of an adopted job (lease, end-job), back to waiting
// Every method runs on the control thread (the io_context's), except where a comment says.
#pragma once

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
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
#include <numeric>
#include <set>
#include <thread>

#include "base/atomic_file.h"
#include "base/clock.h"
#include "base/rng.h"
#include "client/report_text.h"
#include "daemon/control_server.h"
#include "daemon/metrics.h"
#include "daemon/ring_sink.h"
#include "daemon/run_totals.h"
#include "daemon/service_notify.h"
#include "daemon/state_store.h"
#include "daemon/stream_state.h"
#include "daemon/supervisor.h"
#include "engine/autotune.h"
#include "engine/config_diff.h"
#include "engine/pipeline.h"
#include "engine/text_packing.h"
#include "engine/trace.h"
#include "engine/window_profile.h"
#include "source/catalog.h"

namespace mmfeed {

// What a refused reload says when a restart applies the change.
inline constexpr char kRestartHint[] = "; restart the daemon with the new config to apply it";
inline constexpr int kExitLost = 3;  // the drain timed out (batches no trainer took are dropped)

class Supervisor {
 public:
  Supervisor(PipelineConfig cfg, SupervisorOptions opt)
      : cfg_(std::move(cfg)), opt_(std::move(opt)), timer_(io_) {}

  int Run();

 private:
  // Run's steps: the saved stream to continue (--state-dir), and what follows the io_context.
  Result<std::optional<StreamState>> SavedStream();
  // A saved stream made with another config than the daemon's (an edited file) continues with
  // that config (cfg_ becomes it, then_reload_ the daemon's file) if it still makes the stream,
  // else is dropped. A config taking its shape from the trainers waits for the first declared
  // job (`job`, adopted by cfg_ already): the stream's fingerprint names the shape.
  void KeepSavedConfig(const JobShape* job);
  bool kept_waits_for_job_ = false;
  int Exit();
  std::optional<StreamState> saved_;  // Run's, for Build
  std::optional<JobShape> job_;       // adopted (consumers: auto) or the first declared
  std::string job_from_;              // "pid 123 (torchrun)"
  std::set<std::string> job_warned_;
  // The job's position the first trainer's cursor resumed this daemon's stream at (a job
  // restarted at another shape): every rank's cursor at it starts at the origin.
  struct Resumed {
    uint32_t epoch = 0;
    uint64_t position = 0;
    std::string from;  // "pid 123"
  };
  std::optional<Resumed> resumed_;
  int failed_exit_ = 0;  // a failure after the start ended the daemon with this status

  // Ranks with a ring (streams): the config's consumers, then any a reload removed (their rings
  // end).
  int ranks() const { return static_cast<int>(sinks_.size()); }
  // Trainer rank t reads stream t / replicas as the ring's member t % replicas (`replicas:`;
  // both t with one replica). holders_ is by trainer rank.
  int StreamOf(int t) const { return t / cfg_.replicas; }
  uint32_t MemberOf(int t) const { return static_cast<uint32_t>(t % cfg_.replicas); }
  // The trainer ranks that read stream s.
  std::vector<int> GroupOf(int s) const {
    std::vector<int> ranks(cfg_.replicas);
    std::iota(ranks.begin(), ranks.end(), s * cfg_.replicas);
    return ranks;
  }

  // The process attached for a trainer rank: its pid, a pidfd on it, and the attach's
  // generation.
  struct Holder {
    int pid = 0;
    int pidfd = -1;
    uint32_t generation = 0;
    RingSink* sink = nullptr;  // the rank's ring, or the one a reload replaced
  };

  Result<AttachGrant> Attach(int rank, int pid, int pidfd,
                             const std::optional<StreamCursor>& resume,
                             const std::optional<JobShape>& job);

  // Run's steps. Build: the rings, the pipeline (not started), the saved state, the metrics
  // endpoint; returns 0, or the exit status of a failure and `why`. Serve: starts the pipeline;
  // returns 0 or the exit status (logged). With `consumers: auto`
  // (PipelineConfig::shape_from_trainers) they run once the first trainer declared its job
  // (AdoptJob), the control socket serving meanwhile.
  int Build(std::string* why);
  int Serve();
  // The first declared job: the config takes its shape, then Build and Serve. A job Build
  // refuses (its rings do not fit in memory, the data cannot be dealt to its ranks) is refused
  // and everything undone: the daemon waits on. A failure to start ends the daemon with its
  // exit status (failed_exit_).
  Status AdoptJob(const JobShape& job, int pid, const std::optional<StreamCursor>& resume);
  // AdoptJob's step before Serve: a first trainer's cursor of another stream of the same order,
  // with the job's position (taken at another shape, or in a run since gone), starts the
  // stream there (StreamPlan::Rebased) instead of at the beginning. An error: the cursor's
  // position is not one of this order's (edited, or of other data); the job is not adopted.
  Status ResumeJobAt(const StreamCursor& c, int pid);
  // An attach's cursor as this daemon serves it: one at the position the job resumed at is
  // the origin's; any other unchanged (CheckResume refuses one of another stream).
  StreamCursor Served(const StreamCursor& c) const;
  // A cursor of another stream of this pipeline's order, carrying the job's position: what
  // ResumeJobAt starts a job at and Served maps to the origin.
  bool OfAnotherStreamOfOurOrder(const StreamCursor& c) const {
    return c.order && c.order == pipeline_->stream().order_tag() &&
           c.stream != pipeline_->stream().StreamBefore(c.seq);
  }
  // The end of an adopted job (supervisor_job.cc). Every tick: a job none of whose trainers
  // has been attached for the lease (--job-lease) ends. BeginEndJob refuses while a trainer is
  // attached or a reload is under way; else stops the pipeline (its rings aborted), and the
  // tick calls CompleteEndJob once its threads are done: the cursors saved, the profile
  // reported, everything the job made dropped, the config's shape forgotten, `done` called.
  using JobEnded = std::function<void(Result<nlohmann::json>)>;
  void WatchJobLease();
  Status BeginEndJob(const std::string& why, JobEnded done);
  void CompleteEndJob();
  void EndJob(JobEnded done);  // `mmfeedctl end-job`
  // Everything Build and Serve made for a job (the pipeline, rings, sinks, holders, the
  // metrics endpoint, the tuner's state), dropped: a refused adoption and an ended job. A member
  // Build gains is reset here.
  void DropJobParts();
  int AttachedTrainers() const;
  // For a refused trainer: how long until the adopted job frees the daemon ("" if not adopted).
  std::string WhenJobFrees() const;
  bool job_adopted_ = false;  // AdoptJob took the job's shape (consumers: auto)
  std::optional<std::chrono::steady_clock::time_point> trainers_gone_since_;
  struct Ending {
    std::string why;
    std::vector<JobEnded> done;
  };
  std::optional<Ending> ending_;  // BeginEndJob until CompleteEndJob

  // A job declared to a daemon whose shape is known: refused if it conflicts with the adopted
  // one (naming both); against the config's own values only warned of (once per shape).
  Status CheckJob(const JobShape& job, int pid);
  // What status says of the job: the shape in force and where it came from.
  nlohmann::json JobJson() const;

  // The trainer finished the batches before `cursor`: those in the ring are not delivered
  // again; if the rest starts at the cursor it is reused, else the rank is rewound there. A
  // cursor the rank cannot be served from (forged, past the data, before a reload's boundary
  // with its batches no longer in the ring) is refused before anything changes.
  Status Resume(int rank, const StreamCursor& c);

  // Whether rank `rank` can be served from cursor `c` on, `ring` holding its published batches:
  // a cursor naming its stream must name this one; a seq from the ring's oldest batch to the
  // pipeline's next one is served from the ring; any other must be one the pipeline can make
  // (Pipeline::CheckCursor).
  Status CheckResume(int rank, shm::RingWriter& ring, const StreamCursor& c);

  // SIGHUP, `mmfeedctl reload`: `file` (empty: the running config's) is checked as completely
  // as --check and, if good, a pipeline built from it takes over from each rank's next batch:
  // at once, or at every rank's next common epoch boundary when it changes which samples go
  // where (a new seed). A bad config, or one the running rings cannot serve, changes nothing.
  // The new pipeline is built on a thread of its own (its catalog may wait on storage): the
  // control thread goes on serving, and `done` gets the reply on it when the build is over.
  using ReloadDone = std::function<void(Result<nlohmann::json>)>;
  // `at_batch`: the reload must switch at a batch boundary (only a mixture's weights change) or
  // is refused; else a change of the order waits for an epoch boundary.
  void Reload(const std::string& file, ReloadDone done, bool at_batch = false);

  void EndReload(const std::string& path, Result<nlohmann::json> r, ReloadDone done);

  // What a reload has made before its pipeline is built.
  struct PreparedReload {
    PipelineConfig cfg;
    ConfigChanges changes;
    RingPlan plan;
    std::vector<std::unique_ptr<RingSink>> rings;  // empty, or the rings every rank moves to
    std::vector<BatchSink*> sinks;                 // what the new pipeline feeds
    Result<std::unique_ptr<Pipeline>> next = Status::Unavailable("not built");
    bool at_batch = false;  // asked to switch at a batch boundary (Reload)
  };

  // The checks and the rings, on the control thread (quick: no data is read).
  Result<std::shared_ptr<PreparedReload>> PrepareReload(const std::string& file);

  // Back on the control thread with the built pipeline: how it takes over.
  Result<nlohmann::json> ApplyReload(PreparedReload& p);

  // Whether the pending reload can take over now. One that changes the order or the numbering
  // waits, after the running pipeline finished its epoch, until every trainer has taken the
  // batches before the boundary: from the swap on, the saved state names only the new config,
  // and a restart could not make a batch that only the ring held again. A batch a trainer
  // holds is the trainer's: it finishes it and resumes after it. (Waiting for the releases
  // instead would wait forever for a trainer that keeps its last batch while it asks for the
  // next, as mmfeed.torch's dataset and to_device do.)
  bool ReadyToSwap();

  // The running pipeline goes on to the pending reload's boundary (of an epoch or a batch).
  void QuiesceForPending();

  // The ranks whose trainer has not attached since the daemon continued from saved cursors,
  // as a list for messages ("1, 2"); empty when every one is back.
  std::string UnseenRanks() const;

  // Every rank's trainer attached since the daemon continued from saved cursors: a reload
  // waiting for them chooses its epoch boundary now, and a restart on an edited config
  // reloads it.
  void EveryRankBack();

  // The rank's acknowledged cursor: a trainer still draining the ring a reload replaced
  // acknowledges there.
  StreamCursor AckedOf(int r);

  // The running pipeline has quiesced: the pending one continues every rank from its next
  // batch, into the same sinks, reshaped for its tensors.
  void CompleteReload();

  // Makes one ring per rank of `cfg` for `plan`.
  static Result<std::vector<std::unique_ptr<RingSink>>> MakeRings(const PipelineConfig& cfg,
                                                                  const RingPlan& plan);

  // Rank `r` goes on in `ring` (a reload needed larger slots or changed the ranks) from `next`,
  // the first batch not in the old ring. The old ring's batches are served first (see Attach): an
  // attached trainer drains it and attaches again by itself.
  void MoveRank(int r, std::unique_ptr<RingSink> ring, const StreamCursor& next);

  // The config a saved stream was made with, loaded as the daemon loads its file (relative
  // paths from where that file was), with `job`'s shape when it takes it from the trainers.
  Result<PipelineConfig> KeptConfig(const StreamState& s, const JobShape* job) const;

  // Starts every rank from its saved cursor when `saved` is this pipeline's stream.
  Status LoadState(std::optional<StreamState> saved);

  // Writes the stream's state (StateStore: only when it changed; failures logged sparingly).
  Status SaveState();

  void Detach(int rank, int pid, uint32_t generation);

  nlohmann::json StatusJson();

  // Everything the windowed profile compares, now.
  WindowSample SampleWindow();

  // workers: auto: a window every kTuneWindow, after which the tuner may move one worker.
  void Tune();

  // `mmfeedctl profile`: samples now and again after `seconds`, on this thread's timer; with
  // `trace`, records the window's spans too (one trace at a time).
  void Profile(double seconds, bool trace, std::function<void(Result<nlohmann::json>)> done);

  // Every field stage's workers now; with workers: auto, the budget and the tuner's last moves.
  nlohmann::json WorkersJson();

  void WaitSignal(asio::signal_set& signals);

  void BeginDrain(const std::string& why);

  // Every 100 ms: exit once every produced batch was taken, or the drain timed out.
  void Tick();

  // One line for systemd's STATUS=: throughput over the last interval and the trainers.
  std::string StatusLine();

  // Every tick: the watchdog is fed while the pipeline makes progress or is idle for a good
  // reason (finished, draining, or waiting for trainers to take batches); a pipeline stuck on
  // something else stops feeding it, and systemd restarts the service. STATUS= every 5 s.
  void Heartbeat();

  // The config file's content hash, to tell which version runs ("" if unreadable).
  static std::string HashFile(const std::string& path);

  // The /metrics page (Prometheus text format). Counters belong to the daemon: those of
  // pipelines replaced by reloads are included.
  std::string MetricsText();

  int Report();

  PipelineConfig cfg_;
  SupervisorOptions opt_;
  StateStore state_{opt_.state_dir};  // --state-dir: the stream the trainers are in
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
  // A reload waiting for the running pipeline to quiesce (at the epoch boundary, or at one
  // batch boundary for a weights-only change of a mixture).
  struct PendingReload {
    std::unique_ptr<Pipeline> pipeline;
    PipelineConfig cfg;
    RingPlan plan;
    std::vector<std::unique_ptr<RingSink>> rings;  // empty, or larger rings to move to
    bool at_epoch = false;  // the order or numbering changes: all ranks switch at one epoch
    bool at_batch = false;  // only the mixture's weights change: all ranks switch at one batch
    bool boundary_deferred = false;  // at_epoch or at_batch, chosen once every rank is back
    std::string Boundary() const { return at_batch ? "batch boundary" : "epoch boundary"; }
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
  RunTotals totals_;                // the counters of the pipelines reloads replaced
  uint64_t watchdog_progress_ = 0;  // Heartbeat's last sign of life
  std::chrono::steady_clock::time_point status_at_;  // the last STATUS= line, and its count
  uint64_t status_published_ = 0;
  std::unique_ptr<ControlServer> server_;
  std::vector<Holder> holders_;
  uint32_t last_generation_ = 0;
  uint64_t ring_bytes_ = 0;
  bool draining_ = false;
  // The drain ended early: no attached trainer had batches left to take (a stop with nobody
  // to wait for returns at once, exit 0).
  bool drained_unattended_ = false;
  bool drain_timed_out_ = false;
  // Per rank, true while its trainer has not attached since the daemon continued from saved
  // cursors: the trainer may be past them (the state is written once a tick, a kill loses the
  // last ones), so an order-changing reload chooses its epoch boundary only once every rank's
  // trainer is back and has said where it is (EveryRankBack).
  std::vector<bool> unseen_since_restart_;
  // Once: ranks no trainer has taken from while another rank's trainer took more than a ring
  // (`consumers:` larger than the trainers started: the run could never end).
  void WarnRanksWithoutTrainers();
  bool warned_missing_trainers_ = false;
  // A restart on an edited config: the file to reload once every rank has attached again.
  std::string then_reload_;
  // A reload building its pipeline (Reload): joinable until its completion ran on the control
  // thread; reload_built_ once the pipeline is built.
  std::thread reload_thread_;
  std::atomic<bool> reload_built_{false};
  bool threads_abandoned_ = false;  // stuck past kStuckGrace after the drain timed out
  static constexpr std::chrono::seconds kStuckGrace{5};
  std::chrono::steady_clock::time_point drain_deadline_;
};

}  // namespace mmfeed
