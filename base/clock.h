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

// Milliseconds left until `deadline` (0 once it has passed), for poll() and friends.
inline int RemainingMs(std::chrono::steady_clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                  deadline - std::chrono::steady_clock::now())
                  .count();
  return static_cast<int>(left > 0 ? left : 0);
}

}  // namespace mmfeed
