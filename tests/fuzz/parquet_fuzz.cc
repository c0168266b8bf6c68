// libFuzzer target: a Parquet file (source/parquet/) as a tampered or truncated file may hold
// it. Its footer is metadata that passes the checks (every chunk inside the file, one per leaf,
// rows adding up) or an error naming the file; then every column chunk's pages are decoded, or
// refused with an error naming the file and the column, and each top-level column's rows are
// assembled from its leaves (source/parquet/rows.h) or refused naming the file and column; never
// a crash, a hang or an allocation the bytes do not pay for.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "source/parquet/column.h"
#include "source/parquet/metadata.h"
#include "source/parquet/rows.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mmfeed::parquet;
  const std::string_view file(reinterpret_cast<const char*>(data), size);
  if (size < kFooterBytes) return 0;
  mmfeed::Result<uint64_t> len =
      MetadataLength(file.substr(size - kFooterBytes), size, "f.parquet");
  if (!len.ok()) {
    if (len.status().message().rfind("f.parquet: ", 0) != 0) __builtin_trap();
    return 0;
  }
  mmfeed::Result<FileMetaData> m =
      ParseMetadata(file.substr(size - kFooterBytes - *len, *len), size, "f.parquet");
  if (!m.ok()) {
    if (m.status().message().find("f.parquet") == std::string::npos) __builtin_trap();
    return 0;
  }
  for (const RowGroup& g : m->row_groups) {
    if (g.columns.size() != m->leaves.size()) __builtin_trap();
    for (const ColumnChunk& c : g.columns)
      if (c.start() < 4 || static_cast<uint64_t>(c.start() + c.total_compressed_size) > size)
        __builtin_trap();
  }
  (void)MetadataJson(*m);
  const SchemaTree tree(*m);
  for (const RowGroup& g : m->row_groups) {
    std::vector<ColumnValues> values(g.columns.size());
    std::vector<bool> read(g.columns.size());
    for (size_t k = 0; k < g.columns.size(); ++k) {
      const ColumnChunk& c = g.columns[k];
      mmfeed::Result<ColumnValues> v = ReadColumn(
          file.substr(static_cast<size_t>(c.start()), static_cast<size_t>(c.total_compressed_size)),
          c, m->leaves[k], "f.parquet");
      if (!v.ok() && v.status().message().rfind("f.parquet: column '", 0) != 0) __builtin_trap();
      if (v.ok() && v->size() > static_cast<size_t>(c.num_values)) __builtin_trap();
      if (v.ok()) values[k] = std::move(v.value()), read[k] = true;
    }
    // Each top-level column whose leaves all decoded, as rows.
    for (size_t top : tree.children.empty() ? std::vector<size_t>{} : tree.children[0]) {
      std::vector<size_t> leaves;
      std::vector<ColumnValues> of;
      bool all = true;
      for (size_t k = 0; k < m->leaves.size(); ++k)
        if (m->leaves[k].elements.front() == top) {
          leaves.push_back(k);
          all = all && read[k];
          of.push_back(values[k]);
        }
      if (!all) continue;
      mmfeed::Result<std::vector<nlohmann::ordered_json>> rows =
          AssembleColumn(*m, tree, top, leaves, of, g.num_rows, "f.parquet");
      if (!rows.ok() && rows.status().message().rfind("f.parquet: column '", 0) != 0)
        __builtin_trap();
      if (rows.ok() && rows->size() != static_cast<size_t>(g.num_rows)) __builtin_trap();
      (void)TypeName(*m, tree, top);
    }
  }
  return 0;
}
