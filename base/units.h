// Numbers for people, the same wherever a report is written (the windowed profile's diagnosis
// in engine/, its text in client/): a share as a whole percentage, bytes as whole megabytes.
#pragma once

#include <fmt/format.h>

#include <string>

namespace mmfeed {

inline std::string Percent(double share) { return fmt::format("{:.0f}%", share * 100); }
inline std::string Megabytes(double bytes) { return fmt::format("{:.0f} MB", bytes / 1e6); }

}  // namespace mmfeed
