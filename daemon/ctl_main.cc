// mmfeedctl: talks to a running mmfeedd.
//
//
// Its command line is in one place, Usage() below: what --help prints and
// docs/reference/cli.md shows.
#include <fmt/format.h>
#include <poll.h>
#include <termios.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <thread>

#include "base/atomic_file.h"
#include "base/flags.h"
#include "client/client.h"
#include "client/report_text.h"

using namespace mmfeed;

namespace {

int Usage(bool help = false) {
  std::fprintf(
      help ? stdout : stderr,
      "usage: mmfeedctl [--socket PATH] [--timeout SECONDS] COMMAND [OPTIONS]\n"
      "\n"
      "  status [--json]          the pipeline, its profile since start, the trainers, rings,\n"
      "                           placement, reloads and errors\n"
      "  consumers [--json]       per rank: trainer pid, cursor, samples/s, lag, last take\n"
      "  profile [--seconds N] [--json] [--trace FILE]\n"
      "                           measure the daemon for N seconds (default 5, at most 600) and\n"
      "                           say what limits the job (cpu, io, memory, consumer or none),\n"
      "                           with the figures and what to do; --trace FILE writes the\n"
      "                           window as a Chrome trace (open it in Perfetto)\n"
      "  profile --explain        what each column and percentage of a profile means\n"
      "  top [--iterations N] [--json]\n"
      "                           a live view: each second's figures (the first after one\n"
      "                           second); q quits; --json: one status object a line\n"
      "  reload [--config FILE] [--at batch|epoch] [--json]\n"
      "                           check FILE (default: the running config's file) and swap it\n"
      "                           in; the reply says when each change reaches the trainers;\n"
      "                           exit 1 with the reason (file:line:col) if refused, the\n"
      "                           running pipeline unchanged; --at batch: a mixture's new\n"
      "                           weights start at the next batch boundary\n"
      "  stop [--json]            drain (while attached trainers take what was published) and\n"
      "                           exit; with no trainer attached the daemon stops at once\n"
      "  end-job [--json]         consumers: auto, no trainer attached: end the adopted job now\n"
      "                           (cursors kept) and wait for the next job's shape\n"
      "\n"
      "  --socket PATH            the daemon's socket (default $MMFEED_SOCKET, else\n"
      "                           /tmp/mmfeed.sock)\n"
      "  --timeout SECONDS        how long to wait for the daemon's answer (default 10)\n"
      "exit status: 0 done, 1 the daemon refused or did not answer, 2 bad arguments\n");
  return help ? 0 : 2;
}

std::string Cursor(const nlohmann::json& c) {
  return fmt::format("epoch {} batch {} (seq {})", c["epoch"].get<uint64_t>(),
                     c["batch"].get<uint64_t>(), c["seq"].get<uint64_t>());
}

void PrintConsumers(const nlohmann::json& s) {
  std::printf("%-5s %-8s %-34s %10s %5s %10s %10s %10s\n", "rank", "pid", "cursor", "samples/s",
              "lag", "last take", "published", "released");
  for (const auto& r : s["consumers"]) {
    double since = r["seconds_since_take"].get<double>();
    // A rank a reload removed: its trainer drains its ring, then sees the end. A rank of a
    // model-parallel group (replicas) names its stream: "3/1" reads stream 1.
    const int stream = r.value("stream", r["rank"].get<int>());
    const std::string rank = std::to_string(r["rank"].get<int>()) +
                             (stream != r["rank"].get<int>() || s["job"].value("replicas", 1) > 1
                                  ? "/" + std::to_string(stream)
                                  : "") +
                             (r["removed"] ? "*" : "");
    std::printf("%-5s %-8s %-34s %10.0f %5u %10s %10lu %10lu\n", rank.c_str(),
                r["attached"].get<bool>() ? std::to_string(r["pid"].get<int>()).c_str() : "-",
                Cursor(r["acked"]).c_str(), r["samples_per_s"].get<double>(),
                r["lag_batches"].get<unsigned>(),
                since < 0 ? "never" : fmt::format("{:.1f}s ago", since).c_str(),
                static_cast<unsigned long>(r["published"].get<uint64_t>()),
                static_cast<unsigned long>(r["released"].get<uint64_t>()));
  }
  for (const auto& r : s["consumers"])
    if (r["removed"]) {
      std::printf("*: removed by a reload; its trainer gets what its ring holds, then the end\n");
      break;
    }
  if (s["job"].value("replicas", 1) > 1)
    std::printf("rank/stream: replicas %d, each group of ranks reads one stream's ring\n",
                s["job"]["replicas"].get<int>());
}

// The job's shape in force and where it came from (status "job").
std::string JobLine(const nlohmann::json& s) {
  const auto& j = s["job"];
  const int replicas = j.value("replicas", 1);
  return fmt::format(
      "job: {} consumer rank(s){}, node {} of {} (from {})", j["consumers"].get<int>(),
      replicas > 1 ? fmt::format(" in groups of {} (replicas)", replicas) : "",
      j["node_rank"].get<int>(), j["num_nodes"].get<int>(), j["from"].get<std::string>());
}

void PrintStatus(const nlohmann::json& s) {
  if (!s.contains("profile")) {  // consumers: auto, before the first trainer
    std::printf("pipeline %s (pid %d): %s\n%s\n", s["pipeline"].get<std::string>().c_str(),
                s["pid"].get<int>(), s["state"].get<std::string>().c_str(), JobLine(s).c_str());
    return;
  }
  std::printf("pipeline %s (pid %d): %s, up %.0fs\n", s["pipeline"].get<std::string>().c_str(),
              s["pid"].get<int>(), s["state"].get<std::string>().c_str(),
              s["uptime_s"].get<double>());
  std::printf("%s\n", JobLine(s).c_str());
  if (s.contains("storage_stalled") && !s["storage_stalled"].is_null()) {
    const auto& st = s["storage_stalled"];
    std::printf(
        "storage stalled: no request answered for %.0f s (samples wait for it, none is "
        "skipped):\n",
        st["stalled_seconds"].get<double>());
    for (const auto& r : st["requests"])
      std::printf("  %s: %s\n", r["url"].get<std::string>().c_str(),
                  r["error"].get<std::string>().c_str());
  }
  std::printf("config %s (hash %s); reloads: %lu ok, %lu refused%s\n",
              s["config"].get<std::string>().c_str(), s["config_hash"].get<std::string>().c_str(),
              static_cast<unsigned long>(s["reloads"]["ok"].get<uint64_t>()),
              static_cast<unsigned long>(s["reloads"]["failed"].get<uint64_t>()),
              !s["reloads"]["pending"].get<bool>()
                  ? ""
                  : (", one waiting for the " +
                     s["reloads"].value("pending_at", std::string("epoch boundary")))
                        .c_str());
  PrintConsumers(s);
  const auto& rings = s["rings"];
  int node = rings["numa_node"].get<int>();
  std::printf("rings: %.2f GiB, %d slots per rank, %s\n",
              rings["bytes"].get<uint64_t>() / 1073741824.0, rings["slots"].get<int>(),
              node >= 0 ? ("bound to NUMA node " + std::to_string(node)).c_str() : "not bound");
  for (const auto& p : s["placement"])
    std::printf("  %-14s %2d thread(s) on CPUs %s%s\n", p["stage"].get<std::string>().c_str(),
                p["threads"].get<int>(), p["cpus"].get<std::string>().c_str(),
                p.value("auto", false)
                    ? fmt::format(" (workers: auto, up to {})", p["max_threads"].get<int>()).c_str()
                    : "");
  if (s["workers"].contains("cpu_budget")) {
    std::printf("workers: auto within cpu_budget %d", s["workers"]["cpu_budget"].get<int>());
    const auto& moves = s["workers"]["decisions"];
    if (moves.empty()) std::printf(", no move yet\n");
    for (size_t i = 0; i < moves.size(); ++i)
      std::printf(
          "%s  %.0fs: +1 %s%s (%s)\n", i ? "" : ":\n", moves[i]["uptime_s"].get<double>(),
          moves[i]["to"].get<std::string>().c_str(),
          moves[i]["from"].is_null() ? "" : (", -1 " + moves[i]["from"].get<std::string>()).c_str(),
          moves[i]["evidence"].get<std::string>().c_str());
  }
  std::printf("%s", FormatProfile(s["profile"]).c_str());
  const auto& errors = s["profile"]["errors"];
  std::printf("errors: %lu", static_cast<unsigned long>(errors["total"].get<uint64_t>()));
  for (const auto& [reason, n] : errors["by_reason"].items())
    std::printf(", %s %lu", reason.c_str(), static_cast<unsigned long>(n.get<uint64_t>()));
  std::printf("\n");
}

// `top`: every second, each stage's share of the last second (busy, starved, blocked per
// worker thread) and items/s, and the daemon's CPU, memory and reads.
class Top {
 public:
  // Renders one screen from a status and the previous one (empty the first time).
  std::string Render(const nlohmann::json& s, double dt) {
    if (!s.contains("profile"))
      return fmt::format("mmfeedd {} (pid {}): {}  [q quits]\n{}\n",
                         s["pipeline"].get<std::string>(), s["pid"].get<int>(),
                         s["state"].get<std::string>(), JobLine(s));
    std::string out = fmt::format("mmfeedd {} (pid {}): {}, up {:.0f}s  [q quits]\n\n",
                                  s["pipeline"].get<std::string>(), s["pid"].get<int>(),
                                  s["state"].get<std::string>(), s["uptime_s"].get<double>());
    out += fmt::format("{:<12} {:>7} {:>6} {:>8} {:>8} {:>6} {:>10}\n", "stage", "workers", "busy",
                       "starved", "blocked", "queue", "items/s");
    std::map<std::string, Sample> now;
    for (const auto& st : s["profile"]["stages"]) {
      std::string name = st["name"].get<std::string>();
      Sample x{st["items"].get<double>(), st["busy_seconds"].get<double>(),
               st["starved_seconds"].get<double>(), st["blocked_seconds"].get<double>()};
      now[name] = x;
      auto prev = last_.find(name);
      Sample d = prev == last_.end() || dt <= 0 ? Sample{} : x - prev->second;
      double capacity = std::max(dt, 1e-9) * std::max(1, st["workers"].get<int>());
      out += fmt::format("{:<12} {:>7} {:>5.0f}% {:>7.0f}% {:>7.0f}% {:>5.0f}% {:>10.0f}\n", name,
                         st["workers"].get<int>(), 100 * d.busy / capacity,
                         100 * d.starved / capacity, 100 * d.blocked / capacity,
                         100.0 * st["queue_depth"].get<double>() /
                             std::max<double>(1, st["queue_capacity"].get<double>()),
                         dt > 0 ? d.items / dt : 0);
    }
    last_ = now;
    const auto& p = s["process"];
    double cpu = p["cpu_seconds"].get<double>(), read = p["read_bytes"].get<double>();
    out += fmt::format("\nhost: CPU {:.0f}%  RSS {:.0f} MiB  read {:.1f} MB/s\n",
                       dt > 0 ? 100 * (cpu - last_cpu_) / dt : 0.0,
                       p["rss_bytes"].get<double>() / 1048576,
                       dt > 0 ? (read - last_read_) / dt / 1e6 : 0.0);
    last_cpu_ = cpu;
    last_read_ = read;
    out += "\n";
    for (const auto& r : s["consumers"])
      out += fmt::format("rank {}: {}, {:.0f} samples/s, lag {} batch(es)\n", r["rank"].get<int>(),
                         r["attached"].get<bool>() ? fmt::format("pid {}", r["pid"].get<int>())
                                                   : std::string("not attached"),
                         r["samples_per_s"].get<double>(), r["lag_batches"].get<unsigned>());
    return out;
  }

