#include "engine/trace.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "base/clock.h"

namespace mmfeed::trace {
namespace {

struct Recorded {
  uint64_t t0, t1;
  std::string stage, id;
  const char* what;  // "work" or a "wait: ..." literal
};

// Each thread records into its own buffer (no lock shared with the other threads); Stop()
// collects them. A buffer's spans belong to the recording numbered `recording`.
struct Buffer {
  int tid = 0;
  std::mutex mu;  // the owner thread and Stop() only
  uint64_t recording = 0;
  std::vector<Recorded> spans;
};

std::atomic<bool> g_on{false};
std::atomic<uint64_t> g_recording{0};  // the current recording's number (0: none yet)
std::atomic<uint64_t> g_started_ns{0};
std::atomic<uint64_t> g_kept{0}, g_dropped{0};
std::mutex g_mu;  // guards g_buffers and g_busy
std::vector<std::shared_ptr<Buffer>> g_buffers;
bool g_busy = false;

Buffer& ThisThreadsBuffer() {
  thread_local std::shared_ptr<Buffer> buffer;
  if (!buffer) {
    buffer = std::make_shared<Buffer>();
    buffer->tid = gettid();
    std::lock_guard<std::mutex> lock(g_mu);
    g_buffers.push_back(buffer);
  }
  return *buffer;
}

}  // namespace

bool On() { return g_on.load(std::memory_order_relaxed); }

Status Start() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_busy)
    return Status::Invalid(
        "a trace is already being recorded (one at a time); try again when "
        "its window ends");
  g_busy = true;
  g_kept.store(0);
  g_dropped.store(0);
  g_started_ns.store(NowNs());
  g_recording.fetch_add(1);
  g_on.store(true, std::memory_order_release);
  return Status::Ok();
}

nlohmann::json Stop(const std::map<int, std::string>& thread_names) {
  std::vector<std::pair<int, std::vector<Recorded>>> collected;
  uint64_t started, dropped;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_on.store(false, std::memory_order_release);
    g_busy = false;
    const uint64_t recording = g_recording.load();
    for (const auto& b : g_buffers) {
      std::lock_guard<std::mutex> buffer_lock(b->mu);
      if (b->recording == recording && !b->spans.empty())
        collected.emplace_back(b->tid, std::move(b->spans));
      b->spans.clear();
    }
    // Buffers of threads that have exited are only held here: let them go.
    std::erase_if(g_buffers, [](const auto& b) { return b.use_count() == 1; });
    started = g_started_ns.load();
    dropped = g_dropped.load();
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
  size_t spans = 0;
  for (const auto& [tid, recorded] : collected) {
    for (const Recorded& s : recorded) {
      const bool wait = std::string_view(s.what) != "work";
      nlohmann::json args = {{"stage", s.stage}};
      if (!s.id.empty()) args["id"] = s.id;
      // Chrome trace times are microseconds; from the recording's start.
      events.push_back({{"name", wait ? s.what : s.stage},
                        {"cat", wait ? "wait" : "work"},
                        {"ph", "X"},
                        {"pid", pid},
                        {"tid", tid},
                        {"ts", (static_cast<double>(s.t0) - static_cast<double>(started)) / 1e3},
                        {"dur", static_cast<double>(s.t1 - s.t0) / 1e3},
                        {"args", std::move(args)}});
      ++spans;
    }
  }
  return {{"traceEvents", std::move(events)},
          {"displayTimeUnit", "ms"},
          {"otherData", {{"spans", spans}, {"dropped_spans", dropped}}}};
}

void Span(std::string_view stage, const char* what, std::string_view id, uint64_t t0_ns,
          uint64_t t1_ns) {
  if (!On()) return;
  const uint64_t started = g_started_ns.load(std::memory_order_relaxed);
  if (t1_ns < started) return;
  if (g_kept.fetch_add(1, std::memory_order_relaxed) >= kMaxSpans) {
    g_dropped.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  Buffer& b = ThisThreadsBuffer();
  const uint64_t recording = g_recording.load(std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(b.mu);
  if (b.recording != recording) {
    b.spans.clear();
    b.recording = recording;
  }
  b.spans.push_back({std::max(t0_ns, started), t1_ns, std::string(stage), std::string(id), what});
}

}  // namespace mmfeed::trace
