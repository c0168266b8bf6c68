// workers: auto — how the supervisor moves worker threads between stages while running. Every
// window it measures the pipeline (BuildWindowReport) and asks the tuner whether one worker
// should move: to the stage that limits the pipeline (the diagnosis names it, CPU- or
// IO-bound, busy at least 85%), from a free place in the cpu_budget (for a CPU-bound stage, only
// while half a core of the machine idles) or else from another
// `workers: auto` stage that would stay under 75% busy without it. Slowly: a move is made when
// the same one is proposed in two windows in a row, and the window after a move only settles.
// Worker counts never change bytes (every sample's work depends on its id, not its thread).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace mmfeed {

struct WorkerMove {
  std::string to;    // the stage that gets a worker
  std::string from;  // the stage that gives one; empty: a free place in the budget
  std::string evidence;
};

// One window's proposal. `fixed_workers`: the workers of stages with a fixed count, which
// count against `cpu_budget` too.
std::optional<WorkerMove> ProposeMove(const nlohmann::json& report, int cpu_budget,
                                      int fixed_workers);

class WorkerTuner {
 public:
  // Windows a proposal must repeat before it is made.
  static constexpr int kConfirmWindows = 2;
  WorkerTuner(int cpu_budget, int fixed_workers)
      : cpu_budget_(cpu_budget), fixed_workers_(fixed_workers) {}
  // The move to make now, if any, after this window's report.
  std::optional<WorkerMove> Observe(const nlohmann::json& report);

 private:
  int cpu_budget_, fixed_workers_;
  std::optional<WorkerMove> pending_;
  int streak_ = 0;
  bool settling_ = false;
};

}  // namespace mmfeed