 private:
  struct Sample {
    double items = 0, busy = 0, starved = 0, blocked = 0;
    Sample operator-(const Sample& o) const {
      return {items - o.items, busy - o.busy, starved - o.starved, blocked - o.blocked};
    }
  };
  std::map<std::string, Sample> last_;
  double last_cpu_ = 0, last_read_ = 0;
};

// Keys are read one at a time, without echo, while `top` runs on a terminal.
class RawTerminal {
 public:
  RawTerminal() {
    if (!isatty(STDIN_FILENO) || tcgetattr(STDIN_FILENO, &saved_) != 0) return;
    termios raw = saved_;
    raw.c_lflag &= ~static_cast<tcflag_t>(ICANON | ECHO);
    raw.c_cc[VMIN] = 0;
    raw.c_cc[VTIME] = 0;
    active_ = tcsetattr(STDIN_FILENO, TCSANOW, &raw) == 0;
  }
  ~RawTerminal() {
    if (active_) tcsetattr(STDIN_FILENO, TCSANOW, &saved_);
  }
  // Waits `ms` for a key; true if it was 'q'. Without a terminal it only waits.
  bool QuitPressed(int ms) {
    auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    while (active_) {
      int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                      until - std::chrono::steady_clock::now())
                                      .count());
      pollfd p{STDIN_FILENO, POLLIN, 0};
      if (left <= 0 || poll(&p, 1, left) <= 0) return false;
      char c;
      if (read(STDIN_FILENO, &c, 1) == 1 && (c == 'q' || c == 'Q')) return true;
    }
    std::this_thread::sleep_until(until);
    return false;
  }

 private:
  termios saved_{};
  bool active_ = false;
};

