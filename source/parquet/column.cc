#include "source/parquet/column.h"

#include <brotli/decode.h>
#include <fmt/format.h>
#include <lz4.h>
#include <snappy-c.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cstring>

#include "source/parquet/thrift_compact.h"

namespace mmfeed::parquet {
namespace {

// Decoded values past this are refused (a dictionary's long value repeated by a forged page).
constexpr uint64_t kMaxDecodedBytes = 1ull << 30;
// The most values (level entries) a chunk may hold: 6 bytes each in levels, more in rows.
constexpr uint64_t kMaxEntries = 32ull << 20;

enum PageType : int32_t { kDataPage = 0, kIndexPage = 1, kDictionaryPage = 2, kDataPageV2 = 3 };
enum Encoding : int32_t {
  kPlain = 0,
  kPlainDictionary = 2,
  kRle = 3,
  kDeltaBinaryPacked = 5,
  kDeltaLengthByteArray = 6,
  kDeltaByteArray = 7,
  kRleDictionary = 8,
  kByteStreamSplit = 9,
};

struct PageHeader {
  int32_t type = -1;
  int32_t uncompressed = 0, compressed = 0;
  int32_t num_values = 0, encoding = 0;
  int32_t def_encoding = kRle, rep_encoding = kRle;
  int32_t num_nulls = 0, num_rows = 0, def_bytes = 0, rep_bytes = 0;  // v2
  bool values_compressed = true;                                      // v2
};

Status ReadPageHeader(ThriftReader& r, PageHeader* h) {
  auto i32 = [&](uint8_t type, int32_t* out) -> Status {
    MMFEED_ASSIGN_OR_RETURN(const int64_t v, r.Int(type));
    if (v < INT32_MIN || v > INT32_MAX) return Status::Corrupt("a page header field out of range");
    *out = static_cast<int32_t>(v);
    return Status::Ok();
  };
  return r.Struct([&](int16_t id, uint8_t type) -> Status {
    switch (id) {
      case 1:
        return i32(type, &h->type);
      case 2:
        return i32(type, &h->uncompressed);
      case 3:
        return i32(type, &h->compressed);
      case 5:  // DataPageHeader
        return r.Struct([&](int16_t f, uint8_t t) -> Status {
          if (f == 1) return i32(t, &h->num_values);
          if (f == 2) return i32(t, &h->encoding);
          if (f == 3) return i32(t, &h->def_encoding);
          if (f == 4) return i32(t, &h->rep_encoding);
          return r.Skip(t);
        });
      case 7:  // DictionaryPageHeader
        return r.Struct([&](int16_t f, uint8_t t) -> Status {
          if (f == 1) return i32(t, &h->num_values);
          if (f == 2) return i32(t, &h->encoding);
          return r.Skip(t);
        });
      case 8:  // DataPageHeaderV2
        return r.Struct([&](int16_t f, uint8_t t) -> Status {
          switch (f) {
            case 1:
              return i32(t, &h->num_values);
            case 2:
              return i32(t, &h->num_nulls);
            case 3:
              return i32(t, &h->num_rows);
            case 4:
              return i32(t, &h->encoding);
            case 5:
              return i32(t, &h->def_bytes);
            case 6:
              return i32(t, &h->rep_bytes);
            case 7: {
              MMFEED_ASSIGN_OR_RETURN(h->values_compressed, r.Bool(t));
              return Status::Ok();
            }
            default:
              return r.Skip(t);
          }
        });
      default:
        return r.Skip(type);
    }
  });
}

int BitWidth(uint32_t max) {
  int w = 0;
  while (max) {
    ++w;
    max >>= 1;
  }
  return w;
}

// The RLE / bit-packed hybrid (Encodings.md): `count` values of `bit_width` bits from `in`.
Status DecodeHybrid(std::string_view in, int bit_width, size_t count, std::vector<uint32_t>* out) {
  if (bit_width < 0 || bit_width > 32)
    return Status::Corrupt(fmt::format("bit width {}", bit_width));
  size_t at = 0;
  const size_t start = out->size();
  const size_t value_bytes = static_cast<size_t>((bit_width + 7) / 8);
  while (out->size() - start < count) {
    uint64_t header = 0;
    for (int shift = 0;; shift += 7) {
      if (at >= in.size() || shift > 56) return Status::Corrupt("levels or indices end early");
      const uint8_t b = static_cast<uint8_t>(in[at++]);
      header |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) break;
    }
    const size_t left = count - (out->size() - start);
    if (!(header & 1)) {  // a run of one value
      const uint64_t n = header >> 1;
      if (n == 0 || value_bytes > in.size() - at) return Status::Corrupt("a bad run");
      uint32_t v = 0;
      std::memcpy(&v, in.data() + at, value_bytes);
      at += value_bytes;
      out->insert(out->end(), static_cast<size_t>(std::min<uint64_t>(n, left)), v);
    } else {  // groups of 8 bit-packed values, least significant bit first
      const uint64_t groups = header >> 1;
      if (groups == 0 || (bit_width > 0 && groups > in.size() - at))
        return Status::Corrupt("a bit-packed run past the page's end");
      const uint64_t bytes = groups * static_cast<uint64_t>(bit_width);
      if (bytes > in.size() - at) return Status::Corrupt("a bit-packed run past the page's end");
      const auto* p = reinterpret_cast<const uint8_t*>(in.data() + at);
      const uint64_t n = std::min<uint64_t>(groups * 8, left);
      for (uint64_t i = 0; i < n; ++i) {
        uint64_t v = 0;
        const uint64_t bit = i * static_cast<uint64_t>(bit_width);
        for (int k = 0; k < bit_width; ++k) {
          const uint64_t b = bit + static_cast<uint64_t>(k);
          v |= static_cast<uint64_t>((p[b >> 3] >> (b & 7)) & 1) << k;
        }
        out->push_back(static_cast<uint32_t>(v));
      }
      at += static_cast<size_t>(bytes);
    }
  }
  return Status::Ok();
}

// `count` PLAIN values of the column's type from `in`, appended to `out`.
Status DecodePlain(std::string_view in, const LeafColumn& leaf, size_t count, ColumnValues* out) {
  size_t at = 0;
  auto fixed = [&](size_t width) -> Status {
    if (width == 0 || count > (in.size() - at) / width)
      return Status::Corrupt(
          fmt::format("{} values of {} bytes in {} bytes", count, width, in.size() - at));
    for (size_t i = 0; i < count; ++i) {
      out->data.append(in.substr(at, width));
      at += width;
      out->offsets.push_back(out->data.size());
    }
    return Status::Ok();
  };
  switch (leaf.type) {
    case PhysicalType::kBoolean:
      if (count > in.size() * 8) return Status::Corrupt("booleans past the page's end");
      for (size_t i = 0; i < count; ++i) {
        out->data.push_back(static_cast<char>((static_cast<uint8_t>(in[i >> 3]) >> (i & 7)) & 1));
        out->offsets.push_back(out->data.size());
      }
      return Status::Ok();
    case PhysicalType::kInt32:
    case PhysicalType::kFloat:
      return fixed(4);
    case PhysicalType::kInt64:
    case PhysicalType::kDouble:
      return fixed(8);
    case PhysicalType::kInt96:
      return fixed(12);
    case PhysicalType::kFixedLenByteArray:
      return fixed(static_cast<size_t>(std::max(leaf.type_length, 0)));
    case PhysicalType::kByteArray:
      for (size_t i = 0; i < count; ++i) {
        uint32_t n;
        if (in.size() - at < 4) return Status::Corrupt("a byte array's length past the page's end");
        std::memcpy(&n, in.data() + at, 4);
        at += 4;
        if (n > in.size() - at)
          return Status::Corrupt(fmt::format("a byte array of {} bytes past the page's end", n));
        out->data.append(in.substr(at, n));
        at += n;
        out->offsets.push_back(out->data.size());
      }
      return Status::Ok();
  }
  return Status::Corrupt("unknown type");
}

// DELTA_BINARY_PACKED (Encodings.md): a header (values per block, miniblocks per block, the
// value count, the first value), then blocks of a minimum delta, each miniblock's bit width, and
// the miniblocks' bit-packed deltas over the minimum. Values are 32- or 64-bit integers whose
// sums wrap. `*used`: the bytes the encoded values took.
Status DecodeDeltaBinary(std::string_view in, bool wide, size_t count, std::vector<int64_t>* out,
                         size_t* used) {
  size_t at = 0;
  auto varint = [&](uint64_t* v) -> Status {
    *v = 0;
    for (int shift = 0;; shift += 7) {
      if (at >= in.size() || shift > 63) return Status::Corrupt("a delta header ends early");
      const uint8_t b = static_cast<uint8_t>(in[at++]);
      *v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return Status::Ok();
    }
  };
  auto zigzag = [](uint64_t z) { return static_cast<int64_t>((z >> 1) ^ (~(z & 1) + 1)); };
  uint64_t block = 0, miniblocks = 0, total = 0, first = 0;
  MMFEED_RETURN_IF_ERROR(varint(&block));
  MMFEED_RETURN_IF_ERROR(varint(&miniblocks));
  MMFEED_RETURN_IF_ERROR(varint(&total));
  MMFEED_RETURN_IF_ERROR(varint(&first));
  if (block == 0 || block % 128 != 0 || miniblocks == 0 || block % miniblocks != 0 ||
      (block / miniblocks) % 32 != 0 || block > (1u << 20))
    return Status::Corrupt(
        fmt::format("a delta block of {} values in {} miniblocks", block, miniblocks));
  if (total != count)
    return Status::Corrupt(
        fmt::format("{} delta-encoded values where {} were expected", total, count));
  const uint64_t per_mini = block / miniblocks;
  auto wrap = [wide](int64_t v) {
    return wide ? v : static_cast<int64_t>(static_cast<int32_t>(static_cast<uint32_t>(v)));
  };
  int64_t value = wrap(zigzag(first));
  if (total > 0) out->push_back(value);
  uint64_t done = total > 0 ? 1 : 0;
  while (done < total) {
    uint64_t z = 0;
    MMFEED_RETURN_IF_ERROR(varint(&z));
    const int64_t min_delta = zigzag(z);
    if (miniblocks > in.size() - at) return Status::Corrupt("delta bit widths past the end");
    const std::string_view widths = in.substr(at, miniblocks);
    at += miniblocks;
    for (uint64_t m = 0; m < miniblocks && done < total; ++m) {
      const int w = static_cast<uint8_t>(widths[m]);
      if (w > (wide ? 64 : 32)) return Status::Corrupt(fmt::format("a delta bit width of {}", w));
      const uint64_t bytes = per_mini * static_cast<uint64_t>(w) / 8;
      if (bytes > in.size() - at) return Status::Corrupt("a delta miniblock past the end");
      const auto* p = reinterpret_cast<const uint8_t*>(in.data() + at);
      for (uint64_t i = 0; i < per_mini && done < total; ++i, ++done) {
        uint64_t d = 0;
        const uint64_t bit = i * static_cast<uint64_t>(w);
        for (int k = 0; k < w; ++k) {
          const uint64_t b = bit + static_cast<uint64_t>(k);
          d |= static_cast<uint64_t>((p[b >> 3] >> (b & 7)) & 1) << k;
        }
        value = wrap(static_cast<int64_t>(static_cast<uint64_t>(value) +
                                          static_cast<uint64_t>(min_delta) + d));
        out->push_back(value);
      }
      at += static_cast<size_t>(bytes);
    }
  }
  *used = at;
  return Status::Ok();
}

// The delta encodings and BYTE_STREAM_SPLIT: `count` values of the column from `in`.
Status DecodeOther(int32_t encoding, std::string_view in, const LeafColumn& leaf, size_t count,
                   ColumnValues* out) {
  const bool ints = leaf.type == PhysicalType::kInt32 || leaf.type == PhysicalType::kInt64;
  const bool arrays =
      leaf.type == PhysicalType::kByteArray || leaf.type == PhysicalType::kFixedLenByteArray;
  std::vector<int64_t> a, b;
  size_t used = 0, used2 = 0;
  switch (encoding) {
    case kDeltaBinaryPacked: {
      if (!ints) break;
      const bool wide = leaf.type == PhysicalType::kInt64;
      MMFEED_RETURN_IF_ERROR(DecodeDeltaBinary(in, wide, count, &a, &used));
      for (int64_t v : a) {
        const int32_t v32 = static_cast<int32_t>(v);
        out->data.append(
            wide ? reinterpret_cast<const char*>(&v) : reinterpret_cast<const char*>(&v32),
            wide ? 8 : 4);
        out->offsets.push_back(out->data.size());
      }
      return Status::Ok();
    }
    case kDeltaLengthByteArray: {
      if (leaf.type != PhysicalType::kByteArray) break;
      MMFEED_RETURN_IF_ERROR(DecodeDeltaBinary(in, false, count, &a, &used));
      size_t at = used;
      for (int64_t n : a) {
        if (n < 0 || static_cast<uint64_t>(n) > in.size() - at)
          return Status::Corrupt("a byte array's length past the page's end");
        out->data.append(in.substr(at, static_cast<size_t>(n)));
        at += static_cast<size_t>(n);
        out->offsets.push_back(out->data.size());
      }
      return Status::Ok();
    }
    case kDeltaByteArray: {
      if (!arrays) break;
      MMFEED_RETURN_IF_ERROR(DecodeDeltaBinary(in, false, count, &a, &used));
      MMFEED_RETURN_IF_ERROR(DecodeDeltaBinary(in.substr(used), false, count, &b, &used2));
      size_t at = used + used2;
      std::string previous;
      for (size_t i = 0; i < count; ++i) {
        if (a[i] < 0 || static_cast<uint64_t>(a[i]) > previous.size() || b[i] < 0 ||
            static_cast<uint64_t>(b[i]) > in.size() - at)
          return Status::Corrupt("a prefix or suffix past its bounds");
        previous.resize(static_cast<size_t>(a[i]));
        previous.append(in.substr(at, static_cast<size_t>(b[i])));
        at += static_cast<size_t>(b[i]);
        out->data.append(previous);
        out->offsets.push_back(out->data.size());
        if (out->data.size() > kMaxDecodedBytes) return Status::TooLarge("over 1 GiB decoded");
      }
      return Status::Ok();
    }
    case kByteStreamSplit: {
      size_t width = 0;
      if (leaf.type == PhysicalType::kInt32 || leaf.type == PhysicalType::kFloat) width = 4;
      if (leaf.type == PhysicalType::kInt64 || leaf.type == PhysicalType::kDouble) width = 8;
      if (leaf.type == PhysicalType::kFixedLenByteArray)
        width = static_cast<size_t>(std::max(leaf.type_length, 0));
      if (width == 0) break;
      if (count > in.size() / width) return Status::Corrupt("split streams past the page's end");
      for (size_t i = 0; i < count; ++i) {
        for (size_t k = 0; k < width; ++k) out->data.push_back(in[k * count + i]);
        out->offsets.push_back(out->data.size());
      }
      return Status::Ok();
    }
    default:
      return Status::Unsupported(fmt::format("encoding {} is not read", EncodingName(encoding)));
  }
  return Status::Corrupt(
      fmt::format("encoding {} for a {} column", EncodingName(encoding), Name(leaf.type)));
}

}  // namespace

