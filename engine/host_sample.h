// What the daemon reads of its process and its host, in one place: /proc/self/{stat,status,io}
// and its threads' stat and schedstat, /proc/meminfo, /proc/pressure, /proc/stat, and the
// cgroup's memory limit. Used by the windowed profile (engine/window_profile.h), the metrics
// page and the start's memory check (daemon/). Values that cannot be read are zero (or -1
// where a comment says so), never an error: a sandbox without /proc gets a poorer profile.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

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

// Bytes of memory the daemon may still use: MemAvailable, bounded by the cgroup's memory.max
// less memory.current; UINT64_MAX when neither can be read.
uint64_t AvailableBytes();

}  // namespace mmfeed
