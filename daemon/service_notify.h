// The systemd notify protocol (sd_notify(3)), as mmfeedd speaks it:
//   READY=1                          serving (and again at the end of every reload, good or not)
//   RELOADING=1, MONOTONIC_USEC=...  a reload started
//   STOPPING=1                       draining
//   STATUS=...                       a human-readable line: throughput, attached trainers
//   WATCHDOG=1                       every half $WATCHDOG_USEC, only while the pipeline makes
//                                    progress or is legitimately idle (see Supervisor::Tick)
// Without $NOTIFY_SOCKET (not run by systemd) every call does nothing.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace mmfeed {

class ServiceNotifier {
 public:
  ServiceNotifier();
  void Ready(const std::string& status);
  void Reloading();
  void Stopping();
  void Status(const std::string& status);
  // Called often (every control tick): sends WATCHDOG=1 when half the watchdog interval has
  // passed and `healthy` is true. Without a watchdog (no $WATCHDOG_USEC) it does nothing.
  void Watchdog(bool healthy);

 private:
  void Send(const std::string& message);
  uint64_t watchdog_usec_ = 0;
  std::chrono::steady_clock::time_point last_ping_;
};

}  // namespace mmfeed
