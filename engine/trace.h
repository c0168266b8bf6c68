// The trace behind `mmfeedctl profile --trace FILE`: while it records, every pipeline thread
// adds a span per item it works on (its stage and sample id) and per wait (for input, for room
// downstream, for the trainers). Stop() returns them as a Chrome trace (JSON with
// "traceEvents", loadable in Perfetto and chrome://tracing): one track per thread. When no trace
// records, a span costs one relaxed atomic load.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "base/clock.h"
#include "base/status.h"

namespace mmfeed::trace {

// Spans kept at most per recording; later ones are counted as dropped.
constexpr size_t kMaxSpans = 1 << 20;

bool On();
// Starts recording; refused while another recording runs (one trace at a time).
Status Start();
// Stops recording and returns the trace; `thread_names`: thread id -> name, for the tracks.
nlohmann::json Stop(const std::map<int, std::string>& thread_names);

// A span of the calling thread from t0_ns to t1_ns (NowNs() clock). `what`: "work" for an
// item, "wait: ..." for a wait (a string literal: it is kept as a pointer); `id`: the sample
// (or batch) it was for, may be empty.
void Span(std::string_view stage, const char* what, std::string_view id, uint64_t t0_ns,
          uint64_t t1_ns);

// Waits shorter than this are not recorded (they would drown the items).
constexpr uint64_t kMinWaitNs = 20000;

// Records the wait of its own lifetime on the calling thread, when a trace runs.
class WaitSpan {
 public:
  WaitSpan(std::string_view stage, const char* what)
      : stage_(stage), what_(what), t0_(On() ? NowNs() : 0) {}
  ~WaitSpan() {
    if (!t0_) return;
    const uint64_t t1 = NowNs();
    if (t1 - t0_ >= kMinWaitNs) Span(stage_, what_, {}, t0_, t1);
  }
  WaitSpan(const WaitSpan&) = delete;
  WaitSpan& operator=(const WaitSpan&) = delete;

 private:
  std::string_view stage_;
  const char* what_;
  uint64_t t0_;
};

}  // namespace mmfeed::trace
