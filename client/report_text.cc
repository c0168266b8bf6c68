#include "client/report_text.h"

#include <fmt/format.h>

#include "base/units.h"

namespace mmfeed {

std::string FormatProfile(const nlohmann::json& p) {
  std::string s = fmt::format("{:<12} {:>7} {:>9} {:>7} {:>6} {:>8} {:>8} {:>6} {:>6} {:>7}\n",
                              "stage", "workers", "items", "errors", "busy", "starved", "blocked",
                              "cpu", "runq", "queue");
  for (const auto& st : p["stages"]) {
    s += fmt::format(
        "{:<12} {:>7} {:>9} {:>7} {:>5.0f}% {:>7.0f}% {:>7.0f}% {:>5.0f}% {:>5.0f}% {:>6.0f}%\n",
        st["name"].get<std::string>(), st["workers"].get<int>(), st["items"].get<uint64_t>(),
        st["errors"].get<uint64_t>(), st["busy_share"].get<double>() * 100,
        st["starved_share"].get<double>() * 100, st["blocked_share"].get<double>() * 100,
        st["cpu_share_of_busy"].get<double>() * 100,
        st["runnable_share_of_busy"].get<double>() * 100, st["queue_fill"].get<double>() * 100);
  }
  for (const auto& st : p["stages"]) {
    if (!st.contains("metrics")) continue;
    std::string line;
    for (const auto& [k, v] : st["metrics"].items())
      line += fmt::format("{}{} {:.4g}", line.empty() ? "" : ", ", k, v.get<double>());
    s += fmt::format("{}: {}\n", st["name"].get<std::string>(), line);
  }
  for (const auto& st : p["stages"]) {  // a stage's `cache:`
    if (!st.contains("cache")) continue;
    const auto& c = st["cache"];
    s += fmt::format(
        "{}: cache hits {}, misses {} ({} hit), {} samples in {:.1f} of {:.1f} MiB, {:.1f} MiB "
        "evicted, {} not kept\n",
        st["name"].get<std::string>(), c["hits"].get<uint64_t>(), c["misses"].get<uint64_t>(),
        Percent(c["hit_rate"].get<double>()), c["samples"].get<uint64_t>(),
        c["bytes"].get<double>() / 1048576, c["max_bytes"].get<double>() / 1048576,
        c["evicted_bytes"].get<double>() / 1048576, c["not_kept"].get<uint64_t>());
    if (c.contains("disk")) {
      const auto& d = c["disk"];
      s += fmt::format(
          "{}: cache disk hits {}, {} samples in {:.1f} of {:.1f} MiB, {:.1f} MiB written, {} "
          "damaged, {} failed writes\n",
          st["name"].get<std::string>(), d["hits"].get<uint64_t>(), d["samples"].get<uint64_t>(),
          d["bytes"].get<double>() / 1048576, d["max_bytes"].get<double>() / 1048576,
          d["written_bytes"].get<double>() / 1048576, d["damaged"].get<uint64_t>(),
          d["write_failures"].get<uint64_t>());
    }
  }
  if (p.contains("sources")) {  // a mixture: each source's realised share against the plan
    double total = 0;
    for (const auto& src : p["sources"]) total += src["samples"].get<double>();
    std::string line;
    for (const auto& src : p["sources"])
      line +=
          fmt::format("{}{} {} ({}, planned {}, {} failed)", line.empty() ? "" : "; ",
                      src["name"].get<std::string>(), src["samples"].get<uint64_t>(),
                      Percent(total > 0 ? src["samples"].get<double>() / total : 0),
                      Percent(src["planned_share"].get<double>()), src["errors"].get<uint64_t>());
    s += fmt::format("sources: {}\n", line);
  }
  if (p.contains("bottleneck") && !p["bottleneck"].is_null())
    s += fmt::format("bottleneck: {} ({}): {}\n", p["bottleneck"]["stage"].get<std::string>(),
                     p["bottleneck"]["kind"].get<std::string>(),
                     p["bottleneck"]["why"].get<std::string>());
  return s;
}

std::string FormatWindowReport(const nlohmann::json& r) {
  std::string s = fmt::format("window {:.1f}s{}\n\n", r["window_s"].get<double>(),
                              r["pipeline_replaced"].get<bool>()
                                  ? " (a reload replaced the pipeline: its stages count from then)"
                                  : "");
  s += fmt::format(
      "{:<12} {:>7} {:>9} {:>6} {:>8} {:>6} {:>6} {:>7} {:>7} {:>5} {:>8} {:>8} "
      "{:>6} {:>6}\n",
      "stage", "workers", "items/s", "errors", "work s", "share", "busy", "starved", "blocked",
      "cpu", "p50 ms", "p99 ms", "queue", "cores");
  for (const auto& st : r["stages"]) {
    const auto& lat = st["latency_ms"];
    s += fmt::format(
        "{:<12} {:>7} {:>9.1f} {:>6.0f} {:>8.2f} {:>5.0f}% {:>5.0f}% {:>6.0f}% {:>6.0f}% "
        "{:>4.0f}% {:>8} {:>8} {:>5.0f}% {:>6.2f}\n",
        st["name"].get<std::string>(), st["workers"].get<int>(), NumberIn(st, "items_per_s"),
        NumberIn(st, "errors"), NumberIn(st, "busy_seconds"), NumberIn(st, "work_share") * 100,
        NumberIn(st, "busy_share") * 100, NumberIn(st, "starved_share") * 100,
        NumberIn(st, "blocked_share") * 100, NumberIn(st, "cpu_share_of_busy") * 100,
        lat.is_null() ? "-" : fmt::format("{:.2f}", lat["p50"].get<double>()),
        lat.is_null() ? "-" : fmt::format("{:.2f}", lat["p99"].get<double>()),
        NumberIn(st, "queue_fill") * 100, NumberIn(st, "thread_cpu_cores"));
  }
  const auto& h = r["host"];
  s += fmt::format(
      "\nhost: {:.2f} of {} cores used; RSS {} ({:+.1f} MB/s); faults {:.0f} minor, "
      "{:.0f} major /s; read {}/s in {:.0f} calls/s ({}/s from storage); "
      "{} available\n",
      NumberIn(h, "cpu_cores_used"), h["cpus"].get<int>(), Megabytes(NumberIn(h, "rss_bytes")),
      NumberIn(h, "rss_growth_bytes_per_s") / 1e6, NumberIn(h, "minor_faults_per_s"),
      NumberIn(h, "major_faults_per_s"), Megabytes(NumberIn(h, "read_bytes_per_s")),
      NumberIn(h, "read_syscalls_per_s"), Megabytes(NumberIn(h, "storage_read_bytes_per_s")),
      Megabytes(NumberIn(h, "mem_available_bytes")));
  std::string pressure;
  for (const char* k : {"cpu", "io", "memory"})
    if (h["pressure"][k].is_number())
      pressure += fmt::format("{}{} {}", pressure.empty() ? "" : ", ", k,
                              Percent(h["pressure"][k].get<double>()));
  s += fmt::format("pressure (some): {}\n", pressure.empty() ? "not available" : pressure);
  if (r.contains("storage")) {
    const nlohmann::json& st = r["storage"];
    s += fmt::format("object storage: {}/s fetched, workers waited {:.2f} s/s, {:.0f} retries",
                     Megabytes(NumberIn(st, "read_bytes_per_s")), NumberIn(st, "wait_share"),
                     NumberIn(st, "retries"));
    if (st.contains("cache"))
      s += fmt::format("; disk cache: {} of shard reads hit, {} of {} held",
                       Percent(NumberIn(st["cache"], "hit_share")),
                       Megabytes(NumberIn(st["cache"], "bytes")),
                       Megabytes(NumberIn(st["cache"], "max_bytes")));
    s += "\n";
  }
  std::string threads;
  int shown = 0;
  for (const auto& t : h["threads"]) {
    if (shown++ == 8) break;
    threads += fmt::format("{}{} {}", threads.empty() ? "" : ", ", t["name"].get<std::string>(),
                           Percent(t["cpu_share"].get<double>()));
  }
  s += fmt::format("busiest threads: {}\n", threads);
  if (!r["consumers"].empty()) {
    s += fmt::format("\n{:<5} {:>9} {:>10} {:>6} {:>6} {:>6}\n", "rank", "batches/s", "waited",
                     "held", "ready", "taken");
    for (const auto& c : r["consumers"])
      s += fmt::format("{:<5} {:>9.1f} {:>9.0f}% {:>6.2f} {:>6} {:>6}{}\n", c["rank"].get<int>(),
                       NumberIn(c, "batches_per_s"), NumberIn(c, "wait_share") * 100,
                       NumberIn(c, "held_batches"), c["ready_not_taken"].get<int>(),
                       c["taken"].get<int>(), c["attached"].get<bool>() ? "" : "  (no trainer)");
  }
  const auto& d = r["diagnosis"];
  s += fmt::format("\ndiagnosis: {} ({})\n  {}\n  -> {}\n",
                   d["stage"].is_null() ? "-" : d["stage"].get<std::string>(),
                   d["kind"].get<std::string>(), d["evidence"].get<std::string>(),
                   d["advice"].get<std::string>());
  return s;
}

std::string ProfileExplanation() {
  return R"(What the profile's figures mean (mmfeedctl profile, and the report mmfeedd prints at exit).
Shares are of the window (profile) or of the run (at exit).

Per stage:
  workers   threads taking items now (workers: auto moves them)
  items/s   samples the stage finished per second
  errors    samples it failed (skipped and counted; their rows refilled)
  work s    seconds its workers spent working on items, summed over the workers
  share     its work seconds over all stages' work seconds
  busy      of its threads' time: working on an item (per worker: 100% is every worker
            working all the time)
  starved   of its threads' time: waiting for input (the stage before it is slower)
  blocked   of its threads' time: waiting for room downstream (a ring: for a trainer to free
            a slot)
  cpu       of the busy time: on a CPU. The rest of busy is IO, page faults or locks,
            or runq: runnable but waiting for a CPU (more runnable threads than cores)
  p50, p99  work time per item, median and 99th percentile
  queue     the mean fill of its mailbox (its `queue:` capacity)
  cores     CPU its threads used, in cores

Host: cores used by the daemon, RSS and its growth, page faults, reads (all, and from storage
rather than the page cache), memory available; pressure: /proc/pressure's "some avg10", the
share of time some task stalled on CPU, IO or memory.

Per trainer rank:
  batches/s  batches the trainer released per second
  waited     of the window: the trainer's time inside next() waiting for a batch (its data
             stall, measured by the client)
  held       not a share: the mean number of batches the trainer held (taken, not released);
             1.00 is one batch held all the time
  ready      batches published and not yet taken
  taken      batches taken and not yet released, now

The diagnosis names the stage and kind (cpu, io, memory, consumer, none), the figures that show
it and what to do. Its rules: docs/guide/profile.md.
)";
}

}  // namespace mmfeed
