// Strict parsing of numeric command-line values: the whole text must be a number within
// [min, max]. "abc" is not 0, "1e9" does not overflow an int, and 4294967296 does not wrap.
#pragma once

#include <cstdint>
#include <string>

#include "base/status.h"

namespace mmfeed {

Result<int64_t> ParseInt(const std::string& flag, const std::string& text, int64_t min,
                         int64_t max);
Result<double> ParseDouble(const std::string& flag, const std::string& text, double min,
                           double max);

}  // namespace mmfeed
