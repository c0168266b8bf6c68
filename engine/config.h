// The pipeline config: the YAML graph a user writes, parsed and validated in full before
// anything starts. Every mistake is reported as "file:line:col: message". Parsing runs on the
// supervisor thread; the resulting PipelineConfig is a plain value.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/registry.h"
#include "source/source_config.h"

namespace mmfeed {

struct Placement {
  int numa_node = -1;  // -1: every CPU the daemon may use
  // Refuse, rather than warn about, more worker threads than the placement has usable CPUs.
  bool strict = false;
};

enum class ErrorPolicy { kSkip, kFail };

struct StageConfig {
  std::string name;
  std::string type;
  std::string field;                // kField stages
  std::vector<std::string> inputs;  // kBatch stages
  int workers = 1;
  // `workers: auto`: the supervisor moves worker threads between such stages while running,
  // within the top-level cpu_budget (engine/autotune.h); `workers` is then unused.
  bool workers_auto = false;
  int queue = 0;  // mailbox capacity; 0 = default (4 x workers, at least 8)
  Placement placement;
  // `cache: {max_bytes: 16G}`: keep the stage's outputs per sample in memory (SampleCache,
  // docs/design/cache.md). `cache: {}` under a top-level cache_budget takes an equal share of what
  // the stages with their own max_bytes leave. 0: no cache.
  bool cache = false;
  uint64_t cache_max_bytes = 0;
  // `cache: {disk: {dir, max_bytes}}`: the cache's disk tier (SampleDisk); "" and 0: none.
  std::string cache_disk_dir;
  uint64_t cache_disk_max_bytes = 0;
  ConfigMark cache_mark;
  const StageSchema* schema = nullptr;
  std::shared_ptr<Stage> stage;  // built by the factory during validation
  Params params;
  ConfigMark mark;
};

// `faults:` — injected faults, for tests of the profile's diagnosis (refused unless mmfeedd runs
// with --allow-faults): an off-CPU delay before each file a stage opens, and memory a stage
// keeps for every item (never freed while the pipeline runs).
struct FaultConfig {
  std::string stage;  // empty: no faults
  int read_delay_ms = 0;
  int64_t leak_bytes_per_item = 0;
  ConfigMark mark;
};

constexpr int kMaxConsumers = 64;  // rings (trainer ranks) per daemon

struct PipelineConfig {
  std::string file;      // the config file's path
  std::string text;      // the YAML it was parsed from (--state-dir keeps it with the cursors)
  std::string base_dir;  // its folder
  std::string name;      // `pipeline:`
  // The source, or with `sources:` a mixture's order settings (type "mix": seed, shuffle,
  // epochs, node_rank, num_nodes from `mix:`) and its sources.
  SourceConfig source;
  std::vector<SourceConfig> sources;
  MixConfig mix;
  bool mixed() const { return !sources.empty(); }
  // Where the sources keep their indexes (the daemon's --state-dir; empty: beside the data).
  void SetIndexDir(const std::string& dir) {
    source.index_dir = dir;
    for (SourceConfig& s : sources) s.index_dir = dir;
  }
  // The node's streams: one ring each, dealt its own share of the data. The YAML's `consumers:`
  // counts trainer ranks, `replicas:` of which read each stream (model-parallel peers), so
  // consumers = `consumers:` / replicas; trainer rank t reads stream t / replicas.
  int consumers = 1;
  int replicas = 1;
  int trainers() const { return consumers * replicas; }
  // `consumers: auto` (and source.node_auto: `node_rank`/`num_nodes: auto`): the job's shape
  // comes from the trainers' attach; consumers 1 (node 0 of 1) until AdoptShape.
  bool consumers_auto = false;
  // `replicas: auto` (with consumers: auto): the group size the trainers declare (JobShape::
  // replicas; 1 when they declare none); replicas 1 until AdoptShape.
  bool replicas_auto = false;
  bool shape_from_trainers() const { return consumers_auto || source.node_auto; }
  // Takes a declared job's values for what is auto: local_world_size trainer ranks (streams:
  // that over replicas), this node's rank of num_nodes, the group size `declared_replicas` (0: not
  // declared). Refuses more than kMaxConsumers, a local_world_size that is not a multiple of
  // replicas, and a declared group size other than the config's `replicas: k`.
  Status AdoptShape(int local_world_size, int node_rank, int num_nodes, int declared_replicas);
  // Back to what AdoptShape found (one stream, node 0 of 1) for what is auto: the next job's.
  void ForgetShape();
  std::vector<StageConfig> stages;  // in file order; the batch stage is `batch_stage`
  int batch_stage = -1;
  int64_t batch_size = 0;
  bool drop_last = false;
  // Token-budget batches (engine/budget.h); 0: none. Either makes batch_size a limit.
  int64_t max_tokens = 0, max_patches = 0;
  bool budgeted() const { return max_tokens > 0 || max_patches > 0; }
  // Set when the batch's only input is a text stage with `pack: true`: its samples are
  // concatenated into fixed-length rows of its max_len, padded with its pad_id (the engine's
  // batch transform: engine/text_packing.h).
  int packed_stage = -1;
  struct Packing {
    int64_t max_len = 0;
    int32_t pad_id = 0;
  } packing;
  int ring_slots = 8;
  // Folders sample files must lie in (resolved against the config's folder), besides the
  // source's own; `data_roots: any` lifts the check.
  std::vector<std::string> data_roots;
  bool data_roots_any = false;
  ErrorPolicy on_error = ErrorPolicy::kSkip;
  // A sample taking longer than this in a stage fails as timed out (0: no limit).
  double sample_timeout_s = 60;
  Placement placement;
  // `metrics: {listen: "127.0.0.1:9464"}`: where GET /metrics is served; empty: nowhere.
  std::string metrics_listen;
  ConfigMark metrics_mark;
  FaultConfig faults;
  // Worker threads all field stages may have together when some have `workers: auto`;
  // 0: the CPUs of the top-level placement.
  int cpu_budget = 0;
  ConfigMark cpu_budget_mark;
  // `cache_budget: 32G`: the stages' caches together (shared out at parse: each stage's
  // cache_max_bytes is set). 0: none.
  uint64_t cache_budget = 0;
  // The stages' caches together, counted in the memory check at start.
  uint64_t CacheBytes() const {
    uint64_t sum = 0;
    for (const StageConfig& s : stages) sum += s.cache_max_bytes;
    return sum;
  }
};

// Refuses a config with `faults:` unless `allowed` (mmfeedd --allow-faults), naming where.
Status CheckFaultsAllowed(const PipelineConfig& cfg, bool allowed);

// Parses and validates `text` as if read from `file` (used for messages and relative paths).
Result<PipelineConfig> ParseConfig(const std::string& text, const std::string& file);
// Refuses anything but a regular file of at most kMaxConfigBytes.
constexpr uint64_t kMaxConfigBytes = 1 << 20;
Result<PipelineConfig> LoadConfigFile(const std::string& file);

}  // namespace mmfeed
