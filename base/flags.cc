#include "base/flags.h"

#include <fmt/format.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>

namespace mmfeed {

Result<int64_t> ParseInt(const std::string& flag, const std::string& text, int64_t min,
                         int64_t max) {
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno == ERANGE || v < min || v > max)
    return Status::Invalid(
        fmt::format("{}: '{}' is not an integer in [{}, {}]", flag, text, min, max));
  return static_cast<int64_t>(v);
}

Result<double> ParseDouble(const std::string& flag, const std::string& text, double min,
                           double max) {
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(v) || v < min || v > max)
    return Status::Invalid(
        fmt::format("{}: '{}' is not a number in [{}, {}]", flag, text, min, max));
  return v;
}

}  // namespace mmfeed
