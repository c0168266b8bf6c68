// Numbers for people, the same wherever a report is written (the windowed profile's diagnosis
// in engine/, its text in client/): a share as a whole percentage, bytes as whole megabytes (or
// MiB, as config sizes count);
// and a report's numbers read back.
#pragma once

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <string>

namespace mmfeed {

inline std::string Percent(double share) { return fmt::format("{:.0f}%", share * 100); }
inline std::string Megabytes(double bytes) { return fmt::format("{:.0f} MB", bytes / 1e6); }
// Sizes a config's keys take (max_bytes: 512M is 512 MiB): in MiB, one decimal.
inline std::string Mebibytes(double bytes) { return fmt::format("{:.1f} MiB", bytes / 1048576.0); }

// j[key] as a number; 0 when j lacks it or it is not one (a field a report leaves out).
inline double NumberIn(const nlohmann::json& j, const char* key) {
  return j.contains(key) && j[key].is_number() ? j[key].get<double>() : 0.0;
}

}  // namespace mmfeed
