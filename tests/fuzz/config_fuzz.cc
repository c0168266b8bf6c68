// libFuzzer target: the YAML pipeline loader must turn any input into a config or a
// file:line:col error, never a crash.
#include <string>

#include "engine/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mmfeed::ParseConfig(std::string(reinterpret_cast<const char*>(data), size),
                      "/nonexistent/fuzz.yaml");
  return 0;
}
