// Parquet value encodings (source/parquet/column.h, DecodeValues) on bytes encoded by hand from
// Encodings.md's own examples, for what the DuckDB files of tests/integration/parquet_test.py do
// not hold: DELTA_BYTE_ARRAY (incremental encoding of sorted strings), and the edges of
// DELTA_BINARY_PACKED (32-bit wrap, a header that lies about its count).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "source/parquet/column.h"
#include "tests/test_util.h"

namespace mmfeed::parquet {
namespace {

using testing::Bytes;

// A DELTA_BINARY_PACKED block of 128 values in 4 miniblocks holding up to 4 values, whose
// deltas over the minimum fit 3 bits: the header, the minimum delta, the widths [3, 0, 0, 0],
// and miniblock 0's 32 values of 3 bits (12 bytes; the unused ones zero).
std::string Delta4(int first_zigzag, int min_delta_zigzag, std::vector<int> adjusted) {
  std::string s = Bytes({0x80, 0x01, 0x04, 0x04, first_zigzag, min_delta_zigzag, 3, 0, 0, 0});
  std::string packed(12, '\0');
  for (size_t i = 0; i < adjusted.size(); ++i)
    for (int k = 0; k < 3; ++k)
      if (adjusted[i] >> k & 1)
        packed[(i * 3 + k) / 8] |= static_cast<char>(1 << ((i * 3 + k) % 8));
  return s + packed;
}

TEST(ParquetValuesTest, DeltaByteArrayRebuildsEachStringFromItsPredecessor) {
  // Encodings.md: "axis", "axle", "babble", "babyhood" -> prefix lengths 0, 2, 0, 3 and
  // suffixes "axis", "le", "babble", "yhood". Prefix deltas 2, -2, 3 (minimum -2, zigzag 3)
  // adjusted 4, 0, 5; suffix lengths 4, 2, 6, 5: first 4 (zigzag 8), deltas -2, 4, -1 adjusted
  // 0, 6, 1.
  const std::string in = Delta4(0, 3, {4, 0, 5}) + Delta4(8, 3, {0, 6, 1}) + "axislebabbleyhood";
  LeafColumn leaf{{"word"}, PhysicalType::kByteArray};
  ColumnValues v;
  ASSERT_TRUE(DecodeValues(7, in, leaf, 4, &v).ok());
  ASSERT_EQ(v.size(), 4u);
  EXPECT_EQ(v.value(0), "axis");
  EXPECT_EQ(v.value(1), "axle");
  EXPECT_EQ(v.value(2), "babble");
  EXPECT_EQ(v.value(3), "babyhood");
  // A prefix longer than the string before it is refused.
  const std::string bad = Delta4(2, 3, {4, 0, 5}) + Delta4(8, 3, {0, 6, 1}) + "axislebabbleyhood";
  ColumnValues w;
  EXPECT_FALSE(DecodeValues(7, bad, leaf, 4, &w).ok());
}

TEST(ParquetValuesTest, DeltaBinaryPackedWrapsIn32BitsAndChecksItsCount) {
  // INT32: first 2147483647 (zigzag 4294967294), then +1 twice: the sum wraps as Parquet's
  // writers' arithmetic does.
  std::string in = Bytes({0x80, 0x01, 0x04, 0x03, 0xfe, 0xff, 0xff, 0xff, 0x0f, 0x02, 0, 0, 0, 0});
  LeafColumn leaf{{"n"}, PhysicalType::kInt32};
  ColumnValues v;
  ASSERT_TRUE(DecodeValues(5, in, leaf, 3, &v).ok());
  ASSERT_EQ(v.size(), 3u);
  int32_t x[3];
  for (int i = 0; i < 3; ++i) std::memcpy(&x[i], v.value(i).data(), 4);
  EXPECT_EQ(x[0], 2147483647);
  EXPECT_EQ(x[1], -2147483647 - 1);
  EXPECT_EQ(x[2], -2147483647);
  // The page's levels promised 4 values; the header says 3.
  ColumnValues w;
  EXPECT_FALSE(DecodeValues(5, in, leaf, 4, &w).ok());
  // A header claiming blocks that are no multiple of 128.
  ColumnValues u;
  EXPECT_FALSE(DecodeValues(5, Bytes({0x05, 0x01, 0x01, 0x00}), leaf, 1, &u).ok());
}

TEST(ParquetValuesTest, ByteStreamSplitInterleavesTheBytes) {
  // Two floats 1.0f (00 00 80 3f) and 2.0f (00 00 00 40): byte k of value i at k * 2 + i.
  const std::string in = Bytes({0x00, 0x00, 0x00, 0x00, 0x80, 0x00, 0x3f, 0x40});
  LeafColumn leaf{{"f"}, PhysicalType::kFloat};
  ColumnValues v;
  ASSERT_TRUE(DecodeValues(9, in, leaf, 2, &v).ok());
  float f[2];
  std::memcpy(&f[0], v.value(0).data(), 4);
  std::memcpy(&f[1], v.value(1).data(), 4);
  EXPECT_EQ(f[0], 1.0f);
  EXPECT_EQ(f[1], 2.0f);
  ColumnValues w;
  EXPECT_FALSE(DecodeValues(9, in.substr(0, 7), leaf, 2, &w).ok()) << "streams cut short";
}

}  // namespace
}  // namespace mmfeed::parquet
