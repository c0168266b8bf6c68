// libFuzzer target: the BPE tokenizer on arbitrary bytes (invalid UTF-8, special-token
// fragments, whitespace runs) must encode without crashing, and decoding must give valid UTF-8.
// The Qwen3 tokenizer is read from $MMFEED_FUZZ_TOKENIZER (default: the test copy).
#include <cstdlib>
#include <string>
#include <vector>

#include "stages/text/bpe_tokenizer.h"

#ifndef MMFEED_TEST_DATA
#define MMFEED_TEST_DATA "tests/data"
#endif

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static std::shared_ptr<const mmfeed::BpeTokenizer> tok = [] {
    const char* env = std::getenv("MMFEED_FUZZ_TOKENIZER");
    auto t = mmfeed::BpeTokenizer::Load(
        env ? env : MMFEED_TEST_DATA "/tokenizer/qwen3-tokenizer.json.gz");
    if (!t.ok()) std::abort();
    return *t;
  }();
  static mmfeed::BpeCache cache(1024);
  std::vector<int32_t> ids;
  tok->Encode(std::string_view(reinterpret_cast<const char*>(data), size), &cache, &ids);
  std::string text = tok->Decode(ids);
  if (mmfeed::ReplaceInvalidUtf8(text) != text) std::abort();  // decode yields valid UTF-8
  return 0;
}
