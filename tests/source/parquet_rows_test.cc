// Parquet's record assembly (source/parquet/rows.h) on levels written by hand from the
// specification's rules, for what DuckDB's files in tests/integration do not hold: every kind of
// null and empty in a list of structs (a null list, an empty one, a null element, a null field),
// and levels that lie (a row that starts with a repetition, more rows or values than the row
// group holds, leaves that disagree on a list's length).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "source/parquet/rows.h"

namespace mmfeed::parquet {
namespace {

using json = nlohmann::ordered_json;

// conversations: optional group (LIST) { repeated group list { optional group element {
// optional binary role (UTF8); optional binary content (UTF8) } } }: HF chat turns.
FileMetaData Chat() {
  FileMetaData m;
  auto group = [](std::string name, Repetition r, int32_t children) {
    SchemaElement e;
    e.name = std::move(name);
    e.repetition = r;
    e.num_children = children;
    return e;
  };
  auto text = [](std::string name) {
    SchemaElement e;
    e.name = std::move(name);
    e.type = PhysicalType::kByteArray;
    e.repetition = Repetition::kOptional;
    e.converted_type = 0;  // UTF8
    return e;
  };
  m.schema = {group("schema", Repetition::kRequired, 1),
              group("conversations", Repetition::kOptional, 1),
              group("list", Repetition::kRepeated, 1),
              group("element", Repetition::kOptional, 2),
              text("role"),
              text("content")};
  m.schema[1].logical_type = "LIST";
  for (size_t i : {4, 5})
    m.leaves.push_back({{"conversations", "list", "element", m.schema[i].name},
                        PhysicalType::kByteArray,
                        0,
                        4,
                        1,
                        i,
                        {1, 2, 3, i}});
  return m;
}

// A leaf's entries: (repetition, definition, value when defined at 4).
ColumnValues Leaf(const std::vector<std::tuple<int, int, std::string>>& entries) {
  ColumnValues v;
  for (const auto& [r, d, value] : entries) {
    v.repetition.push_back(static_cast<int16_t>(r));
    v.definition.push_back(static_cast<int16_t>(d));
    if (d == 4) {
      v.data += value;
      v.offsets.push_back(v.data.size());
    }
  }
  return v;
}

TEST(ParquetRowsTest, ListsOfStructsKeepEveryNullAndEmpty) {
  const FileMetaData m = Chat();
  const SchemaTree tree(m);
  ASSERT_EQ(tree.Top(m, "conversations"), 1u);
  EXPECT_EQ(tree.Top(m, "other"), SchemaTree::npos);
  EXPECT_EQ(TypeName(m, tree, 1),
            "list<struct<role: BYTE_ARRAY (STRING), content: BYTE_ARRAY (STRING)>>");
  // Row 0: two turns, the second's content null; row 1: null; row 2: []; row 3: [null].
  const ColumnValues role =
      Leaf({{0, 4, "user"}, {1, 4, "assistant"}, {0, 0, ""}, {0, 1, ""}, {0, 2, ""}});
  const ColumnValues content = Leaf({{0, 4, "q"}, {1, 3, ""}, {0, 0, ""}, {0, 1, ""}, {0, 2, ""}});
  Result<std::vector<json>> rows = AssembleColumn(m, tree, 1, {0, 1}, {role, content}, 4, "f");
  ASSERT_TRUE(rows.ok()) << rows.status().message();
  ASSERT_EQ(rows->size(), 4u);
  EXPECT_EQ((*rows)[0].dump(),
            R"([{"role":"user","content":"q"},{"role":"assistant","content":null}])");
  EXPECT_TRUE((*rows)[1].is_null());
  EXPECT_EQ((*rows)[2].dump(), "[]");
  EXPECT_EQ((*rows)[3].dump(), "[null]");
}

TEST(ParquetRowsTest, LevelsThatLieAreRefusedNamingTheColumn) {
  const FileMetaData m = Chat();
  const SchemaTree tree(m);
  const ColumnValues ok = Leaf({{0, 4, "a"}, {0, 4, "b"}});
  auto fails = [&](const ColumnValues& role, const ColumnValues& content, int64_t rows,
                   const std::string& why) {
    Result<std::vector<json>> r = AssembleColumn(m, tree, 1, {0, 1}, {role, content}, rows, "f");
    ASSERT_FALSE(r.ok()) << why;
    EXPECT_EQ(r.status().message().rfind("f: column 'conversations.list.element.", 0), 0u)
        << r.status().message();
    EXPECT_NE(r.status().message().find(why), std::string::npos) << r.status().message();
  };
  fails(Leaf({{1, 4, "a"}, {0, 4, "b"}}), ok, 2, "continues a row");
  fails(ok, ok, 1, "more rows than the row group's 1");
  fails(ok, ok, 3, "2 entries for the row group's 3 rows");  // a row count past the entries
  fails(ok, ok, 1u << 30, "entries for the row group's");    // nothing made for the lie
  fails(Leaf({{0, 4, "a"}, {1, 4, "b"}}), Leaf({{0, 4, "x"}}), 1, "disagree");
  ColumnValues short_values = ok;
  short_values.offsets.pop_back();
  fails(short_values, ok, 2, "more values than its 1 values");
  ColumnValues past = ok;
  past.definition[0] = 3;  // a null field, yet its value is there: one value left over
  fails(past, ok, 2, "2 values, its levels place 1");
}

}  // namespace
}  // namespace mmfeed::parquet
