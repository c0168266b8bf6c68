// A column chunk's values (source/parquet/metadata.h says where its bytes are): its pages read,
// decompressed and decoded, written from Parquet's specification (the page headers in
// parquet.thrift, Encodings.md, Compression.md). Pages: dictionary pages and data pages v1 and
// v2. Codecs: uncompressed, Snappy, gzip, zstd, LZ4_RAW, the older Hadoop LZ4 framing, Brotli.
// Encodings: PLAIN, PLAIN_DICTIONARY / RLE_DICTIONARY, and the RLE / bit-packed hybrid for
// levels. Anything else is refused naming the column and what it is. Bounded: a page may not
// claim more bytes than the chunk has, nor decompress to more than it said, and a chunk's values
// may not exceed what its header promised.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "source/parquet/metadata.h"

namespace mmfeed::parquet {

struct ColumnValues {
  // Per level entry (ColumnChunk::num_values of them): its definition and repetition levels
  // (empty when the column's maximum is 0: every entry is a value, each a row of its own).
  std::vector<int16_t> definition, repetition;
  // The values, nulls left out, in order: value i is bytes [offsets[i], offsets[i + 1]) of
  // `data` (little-endian for numbers; a byte 0 or 1 for booleans).
  std::string data;
  std::vector<uint64_t> offsets{0};
  size_t size() const { return offsets.size() - 1; }
  std::string_view value(size_t i) const {
    return std::string_view(data).substr(offsets[i], offsets[i + 1] - offsets[i]);
  }
};

// The values of `chunk` of column `leaf`, from the chunk's bytes (`bytes`: the file's bytes
// [chunk.start(), chunk.start() + chunk.total_compressed_size)). `name` names the file in errors.
Result<ColumnValues> ReadColumn(std::string_view bytes, const ColumnChunk& chunk,
                                const LeafColumn& leaf, const std::string& name);

// `count` values of `leaf`'s type in `encoding` (any but the dictionary ones, whose indices need
// their page's dictionary) from a data page's value bytes `in`, appended to `out`.
Status DecodeValues(int32_t encoding, std::string_view in, const LeafColumn& leaf, size_t count,
                    ColumnValues* out);

// `in` decompressed with `codec` to exactly `size` bytes.
Result<std::string> Decompress(Codec codec, std::string_view in, size_t size);

}  // namespace mmfeed::parquet
