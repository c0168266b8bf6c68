#include "daemon/run_totals.h"

#include <set>

namespace mmfeed {

void RunTotals::Stage::Add(const nlohmann::json& stage) {
  items += stage["items"].get<double>();
  errors += stage["errors"].get<double>();
  busy += stage["busy_seconds"].get<double>();
  starved += stage["starved_seconds"].get<double>();
  blocked += stage["blocked_seconds"].get<double>();
}

void RunTotals::Retire(const nlohmann::json& profile) {
  for (const auto& st : profile["stages"]) {
    if (st["type"] == "ring") continue;  // the rings' counters outlive pipelines anyway
    stages_[st["name"].get<std::string>()].Add(st);
  }
  for (const auto& [reason, n] : profile["errors"]["by_reason"].items())
    errors_[reason] += n.get<uint64_t>();
  for (auto& [name, total] : Sources(profile)) sources_[name] = std::move(total);
}

void RunTotals::RetireStage(const std::string& name, const nlohmann::json& stage) {
  stages_[name].Add(stage);
}

std::map<std::string, RunTotals::Stage> RunTotals::Stages(const nlohmann::json& profile) const {
  std::map<std::string, Stage> stages = stages_;
  for (const auto& st : profile["stages"]) stages[st["name"].get<std::string>()].Add(st);
  return stages;
}

std::map<std::string, uint64_t> RunTotals::Errors(const nlohmann::json& profile) const {
  std::map<std::string, uint64_t> errors = errors_;
  for (const auto& [reason, n] : profile["errors"]["by_reason"].items())
    errors[reason] += n.get<uint64_t>();
  return errors;
}

std::vector<std::pair<std::string, RunTotals::Source>> RunTotals::Sources(
    const nlohmann::json& profile) const {
  std::vector<std::pair<std::string, Source>> totals;
  std::set<std::string> current;
  if (profile.contains("sources"))
    for (const auto& s : profile["sources"]) {
      const std::string name = s["name"].get<std::string>();
      auto retired = sources_.find(name);
      Source t = retired == sources_.end() ? Source() : retired->second;
      t.samples += s["samples"].get<uint64_t>();
      t.errors += s["errors"].get<uint64_t>();
      t.passes += s["passes"].get<double>();
      for (const auto& [reason, n] : s["errors_by_reason"].items())
        t.reasons[reason] += n.get<uint64_t>();
      totals.emplace_back(name, std::move(t));
      current.insert(name);
    }
  for (const auto& [name, t] : sources_)
    if (!current.count(name)) totals.emplace_back(name, t);
  return totals;
}

}  // namespace mmfeed
