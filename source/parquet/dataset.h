// Parquet files read in place as one table: row i of the dataset is a row of one file's row
// group, in file order then row order. Only the files' footers are read at start (a read or two
// per file); a row's values are read when it is dealt, one row group at a time: the chunks of
// the top-level columns the pipeline reads (and no other) are read, decompressed, decoded and
// assembled into one value per row (source/parquet/rows.h), and the row group is kept, decoded,
// while there is room (row_group_cache_bytes, least recently used first), so a run over the
// data in its order decodes each row group once. A file whose footer cannot be read holds no
// rows and is reported; a row group that cannot be decoded fails each of its rows (the sample
// is counted and skipped, named with the file, row group and reason). Safe to share between
// threads: several rows of one row group asked for at once are decoded once.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "source/parquet/metadata.h"
#include "source/parquet/rows.h"

namespace mmfeed::parquet {

struct Group;  // a row group's decoded columns (below)

class Dataset {
 public:
  struct Damage {
    std::string origin, reason;
  };
  struct Options {
    // The top-level columns rows are read with (a file may lack some: Row::column is then null).
    std::vector<std::string> columns;
    // Decoded row groups kept, in bytes. A row group whose columns take more than this decoded
    // is refused (its rows fail, the message names the key to raise).
    uint64_t cache_bytes = 1ull << 30;
  };
  static Result<std::unique_ptr<Dataset>> Open(const std::vector<std::string>& files,
                                               Options options, std::vector<Damage>* damage);

  size_t size() const { return total_; }
  size_t file_count() const { return files_.size(); }
  // Every file's row groups, in dataset order: row group k holds rows [first, first + count).
  struct Span {
    uint64_t first = 0, count = 0;
  };
  size_t group_count() const { return groups_.size(); }
  Span group(size_t k) const { return groups_[k]; }
  const std::string& path(size_t file) const { return files_[file].path; }
  // Names the files' contents (each one's size, mtime, inode and ends, in order).
  uint64_t fingerprint() const { return fingerprint_; }
  // Top-level column `name` of file `file` in words ("BYTE_ARRAY (STRING)", "struct<...>"), or
  // "" when the file has no such column.
  std::string ColumnType(size_t file, const std::string& name) const;
  // The top-level columns of file `file`, in schema order.
  std::vector<std::string> Columns(size_t file) const;

  // Row i, its values decoded. REQUIRES: i < size().
  struct Row {
    size_t file = 0;   // of path(file)
    uint64_t row = 0;  // in its file
    size_t group = 0;  // its row group
    // Options::columns[c]'s value in this row, or null when the file lacks the column.
    const nlohmann::ordered_json* column(size_t c) const;

    std::shared_ptr<const Group> decoded;  // keeps the values alive
    uint64_t in_group = 0;                 // the row's index in its row group
  };
  // On failure (the row group cannot be read or decoded) `row` still names the file and row.
  Status Read(size_t i, Row* row) const;

 private:
  struct File {
    std::string path;
    uint64_t first = 0, rows = 0;  // its rows' dataset positions
    std::vector<uint64_t> starts;  // starts[g]: the first row of row group g, in the file
    FileMetaData meta;
    std::unique_ptr<SchemaTree> tree;
    std::vector<size_t> tops;                 // per Options::columns, its element (or npos)
    std::vector<std::vector<size_t>> leaves;  // per Options::columns, its leaf columns
  };
  struct Slot;
  Dataset() = default;
  // Row group `group` of `f`, its columns read and decoded.
  Result<std::shared_ptr<const Group>> Decode(const File& f, size_t group) const;
  void EvictLocked() const;  // drops least recently used decoded row groups until they fit

  Options options_;
  std::vector<File> files_;
  std::vector<Span> groups_;
  uint64_t total_ = 0, fingerprint_ = 0;
  mutable std::mutex mu_;
  mutable std::map<std::pair<size_t, size_t>, std::shared_ptr<Slot>> cache_;
  mutable uint64_t held_ = 0, clock_ = 0;
};

// A row group's decoded columns (Dataset::Row keeps one alive).
struct Group {
  Status status;
  std::vector<std::vector<nlohmann::ordered_json>>
      columns;         // per Options::columns; empty: not in file
  uint64_t bytes = 0;  // decoded, estimated
};

}  // namespace mmfeed::parquet
