// What a source is, as the config says it: SourceConfig (the `source:` block, parsed and
// checked by engine/config.cc) and RemoteConfig (its keys for shards in object storage). Plain
// values, so the source layer needs nothing from the engine.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "source/mixture.h"

namespace mmfeed {

// Where a config item was written, for error messages.
struct ConfigMark {
  int line = 0;    // 1-based, 0 = unknown
  int column = 0;  // 1-based
};

// Reading shards from object storage (source/remote_store.h): `source:` keys of a
// webdataset source whose path is an http://, https:// or s3:// URL.
struct RemoteConfig {
  int concurrency = 4;                   // whole shards fetched at once
  uint64_t prefetch_bytes = 1ull << 30;  // shards held or being fetched, in bytes
  int retries = 5;                       // per request, with exponential backoff
  double timeout_s = 30;                 // a connect or a stalled transfer gives up after this
  // The store answering no request for this long is reported (status, metrics, the profile,
  // a trainer's next() that times out); meanwhile samples wait for it, none is skipped.
  double stall_s = 30;
  uint64_t max_shard_bytes = 64ull << 30;  // a larger shard (as its HEAD says) is refused
  // s3:// paths: `s3: {endpoint, region, credentials_file, profile}`; empty values come from
  // AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, AWS_REGION / AWS_DEFAULT_REGION, the
  // AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN variables, then
  // AWS_SHARED_CREDENTIALS_FILE or ~/.aws/credentials and AWS_PROFILE.
  std::string s3_endpoint, s3_region, s3_credentials_file, s3_profile;
  // `cache: {dir, max_bytes}`: shards kept on local disk (source/shard_cache.h); empty: none.
  std::string cache_dir;
  uint64_t cache_max_bytes = 0;
};

struct SourceConfig {
  std::string type;  // manifest | webdataset | parquet
  std::string path;  // resolved against the config's folder
  bool shuffle = false;
  uint64_t seed = 0;
  int epochs = 1;                     // 0 = forever
  uint64_t max_bytes = 256ull << 20;  // largest file a sample field may read
  int node_rank = 0;
  int num_nodes = 1;
  bool node_auto = false;  // `node_rank: auto`: the trainers' job gives both (PipelineConfig)
  // webdataset: logical field name -> member extensions that provide it
  std::map<std::string, std::vector<std::string>> fields;
  // "on" keeps only each manifest line's offset (source/manifest_index.h), or each tar
  // shard's member list in an index file per shard (source/shard_index.h), and reads a
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
  // manifest: the pipeline's field name -> the manifest key it is read from (`fields:`, for
  // datasets whose keys differ); a field not named here is read from its own key. parquet: the
  // column it is read from, or a path into one ("image.bytes").
  std::map<std::string, std::string> keys;
  // parquet: a Hugging Face dataset folder's split, and the decoded row groups kept in memory.
  std::string split = "train";
  uint64_t row_group_cache_bytes = 1ull << 30;
  // A source of a mixture (`sources:`, source/mixture.h): its name and its share.
  std::string name;
  double weight = 0;  // mix mode weighted
  double repeat = 0;  // mix mode epochs
  // Set for the sources of a mixture (not a YAML key): a sample may lack some of the fields the
  // stages read (a text-only sample in an image pipeline); one that has none is unusable.
  bool fields_optional = false;
};

// `mix:` with `sources:` (source/mixture.h). The order's seed, shuffle, epochs and the node's
// share are the pipeline's `source` settings, taken from `mix:`.
struct MixConfig {
  std::string mode = "weighted";   // weighted | epochs
  uint64_t samples_per_epoch = 0;  // weighted: over all ranks and nodes; 0 = the sum of sizes
  // Not YAML: the weights reloads changed at batch boundaries before (oldest first), kept in
  // --state-dir; LoadMixture drops them when they no longer fit the sources.
  std::vector<MixSwitch> switches;
};

}  // namespace mmfeed