int RunTop(const std::string& socket_path, int timeout_ms, int iterations, bool json) {
  Top top;
  RawTerminal term;
  const bool tty = isatty(STDOUT_FILENO);
  // Every frame's rates are over the second before it: the first frame comes after a window
  // from a first, unshown sample (`--iterations 1` printed zeros before).
  Result<nlohmann::json> first = ControlRequest(socket_path, {{"cmd", "status"}}, timeout_ms);
  if (!first.ok()) {
    std::fprintf(stderr, "mmfeedctl: %s\n", first.status().message().c_str());
    return 1;
  }
  (void)top.Render((*first)["status"], 0);
  auto last = std::chrono::steady_clock::now();
  if (term.QuitPressed(1000)) return 0;
  for (int i = 0; iterations <= 0 || i < iterations; ++i) {
    Result<nlohmann::json> reply = ControlRequest(socket_path, {{"cmd", "status"}}, timeout_ms);
    if (!reply.ok()) {
      std::fprintf(stderr, "mmfeedctl: %s\n", reply.status().message().c_str());
      return 1;
    }
    auto now = std::chrono::steady_clock::now();
    double dt = std::chrono::duration<double>(now - last).count();
    last = now;
    if (json) {  // for scripts: one line per refresh
      std::printf("%s\n", (*reply)["status"].dump().c_str());
    } else {
      std::string screen = top.Render((*reply)["status"], dt);
      // Home and clear on a terminal (tmux included); plain frames one after another otherwise.
      std::printf("%s%s", tty ? "\x1b[H\x1b[2J" : (i ? "\n" : ""), screen.c_str());
    }
    std::fflush(stdout);
    if (iterations > 0 && i + 1 == iterations) break;
    if (term.QuitPressed(1000)) break;
  }
  return 0;
}

