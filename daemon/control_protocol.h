// The control protocol's requests: one JSON object per line (see control_server.h). Parsing is
// apart from the server so that it can be fuzzed on its own: any line yields a request or a
// message saying what is wrong with it, never an exception.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "base/cursor.h"
#include "base/status.h"

namespace mmfeed {

struct ControlRequest {
  enum class Cmd { kAttach, kStatus, kStop, kReload, kProfile };
  Cmd cmd = Cmd::kStatus;
  int rank = -1;                       // attach
  std::optional<StreamCursor> resume;  // attach: serve from this cursor
  std::string config;                  // reload: the config file; empty: the running one's
  double seconds = 5;                  // profile: the window
  bool trace = false;                  // profile: record a trace of the window too
};

// The longest profile window a request may ask for.
constexpr double kMaxProfileSeconds = 600;

Result<ControlRequest> ParseControlRequest(std::string_view line);

}  // namespace mmfeed
