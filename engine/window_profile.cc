#include "engine/window_profile.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "base/units.h"

namespace mmfeed {
namespace {

// The diagnosis's thresholds (docs/guide/profile.md).
constexpr double kSaturatedBusy = 0.7;        // a stage this busy limits the pipeline
constexpr double kWaiting = 0.05;             // trainers waiting less never notice the host
constexpr double kStallingWait = 0.2;         // trainers waiting this much are starved of data
constexpr double kStalledStageBusy = 0.3;     // ... and then a stage this busy is named
constexpr double kOnCpu = 0.6;                // busy time on (or waiting for) a CPU: cpu-bound
constexpr double kRingsFull = 0.5;            // rings full this much of the window
constexpr double kHolding = 0.5;              // trainers holding batches this much
constexpr double kLeakBytesPerS = 8 << 20;    // RSS growth that is a memory problem ...
constexpr double kLeakBytes = 32 << 20;       // ... once it adds up to this much
constexpr double kMajorFaultsPerS = 200;      // paging
constexpr double kStageMajorFaultsPerS = 50;  // a stage's off-CPU time is paging, not IO
constexpr double kMemoryPressure = 0.1;       // share of the window some task stalled on memory

// A counter's growth; 0 if it went back (it restarted).
double Delta(uint64_t x, uint64_t x0) { return static_cast<double>(x >= x0 ? x - x0 : 0); }

double Ratio(double part, double whole) { return whole > 0 ? part / whole : 0; }

double Quantile(const std::array<uint64_t, kLatencyBuckets>& h, uint64_t total, double q) {
  uint64_t rank = static_cast<uint64_t>(q * (total - 1)), seen = 0;
  for (int b = 0; b < kLatencyBuckets; ++b) {
    seen += h[b];
    if (seen > rank) return LatencyBucketNs(b);
  }
  return LatencyBucketNs(kLatencyBuckets - 1);
}

// A stage's threads' CPU time and faults over a window.
struct PerStage {
  double cpu_ns = 0, minor = 0, major = 0;
  int threads = 0;
};

// Threads: the CPU time and faults of those alive at the end, since the start (or since they
// started), busiest first; summed per stage into `per_stage`, all faults into `thread_faults`.
nlohmann::json ThreadReport(const WindowSample& a, const WindowSample& b, double window_ns,
                            std::map<std::string, PerStage>* per_stage, double* thread_faults) {
  const double window_s = window_ns / 1e9;
  std::map<int, const ThreadSample*> before;
  for (const ThreadSample& t : a.host.threads) before[t.tid] = &t;
  nlohmann::json threads = nlohmann::json::array();
  for (const ThreadSample& t : b.host.threads) {
    auto it = before.find(t.tid);
    const ThreadSample* t0 =
        it != before.end() && it->second->name == t.name ? it->second : nullptr;
    double cpu = static_cast<double>(t.cpu_ns - (t0 ? std::min(t0->cpu_ns, t.cpu_ns) : 0));
    double minor =
        static_cast<double>(t.minor_faults - (t0 ? std::min(t0->minor_faults, t.minor_faults) : 0));
    double major =
        static_cast<double>(t.major_faults - (t0 ? std::min(t0->major_faults, t.major_faults) : 0));
    *thread_faults += minor + major;
    PerStage& s = (*per_stage)[t.stage];
    s.cpu_ns += cpu;
    s.minor += minor;
    s.major += major;
    ++s.threads;
    threads.push_back({{"tid", t.tid},
                       {"name", t.name},
                       {"stage", t.stage.empty() ? nlohmann::json() : nlohmann::json(t.stage)},
                       {"cpu_share", cpu / window_ns},
                       {"minor_faults_per_s", minor / window_s},
                       {"major_faults_per_s", major / window_s}});
  }
  std::sort(threads.begin(), threads.end(), [](const auto& x, const auto& y) {
    return x["cpu_share"].template get<double>() > y["cpu_share"].template get<double>();
  });

  return threads;
}

// Stages: the difference of their counters. A stage of a pipeline a reload replaced within
// the window counts from the new pipeline's start (rings outlive pipelines).
nlohmann::json StageReport(const WindowSample& a, const WindowSample& b, double window_ns,
                           bool replaced, const std::map<std::string, PerStage>& per_stage) {
  const double window_s = window_ns / 1e9;
  std::map<std::string, const StageSample*> stages_before;
  for (const StageSample& s : a.stages) stages_before[s.name] = &s;
  const StageSample zero;
  // The sample a stage's window starts from: its own at the start, or zeros when its counters
  // started within the window.
  auto base = [&](const StageSample& s) -> const StageSample& {
    auto it = stages_before.find(s.name);
    return it != stages_before.end() && !(replaced && s.type != "ring") &&
                   it->second->items <= s.items && it->second->busy_ns <= s.busy_ns
               ? *it->second
               : zero;
  };
  double total_busy = 0;
  for (const StageSample& s : b.stages) total_busy += Delta(s.busy_ns, base(s).busy_ns);
  nlohmann::json stages = nlohmann::json::array();
  for (const StageSample& s : b.stages) {
    const StageSample& s0 = base(s);
    // Thread time, less what parked threads (workers: auto) spent out of use.
    const double capacity =
        std::max(window_ns, window_ns * std::max(1, s.threads) - Delta(s.parked_ns, s0.parked_ns));
    const double busy = Delta(s.busy_ns, s0.busy_ns), items = Delta(s.items, s0.items);
    std::array<uint64_t, kLatencyBuckets> hist;
    uint64_t timed = 0;
    for (int k = 0; k < kLatencyBuckets; ++k) {
      hist[k] = s.latency[k] >= s0.latency[k] ? s.latency[k] - s0.latency[k] : 0;
      timed += hist[k];
    }
    const double fills = Delta(s.fill_samples, s0.fill_samples);
    const PerStage& ps = per_stage.count(s.name) ? per_stage.at(s.name) : PerStage{};
    nlohmann::json j = {
        {"name", s.name},
        {"type", s.type},
        {"workers", s.workers},
        {"auto_workers", s.auto_workers},
        {"max_workers", s.threads},
        {"items", items},
        {"items_per_s", items / window_s},
        {"errors", Delta(s.errors, s0.errors)},
        {"busy_seconds", busy / 1e9},
        {"work_share", Ratio(busy, total_busy)},
        {"busy_share", std::min(1.0, busy / capacity)},
        {"starved_share", std::min(1.0, Delta(s.starved_ns, s0.starved_ns) / capacity)},
        {"blocked_share", std::min(1.0, Delta(s.blocked_ns, s0.blocked_ns) / capacity)},
        {"cpu_share_of_busy", std::min(1.0, Ratio(Delta(s.cpu_ns, s0.cpu_ns), busy))},
        {"runnable_share_of_busy",
         std::min(1.0, Ratio(Delta(s.runnable_ns, s0.runnable_ns), busy))},
        {"latency_ms", timed ? nlohmann::json{{"p50", Quantile(hist, timed, 0.5) / 1e6},
                                              {"p99", Quantile(hist, timed, 0.99) / 1e6}}
                             : nlohmann::json()},
        {"queue_capacity", s.queue_capacity},
        {"queue_fill", s.queue_capacity && fills > 0 ? Delta(s.fill_sum, s0.fill_sum) / fills /
                                                           static_cast<double>(s.queue_capacity)
                                                     : 0.0},
        {"threads", ps.threads},
        {"thread_cpu_cores", ps.cpu_ns / window_ns},
        {"minor_faults_per_s", ps.minor / window_s},
        {"major_faults_per_s", ps.major / window_s}};
    if (!s.tuning.is_null()) j["tuning"] = s.tuning;
    stages.push_back(std::move(j));
  }
  return stages;
}

// The process and the machine: CPU, memory, faults, reads, pressure.
nlohmann::json HostReport(const WindowSample& a, const WindowSample& b, double window_ns,
                          const std::map<std::string, PerStage>& per_stage, nlohmann::json threads,
                          double thread_faults) {
  const double window_s = window_ns / 1e9;
  const HostSample &h0 = a.host, &h1 = b.host;
  auto rate = [&](uint64_t x1, uint64_t x0) {
    return (static_cast<double>(x1) - static_cast<double>(x0)) / window_s;
  };
  nlohmann::json pressure;
  const char* names[] = {"cpu", "io", "memory"};
  for (int k = 0; k < 3; ++k)
    pressure[names[k]] = h0.pressure_us[k] >= 0 && h1.pressure_us[k] >= h0.pressure_us[k]
                             ? nlohmann::json(std::min(
                                   1.0, (h1.pressure_us[k] - h0.pressure_us[k]) * 1e3 / window_ns))
                             : nlohmann::json();
  nlohmann::json stage_cpu = nlohmann::json::object();
  for (const auto& [stage, ps] : per_stage)
    stage_cpu[stage.empty() ? "(other)" : stage] = ps.cpu_ns / window_ns;
  // Cores free for more workers: those the daemon may use and does not, less what the rest of
  // the machine keeps busy.
  double idle_cores = h1.cpus - rate(h1.cpu_ns, h0.cpu_ns) / 1e9;
  if (h0.idle_cpu_ns >= 0 && h1.idle_cpu_ns >= h0.idle_cpu_ns)
    idle_cores = std::min(idle_cores, (h1.idle_cpu_ns - h0.idle_cpu_ns) / window_ns);
  return {{"cpus", h1.cpus},
          {"cpu_cores_used", rate(h1.cpu_ns, h0.cpu_ns) / 1e9},
          {"idle_cores", std::max(0.0, idle_cores)},
          {"stage_cpu_cores", stage_cpu},
          {"threads", std::move(threads)},
          {"rss_bytes", h1.rss_bytes},
          {"rss_anon_bytes", h1.rss_anon_bytes},
          {"rss_growth_bytes_per_s", rate(h1.rss_anon_bytes, h0.rss_anon_bytes)},
          {"minor_faults_per_s", rate(h1.minor_faults, h0.minor_faults)},
          {"major_faults_per_s", rate(h1.major_faults, h0.major_faults)},
          {"thread_faults_per_s", thread_faults / window_s},
          {"read_bytes_per_s", rate(h1.read_bytes, h0.read_bytes)},
          {"read_syscalls_per_s", rate(h1.read_syscalls, h0.read_syscalls)},
          {"storage_read_bytes_per_s", rate(h1.storage_read_bytes, h0.storage_read_bytes)},
          {"pressure", pressure},
          {"mem_available_bytes", h1.mem_available_bytes}};
}

// The trainers: batches taken, time waiting for data, time holding batches.
nlohmann::json ConsumerReport(const WindowSample& a, const WindowSample& b, double window_ns) {
  const double window_s = window_ns / 1e9;
  std::map<int, const ConsumerSample*> consumers_before;
  for (const ConsumerSample& c : a.consumers) consumers_before[c.rank] = &c;
  nlohmann::json consumers = nlohmann::json::array();
  for (const ConsumerSample& c : b.consumers) {
    ConsumerSample zero;
    auto it = consumers_before.find(c.rank);
    const ConsumerSample& c0 =
        it != consumers_before.end() && it->second->generation == c.generation ? *it->second : zero;
    // The reader writes its own counts: a nonsense value only spoils its own line.
    consumers.push_back(
        {{"rank", c.rank},
         {"attached", c.attached},
         {"removed", c.removed},
         {"batches_per_s",
          (it != consumers_before.end() ? Delta(c.released, it->second->released) : 0) / window_s},
         {"wait_share", std::min(1.0, Delta(c.wait_ns, c0.wait_ns) / window_ns)},
         {"held_batches", std::min<double>(c.slots, Delta(c.hold_ns, c0.hold_ns) / window_ns)},
         // The share of the window it held a batch (exact for a trainer holding one at a time).
         {"hold_share", std::min(1.0, Delta(c.hold_ns, c0.hold_ns) / window_ns)},
         {"ready_not_taken", c.ready},
         {"taken", c.taken},
         {"slots", c.slots}});
  }
  return consumers;
}

}  // namespace

nlohmann::json BuildWindowReport(const WindowSample& a, const WindowSample& b) {
  const double window_ns = std::max<double>(1, static_cast<double>(b.t_ns - a.t_ns));
  const double window_s = window_ns / 1e9;
  const bool replaced = a.pipeline_id != b.pipeline_id;
  nlohmann::json report = {{"window_s", window_s}, {"pipeline_replaced", replaced}};

  std::map<std::string, PerStage> per_stage;
  double thread_faults = 0;
  nlohmann::json threads = ThreadReport(a, b, window_ns, &per_stage, &thread_faults);
  report["stages"] = StageReport(a, b, window_ns, replaced, per_stage);
  report["host"] = HostReport(a, b, window_ns, per_stage, std::move(threads), thread_faults);
  report["consumers"] = ConsumerReport(a, b, window_ns);
  if (a.storage.remote && b.storage.remote && !replaced) {
    report["storage"] = {
        {"read_bytes_per_s", Delta(b.storage.bytes, a.storage.bytes) / window_s},
        {"wait_share", std::max(0.0, b.storage.wait_s - a.storage.wait_s) / window_s},
        {"retries", Delta(b.storage.retries, a.storage.retries)},
        {"data_bytes", b.storage.data_bytes},
        {"stalled_seconds", b.storage.stalled_s},
        {"stalled_requests", nlohmann::json::array()}};
    for (const auto& [url, why] : b.storage.stalled_requests)
      report["storage"]["stalled_requests"].push_back({{"url", url}, {"error", why}});
    if (b.storage.cache) {
      const double hits = Delta(b.storage.cache_hits, a.storage.cache_hits),
                   misses = Delta(b.storage.cache_misses, a.storage.cache_misses);
      report["storage"]["cache"] = {{"hits", hits},
                                    {"misses", misses},
                                    {"hit_share", hits + misses > 0 ? hits / (hits + misses) : 0},
                                    {"bytes", b.storage.cache_bytes},
                                    {"max_bytes", b.storage.cache_max_bytes}};
    }
  }
  report["diagnosis"] = Diagnose(report);
  return report;
}

namespace {

nlohmann::json Verdict(nlohmann::json stage, const char* kind, std::string evidence,
                       std::string advice) {
  return nlohmann::json{{"stage", std::move(stage)},
                        {"kind", kind},
                        {"evidence", std::move(evidence)},
                        {"advice", std::move(advice)}};
}

// Memory: the process grows, or pages, or the host stalls on memory. Null when none does.
nlohmann::json MemoryVerdict(const nlohmann::json& r) {
  const nlohmann::json& host = r["host"];
  const double window_s = r["window_s"].get<double>();
  const double growth = NumberIn(host, "rss_growth_bytes_per_s");
  const double major = NumberIn(host, "major_faults_per_s");
  const double mem_pressure = NumberIn(host["pressure"], "memory");
  if ((growth >= kLeakBytesPerS && growth * window_s >= kLeakBytes) || major >= kMajorFaultsPerS ||
      mem_pressure >= kMemoryPressure) {
    const nlohmann::json* worst = nullptr;
    double worst_faults = 0, faults = 0;
    for (const auto& s : r["stages"]) {
      double f = NumberIn(s, "minor_faults_per_s") + NumberIn(s, "major_faults_per_s");
      faults += f;
      if (f > worst_faults) {
        worst_faults = f;
        worst = &s;
      }
    }
    const double thread_faults = std::max(faults, NumberIn(host, "thread_faults_per_s"));
    const bool named = worst && worst_faults >= 0.5 * thread_faults;
    std::string who = named ? (*worst)["name"].get<std::string>() : "the daemon";
    std::string evidence = fmt::format(
        "memory: RSS grows {}/s ({} in {:.1f}s, now {}), {:.0f} minor and {:.0f} major faults/s",
        Megabytes(growth), Megabytes(growth * window_s), window_s,
        Megabytes(NumberIn(host, "rss_bytes")), NumberIn(host, "minor_faults_per_s"), major);
    if (named)
      evidence +=
          fmt::format(", {} of them on {}'s threads", Percent(worst_faults / thread_faults), who);
    if (mem_pressure > 0) evidence += fmt::format(", memory pressure {}", Percent(mem_pressure));
    std::string advice =
        growth > 0 ? fmt::format(
                         "{} keeps memory it does not give back (a leak or an unbounded "
                         "cache): at this rate the {} available last {:.0f}s",
                         who, Megabytes(NumberIn(host, "mem_available_bytes")),
                         NumberIn(host, "mem_available_bytes") / growth)
                   : "the host pages: lower ring_slots or batch_size, or free memory on the node";
    return Verdict(named ? nlohmann::json(who) : nlohmann::json(), "memory", evidence, advice);
  }

  return nullptr;
}

// The busiest stage limits the job: on CPU, on memory, or waiting on IO (storage).
// What else makes a CPU-bound stage cheaper, from what the stage says of itself (its tuning):
// a `cache:` when the epoch's samples fit in the memory it could use (later epochs copy instead
// of working again), then the stage's own settings not yet in force.
std::string CpuBoundExtras(const nlohmann::json& stage, const nlohmann::json& host) {
  if (!stage.contains("tuning")) return "";
  const nlohmann::json& t = stage["tuning"];
  std::string out;
  const double entry = NumberIn(t, "cache_entry_bytes"), samples = NumberIn(t, "epoch_samples");
  const double have = NumberIn(t, "cache_max_bytes");
  const double need = std::ceil(entry * samples * 1.05 / (1 << 20));  // MiB, 5% for overhead
  // Memory the daemon could use for it: half of what the machine has available now (the rest
  // is the trainers' and the page cache's), on top of what a cache already holds.
  const double room = NumberIn(host, "mem_available_bytes") / 2 + have;
  const std::string name = stage["name"].get<std::string>();
  if (t.value("cacheable", false) && entry > 0 && samples > 0 && need * (1 << 20) > have &&
      need * (1 << 20) <= room)
    out += fmt::format(
        "; {}: {}cache: {{max_bytes: {:.0f}M}} keeps its work for all {:.0f} samples of an "
        "epoch ({} of the {} available), so epochs after the first copy it instead of "
        "working again",
        name, have > 0 ? "a larger " : "", need, samples, Mebibytes(need * (1 << 20)),
        Mebibytes(NumberIn(host, "mem_available_bytes")));
  if (t.contains("cpu_advice"))
    for (const auto& a : t["cpu_advice"])
      out += fmt::format("; {}: {}", name, a.get<std::string>());
  return out;
}

nlohmann::json BusyStageVerdict(const nlohmann::json& r, const nlohmann::json* busiest,
                                const nlohmann::json* batch, int attached, double wait) {
  const nlohmann::json& host = r["host"];
  const double busy = NumberIn(*busiest, "busy_share");
  const double mem_pressure = NumberIn(host["pressure"], "memory");
  // Remote shards: what waiting for object storage took of the window.
  std::string storage_evidence, storage_advice;
  if (r.contains("storage") && r["storage"]["wait_share"].get<double>() >= 0.1) {
    const nlohmann::json& st = r["storage"];
    storage_evidence = fmt::format(
        "; worker threads waited {:.1f} s/s for object storage ({}/s fetched, {:.0f} retries)",
        st["wait_share"].get<double>(), Megabytes(st["read_bytes_per_s"].get<double>()),
        st["retries"].get<double>());
    storage_advice =
        "; the shards come from object storage: raise source.fetch_concurrency and "
        "prefetch_bytes, or bring the data nearer (a closer bucket, a local copy)";
    // Whether a disk cache (more of it) would take storage off the path after the first epoch.
    const double data = NumberIn(st, "data_bytes");
    if (!st.contains("cache"))
      storage_advice += fmt::format(
          "; a disk cache would read every epoch after the first from local disk: source.cache: "
          "{{dir: /a/local/disk, max_bytes: {:.0f}M}} holds all {} of shards",
          std::ceil(data / (1 << 20)), Megabytes(data));
    else if (NumberIn(st["cache"], "max_bytes") < data)
      storage_advice += fmt::format(
          "; the disk cache ({} of it filled, {} hit) is smaller than the data ({}): "
          "max_bytes: {:.0f}M would read every epoch after the first from disk",
          Megabytes(NumberIn(st["cache"], "bytes")), Percent(NumberIn(st["cache"], "hit_share")),
          Megabytes(data), std::ceil(data / (1 << 20)));
    else
      storage_advice += fmt::format(
          "; the disk cache holds all the data ({} hit in this window): once each shard has been "
          "fetched, storage stops limiting the job",
          Percent(NumberIn(st["cache"], "hit_share")));
  }
  const std::string name = (*busiest)["name"].get<std::string>();
  const int workers = (*busiest)["workers"].get<int>();
  const double on_cpu = NumberIn(*busiest, "cpu_share_of_busy");
  const double runq = NumberIn(*busiest, "runnable_share_of_busy");
  std::string downstream;
  if (batch && batch != busiest)
    downstream = fmt::format(", the {} stage starved {}", (*batch)["name"].get<std::string>(),
                             Percent(NumberIn(*batch, "starved_share")));
  std::string trainers =
      attached ? fmt::format("; trainers waited for data {} of the time", Percent(wait)) : "";
  const std::string workers_text = fmt::format("{} worker{}", workers, workers == 1 ? "" : "s");
  if (on_cpu + runq >= kOnCpu) {
    const double idle = host.contains("idle_cores")
                            ? NumberIn(host, "idle_cores")
                            : host["cpus"].get<double>() - NumberIn(host, "cpu_cores_used");
    std::string advice = idle >= 0.8
                             ? fmt::format("add {} workers ({:.1f} idle cores)", name, idle)
                             : fmt::format(
                                   "no idle core (the daemon uses {:.1f} of its {}, other work the "
                                   "rest): give it more cores, or less work per item",
                                   NumberIn(host, "cpu_cores_used"), host["cpus"].get<int>());
    advice += CpuBoundExtras(*busiest, host);
    if (runq >= 0.25)
      advice += fmt::format(
          "; its threads waited for a CPU {} of their busy time: more "
          "runnable threads than cores",
          Percent(runq));
    return Verdict(name, "cpu",
                   fmt::format("{} is CPU-bound: {} {} busy, {} of it on CPU ({} waiting for "
                               "a CPU), its mailbox {} full{}{}",
                               name, workers_text, Percent(busy), Percent(on_cpu), Percent(runq),
                               Percent(NumberIn(*busiest, "queue_fill")), downstream, trainers),
                   advice);
  }
  const double stage_major = NumberIn(*busiest, "major_faults_per_s");
  if (stage_major >= kStageMajorFaultsPerS || mem_pressure >= kMemoryPressure)
    return Verdict(name, "memory",
                   fmt::format("{} waits on memory: {} {} busy but {} of it on CPU, {:.0f} "
                               "major faults/s on its threads, memory pressure {}{}{}",
                               name, workers_text, Percent(busy), Percent(on_cpu), stage_major,
                               Percent(mem_pressure), downstream, trainers),
                   "the host pages: free memory on the node, or lower ring_slots, batch_size "
                   "or the workers' memory per item");
  std::string io_pressure =
      host["pressure"]["io"].is_number()
          ? fmt::format(", IO pressure {}", Percent(host["pressure"]["io"].get<double>()))
          : "";
  return Verdict(
      name, "io",
      fmt::format("{} is IO-bound: {} {} busy but {} of it on CPU, {}/s read ({:.0f} read "
                  "calls/s, {}/s from storage){}{}{}{}",
                  name, workers_text, Percent(busy), Percent(on_cpu),
                  Megabytes(NumberIn(host, "read_bytes_per_s")),
                  NumberIn(host, "read_syscalls_per_s"),
                  Megabytes(NumberIn(host, "storage_read_bytes_per_s")), io_pressure,
                  storage_evidence, downstream, trainers),
      fmt::format("more {} workers (they wait rather than compute, so they need little CPU) "
                  "or faster storage (local disk, a warm page cache){}",
                  name, storage_advice));
}

}  // namespace

nlohmann::json Diagnose(const nlohmann::json& r) {
  // A store that answers no request holds everything up, whatever the stages would do.
  if (r.contains("storage") && NumberIn(r["storage"], "stalled_seconds") > 0) {
    std::string failing;
    for (const auto& q : r["storage"]["stalled_requests"])
      failing +=
          fmt::format("; {}: {}", q["url"].get<std::string>(), q["error"].get<std::string>());
    return Verdict(nullptr, "io",
                   fmt::format("storage stalled: object storage has answered no request for "
                               "{:.0f} s{}",
                               NumberIn(r["storage"], "stalled_seconds"), failing),
                   "samples wait for the store (none is skipped) and the job goes on exactly "
                   "when it answers: check the store and the network to it; the trainers' "
                   "next() with a timeout says so");
  }
  if (nlohmann::json v = MemoryVerdict(r); !v.is_null()) return v;

  // The trainers: are they attached, do they wait for data, do they hold batches?
  int attached = 0;
  double wait = 0, held = 0, ready = 0;
  for (const auto& c : r["consumers"]) {
    if (!c["attached"].get<bool>()) continue;
    ++attached;
    wait = std::max(wait, NumberIn(c, "wait_share"));
    held += NumberIn(c, "held_batches");
    ready += NumberIn(c, "ready_not_taken");
  }
  double rings_full = 0;
  const nlohmann::json* busiest = nullptr;
  const nlohmann::json* batch = nullptr;  // where every branch's samples go
  for (const auto& s : r["stages"]) {
    if (s["type"] == "ring") {
      rings_full = std::max(rings_full, NumberIn(s, "blocked_share"));
      continue;
    }
    if (s["type"] == "batch") batch = &s;
    if (!busiest || NumberIn(s, "busy_share") > NumberIn(*busiest, "busy_share")) busiest = &s;
  }
  const double hold_share = attached ? held / attached : 0;
  // Trainers that hold batches most of the time and keep the rings full, or never wait for
  // one: their step time sets the pace.
  if (attached && hold_share >= kHolding && (rings_full >= kRingsFull || wait < kWaiting))
    return Verdict(
        nullptr, "consumer",
        fmt::format("consumer-bound: each trainer holds {:.2f} batches on average (1.00: one "
                    "batch held all the time), the rings were full {} of the window ({:.0f} "
                    "batches ready and not taken), trainers waited for data {}",
                    hold_share, Percent(rings_full), ready, Percent(wait)),
        "the host is not the limit: the trainers' step time is; release each batch as soon as "
        "it is copied to the GPU, or add trainers; mmfeed could do with fewer workers");

  // A busy stage limits the job only if trainers wait for data (or none is attached yet): one
  // at 80% while trainers never wait is spare capacity, not a bottleneck.
  const double busy = busiest ? NumberIn(*busiest, "busy_share") : 0;
  const bool saturated = busy >= kSaturatedBusy && (!attached || wait >= kWaiting);
  const bool stalling = attached && wait >= kStallingWait && busy >= kStalledStageBusy;
  if (busiest && (saturated || stalling))
    return BusyStageVerdict(r, busiest, batch, attached, wait);

  std::string evidence;
  if (!attached)
    evidence = "no trainer is attached";
  else if (rings_full >= kRingsFull)
    evidence = fmt::format(
        "the rings were full {} of the window and trainers take batches "
        "promptly ({:.2f} batches held on average, waited for data {})",
        Percent(rings_full), hold_share, Percent(wait));
  else
    evidence = fmt::format("trainers waited for data {} of the time", Percent(wait));
  if (busiest)
    evidence += fmt::format("; the busiest stage, {}, was busy {}",
                            (*busiest)["name"].get<std::string>(), Percent(busy));
  return Verdict(nullptr, "none", "nothing limits: " + evidence,
                 "nothing to do: mmfeed has spare capacity");
}

}  // namespace mmfeed
