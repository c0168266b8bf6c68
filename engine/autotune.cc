#include "engine/autotune.h"

#include <fmt/format.h>

#include "base/units.h"

namespace mmfeed {
namespace {

constexpr double kSaturated = 0.85;   // a stage this busy wants another worker
constexpr double kDonorAfter = 0.75;  // a donor must stay below this busy without one worker
constexpr double kIdleCore = 0.5;     // a CPU-bound stage grows only while this much CPU idles

std::string Describe(const nlohmann::json& s) {
  const int w = s["workers"].get<int>();
  return fmt::format(
      "{} busy {:.0f}% ({:.0f}% on CPU) with {} worker{}", s["name"].get<std::string>(),
      NumberIn(s, "busy_share") * 100,
      (NumberIn(s, "cpu_share_of_busy") + NumberIn(s, "runnable_share_of_busy")) * 100, w,
      w == 1 ? "" : "s");
}

}  // namespace

std::optional<WorkerMove> ProposeMove(const nlohmann::json& report, int cpu_budget,
                                      int fixed_workers) {
  const nlohmann::json& dx = report["diagnosis"];
  if (dx["stage"].is_null() || (dx["kind"] != "cpu" && dx["kind"] != "io")) return std::nullopt;
  const nlohmann::json* target = nullptr;
  int used = fixed_workers;
  for (const auto& s : report["stages"]) {
    if (!s.value("auto_workers", false)) continue;
    used += s["workers"].get<int>();
    if (s["name"] == dx["stage"]) target = &s;
  }
  if (!target || NumberIn(*target, "busy_share") < kSaturated) return std::nullopt;
  if (target->at("workers").get<int>() >= target->at("max_workers").get<int>()) return std::nullopt;
  WorkerMove move;
  move.to = (*target)["name"].get<std::string>();
  // A free place in the budget, for a CPU-bound stage only while the machine has a core idle
  // (another thread would only wait for one).
  const nlohmann::json& host = report.contains("host") ? report["host"] : nlohmann::json();
  const bool core_idle = dx["kind"] != "cpu" || !host.is_object() || !host.contains("idle_cores") ||
                         NumberIn(host, "idle_cores") >= kIdleCore;
  if (used < cpu_budget && core_idle) {
    move.evidence = fmt::format("{}; {} of cpu_budget {} free", Describe(*target),
                                cpu_budget - used, cpu_budget);
    return move;
  }
  const nlohmann::json* donor = nullptr;
  for (const auto& s : report["stages"]) {
    if (!s.value("auto_workers", false) || &s == target) continue;
    const int w = s["workers"].get<int>();
    if (w < 2 || NumberIn(s, "busy_share") * w / (w - 1) >= kDonorAfter) continue;
    if (!donor || NumberIn(s, "busy_share") < NumberIn(*donor, "busy_share")) donor = &s;
  }
  if (!donor) return std::nullopt;
  move.from = (*donor)["name"].get<std::string>();
  move.evidence =
      fmt::format("{}; {}; cpu_budget {} in use", Describe(*target), Describe(*donor), cpu_budget);
  return move;
}

std::optional<WorkerMove> WorkerTuner::Observe(const nlohmann::json& report) {
  if (settling_) {  // the window after a move shows the move, not yet its effect on the rest
    settling_ = false;
    pending_.reset();
    streak_ = 0;
    return std::nullopt;
  }
  std::optional<WorkerMove> m = ProposeMove(report, cpu_budget_, fixed_workers_);
  if (!m) {
    pending_.reset();
    streak_ = 0;
    return std::nullopt;
  }
  streak_ = pending_ && pending_->to == m->to && pending_->from == m->from ? streak_ + 1 : 1;
  pending_ = m;
  if (streak_ < kConfirmWindows) return std::nullopt;
  pending_.reset();
  streak_ = 0;
  settling_ = true;
  return m;
}

}  // namespace mmfeed
