// Supervisor: the daemon's lifecycle. It plans and creates the rings, builds the pipeline
// from the config, serves the control socket (attach, resume, status, reload, stop), watches the
// trainers (pidfds) and the rings (cut-off readers), persists the acknowledged cursors
// (--state-dir), reloads the config (SIGHUP, reload), drains on SIGTERM/SIGINT/stop and reports.
// Everything runs on the calling thread's Asio io_context, except the pipeline's own threads
// (docs/design/threads.md).
#pragma once

#include <string>
#include <vector>

#include "base/status.h"
#include "base/tensor.h"
#include "client/control_protocol.h"
#include "engine/config.h"
#include "shm/ring.h"
#include "source/path_check.h"

namespace mmfeed {

struct SupervisorOptions {
  std::string socket = kDefaultSocket;
  std::string socket_group;  // members may attach too (socket mode 0660)
  std::string state_dir;     // where acknowledged cursors are kept; empty: nowhere
  double drain_timeout = 30;
  // `consumers: auto`: a job whose trainers have all left, none back within this many seconds,
  // ends (its cursors saved) and the daemon takes the next job's shape (--job-lease).
  double job_lease = 120;
  bool allow_faults = false;  // configs may inject faults (`faults:`, for tests)
};

// The rings a config needs: every slot's layout and their total size.
struct RingPlan {
  std::vector<TensorSpec> specs;  // a batch's tensors, per sample
  shm::SlotLayout layout;
  uint64_t total_bytes = 0;  // all ranks' rings together
};
// The rings of `cfg` (engine/batch_plan.h: what a slot holds), for every consumer rank.
Result<RingPlan> PlanRings(const PipelineConfig& cfg);

// Refuses rings, and the stages' caches of `cache_bytes` (PipelineConfig::CacheBytes) at
// their fullest, larger than the memory available (MemAvailable, and the cgroup's memory.max)
// less a margin: "needs X GiB, Y GiB available".
Status CheckMemory(const RingPlan& plan, uint64_t cache_bytes = 0);

// What --check (and, as a warning, the start) looks at of the samples' files: this many
// samples, spread over the catalog.
constexpr size_t kCheckedSamples = 5000;
// Refuses files outside the data roots (naming file:line:col, the roots in force and the
// `data_roots:` line to add) and a sample set none of whose files can be read; warns of
// missing or unreadable ones.
Status CheckSampleFiles(const PipelineConfig& cfg, const PathCheck& check);

// What `mmfeedd --check` runs: everything the daemon would do before serving (the source's
// catalog, the stages, the rings' size), without starting anything. Returns a summary in
// parentheses, then for a mixture its plan (Pipeline::MixPlan) on the lines after.
Result<std::string> CheckPipeline(const PipelineConfig& cfg);

// The exit status of a bad config or bad data (mmfeedd --check too).
inline constexpr int kExitConfig = 2;

// Runs the daemon until it drained or failed; returns its exit status (0 ok, 1 error or
// on_error: fail, 2 (kExitConfig) bad config or data, 3 the drain timed out with batches no
// trainer took).
// The config file as the daemon runs it (at start and on reload): loaded, its fault injection
// checked against --allow-faults, its manifest indexes put in --state-dir.
Result<PipelineConfig> LoadDaemonConfig(const std::string& file, const SupervisorOptions& options);
// REQUIRES: cfg from LoadDaemonConfig.
int RunSupervisor(PipelineConfig cfg, SupervisorOptions options);

}  // namespace mmfeed