int RunProfile(const std::string& socket_path, int timeout_ms, double seconds,
               const std::string& trace_file, bool json) {
  nlohmann::json request = {{"cmd", "profile"}, {"seconds", seconds}};
  if (!trace_file.empty()) request["trace"] = true;
  Result<nlohmann::json> reply =
      ControlRequest(socket_path, request, timeout_ms + static_cast<int>(seconds * 1000));
  if (!reply.ok()) {
    std::fprintf(stderr, "mmfeedctl: %s\n", reply.status().message().c_str());
    return 1;
  }
  nlohmann::json& report = (*reply)["profile"];
  std::string wrote;
  if (!trace_file.empty()) {
    Status st = WriteFileAtomically(trace_file, report["trace"].dump());
    if (!st.ok()) {
      std::fprintf(stderr, "mmfeedctl: --trace: %s\n", st.message().c_str());
      return 1;
    }
    const auto& other = report["trace"]["otherData"];
    wrote = fmt::format("wrote {}: {} spans", trace_file, other["spans"].get<uint64_t>());
    if (other["dropped_spans"].get<uint64_t>())
      wrote += fmt::format(" ({} more dropped)", other["dropped_spans"].get<uint64_t>());
    report.erase("trace");
  }
  if (json)
    std::printf("%s\n", report.dump(2).c_str());
  else
    std::printf("%s", FormatWindowReport(report).c_str());
  std::fflush(stdout);
  if (!wrote.empty()) std::fprintf(stderr, "%s\n", wrote.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string socket_path = kDefaultSocket, cmd, config, at, trace_file;
  double seconds = 5;
  if (const char* s = std::getenv("MMFEED_SOCKET")) socket_path = s;
  bool json = false;
  double timeout_s = 10;
  int iterations = 0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--socket" && i + 1 < argc)
      socket_path = argv[++i];
    else if (a == "--timeout" && i + 1 < argc) {
      Result<double> t = ParseDouble(a, argv[++i], 0.001, 86400);
      if (!t.ok()) {
        std::fprintf(stderr, "mmfeedctl: %s\n", t.status().message().c_str());
        return 2;
      }
      timeout_s = *t;
    } else if (a == "--json")
      json = true;
    else if (a == "--config" && i + 1 < argc && cmd == "reload")
      config = argv[++i];
    else if (a == "--at" && i + 1 < argc && cmd == "reload") {
      at = argv[++i];
      if (at != "batch" && at != "epoch") return Usage();
    } else if (a == "--iterations" && i + 1 < argc && cmd == "top") {
      Result<int64_t> n = ParseInt(a, argv[++i], 1, 1 << 30);
      if (!n.ok()) {
        std::fprintf(stderr, "mmfeedctl: %s\n", n.status().message().c_str());
        return 2;
      }
      iterations = static_cast<int>(*n);
    } else if (a == "--seconds" && i + 1 < argc && cmd == "profile") {
      Result<double> t = ParseDouble(a, argv[++i], 0.1, 600);
      if (!t.ok()) {
        std::fprintf(stderr, "mmfeedctl: %s\n", t.status().message().c_str());
        return 2;
      }
      seconds = *t;
    } else if (a == "--explain" && cmd == "profile") {
      std::printf("%s", ProfileExplanation().c_str());
      return 0;
    } else if (a == "--trace" && i + 1 < argc && cmd == "profile")
      trace_file = argv[++i];
    else if (a == "--help" || a == "-h")
      return Usage(/*help=*/true);
    else if (cmd.empty() && (a == "status" || a == "stop" || a == "reload" || a == "consumers" ||
                             a == "top" || a == "profile" || a == "end-job"))
      cmd = a;
    else
      return Usage();
  }
  if (cmd.empty()) return Usage();
  if (cmd == "top")
    return RunTop(socket_path, static_cast<int>(timeout_s * 1000), iterations, json);
  if (cmd == "profile")
    return RunProfile(socket_path, static_cast<int>(timeout_s * 1000), seconds, trace_file, json);
  nlohmann::json request = {{"cmd", cmd == "consumers" ? "status"
                                    : cmd == "end-job" ? "end_job"
                                                       : cmd}};
  if (!config.empty()) {
    // The daemon runs elsewhere: the path is made absolute here.
    std::error_code ec;
    std::filesystem::path abs = std::filesystem::absolute(config, ec);
    request["config"] = ec ? config : abs.lexically_normal().string();
  }
  if (!at.empty()) request["at"] = at;
  Result<nlohmann::json> reply =
      ControlRequest(socket_path, request, static_cast<int>(timeout_s * 1000));
  if (!reply.ok()) {
    std::fprintf(stderr, "mmfeedctl: %s\n", reply.status().message().c_str());
    return 1;
  }
  if (cmd == "stop") {
    std::printf(json ? "{\"stopping\": true}\n" : "stopping\n");
    return 0;
  }
  if (cmd == "end-job") {
    const nlohmann::json& e = (*reply)["ended"];
    if (json)
      std::printf("%s\n", e.dump(2).c_str());
    else
      std::printf("ended the job %s (%s)%s; waiting for the next job's shape\n",
                  e["job"].get<std::string>().c_str(), e["from"].get<std::string>().c_str(),
                  e["cursors"].get<std::string>().empty()
                      ? ""
                      : (", cursors kept in " + e["cursors"].get<std::string>()).c_str());
    return 0;
  }
  if (cmd == "reload") {
    const nlohmann::json& r = (*reply)["reload"];
    if (json)
      std::printf("%s\n", r.dump(2).c_str());
    else {
      // When each change reaches the trainers: "when" (absent from an older daemon's reply).
      const std::string when = r.value("when", std::string());
      const std::string rings = r.value("rings", std::string("unchanged"));
      std::printf("reloaded %s: %s; applied %s%s%s\n", r["config"].get<std::string>().c_str(),
                  r["summary"].get<std::string>().c_str(), r["applied"].get<std::string>().c_str(),
                  when.empty() ? "" : ("; " + when).c_str(),
                  rings == "unchanged" ? "" : ("; rings " + rings).c_str());
    }
    return 0;
  }
  const nlohmann::json& status = (*reply)["status"];
  if (cmd == "consumers") {
    if (json)
      std::printf("%s\n", status["consumers"].dump(2).c_str());
    else
      PrintConsumers(status);
    return 0;
  }
  if (json)
    std::printf("%s\n", status.dump(2).c_str());
  else
    PrintStatus(status);
  return 0;
}
