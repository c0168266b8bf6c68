// Tar shards written by hand for the source tests: a ustar member, and a WebDataset source of
// image and text fields.
#pragma once

#include <cstdio>
#include <cstring>
#include <string>

#include "source/source_config.h"

namespace mmfeed::testing {

inline std::string TarRecord(const std::string& name, const std::string& data) {
  char h[512] = {};
  std::strncpy(h, name.c_str(), 99);
  std::snprintf(h + 100, 8, "%07o", 0644);
  std::snprintf(h + 108, 8, "%07o", 0);
  std::snprintf(h + 116, 8, "%07o", 0);
  std::snprintf(h + 124, 12, "%011lo", static_cast<unsigned long>(data.size()));
  std::snprintf(h + 136, 12, "%011o", 0);
  h[156] = '0';
  std::memcpy(h + 257, "ustar", 6);
  std::memcpy(h + 263, "00", 2);
  std::memset(h + 148, ' ', 8);
  unsigned sum = 0;
  for (unsigned char c : h) sum += c;
  std::snprintf(h + 148, 8, "%06o", sum);
  std::string out(h, 512);
  out += data;
  out.append((512 - data.size() % 512) % 512, '\0');
  return out;
}

inline SourceConfig WebDataset(const std::string& pattern) {
  SourceConfig s;
  s.type = "webdataset";
  s.path = pattern;
  s.fields = {{"image", {"jpg", "png"}}, {"text", {"txt"}}};
  return s;
}

}  // namespace mmfeed::testing
