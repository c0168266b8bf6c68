// Parquet's file metadata (the footer), read from the format's specification
// (apache/parquet-format: parquet.thrift and the file layout): a file is "PAR1", the column
// chunks of its row groups, the FileMetaData in Thrift's compact protocol, its length (4 bytes,
// little-endian) and "PAR1". Read is bounded and checked: the length must fit the file, the
// schema must be one tree, every row group must have one chunk per leaf column lying inside the
// file, and the row counts must add up; anything else is an error naming the file and what is
// wrong. Only the fields mmfeed uses are kept; the rest are read past.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"

namespace mmfeed::parquet {

// parquet.thrift's enums, by their numbers.
enum class PhysicalType : int32_t {
  kBoolean = 0,
  kInt32 = 1,
  kInt64 = 2,
  kInt96 = 3,
  kFloat = 4,
  kDouble = 5,
  kByteArray = 6,
  kFixedLenByteArray = 7,
};
enum class Repetition : int32_t { kRequired = 0, kOptional = 1, kRepeated = 2 };
enum class Codec : int32_t {
  kUncompressed = 0,
  kSnappy = 1,
  kGzip = 2,
  kLzo = 3,
  kBrotli = 4,
  kLz4 = 5,  // the older Hadoop framing
  kZstd = 6,
  kLz4Raw = 7,
};
const char* Name(PhysicalType t);
const char* Name(Codec c);
const char* EncodingName(int32_t encoding);

struct SchemaElement {
  std::optional<PhysicalType> type;  // none: a group
  int32_t type_length = 0;           // FIXED_LEN_BYTE_ARRAY's
  Repetition repetition = Repetition::kRequired;
  std::string name;
  int32_t num_children = 0;
  std::optional<int32_t> converted_type;  // UTF8 = 0, LIST = 3, ...
  std::string logical_type;               // "STRING", "LIST", ... ("" when none)
};

struct ColumnChunk {
  std::string file_path;  // another file holds it (refused: mmfeed reads one file at a time)
  PhysicalType type = PhysicalType::kBoolean;
  std::vector<int32_t> encodings;
  std::vector<std::string> path;  // in the schema, from the root's child down
  Codec codec = Codec::kUncompressed;
  int64_t num_values = 0;
  int64_t total_uncompressed_size = 0, total_compressed_size = 0;
  int64_t data_page_offset = 0;
  std::optional<int64_t> dictionary_page_offset;
  // Where the chunk's bytes start (its dictionary page, else its first data page).
  int64_t start() const { return dictionary_page_offset.value_or(data_page_offset); }
};

struct RowGroup {
  std::vector<ColumnChunk> columns;
  int64_t total_byte_size = 0;
  int64_t num_rows = 0;
};

// A leaf column of the schema: its path, type and levels.
struct LeafColumn {
  std::vector<std::string> path;
  PhysicalType type;
  int32_t type_length = 0;
  int16_t max_definition = 0, max_repetition = 0;
  size_t schema_index = 0;  // its SchemaElement
  // The SchemaElements from the root's child down to this leaf (the last is schema_index).
  std::vector<size_t> elements;
};

struct FileMetaData {
  int32_t version = 0;
  std::vector<SchemaElement> schema;  // depth first, the root first
  int64_t num_rows = 0;
  std::vector<RowGroup> row_groups;
  std::vector<std::pair<std::string, std::string>> key_value;
  std::string created_by;
  std::vector<LeafColumn> leaves;  // derived from `schema` by Read
};

// A Parquet file ends with the metadata's length and "PAR1": given the file's last 8 bytes and
// its size, the metadata's length (checked to fit between the leading "PAR1" and them). `name`
// names the file in errors.
inline constexpr size_t kFooterBytes = 8;
Result<uint64_t> MetadataLength(std::string_view last8, uint64_t size, const std::string& name);
// The metadata, from its `bytes` (the MetadataLength bytes before the last 8), checked against
// the file's `size`.
Result<FileMetaData> ParseMetadata(std::string_view bytes, uint64_t size, const std::string& name);
// Reads a local file's footer (two reads at most): of the open regular file `fd` of `size` bytes
// (`name` names it in errors), or of the file at `path`.
Result<FileMetaData> ReadFooter(int fd, uint64_t size, const std::string& name);
Result<FileMetaData> ReadFooter(const std::string& path);

// The metadata as JSON (mmfeed-parquet's output; the tests compare it with another reader's).
std::string MetadataJson(const FileMetaData& m);

}  // namespace mmfeed::parquet
