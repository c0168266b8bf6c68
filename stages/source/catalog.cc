#include "stages/source/catalog.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "stages/runtime/rng.h"
#include "stages/source/brace.h"

namespace mmfeed {
namespace {

// A manifest line's entry before it is parsed: its origin, and the id it has when the line
// gives none.
CatalogEntry LineEntry(const std::string& path, const std::string& name, uint64_t line_no) {
  CatalogEntry e;
  e.id = fmt::format("{}:{}", name, line_no);
  e.origin = fmt::format("{}:{}", path, line_no);
  return e;
}

// Parses one manifest line into `entry` (made by LineEntry); returns the reason on failure.
std::string ParseManifestLine(const std::string& line, const std::string& dir,
                              const std::set<std::string>& needed,
                              const std::set<std::string>& path_fields, CatalogEntry* entry) {
  nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return "malformed JSON (or invalid UTF-8)";
  if (!j.is_object()) return "a manifest line must be a JSON object";
  if (j.contains("id")) {
    const auto& id = j["id"];
    if (id.is_string())
      entry->id = id.get<std::string>();
    else if (id.is_number_integer())
      entry->id = std::to_string(id.get<int64_t>());
    else
      return "'id' must be a string or an integer";
    if (entry->id.empty()) return "'id' is empty";
    if (entry->id.size() > kMaxIdBytes)
      return fmt::format("'id' is longer than {} bytes", kMaxIdBytes);
  }
  for (const std::string& name : needed) {
    if (!j.contains(name)) return fmt::format("missing field '{}'", name);
    const auto& v = j[name];
    FieldValue f;
    if (v.is_string()) {
      f.data = v.get<std::string>();
      f.kind = path_fields.count(name) ? FieldValue::Kind::kPath : FieldValue::Kind::kText;
    } else if (v.is_object() && v.contains("path") && v["path"].is_string()) {
      f.data = v["path"].get<std::string>();
      f.kind = FieldValue::Kind::kPath;
    } else {
      return fmt::format("field '{}' must be a string or {{\"path\": ...}}", name);
    }
    if (f.kind == FieldValue::Kind::kPath) {
      if (f.data.empty()) return fmt::format("field '{}' has an empty path", name);
      f.data = ResolvePath(dir, f.data);
    }
    entry->fields.emplace_back(name, std::move(f));
  }
  return "";
}

uint64_t ParseOctal(const char* p, size_t n, bool* ok) {
  uint64_t v = 0;
  size_t i = 0;
  while (i < n && (p[i] == ' ' || p[i] == 0)) ++i;
  if (i == n) {
    *ok = false;
    return 0;
  }
  for (; i < n && p[i] >= '0' && p[i] <= '7'; ++i) v = v * 8 + (p[i] - '0');
  for (; i < n; ++i)
    if (p[i] != ' ' && p[i] != 0) *ok = false;
  return v;
}

// Reads the headers of one tar shard and appends its samples. Stops at the first damaged or
// truncated member: the members before it are kept, the damage is recorded.
void ScanShard(const std::string& shard, const SourceConfig& source,
               const std::set<std::string>& needed, Catalog* out) {
  int fd = ::open(shard.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    out->errors.push_back({shard, std::string("cannot open: ") + std::strerror(errno)});
    return;
  }
  struct stat st;
  fstat(fd, &st);
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  std::map<std::string, std::string> ext_to_field;
  for (const auto& [field, exts] : source.fields)
    if (needed.count(field))
      for (const auto& e : exts) ext_to_field[e] = field;

  CatalogEntry current;
  std::string current_key;
  auto flush = [&]() {
    if (current_key.empty()) return;
    std::string missing;
    for (const std::string& f : needed) {
      bool found = false;
      for (const auto& kv : current.fields) found |= kv.first == f;
      if (!found) missing = f;
    }
    if (!missing.empty())
      out->errors.push_back(
          {current.origin, fmt::format("sample has no member for field '{}'", missing)});
    else
      out->entries.push_back(std::move(current));
    current = CatalogEntry();
    current_key.clear();
  };

  uint64_t off = 0;
  std::string long_name;
  char h[512];
  while (true) {
    if (off + 512 > file_size) {
      if (off != file_size || off == 0)
        out->errors.push_back(
            {shard, fmt::format("tar truncated at offset {} (no end-of-archive marker)", off)});
      break;
    }
    if (::pread(fd, h, 512, static_cast<off_t>(off)) != 512) {
      out->errors.push_back({shard, fmt::format("read failed at offset {}", off)});
      break;
    }
    bool zero = std::all_of(h, h + 512, [](char c) { return c == 0; });
    if (zero) break;  // end of archive
    bool ok = true;
    uint64_t checksum = ParseOctal(h + 148, 8, &ok);
    uint64_t sum = 0;
    for (int i = 0; i < 512; ++i)
      sum += (i >= 148 && i < 156) ? ' ' : static_cast<unsigned char>(h[i]);
    uint64_t size = ParseOctal(h + 124, 12, &ok);
    if (!ok || sum != checksum) {
      out->errors.push_back({shard, fmt::format("damaged tar header at offset {}", off)});
      break;
    }
    uint64_t data_off = off + 512;
    uint64_t next = data_off + (size + 511) / 512 * 512;
    char type = h[156];
    std::string name;
    if (!long_name.empty()) {
      name = long_name;
      long_name.clear();
    } else {
      name.assign(h, strnlen(h, 100));
      if (std::memcmp(h + 257, "ustar", 5) == 0 && h[345])
        name = std::string(h + 345, strnlen(h + 345, 155)) + "/" + name;
    }
    if (data_off + size > file_size) {
      out->errors.push_back(
          {shard + ":" + name,
           fmt::format("tar truncated: member needs {} bytes at offset {}, file ends at {}", size,
                       data_off, file_size)});
      break;
    }
    if (type == 'L') {  // GNU long name: the name is the member's data
      long_name.resize(size);
      if (::pread(fd, long_name.data(), size, static_cast<off_t>(data_off)) !=
          static_cast<ssize_t>(size))
        break;
      long_name.resize(strnlen(long_name.c_str(), size));
    } else if (type == '0' || type == 0) {
      size_t slash = name.rfind('/');
      size_t dot = name.find('.', slash == std::string::npos ? 0 : slash + 1);
      std::string key = dot == std::string::npos ? name : name.substr(0, dot);
      std::string ext = dot == std::string::npos ? "" : name.substr(dot + 1);
      if (key != current_key) {
        flush();
        if (key.size() > kMaxIdBytes) {
          out->errors.push_back({shard + ":" + key.substr(0, 64) + "...",
                                 fmt::format("sample key is longer than {} bytes", kMaxIdBytes)});
          off = next;
          continue;
        }
        current_key = key;
        current.id = key;
        current.origin = shard + ":" + key;
      }
      auto f = ext_to_field.find(ext);
      if (f != ext_to_field.end()) {
        FieldValue v;
        v.kind = FieldValue::Kind::kFileRange;
        v.data = shard;
        v.offset = data_off;
        v.size = size;
        current.fields.emplace_back(f->second, std::move(v));
      }
    }
    off = next;
  }
  flush();
  ::close(fd);
}

}  // namespace

Result<Catalog> LoadManifest(const std::string& path, const std::set<std::string>& needed,
                             const std::set<std::string>& path_fields) {
  std::ifstream in(path);
  if (!in) return Status::NotFound(fmt::format("{}: cannot open manifest", path));
  Catalog cat;
  std::string dir = std::filesystem::path(path).parent_path().string();
  std::string name = std::filesystem::path(path).filename().string();
  std::string line;
  size_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    CatalogEntry e = LineEntry(path, name, line_no);
    std::string reason = ParseManifestLine(line, dir, needed, path_fields, &e);
    if (reason.empty())
      cat.entries.push_back(std::move(e));
    else
      cat.errors.push_back({e.origin, reason});
  }
  return cat;
}

