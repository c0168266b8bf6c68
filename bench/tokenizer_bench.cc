// mmfeed-bench-tokenizer: single-thread encode throughput of the BPE tokenizer on a corpus.
//   mmfeed-bench-tokenizer --tokenizer FILE --corpus FILE [--passes N]
// Prints JSON: MB/s over passes 2..N (pass 1 warms the piece cache, as the reference's does).
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "stages/text/bpe_tokenizer.h"

int main(int argc, char** argv) {
  std::string tok_path, corpus_path;
  int passes = 6;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--tokenizer")
      tok_path = argv[i + 1];
    else if (a == "--corpus")
      corpus_path = argv[i + 1];
    else if (a == "--passes")
      passes = std::stoi(argv[i + 1]);
  }
  auto tok = mmfeed::BpeTokenizer::Load(tok_path);
  if (!tok.ok()) {
    std::fprintf(stderr, "%s\n", tok.status().message().c_str());
    return 1;
  }
  std::ifstream in(corpus_path, std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t i = 0; i < all.size(); ++i)
    if (all[i] == '\n') lines.push_back(all.substr(start, i - start)), start = i + 1;
  mmfeed::BpeCache cache;
  std::vector<int32_t> ids;
  size_t tokens = 0;
  double seconds = 0;
  for (int p = 0; p < passes; ++p) {
    auto t0 = std::chrono::steady_clock::now();
    for (const std::string& l : lines) {
      ids.clear();
      (*tok)->Encode(l, &cache, &ids);
      tokens += ids.size();
    }
    if (p > 0)
      seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  double mb = all.size() * (passes - 1) / 1e6;
  std::printf("{\"lines\": %zu, \"mb_per_s\": %.2f, \"tokens\": %zu}\n", lines.size(), mb / seconds,
              tokens / passes);
  return 0;
}
