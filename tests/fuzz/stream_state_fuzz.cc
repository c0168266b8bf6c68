// libFuzzer target: the --state-dir file (daemon/stream_state.h), as a crash, a full disk or a
// hostile hand may leave it. Any bytes are a state or a clear error naming the file; a state
// read is written back to the same JSON, and read again to the same state.
#include <nlohmann/json.hpp>
#include <string>

#include "daemon/stream_state.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mmfeed;
  const nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, false);
  if (j.is_discarded()) return 0;
  Result<StreamState> s = StreamStateFromJson(j, "/state/cursors.json");
  if (!s.ok()) {
    if (s.status().message().rfind("/state/cursors.json: ", 0) != 0) __builtin_trap();
    return 0;
  }
  const nlohmann::json written = StreamStateToJson(*s);
  Result<StreamState> again = StreamStateFromJson(written, "/state/cursors.json");
  if (!again.ok() || StreamStateToJson(*again) != written) __builtin_trap();
  return 0;
}
