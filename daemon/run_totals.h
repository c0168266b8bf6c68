// RunTotals: the daemon's counters over every pipeline of the run. A reload replaces the
// pipeline, whose own counters start at zero; the metrics and status go on counting from the
// figures of the pipelines it replaced (Retire), with the running one's added (its profile:
// engine/profile.h). Stages are keyed by name, sources by name (a source a reload removed keeps
// its totals, listed after the current ones), errors by reason.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace mmfeed {

class RunTotals {
 public:
  // A stage's counters summed over pipelines, from their profile entries.
  struct Stage {
    double items = 0, errors = 0, busy = 0, starved = 0, blocked = 0;
    void Add(const nlohmann::json& stage);
  };
  // A mixture's source: samples committed in batches, failed (also by reason), and passes
  // (samples over the source's size).
  struct Source {
    uint64_t samples = 0, errors = 0;
    double passes = 0;
    std::map<std::string, uint64_t> reasons;
  };

  // The counters of a pipeline a reload replaced, from its last profile (its ring stages are
  // left out: the rings outlive pipelines and count on).
  void Retire(const nlohmann::json& profile);
  // A ring a reload replaced (moved rank): its profile entry.
  void RetireStage(const std::string& name, const nlohmann::json& stage);

  // Now, with the running pipeline's `profile`: per stage, per error reason, and per source
  // (the profile's `sources` in order, then those reloads removed).
  std::map<std::string, Stage> Stages(const nlohmann::json& profile) const;
  std::map<std::string, uint64_t> Errors(const nlohmann::json& profile) const;
  std::vector<std::pair<std::string, Source>> Sources(const nlohmann::json& profile) const;

 private:
  std::map<std::string, Stage> stages_;
  std::map<std::string, uint64_t> errors_;
  std::map<std::string, Source> sources_;
};

}  // namespace mmfeed
