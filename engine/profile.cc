#include "engine/profile.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "engine/mailbox.h"

namespace mmfeed {
namespace {

uint64_t ThreadCpuNs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + ts.tv_nsec;
}

// The calling thread's /proc/thread-self/schedstat ("<cpu ns> <run-queue ns> <slices>"), opened
// once by the thread that reads it and closed when that thread exits, and the last reading of
// the thread's clocks that WorkTimer attributed.
class ThreadClocks {
 public:
  ThreadClocks() : fd_(open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC)) {}
  ~ThreadClocks() {
    if (fd_ >= 0) close(fd_);
  }
  ThreadClocks(const ThreadClocks&) = delete;
  ThreadClocks& operator=(const ThreadClocks&) = delete;

  uint64_t RunnableNs() const {
    char buf[96];
    ssize_t n = fd_ >= 0 ? pread(fd_, buf, sizeof buf - 1, 0) : -1;
    if (n <= 0) return 0;
    buf[n] = '\0';
    unsigned long long cpu = 0, runnable = 0;
    return std::sscanf(buf, "%llu %llu", &cpu, &runnable) == 2 ? runnable : 0;
  }

  // The first call only takes a reading; later ones, when the last reading is a period old at
  // `now`, add what the clocks grew by since to `c` (when given) and take a new one.
  void Sample(uint64_t now, StageCounters* c) {
    if (read_ && now - at_ < kThreadClockPeriodNs) return;
    const uint64_t runnable = RunnableNs(), cpu = ThreadCpuNs();
    if (read_ && c) {
      c->cpu_ns.fetch_add(cpu - cpu_, std::memory_order_relaxed);
      c->runnable_ns.fetch_add(runnable - runnable_, std::memory_order_relaxed);
    }
    read_ = true;
    at_ = now;
    cpu_ = cpu;
    runnable_ = runnable;
  }

 private:
  int fd_;
  bool read_ = false;
  uint64_t at_ = 0, cpu_ = 0, runnable_ = 0;
};

ThreadClocks& ThisThreadClocks() {
  thread_local ThreadClocks clocks;
  return clocks;
}

double ShareOfBusy(const StageCounters& c, const std::atomic<uint64_t>& part) {
  uint64_t busy = c.busy_ns.load();
  return busy ? std::min(1.0, static_cast<double>(part.load()) / busy) : 0;
}

}  // namespace

int LatencyBucket(uint64_t ns) {
  if (ns < 1024) return 0;
  const int top = 63 - __builtin_clzll(ns);                     // 2^top <= ns
  const int quarter = static_cast<int>((ns >> (top - 2)) & 3);  // the next two bits
  return std::min(kLatencyBuckets - 1, 1 + 4 * (top - 10) + quarter);
}

double LatencyBucketNs(int bucket) {
  if (bucket <= 0) return 512;
  const int top = 10 + (bucket - 1) / 4, quarter = (bucket - 1) % 4;
  return std::ldexp(1.0 + (quarter + 0.5) / 4, top);
}

StageSample SampleStage(const StageInfo& info) {
  const StageCounters& c = *info.counters;
  StageSample s;
  s.name = info.name;
  s.type = info.type;
  s.workers = info.workers;
  s.threads = info.threads ? info.threads : info.workers;
  s.auto_workers = info.auto_workers;
  s.queue_capacity = info.queue_capacity;
  s.tuning = info.tuning;
  s.items = c.items.load(std::memory_order_relaxed);
  s.errors = c.errors.load(std::memory_order_relaxed);
  s.busy_ns = c.busy_ns.load(std::memory_order_relaxed);
  s.cpu_ns = c.cpu_ns.load(std::memory_order_relaxed);
  s.runnable_ns = c.runnable_ns.load(std::memory_order_relaxed);
  s.starved_ns = c.starved_ns.load(std::memory_order_relaxed);
  s.blocked_ns = c.blocked_ns.load(std::memory_order_relaxed);
  s.parked_ns = c.parked_ns.load(std::memory_order_relaxed);
  s.fill_sum = c.fill_sum.load(std::memory_order_relaxed);
  s.fill_samples = c.fill_samples.load(std::memory_order_relaxed);
  for (int b = 0; b < kLatencyBuckets; ++b)
    s.latency[b] = c.latency[b].load(std::memory_order_relaxed);
  return s;
}

WorkTimer::WorkTimer(Clocks clocks) : clocks_(clocks), wall0_(NowNs()) {
  ThreadClocks& t = ThisThreadClocks();
  if (clocks_ == Clocks::kPerItem) {
    cpu0_ = ThreadCpuNs();
    runnable0_ = t.RunnableNs();
  } else {
    t.Sample(wall0_, nullptr);  // the thread's first reading
  }
}

