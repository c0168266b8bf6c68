// Thrift's compact protocol reader (source/parquet/thrift_compact.h), on bytes encoded by hand
// from the protocol's specification: field headers with deltas and with explicit ids, zigzag
// varints, booleans in fields and in lists, long lists, maps, nested structs skipped; and what a
// hostile file may claim (lists longer than the bytes, endless nesting, cut varints).
#include "source/parquet/thrift_compact.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/test_util.h"

namespace mmfeed::parquet {
namespace {

using testing::Bytes;

TEST(ThriftCompactTest, ReadsFieldsByDeltaAndByExplicitId) {
  // field 1 i32 = -3 (zigzag 5), field 2 string "ab", field 5 (delta 3) true,
  // field 300 (explicit id, zigzag 600 = 0xd8 0x04) i64 = 150 (zigzag 300 = 0xac 0x02), stop.
  const std::string b =
      Bytes({0x15, 0x05, 0x18, 0x02, 'a', 'b', 0x31, 0x06, 0xd8, 0x04, 0xac, 0x02, 0x00});
  std::vector<int> ids;
  int64_t i32 = 0, i64 = 0;
  std::string s;
  bool flag = false;
  ThriftReader q(b);
  ASSERT_TRUE(q.Struct([&](int16_t id, uint8_t type) -> Status {
                 ids.push_back(id);
                 switch (id) {
                   case 1: {
                     MMFEED_ASSIGN_OR_RETURN(i32, q.Int(type));
                     return Status::Ok();
                   }
                   case 2: {
                     MMFEED_ASSIGN_OR_RETURN(s, q.Binary(type));
                     return Status::Ok();
                   }
                   case 5: {
                     MMFEED_ASSIGN_OR_RETURN(flag, q.Bool(type));
                     return Status::Ok();
                   }
                   case 300: {
                     MMFEED_ASSIGN_OR_RETURN(i64, q.Int(type));
                     return Status::Ok();
                   }
                 }
                 return q.Skip(type);
               }).ok());
  EXPECT_EQ(ids, (std::vector<int>{1, 2, 5, 300}));
  EXPECT_EQ(i32, -3);
  EXPECT_EQ(s, "ab");
  EXPECT_TRUE(flag);
  EXPECT_EQ(i64, 150);
  EXPECT_EQ(q.offset(), b.size());
}

TEST(ThriftCompactTest, ListsOfBooleansAndLongListsAndSkippedValues) {
  // field 1: a list of 3 booleans, a byte each (1 true; 2 for false, as some writers send),
  // field 2: a list of 16 i32 (size 15 escape, varint 16), field 3: a nested struct with a map
  // {1: "x"} and a double, skipped; stop.
  std::string b = Bytes({0x19, 0x31, 0x01, 0x02, 0x01, 0x19, 0xf5, 0x10});
  for (int i = 0; i < 16; ++i) b += Bytes({i * 2});  // zigzag of i
  b += Bytes(
      {0x1c, 0x1b, 0x01, 0x58, 0x02, 0x01, 'x', 0x17, 0, 0, 0, 0, 0, 0, 0xf0, 0x3f, 0x00, 0x00});
  ThriftReader r(b);
  std::vector<bool> bools;
  std::vector<int64_t> ints;
  ASSERT_TRUE(r.Struct([&](int16_t id, uint8_t type) -> Status {
                 if (id == 1)
                   return r.List(type, [&](uint8_t e) -> Status {
                     MMFEED_ASSIGN_OR_RETURN(const bool v, r.Bool(e));
                     bools.push_back(v);
                     return Status::Ok();
                   });
                 if (id == 2)
                   return r.List(type, [&](uint8_t e) -> Status {
                     MMFEED_ASSIGN_OR_RETURN(const int64_t v, r.Int(e));
                     ints.push_back(v);
                     return Status::Ok();
                   });
                 return r.Skip(type);
               }).ok());
  EXPECT_EQ(bools, (std::vector<bool>{true, false, true}));
  ASSERT_EQ(ints.size(), 16u);
  EXPECT_EQ(ints[15], 15);
  EXPECT_EQ(r.offset(), b.size());
}

TEST(ThriftCompactTest, HostileBytesAreErrorsNamingTheOffset) {
  const auto skip_all = [](ThriftReader& r) {
    return r.Struct([&](int16_t, uint8_t t) { return r.Skip(t); });
  };
  // A list claiming a billion elements in 4 bytes: refused before any loop.
  {
    const std::string b = Bytes({0x19, 0xf5, 0x80, 0x94, 0xeb, 0xdc, 0x03, 0x00});
    ThriftReader r(b);
    const Status st = skip_all(r);
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("elements where"), std::string::npos) << st.message();
  }
  // Structs nested 1000 deep.
  {
    std::string b;
    for (int i = 0; i < 1000; ++i) b += Bytes({0x1c});
    ThriftReader r(b);
    const Status st = skip_all(r);
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("nested"), std::string::npos) << st.message();
  }
  // A string longer than the bytes; a varint cut; an unknown type; a missing stop.
  for (const std::string& b : {Bytes({0x18, 0x7f, 'a'}), Bytes({0x15, 0x80, 0x80}),
                               Bytes({0x1e, 0x00}), Bytes({0x15, 0x02})}) {
    ThriftReader r(b);
    const Status st = skip_all(r);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.message().rfind("thrift metadata at byte ", 0), 0u) << st.message();
  }
  // A field of another type than the reader expects.
  {
    const std::string b = Bytes({0x18, 0x01, 'a', 0x00});
    ThriftReader r(b);
    const Status st = r.Struct([&](int16_t, uint8_t t) { return r.Int(t).status(); });
    EXPECT_FALSE(st.ok());
  }
}

}  // namespace
}  // namespace mmfeed::parquet
