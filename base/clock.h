// The one clock of the project's own measurements: monotonic nanoseconds.
#pragma once

#include <chrono>
#include <cstdint>

namespace mmfeed {

inline uint64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace mmfeed
