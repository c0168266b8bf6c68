// libFuzzer target: any line a peer sends on the control socket parses to a request or a
// clear error; nothing throws, nothing crashes.
#include <string_view>

#include "client/control_protocol.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto r = mmfeed::ParseControlRequest(std::string_view(reinterpret_cast<const char*>(data), size));
  if (r.ok() && r->cmd == mmfeed::ControlCommand::Cmd::kAttach && r->rank < 0) __builtin_trap();
  return 0;
}
