// libFuzzer target: loading a tokenizer.json of any content is a clear error or a tokenizer,
// never a crash or an escaped exception (a malformed file is a config error).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "stages/text/bpe_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = [] {
    char tmpl[] = "/tmp/mmfeed-fuzz-tokenizer-XXXXXX";
    int fd = mkstemp(tmpl);
    if (fd < 0) std::abort();
    close(fd);
    return std::string(tmpl);
  }();
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  auto t = mmfeed::BpeTokenizer::Load(path);
  if (t.ok()) {
    mmfeed::BpeCache cache;
    std::vector<int32_t> ids;
    (*t)->Encode("hi there <|end|>", &cache, &ids);
  }
  return 0;
}
