// mmfeed-tokenize: the text stage's tokenizer outside the daemon.
//
//   mmfeed-tokenize --tokenizer FILE [--decode | --json]
//
// Reads lines on stdin. Encoding (default): writes one JSON array of ids per line (no special
// tokens are added; special tokens written in the text are recognised). --json: each line is
// a JSON string, the text to encode (it may hold line breaks). --decode: reads one JSON array
// of ids per line and writes the text.
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "stages/text/bpe_tokenizer.h"

int main(int argc, char** argv) {
  std::string path;
  bool decode = false, json = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--tokenizer" && i + 1 < argc)
      path = argv[++i];
    else if (a == "--decode")
      decode = true;
    else if (a == "--json")
      json = true;
    else {
      std::fprintf(stderr, "usage: mmfeed-tokenize --tokenizer FILE [--decode | --json]\n");
      return 2;
    }
  }
  if (path.empty() || (decode && json)) {
    std::fprintf(stderr, "usage: mmfeed-tokenize --tokenizer FILE [--decode | --json]\n");
    return 2;
  }
  auto tok = mmfeed::BpeTokenizer::Load(path);
  if (!tok.ok()) {
    std::fprintf(stderr, "mmfeed-tokenize: %s\n", tok.status().message().c_str());
    return 2;
  }
  std::ios::sync_with_stdio(false);
  mmfeed::BpeCache cache;
  std::string line;
  std::vector<int32_t> ids;
  size_t line_no = 0;
  while (std::getline(std::cin, line)) {
    ++line_no;
    if (decode) {
      nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.is_array()) {
        std::fprintf(stderr, "mmfeed-tokenize: line %zu: expected a JSON array of ids\n", line_no);
        return 1;
      }
      ids.clear();
      for (const auto& v : j) ids.push_back(v.get<int32_t>());
      std::cout << (*tok)->Decode(ids) << '\n';
    } else {
      if (json) {
        nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
        if (j.is_discarded() || !j.is_string()) {
          std::fprintf(stderr, "mmfeed-tokenize: line %zu: expected a JSON string\n", line_no);
          return 1;
        }
        line = j.get<std::string>();
      }
      ids.clear();
      (*tok)->Encode(line, &cache, &ids);
      std::cout << nlohmann::json(ids).dump() << '\n';
    }
  }
  return 0;
}
