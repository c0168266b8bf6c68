// libFuzzer target: a manifest or a tar shard with arbitrary contents loads into a catalog
// plus per-sample errors, never crashes.
#include <unistd.h>

#include <cstdio>
#include <string>

#include "stages/source/catalog.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/mmfeed-fuzz-" + std::to_string(getpid());
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  mmfeed::LoadManifest(path, {"image", "text"}, {"image"});
  mmfeed::SourceConfig s;
  s.type = "webdataset";
  s.path = path;
  s.fields = {{"image", {"jpg"}}, {"text", {"txt"}}};
  mmfeed::LoadWebDataset(s, {"image", "text"});
  return 0;
}
