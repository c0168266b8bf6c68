#include "stages/runtime/trace.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <vector>

#include "base/clock.h"

namespace mmfeed::trace {
namespace {

struct Recorded {
  int tid;
  uint64_t t0, t1;
  std::string stage, what, id;
};

std::atomic<bool> g_on{false};
std::mutex g_mu;  // guards everything below
bool g_recording = false;
uint64_t g_started_ns = 0, g_dropped = 0;
std::vector<Recorded> g_spans;

}  // namespace

bool On() { return g_on.load(std::memory_order_relaxed); }

Status Start() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_recording)
    return Status::Invalid(
        "a trace is already being recorded (one at a time); try again when "
        "its window ends");
  g_recording = true;
  g_started_ns = NowNs();
  g_dropped = 0;
  g_spans.clear();
  g_on.store(true, std::memory_order_relaxed);
  return Status::Ok();
}

nlohmann::json Stop(const std::map<int, std::string>& thread_names) {
  std::vector<Recorded> spans;
  uint64_t started, dropped;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_on.store(false, std::memory_order_relaxed);
    g_recording = false;
    spans.swap(g_spans);
    started = g_started_ns;
    dropped = g_dropped;
  }
  const int pid = getpid();
  nlohmann::json events = nlohmann::json::array();
  events.push_back(
      {{"name", "process_name"}, {"ph", "M"}, {"pid", pid}, {"args", {{"name", "mmfeedd"}}}});
  for (const auto& [tid, name] : thread_names)
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", pid},
                      {"tid", tid},
                      {"args", {{"name", name}}}});
  for (const Recorded& s : spans) {
    const bool wait = s.what != "work";
    nlohmann::json args = {{"stage", s.stage}};
    if (!s.id.empty()) args["id"] = s.id;
    // Chrome trace times are microseconds; start at the recording's start.
    events.push_back({{"name", wait ? s.what : s.stage},
                      {"cat", wait ? "wait" : "work"},
                      {"ph", "X"},
                      {"pid", pid},
                      {"tid", s.tid},
                      {"ts", (static_cast<double>(s.t0) - static_cast<double>(started)) / 1e3},
                      {"dur", static_cast<double>(s.t1 - s.t0) / 1e3},
                      {"args", std::move(args)}});
  }
  return {{"traceEvents", std::move(events)},
          {"displayTimeUnit", "ms"},
          {"otherData", {{"spans", spans.size()}, {"dropped_spans", dropped}}}};
}

void Span(std::string_view stage, std::string_view what, std::string_view id, uint64_t t0_ns,
          uint64_t t1_ns) {
  if (!On()) return;
  thread_local const int tid = gettid();
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_recording || t1_ns < g_started_ns) return;
  if (g_spans.size() >= kMaxSpans) {
    ++g_dropped;
    return;
  }
  g_spans.push_back({tid, std::max(t0_ns, g_started_ns), t1_ns, std::string(stage),
                     std::string(what), std::string(id)});
}

}  // namespace mmfeed::trace
