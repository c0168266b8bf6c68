// The windowed profile behind `mmfeedctl profile`: two samples of every counter the daemon
// keeps (its stages, its threads, the process, the host's pressure, the trainers' own stall
// accounting), taken N seconds apart. The report is their difference, and its diagnosis names
// what limits the job, of which kind (cpu, io, memory, consumer, or none), with the numbers
// that show it and what to do. Everything is measured; the diagnosis never knows about faults
// injected for tests (docs/profile.md lists the rules).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/profile.h"

namespace mmfeed {

struct ThreadSample {
  int tid = 0;
  std::string name;   // the thread's name (comm)
  std::string stage;  // the stage it works for; "" for the daemon's other threads
  uint64_t cpu_ns = 0, minor_faults = 0, major_faults = 0;
};

// This process's counters, from /proc/self (zeros where unreadable).
struct ProcessSample {
  uint64_t cpu_ns = 0;  // user + system, exited threads included
  uint64_t rss_bytes = 0, rss_anon_bytes = 0;
  uint64_t minor_faults = 0, major_faults = 0;
  uint64_t read_bytes = 0, read_syscalls = 0;  // every read(2) and friends (rchar, syscr)
  uint64_t storage_read_bytes = 0;             // what reached the block layer (read_bytes)
};
ProcessSample SampleProcess();

// /proc/meminfo's MemAvailable (0 where unreadable).
uint64_t MemAvailableBytes();

struct HostSample : ProcessSample {
  std::vector<ThreadSample> threads;  // this process's, from /proc/self/task
  // /proc/pressure/{cpu,io,memory}: "some" total stall time in microseconds; -1 if absent.
  std::array<double, 3> pressure_us{-1, -1, -1};
  uint64_t mem_available_bytes = 0;
  int cpus = 1;             // CPUs this process may run on
  double idle_cpu_ns = -1;  // the machine's idle CPU time (/proc/stat idle + iowait); -1: unknown
};
// `thread_stages`: thread id -> stage (Pipeline::Threads()).
HostSample SampleHost(const std::map<int, std::string>& thread_stages);

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
  double wait_s = 0;  // worker threads' time waiting for shards or member reads
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
