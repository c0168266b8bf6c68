// mmfeed-parquet: a Parquet file's metadata as mmfeed reads it (the schema's leaf columns with
// their types and levels, the row groups' column chunks: codec, encodings, offsets, sizes), one
// JSON object per file, or the error that makes mmfeed refuse the file.
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>

#include "source/index_file.h"
#include "source/parquet/column.h"
#include "source/parquet/metadata.h"

namespace {

void Usage(FILE* out) {
  std::fputs(
      "usage: mmfeed-parquet [--values COLUMN] FILE...\n"
      "Prints each Parquet file's metadata as mmfeed reads it, one JSON object per line: its\n"
      "rows, leaf columns (path, physical and logical type, definition and repetition levels)\n"
      "and row groups (per column chunk: codec, encodings, offsets and sizes). A file mmfeed\n"
      "cannot read is named on stderr with the reason, and the exit status is 1.\n"
      "  --values COLUMN  instead, the leaf column's values (its dotted path, as the metadata\n"
      "                   names it), every row group's in order: {\"column\", \"values\" (nulls\n"
      "                   left out; byte arrays as strings, or {\"hex\": ...} when not UTF-8),\n"
      "                   \"definition\", \"repetition\"}\n"
      "  -h, --help       this text\n",
      out);
}

// Whether `s` is well-formed UTF-8 (no overlong forms, surrogates or code points past
// U+10FFFF): printed as a string; other bytes as {"hex": ...}.
bool Utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<uint8_t>(s[i]);
    const size_t n = c < 0x80                 ? 1
                     : c >= 0xc2 && c <= 0xdf ? 2
                     : c >= 0xe0 && c <= 0xef ? 3
                     : c >= 0xf0 && c <= 0xf4 ? 4
                                              : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<uint8_t>(s[i + k]) >> 6) != 2) return false;
    const auto c1 = static_cast<uint8_t>(n > 1 ? s[i + 1] : 0);
    if ((c == 0xe0 && c1 < 0xa0) || (c == 0xed && c1 >= 0xa0) || (c == 0xf0 && c1 < 0x90) ||
        (c == 0xf4 && c1 >= 0x90))
      return false;
    i += n;
  }
  return true;
}

// Every row group's chunk of `column`, read and decoded.
mmfeed::Result<std::string> ValuesJson(const std::string& path,
                                       const mmfeed::parquet::FileMetaData& m,
                                       const std::string& column) {
  using namespace mmfeed::parquet;
  size_t k = 0;
  while (k < m.leaves.size() && fmt::format("{}", fmt::join(m.leaves[k].path, ".")) != column) ++k;
  if (k == m.leaves.size())
    return mmfeed::Status::NotFound(fmt::format("{}: no column '{}'", path, column));
  const LeafColumn& leaf = m.leaves[k];
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return mmfeed::Status::Io(fmt::format("{}: {}", path, std::strerror(errno)));
  nlohmann::json values = nlohmann::json::array(), def = nlohmann::json::array(),
                 rep = nlohmann::json::array();
  for (const RowGroup& g : m.row_groups) {
    const ColumnChunk& c = g.columns[k];
    std::string bytes(static_cast<size_t>(c.total_compressed_size), '\0');
    if (!mmfeed::index_file::FullPread(fd, bytes.data(), bytes.size(),
                                       static_cast<uint64_t>(c.start()))) {
      ::close(fd);
      return mmfeed::Status::Io(fmt::format("{}: {}", path, std::strerror(errno)));
    }
    mmfeed::Result<ColumnValues> v = ReadColumn(bytes, c, leaf, path);
    if (!v.ok()) {
      ::close(fd);
      return v.status();
    }
    for (size_t i = 0; i < v->size(); ++i) {
      const std::string_view b = v->value(i);
      int32_t i32;
      int64_t i64;
      float f;
      double d;
      switch (leaf.type) {
        case PhysicalType::kBoolean:
          values.push_back(b[0] != 0);
          break;
        case PhysicalType::kInt32:
          std::memcpy(&i32, b.data(), 4);
          values.push_back(i32);
          break;
        case PhysicalType::kInt64:
          std::memcpy(&i64, b.data(), 8);
          values.push_back(i64);
          break;
        case PhysicalType::kFloat:
          std::memcpy(&f, b.data(), 4);
          values.push_back(f);
          break;
        case PhysicalType::kDouble:
          std::memcpy(&d, b.data(), 8);
          values.push_back(d);
          break;
        default:
          if (leaf.type == PhysicalType::kByteArray && Utf8(b)) {
            values.push_back(std::string(b));
          } else {
            std::string hex;
            for (char ch : b) hex += fmt::format("{:02x}", static_cast<uint8_t>(ch));
            values.push_back({{"hex", hex}});
          }
      }
    }
    for (int16_t l : v->definition) def.push_back(l);
    for (int16_t l : v->repetition) rep.push_back(l);
  }
  ::close(fd);
  const nlohmann::json j = {
      {"column", column}, {"values", values}, {"definition", def}, {"repetition", rep}};
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    Usage(stderr);
    return 2;
  }
  int status = 0;
  std::string values_of;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "-h") || !std::strcmp(argv[i], "--help")) {
      Usage(stdout);
      return 0;
    }
    if (!std::strcmp(argv[i], "--values")) {
      if (i + 1 >= argc) {
        Usage(stderr);
        return 2;
      }
      values_of = argv[++i];
      continue;
    }
    mmfeed::Result<mmfeed::parquet::FileMetaData> m = mmfeed::parquet::ReadFooter(argv[i]);
    mmfeed::Result<std::string> out = !m.ok()             ? mmfeed::Result<std::string>(m.status())
                                      : values_of.empty() ? mmfeed::parquet::MetadataJson(*m)
                                                          : ValuesJson(argv[i], *m, values_of);
    if (!out.ok()) {
      std::fprintf(stderr, "mmfeed-parquet: %s\n", out.status().message().c_str());
      status = 1;
      continue;
    }
    std::printf("%s\n", out->c_str());
  }
  return status;
}
