// The pipeline config: the YAML graph a user writes, parsed and validated in full before
// anything starts. Every mistake is reported as "file:line:col: message". Parsing runs on the
// supervisor thread; the resulting PipelineConfig is a plain value.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "stages/runtime/registry.h"

namespace mmfeed {

// Where a config item was written, for error messages.
struct ConfigMark {
  int line = 0;    // 1-based, 0 = unknown
  int column = 0;  // 1-based
};

struct Placement {
  int numa_node = -1;  // -1: every CPU the daemon may use
  // Refuse, rather than warn about, more worker threads than the placement has usable CPUs.
  bool strict = false;
};

// Reading shards from object storage (stages/source/remote_store.h): `source:` keys of a
// webdataset source whose path is an http://, https:// or s3:// URL.
struct RemoteConfig {
  int concurrency = 4;                     // whole shards fetched at once
  uint64_t prefetch_bytes = 1ull << 30;    // shards held or being fetched, in bytes
  int retries = 5;                         // per request, with exponential backoff
  double timeout_s = 30;                   // a connect or a stalled transfer gives up after this
  uint64_t max_shard_bytes = 64ull << 30;  // a larger shard (as its HEAD says) is refused
  // s3:// paths: `s3: {endpoint, region, credentials_file, profile}`; empty values come from
  // AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, AWS_REGION / AWS_DEFAULT_REGION, the
  // AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN variables, then
  // AWS_SHARED_CREDENTIALS_FILE or ~/.aws/credentials and AWS_PROFILE.
  std::string s3_endpoint, s3_region, s3_credentials_file, s3_profile;
};

struct SourceConfig {
  std::string type;  // manifest | webdataset
  std::string path;  // resolved against the config's folder
  bool shuffle = false;
  uint64_t seed = 0;
  int epochs = 1;                     // 0 = forever
  uint64_t max_bytes = 256ull << 20;  // largest file a sample field may read
  int node_rank = 0;
  int num_nodes = 1;
  // webdataset: logical field name -> member extensions that provide it
  std::map<std::string, std::vector<std::string>> fields;
  // "on" keeps only each manifest line's offset (stages/source/manifest_index.h), or each tar
  // shard's member list in an index file per shard (stages/source/shard_index.h), and reads a
  // sample's entry when it is dealt; "off" parses every line or tar header at start; "auto": on
  // from kIndexAutoBytes of manifest or shards.
  std::string index = "auto";
  // Where indexes are kept (the daemon's --state-dir; not a YAML key). Empty: beside the data.
  std::string index_dir;
  ConfigMark path_mark;
  // webdataset: the epoch order takes whole shards in a seeded order and shuffles the samples
  // of each run of `shuffle_window` consecutive shards among themselves; a node reads one
  // contiguous part of that order (catalog.h, EpochOrder). 0: a permutation of every sample.
  // Default: 8 for remote shards (which are read whole), 0 otherwise.
  int shuffle_window = 0;
  bool remote = false;  // the path is an http(s):// or s3:// URL
  RemoteConfig fetch;
};

enum class ErrorPolicy { kSkip, kFail };

struct StageConfig {
  std::string name;
  std::string type;
  std::string field;                // kField stages
  std::vector<std::string> inputs;  // kBatch stages
  int workers = 1;
  // `workers: auto`: the supervisor moves worker threads between such stages while running,
  // within the top-level cpu_budget (stages/runtime/autotune.h); `workers` is then unused.
  bool workers_auto = false;
  int queue = 0;  // mailbox capacity; 0 = default (4 x workers, at least 8)
  Placement placement;
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

struct PipelineConfig {
  std::string file;      // the config file's path
  std::string text;      // the YAML it was parsed from (--state-dir keeps it with the cursors)
  std::string base_dir;  // its folder
  std::string name;      // `pipeline:`
  SourceConfig source;
  int consumers = 1;
  std::vector<StageConfig> stages;  // in file order; the batch stage is `batch_stage`
  int batch_stage = -1;
  int64_t batch_size = 0;
  bool drop_last = false;
  // Token-budget batches (stages/runtime/budget.h); 0: none. Either makes batch_size a limit.
  int64_t max_tokens = 0, max_patches = 0;
  bool budgeted() const { return max_tokens > 0 || max_patches > 0; }
  // Set when the batch's only input is a text stage with `pack: true`: its samples are
  // concatenated into fixed-length rows (see stages/text/packing_sink.h).
  int packed_stage = -1;
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
};

// Refuses a config with `faults:` unless `allowed` (mmfeedd --allow-faults), naming where.
Status CheckFaultsAllowed(const PipelineConfig& cfg, bool allowed);

// Parses and validates `text` as if read from `file` (used for messages and relative paths).
Result<PipelineConfig> ParseConfig(const std::string& text, const std::string& file);
// Refuses anything but a regular file of at most kMaxConfigBytes.
constexpr uint64_t kMaxConfigBytes = 1 << 20;
Result<PipelineConfig> LoadConfigFile(const std::string& file);

// Every tensor of a batch, per sample, in order: the batch stage's inputs in order, each
// stage's outputs in order.
std::vector<TensorSpec> BatchSpecs(const PipelineConfig& cfg);

}  // namespace mmfeed
