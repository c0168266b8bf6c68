// A row group's top-level columns as one value per row: the leaf columns' values and levels
// (source/parquet/column.h) put back together into nested values (Dremel's record assembly, as
// Parquet's specification describes it), as JSON (objects keep the schema's order): strings
// (BYTE_ARRAY annotated STRING, ENUM or JSON), binary (other byte arrays, fixed-length ones),
// numbers, booleans, null for a null value, objects for groups, arrays for lists. LIST and MAP
// groups become arrays of their elements (MAP: of {key, value} objects), in the three-level form
// the specification names and the older two-level ones. Checked: the levels must fit the schema and
// the row count.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/status.h"
#include "source/parquet/column.h"
#include "source/parquet/metadata.h"

namespace mmfeed::parquet {

// The top-level columns of a file's schema (the root's children) and, per schema element, its
// children's indexes.
struct SchemaTree {
  explicit SchemaTree(const FileMetaData& m);
  static constexpr size_t npos = static_cast<size_t>(-1);
  std::vector<std::vector<size_t>> children;  // by SchemaElement index
  // The root's child named `name`, or npos.
  size_t Top(const FileMetaData& m, const std::string& name) const;
};

// Top-level column `top` (a SchemaElement index, a child of the root) of a row group of `rows`
// rows: `leaves` are the indexes (into m.leaves) of its leaf columns, `values` their chunks'
// values in the same order. One JSON value per row. `name` names the file in errors.
Result<std::vector<nlohmann::ordered_json>> AssembleColumn(const FileMetaData& m,
                                                           const SchemaTree& tree, size_t top,
                                                           const std::vector<size_t>& leaves,
                                                           const std::vector<ColumnValues>& values,
                                                           int64_t rows, const std::string& name);

// The type of top-level column `top` in words, as the schema says it ("BYTE_ARRAY (STRING)",
// "struct<bytes: BYTE_ARRAY, path: BYTE_ARRAY (STRING)>", "list<...>").
std::string TypeName(const FileMetaData& m, const SchemaTree& tree, size_t element);

}  // namespace mmfeed::parquet