Status DecodeValues(int32_t encoding, std::string_view in, const LeafColumn& leaf, size_t count,
                    ColumnValues* out) {
  if (encoding == kPlain) return DecodePlain(in, leaf, count, out);
  return DecodeOther(encoding, in, leaf, count, out);
}

Result<std::string> Decompress(Codec codec, std::string_view in, size_t size) {
  std::string out(size, '\0');
  auto wrong = [&](const char* what) {
    return Status::Corrupt(fmt::format("{} data that does not decompress to its {} bytes ({})",
                                       Name(codec), size, what));
  };
  switch (codec) {
    case Codec::kUncompressed:
      if (in.size() != size) return wrong("sizes differ");
      out.assign(in);
      return out;
    case Codec::kSnappy: {
      size_t n = 0;
      if (snappy_uncompressed_length(in.data(), in.size(), &n) != SNAPPY_OK || n != size)
        return wrong("its length");
      if (snappy_uncompress(in.data(), in.size(), out.data(), &n) != SNAPPY_OK || n != size)
        return wrong("its data");
      return out;
    }
    case Codec::kGzip: {
      z_stream z{};
      if (inflateInit2(&z, 15 + 32) != Z_OK) return wrong("zlib");
      z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
      z.avail_in = static_cast<uInt>(in.size());
      z.next_out = reinterpret_cast<Bytef*>(out.data());
      z.avail_out = static_cast<uInt>(size);
      const int rc = inflate(&z, Z_FINISH);
      const uLong total = z.total_out;
      inflateEnd(&z);
      if (rc != Z_STREAM_END || total != size) return wrong("its stream");
      return out;
    }
    case Codec::kZstd: {
      const size_t n = ZSTD_decompress(out.data(), size, in.data(), in.size());
      if (ZSTD_isError(n) || n != size) return wrong("its frame");
      return out;
    }
    case Codec::kLz4Raw: {
      if (in.size() > INT32_MAX || size > INT32_MAX) return wrong("too large");
      const int n = LZ4_decompress_safe(in.data(), out.data(), static_cast<int>(in.size()),
                                        static_cast<int>(size));
      if (n < 0 || static_cast<size_t>(n) != size) return wrong("its block");
      return out;
    }
    case Codec::kLz4: {
      // Hadoop's framing: blocks of [4-byte big-endian uncompressed size][4-byte compressed
      // size][LZ4 block]; some writers put a raw block here instead.
      size_t at = 0, written = 0;
      auto be32 = [&](size_t p) {
        const auto* b = reinterpret_cast<const uint8_t*>(in.data() + p);
        return (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | b[3];
      };
      bool framed = true;
      while (at < in.size() && framed) {
        if (in.size() - at < 8) {
          framed = false;
          break;
        }
        const uint32_t raw = be32(at), packed = be32(at + 4);
        if (packed > in.size() - at - 8 || raw > size - written) {
          framed = false;
          break;
        }
        const int n = LZ4_decompress_safe(in.data() + at + 8, out.data() + written,
                                          static_cast<int>(packed), static_cast<int>(raw));
        if (n < 0 || static_cast<uint32_t>(n) != raw) {
          framed = false;
          break;
        }
        at += 8 + packed;
        written += raw;
      }
      if (framed && written == size) return out;
      return Decompress(Codec::kLz4Raw, in, size);
    }
    case Codec::kBrotli: {
      size_t n = size;
      if (BrotliDecoderDecompress(in.size(), reinterpret_cast<const uint8_t*>(in.data()), &n,
                                  reinterpret_cast<uint8_t*>(out.data())) !=
              BROTLI_DECODER_RESULT_SUCCESS ||
          n != size)
        return wrong("its stream");
      return out;
    }
    case Codec::kLzo:
      break;
  }
  return Status::Unsupported(
      fmt::format("codec {} is not read (not in Debian's libraries)", Name(codec)));
}

Result<ColumnValues> ReadColumn(std::string_view bytes, const ColumnChunk& chunk,
                                const LeafColumn& leaf, const std::string& name) {
  const std::string column = fmt::format("{}: column '{}'", name, fmt::join(leaf.path, "."));
  auto fail = [&](const Status& st) { return st.WithContext(column); };
  ColumnValues out;
  ColumnValues dictionary;
  bool have_dictionary = false;
  const int def_width = BitWidth(static_cast<uint32_t>(leaf.max_definition));
  const int rep_width = BitWidth(static_cast<uint32_t>(leaf.max_repetition));
  uint64_t entries = 0;
  size_t at = 0;
  while (at < bytes.size() && entries < static_cast<uint64_t>(chunk.num_values)) {
    ThriftReader r(bytes.substr(at));
    PageHeader h;
    if (Status st = ReadPageHeader(r, &h); !st.ok())
      return fail(st.WithContext(fmt::format("page header at chunk byte {}", at)));
    at += r.offset();
    if (h.compressed < 0 || h.uncompressed < 0 ||
        static_cast<size_t>(h.compressed) > bytes.size() - at)
      return fail(Status::Corrupt(
          fmt::format("a page of {} bytes where {} remain", h.compressed, bytes.size() - at)));
    const std::string_view body = bytes.substr(at, static_cast<size_t>(h.compressed));
    at += static_cast<size_t>(h.compressed);
    if (h.type == kIndexPage) continue;
    if (h.num_values < 0 ||
        static_cast<uint64_t>(h.num_values) > static_cast<uint64_t>(chunk.num_values) - entries)
      return fail(Status::Corrupt(
          fmt::format("a page of {} values past the chunk's {}", h.num_values, chunk.num_values)));
    // Levels cost memory per entry whatever bytes encode them (a run of 2^31 in a few bytes).
    if (entries + static_cast<uint64_t>(h.num_values) > kMaxEntries)
      return fail(Status::TooLarge(fmt::format("over {} values in one column chunk", kMaxEntries)));
    if (h.type == kDictionaryPage) {
      if (have_dictionary) return fail(Status::Corrupt("a second dictionary page"));
      if (h.encoding != kPlain && h.encoding != kPlainDictionary)
        return fail(
            Status::Unsupported(fmt::format("a dictionary page in {}", EncodingName(h.encoding))));
      Result<std::string> plain =
          Decompress(chunk.codec, body, static_cast<size_t>(h.uncompressed));
      if (!plain.ok()) return fail(plain.status());
      MMFEED_RETURN_IF_ERROR(
          fail(DecodePlain(*plain, leaf, static_cast<size_t>(h.num_values), &dictionary)));
      have_dictionary = true;
      continue;
    }
    if (h.type != kDataPage && h.type != kDataPageV2)
      return fail(Status::Unsupported(fmt::format("page type {}", h.type)));
    // The levels, then the values.
    std::string page;
    std::string_view rep_bytes, def_bytes, values;
    if (h.type == kDataPage) {
      Result<std::string> p = Decompress(chunk.codec, body, static_cast<size_t>(h.uncompressed));
      if (!p.ok()) return fail(p.status());
      page = std::move(*p);
      std::string_view rest = page;
      auto prefixed = [&](std::string_view* part) -> Status {
        uint32_t n;
        if (rest.size() < 4) return Status::Corrupt("levels' length past the page's end");
        std::memcpy(&n, rest.data(), 4);
        if (n > rest.size() - 4) return Status::Corrupt("levels past the page's end");
        *part = rest.substr(4, n);
        rest.remove_prefix(4 + n);
        return Status::Ok();
      };
      if (leaf.max_repetition > 0) MMFEED_RETURN_IF_ERROR(fail(prefixed(&rep_bytes)));
      if (leaf.max_definition > 0) MMFEED_RETURN_IF_ERROR(fail(prefixed(&def_bytes)));
      values = rest;
    } else {
      if (h.rep_bytes < 0 || h.def_bytes < 0 ||
          static_cast<uint64_t>(h.rep_bytes) + static_cast<uint64_t>(h.def_bytes) > body.size())
        return fail(Status::Corrupt("a v2 page's levels past its end"));
      rep_bytes = body.substr(0, static_cast<size_t>(h.rep_bytes));
      def_bytes = body.substr(static_cast<size_t>(h.rep_bytes), static_cast<size_t>(h.def_bytes));
      const std::string_view packed = body.substr(static_cast<size_t>(h.rep_bytes + h.def_bytes));
      const int64_t raw = int64_t{h.uncompressed} - h.rep_bytes - h.def_bytes;
      if (raw < 0) return fail(Status::Corrupt("a v2 page smaller than its levels"));
      if (h.values_compressed) {
        Result<std::string> p = Decompress(chunk.codec, packed, static_cast<size_t>(raw));
        if (!p.ok()) return fail(p.status());
        page = std::move(*p);
        values = page;
      } else {
        values = packed;
      }
    }
    const size_t n = static_cast<size_t>(h.num_values);
    std::vector<uint32_t> levels;
    if (leaf.max_repetition > 0) {
      MMFEED_RETURN_IF_ERROR(fail(DecodeHybrid(rep_bytes, rep_width, n, &levels)));
      for (uint32_t v : levels) {
        if (v > static_cast<uint32_t>(leaf.max_repetition))
          return fail(Status::Corrupt("a repetition level past the column's maximum"));
        out.repetition.push_back(static_cast<int16_t>(v));
      }
      levels.clear();
    }
    size_t present = n;
    if (leaf.max_definition > 0) {
      MMFEED_RETURN_IF_ERROR(fail(DecodeHybrid(def_bytes, def_width, n, &levels)));
      present = 0;
      for (uint32_t v : levels) {
        if (v > static_cast<uint32_t>(leaf.max_definition))
          return fail(Status::Corrupt("a definition level past the column's maximum"));
        present += v == static_cast<uint32_t>(leaf.max_definition);
        out.definition.push_back(static_cast<int16_t>(v));
      }
    }
    if (h.encoding == kPlain) {
      MMFEED_RETURN_IF_ERROR(fail(DecodePlain(values, leaf, present, &out)));
    } else if (h.encoding == kPlainDictionary || h.encoding == kRleDictionary) {
      if (!have_dictionary)
        return fail(Status::Corrupt("dictionary indices without a dictionary page"));
      std::vector<uint32_t> idx;
      if (present > 0) {
        if (values.empty()) return fail(Status::Corrupt("dictionary indices missing"));
        MMFEED_RETURN_IF_ERROR(
            fail(DecodeHybrid(values.substr(1), static_cast<uint8_t>(values[0]), present, &idx)));
      }
      for (uint32_t i : idx) {
        if (i >= dictionary.size())
          return fail(
              Status::Corrupt(fmt::format("dictionary index {} of {}", i, dictionary.size())));
        out.data.append(dictionary.value(i));
        out.offsets.push_back(out.data.size());
        if (out.data.size() > kMaxDecodedBytes) return fail(Status::TooLarge("over 1 GiB decoded"));
      }
    } else {
      MMFEED_RETURN_IF_ERROR(fail(DecodeOther(h.encoding, values, leaf, present, &out)));
    }
    if (out.data.size() > kMaxDecodedBytes) return fail(Status::TooLarge("over 1 GiB decoded"));
    entries += n;
  }
  if (entries != static_cast<uint64_t>(chunk.num_values))
    return fail(Status::Corrupt(
        fmt::format("its pages hold {} values, the chunk says {}", entries, chunk.num_values)));
  return out;
}

}  // namespace mmfeed::parquet
