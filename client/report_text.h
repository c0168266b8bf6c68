// The daemon's reports as text for people: what `mmfeedctl status` and `mmfeedctl profile`
// print, and what the daemon logs when a run ends. Pure functions of the reports' JSON (made by
// engine/profile.h, BuildProfile, and engine/window_profile.h, BuildWindowReport), so the
// control tool renders them without linking the engine. Needs base/ only.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace mmfeed {

// The cumulative profile (status's "profile") as an aligned table: per stage, then bottleneck.
std::string FormatProfile(const nlohmann::json& profile);

// A profile window's report: stages, host, consumers, diagnosis.
std::string FormatWindowReport(const nlohmann::json& report);

// What every column and percentage of the two reports above means (`mmfeedctl profile
// --explain`; docs/reference/cli.md shows it).
std::string ProfileExplanation();

}  // namespace mmfeed
