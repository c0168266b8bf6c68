// Per-stage counters and the profile report built from them. Counters are relaxed atomics
// written by the stage's own threads; the report may be taken from any thread at any time.
// Everything in the report is measured (clocks and counts), nothing is estimated.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace mmfeed {

// Per-item work time in a log histogram: bucket 0 holds items under 1 us, then 4 buckets per
// power of two up to ~18 minutes (the last bucket also takes anything longer).
constexpr int kLatencyBuckets = 1 + 4 * 30;
int LatencyBucket(uint64_t ns);
// A bucket's representative time (its geometric middle), in nanoseconds.
double LatencyBucketNs(int bucket);

struct StageCounters {
  std::atomic<uint64_t> items{0};
  std::atomic<uint64_t> errors{0};
  std::atomic<uint64_t> busy_ns{0};      // wall time spent working on items
  std::atomic<uint64_t> cpu_ns{0};       // thread CPU time spent working on items
  std::atomic<uint64_t> runnable_ns{0};  // ... waiting for a CPU while working on items
  std::atomic<uint64_t> starved_ns{0};   // waiting for input
  std::atomic<uint64_t> blocked_ns{0};   // waiting for downstream to take output
  std::atomic<uint64_t> parked_ns{0};    // workers: auto: threads not in use, waiting
  std::atomic<uint64_t> fill_sum{0};     // sum of mailbox fill seen at each pop
  std::atomic<uint64_t> fill_samples{0};
  std::array<std::atomic<uint64_t>, kLatencyBuckets> latency{};  // work time per item
};

// A plain copy of a stage's counters at one moment (the windowed profile compares two).
struct StageSample {
  std::string name, type;
  int workers = 1, threads = 1;
  bool auto_workers = false;
  size_t queue_capacity = 0;
  uint64_t items = 0, errors = 0, busy_ns = 0, cpu_ns = 0, runnable_ns = 0, starved_ns = 0,
           blocked_ns = 0, parked_ns = 0, fill_sum = 0, fill_samples = 0;
  std::array<uint64_t, kLatencyBuckets> latency{};
  nlohmann::json tuning;  // StageInfo::tuning
};

struct StageInfo {
  std::string name;
  std::string type;
  int workers = 1;            // threads taking items now
  size_t queue_capacity = 0;  // 0: the stage has no mailbox of its own
  const StageCounters* counters = nullptr;
  std::vector<std::pair<std::string, double>> metrics;  // Stage::Metrics()
  size_t queue_depth = 0;                               // items in its mailbox now
  // workers: auto: the threads started (`workers` of them take items, the rest are parked);
  // 0: `workers`.
  int threads = 0;
  bool auto_workers = false;
  nlohmann::json cache;  // the stage's `cache:` (SampleCache::Stats), or null
  // What the profile's advice for a CPU-bound stage reads: {"cpu_advice": Stage::CpuAdvice(),
  // "cache_entry_bytes": Stage::CacheEntryBytes(), "cacheable", "epoch_samples" (what the node
  // reads an epoch), "cache_max_bytes" (its cache's, 0 without one)}; null for the source and
  // batch stages.
  nlohmann::json tuning;
};

StageSample SampleStage(const StageInfo& info);

// Builds the report: per stage items, busy share, starved/blocked share, queue fill, CPU share,
// plus "bottleneck": the stage that limits throughput and the kind of limit (cpu, io, memory,
// transfer). A stage's busy time splits into computing, waiting for a CPU (more runnable
// threads than cores: still a CPU limit) and the rest (IO, page faults, locks).
nlohmann::json BuildProfile(const std::vector<StageInfo>& stages, double wall_seconds);

// Its text for people: FormatProfile (client/report_text.h).

// Times one item of work on the calling thread. Wall time is per item (busy_ns and the latency
// histogram). The thread's CPU and run-queue time (/proc/thread-self/schedstat, kept open per
// thread; zero where it cannot be read) cost two system calls (~3 us) to read, as much as a
// cheap stage's whole item, so each thread reads them at most once per kThreadClockPeriodNs of
// wall time and adds what they grew by to the stage of the item that read them: over a profile
// window that is the stage threads' CPU and run-queue time to within a period per thread,
// including their few microseconds of bookkeeping between items and the wait for a CPU after
// being woken. Reports clamp both to the busy time.
constexpr uint64_t kThreadClockPeriodNs = 1000000;

// kPerItem reads them at the start and end of this item instead, for rare items that run
// inside another stage's item on the same thread (a ring's commit inside the batch stage's):
// the enclosing stage's readings include its time, as they include any nested work.
class WorkTimer {
 public:
  enum class Clocks { kSampled, kPerItem };
  explicit WorkTimer(Clocks clocks = Clocks::kSampled);
  // Adds the wall time since construction to busy_ns and the latency histogram, and CPU and
  // run-queue time as the Clocks mode says.
  void AddTo(StageCounters* counters) const;
  // When it started (NowNs() clock).
  uint64_t start_ns() const { return wall0_; }

 private:
  Clocks clocks_;
  uint64_t wall0_, cpu0_ = 0, runnable0_ = 0;
};

}  // namespace mmfeed