// The clocks are read wall first at the start and wall last at the end, so that a preemption
// between two reads can only make the CPU and run-queue times smaller than the wall time.
void WorkTimer::AddTo(StageCounters* c) const {
  ThreadClocks& t = ThisThreadClocks();
  if (clocks_ == Clocks::kPerItem) {
    c->runnable_ns.fetch_add(t.RunnableNs() - runnable0_, std::memory_order_relaxed);
    c->cpu_ns.fetch_add(ThreadCpuNs() - cpu0_, std::memory_order_relaxed);
  } else {
    t.Sample(NowNs(), c);
  }
  const uint64_t wall = NowNs() - wall0_;
  c->busy_ns.fetch_add(wall, std::memory_order_relaxed);
  c->latency[LatencyBucket(wall)].fetch_add(1, std::memory_order_relaxed);
}

nlohmann::json BuildProfile(const std::vector<StageInfo>& stages, double wall_seconds) {
  nlohmann::json out;
  out["wall_seconds"] = wall_seconds;
  nlohmann::json list = nlohmann::json::array();
  double wall_ns = std::max(wall_seconds, 1e-9) * 1e9;
  const StageInfo* worst = nullptr;
  double worst_busy = -1;
  const StageInfo* ring_blocked = nullptr;
  double ring_blocked_share = 0;
  for (const StageInfo& s : stages) {
    const StageCounters& c = *s.counters;
    // Thread time, less what parked threads (workers: auto) spent out of use.
    const int threads = std::max(1, s.threads ? s.threads : s.workers);
    double capacity_ns =
        std::max(wall_ns, wall_ns * threads - static_cast<double>(c.parked_ns.load()));
    double busy = c.busy_ns.load() / capacity_ns;
    double starved = c.starved_ns.load() / capacity_ns;
    double blocked = c.blocked_ns.load() / capacity_ns;
    double cpu = ShareOfBusy(c, c.cpu_ns);
    double fill = 0;
    if (s.queue_capacity && c.fill_samples.load())
      fill = static_cast<double>(c.fill_sum.load()) / c.fill_samples.load() / s.queue_capacity;
    nlohmann::json j = {{"name", s.name},
                        {"type", s.type},
                        {"workers", s.workers},
                        {"items", c.items.load()},
                        {"errors", c.errors.load()},
                        {"busy_seconds", c.busy_ns.load() / 1e9},
                        {"busy_share", busy},
                        {"starved_seconds", c.starved_ns.load() / 1e9},
                        {"blocked_seconds", c.blocked_ns.load() / 1e9},
                        {"starved_share", starved},
                        {"blocked_share", blocked},
                        {"cpu_share_of_busy", cpu},
                        {"runnable_share_of_busy", ShareOfBusy(c, c.runnable_ns)},
                        {"queue_capacity", s.queue_capacity},
                        {"queue_fill", fill},
                        {"queue_depth", s.queue_depth}};
    if (!s.metrics.empty()) {
      j["metrics"] = nlohmann::json::object();
      for (const auto& [k, v] : s.metrics) j["metrics"][k] = v;
    }
    if (!s.cache.is_null()) j["cache"] = s.cache;
    list.push_back(j);
    if (s.type == "ring") {
      if (blocked > ring_blocked_share) {
        ring_blocked_share = blocked;
        ring_blocked = &s;
      }
    } else if (busy > worst_busy) {
      worst_busy = busy;
      worst = &s;
    }
  }
  out["stages"] = list;
  nlohmann::json b;
  if (ring_blocked && ring_blocked_share > 0.5) {
    b = {
        {"stage", ring_blocked->name},
        {"kind", "transfer"},
        {"why", fmt::format("{} waited for trainers to release ring slots {:.0f}% of the time: the "
                            "consumers, not mmfeed, limit throughput",
                            ring_blocked->name, ring_blocked_share * 100)}};
  } else if (worst) {
    const StageCounters& c = *worst->counters;
    double cpu = ShareOfBusy(c, c.cpu_ns), runnable = ShareOfBusy(c, c.runnable_ns);
    std::string kind = worst->type == "batch" ? "memory" : (cpu + runnable >= 0.6 ? "cpu" : "io");
    b = {{"stage", worst->name},
         {"kind", kind},
         {"why", fmt::format("{} workers were busy {:.0f}% of the time ({:.0f}% of that on CPU, "
                             "{:.0f}% waiting for a CPU)",
                             worst->name, worst_busy * 100, cpu * 100, runnable * 100)}};
  }
  out["bottleneck"] = b;
  return out;
}

}  // namespace mmfeed
