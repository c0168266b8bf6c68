// libFuzzer target: a Parquet file (source/parquet/) as a tampered or truncated file may hold
// it. Its footer is metadata that passes the checks (every chunk inside the file, one per leaf,
// rows adding up) or an error naming the file; then every column chunk's pages are decoded, or
// refused with an error naming the file and the column; never a crash, a hang or an allocation
// the bytes do not pay for.
#include <cstdint>
#include <string>
#include <string_view>

#include "source/parquet/column.h"
#include "source/parquet/metadata.h"

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
  for (const RowGroup& g : m->row_groups)
    for (size_t k = 0; k < g.columns.size(); ++k) {
      const ColumnChunk& c = g.columns[k];
      mmfeed::Result<ColumnValues> v = ReadColumn(
          file.substr(static_cast<size_t>(c.start()), static_cast<size_t>(c.total_compressed_size)),
          c, m->leaves[k], "f.parquet");
      if (!v.ok() && v.status().message().rfind("f.parquet: column '", 0) != 0) __builtin_trap();
      if (v.ok() && v->size() > static_cast<size_t>(c.num_values)) __builtin_trap();
    }
  return 0;
}
