// libFuzzer target: a manifest or a tar shard with arbitrary contents loads into a catalog
// plus per-sample errors, never crashes; so do an indexed manifest and an indexed shard, read
// entry by entry.
#include <unistd.h>

#include <cstdio>
#include <string>

#include "source/catalog.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // On tmpfs where there is one: the index is written (and fsynced) for every input.
  static const std::string path = (access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp") +
                                  std::string("/mmfeed-fuzz-") + std::to_string(getpid());
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  mmfeed::LoadManifest(path, {"image", "text"}, {"image"});
  mmfeed::SourceConfig indexed;
  indexed.type = "manifest";
  indexed.path = path;
  indexed.index = "on";
  auto cat = mmfeed::LoadCatalog(indexed, {"image", "text"}, {"image"});
  if (cat.ok()) {
    mmfeed::CatalogEntry e;
    for (size_t i = 0; i < cat->size() && i < 1000; ++i) (void)cat->Read(i, &e);
  }
  mmfeed::SourceConfig s;
  s.type = "webdataset";
  s.path = path;
  s.fields = {{"image", {"jpg"}}, {"text", {"txt"}}};
  mmfeed::LoadWebDataset(s, {"image", "text"});
  s.index = "on";  // the shard's index: built from the headers, then read back twice
  for (int pass = 0; pass < 2; ++pass) {
    auto shards = mmfeed::LoadWebDataset(s, {"image", "text"});
    if (!shards.ok()) continue;
    mmfeed::CatalogEntry e;
    for (size_t i = 0; i < shards->size() && i < 1000; ++i) (void)shards->Read(i, &e);
  }
  unlink((path + ".mmfidx").c_str());
  return 0;
}
