// The windowed profile behind `mmfeedctl profile`: two samples of every counter the daemon
// keeps (its stages, its threads, the process, the host's pressure, the trainers' own stall
// accounting), taken N seconds apart. The report is their difference, and its diagnosis names
// what limits the job, of which kind (cpu, io, memory, consumer, or none), with the numbers
// that show it and what to do. Everything is measured; the diagnosis never knows about faults
// injected for tests (docs/guide/profile.md lists the rules).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/host_sample.h"
#include "engine/profile.h"

namespace mmfeed {

// One rank's ring and trainer. wait_ns and hold_ns are the trainer's own accounting
// (shm/ring_format.md); they restart at 0 with every attach (generation).
struct ConsumerSample {
  int rank = 0;
  bool attached = false, removed = false;
  uint32_t generation = 0;
  uint64_t wait_ns = 0, hold_ns = 0, published = 0, released = 0;
  uint32_t ready = 0, taken = 0, slots = 0;
};

// Remote shards (source/remote_store.h): the store's running totals.
struct StorageSample {
  bool remote = false;
  uint64_t bytes = 0, retries = 0;
  double wait_s = 0;        // worker threads' time waiting for shards or member reads
  uint64_t data_bytes = 0;  // the shards' total size
  bool cache = false;       // source.cache (source/shard_cache.h)
  uint64_t cache_hits = 0, cache_misses = 0, cache_bytes = 0, cache_max_bytes = 0;
  // The store answering no request for longer than source.fetch_stall_s: for how long, and
  // the failing requests (url, why).
  double stalled_s = 0;
  std::vector<std::pair<std::string, std::string>> stalled_requests;
};

struct WindowSample {
  uint64_t t_ns = 0;
  uint64_t pipeline_id = 0;  // a reload makes a new pipeline whose stage counters start at 0
  std::vector<StageSample> stages;
  HostSample host;
  std::vector<ConsumerSample> consumers;
  StorageSample storage;
};

// The report of the window from `a` to `b`: {"window_s", "stages": [...], "host": {...},
// "consumers": [...], "diagnosis": {"stage", "kind", "evidence", "advice"}}.
nlohmann::json BuildWindowReport(const WindowSample& a, const WindowSample& b);

// The diagnosis of a report (BuildWindowReport calls it; apart so that it can be tested on
// reports written by hand).
nlohmann::json Diagnose(const nlohmann::json& report);

// Its text for people: FormatWindowReport (client/report_text.h).

}  // namespace mmfeed
