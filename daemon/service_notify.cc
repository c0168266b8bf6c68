#include "daemon/service_notify.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <systemd/sd-daemon.h>
#include <time.h>

#include <cstring>

namespace mmfeed {

ServiceNotifier::ServiceNotifier() : last_ping_(std::chrono::steady_clock::now()) {
  uint64_t usec = 0;
  if (sd_watchdog_enabled(0, &usec) > 0) watchdog_usec_ = usec;
}

void ServiceNotifier::Send(const std::string& message) {
  int rc = sd_notify(0, message.c_str());
  if (rc < 0) spdlog::warn("sd_notify: {}", std::strerror(-rc));
}

void ServiceNotifier::Ready(const std::string& status) {
  Send(fmt::format("READY=1\nSTATUS={}", status));
}

void ServiceNotifier::Reloading() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  uint64_t usec = static_cast<uint64_t>(ts.tv_sec) * 1000000 + ts.tv_nsec / 1000;
  Send(fmt::format("RELOADING=1\nMONOTONIC_USEC={}\nSTATUS=reloading the config", usec));
}

void ServiceNotifier::Stopping() { Send("STOPPING=1\nSTATUS=draining"); }

void ServiceNotifier::Status(const std::string& status) { Send("STATUS=" + status); }

void ServiceNotifier::Watchdog(bool healthy) {
  if (!watchdog_usec_ || !healthy) return;
  auto now = std::chrono::steady_clock::now();
  if (now - last_ping_ < std::chrono::microseconds(watchdog_usec_ / 2)) return;
  last_ping_ = now;
  Send("WATCHDOG=1");
}

}  // namespace mmfeed