Result<Catalog> LoadWebDataset(const SourceConfig& source, const std::set<std::string>& needed) {
  Result<std::vector<std::string>> shards = ExpandBraces(source.path);
  if (!shards.ok()) return shards.status();
  Catalog cat;
  for (const std::string& s : *shards) ScanShard(s, source, needed, &cat);
  return cat;
}

Status Catalog::Read(size_t i, CatalogEntry* e) const {
  std::string line;
  uint64_t line_no = 0;
  Status st = index->Line(i, &line, &line_no);
  *e = LineEntry(manifest_path, manifest_name, line_no);
  if (!st.ok()) return st;
  std::string reason = ParseManifestLine(line, manifest_dir, needed, path_fields, e);
  return reason.empty() ? Status::Ok() : Status::Corrupt(reason);
}

Result<Catalog> LoadCatalog(const SourceConfig& source, const std::set<std::string>& needed,
                            const std::set<std::string>& path_fields) {
  if (source.type != "manifest") return LoadWebDataset(source, needed);
  bool indexed = source.index == "on";
  if (source.index == "auto") {
    std::error_code ec;
    const uintmax_t bytes = std::filesystem::file_size(source.path, ec);
    indexed = !ec && bytes >= kIndexAutoBytes;
  }
  if (!indexed) return LoadManifest(source.path, needed, path_fields);
  Result<std::unique_ptr<ManifestIndex>> index = ManifestIndex::Open(source.path, source.index_dir);
  if (!index.ok()) return index.status();
  Catalog cat;
  cat.index = std::move(index.value());
  cat.manifest_path = source.path;
  cat.manifest_dir = std::filesystem::path(source.path).parent_path().string();
  cat.manifest_name = std::filesystem::path(source.path).filename().string();
  cat.needed = needed;
  cat.path_fields = path_fields;
  return cat;
}

EpochOrder::EpochOrder(size_t n, const SourceConfig& source, uint32_t epoch, int consumers)
    : size_(n / source.num_nodes / consumers * consumers),
      nodes_(static_cast<uint64_t>(source.num_nodes)),
      node_(static_cast<uint64_t>(source.node_rank)),
      shuffle_(source.shuffle),
      perm_(n, Rng(source.seed, epoch, "", "shuffle").Next()) {}

}  // namespace mmfeed
