#include "source/path_check.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <set>
#include <system_error>

namespace mmfeed {
namespace {

namespace fs = std::filesystem;

void Note(PathCheck::Problem* p, const std::string& example) {
  if (p->count++ == 0) p->example = example;
}

// The data_roots that admit every folder in `dirs` (real paths): their common folder, or,
// when that is /, each one's first two levels.
std::vector<std::string> Suggest(const std::set<std::string>& dirs) {
  if (dirs.empty()) return {};
  fs::path common = *dirs.begin();
  for (const std::string& d : dirs) {
    fs::path p(d), shared;
    for (auto a = common.begin(), b = p.begin(); a != common.end() && b != p.end() && *a == *b;
         ++a, ++b)
      shared /= *a;
    common = shared;
  }
  if (common != "/" && !common.empty()) return {common.string()};
  std::set<std::string> tops;
  for (const std::string& d : dirs) {
    fs::path top;
    int levels = 0;
    for (const fs::path& part : fs::path(d)) {
      top /= part;
      if (part != "/" && ++levels == 2) break;
    }
    tops.insert(top.string());
  }
  return {tops.begin(), tops.end()};
}

}  // namespace

PathCheck CheckCatalogPaths(const Catalog& catalog, const FilePolicy& policy, size_t max_samples) {
  PathCheck r;
  r.catalog_size = catalog.size();
  r.roots = policy.roots;
  const size_t n = std::min(r.catalog_size, std::max<size_t>(max_samples, 1));
  std::set<std::string> outside_dirs;
  CatalogEntry read;
  auto check = [&](const FieldValue& v) {
    if (v.kind != FieldValue::Kind::kPath || IsRemotePath(v.data)) return;
    ++r.files;
    std::error_code ec;
    const fs::path real = fs::canonical(v.data, ec);
    if (ec) {
      PathCheck::Problem* p = ec == std::errc::permission_denied ? &r.unreadable : &r.missing;
      Note(p, fmt::format("{} ({})", v.data, ec.message()));
      return;
    }
    if (!InsideRoots(real.string(), policy.roots)) {
      Note(&r.outside,
           real.string() == v.data ? v.data : fmt::format("{} (it is {})", v.data, real.string()));
      outside_dirs.insert(real.parent_path().string());
      return;
    }
    if (::access(real.c_str(), R_OK) != 0)
      Note(&r.unreadable, fmt::format("{} ({})", v.data, std::strerror(errno)));
  };
  for (size_t k = 0; k < n; ++k) {
    const size_t i = n == r.catalog_size ? k : k * r.catalog_size / n;
    const CatalogEntry* e = &read;
    if (catalog.indexed()) {
      if (!catalog.Read(i, &read).ok()) continue;  // a bad line: counted when the run deals it
    } else {
      e = &catalog.entries[i];
    }
    ++r.samples;
    for (const auto& [name, value] : e->fields) {
      check(value);
      for (const FieldValue& item : value.items) check(item);
    }
  }
  r.suggested_roots = Suggest(outside_dirs);
  return r;
}

}  // namespace mmfeed
