#include "stages/source/catalog.h"

#include <gtest/gtest.h>

#include <cstring>
#include <set>

#include "stages/source/brace.h"
#include "tests/test_util.h"

namespace mmfeed {
namespace {

using testing::TempDir;
using testing::WriteFile;

TEST(BraceTest, ExpandsRangesWithPaddingAndLists) {
  auto r = ExpandBraces("data/shard-{00000..00003}.tar");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, (std::vector<std::string>{"data/shard-00000.tar", "data/shard-00001.tar", "data/shard-00002.tar",
                                          "data/shard-00003.tar"}));
  r = ExpandBraces("{train,val}-{0..1}.tar");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, (std::vector<std::string>{"train-0.tar", "train-1.tar", "val-0.tar", "val-1.tar"}));
  EXPECT_FALSE(ExpandBraces("shard-{5..1}.tar").ok());
  EXPECT_FALSE(ExpandBraces("shard-{1..x}.tar").ok());
  EXPECT_FALSE(ExpandBraces("shard-{1..2.tar").ok());
}

// A minimal ustar writer for the tests.
std::string TarMember(const std::string& name, const std::string& data) {
  char h[512] = {};
  std::strncpy(h, name.c_str(), 99);
  std::snprintf(h + 100, 8, "%07o", 0644);
  std::snprintf(h + 108, 8, "%07o", 0);
  std::snprintf(h + 116, 8, "%07o", 0);
  std::snprintf(h + 124, 12, "%011lo", static_cast<unsigned long>(data.size()));
  std::snprintf(h + 136, 12, "%011o", 0);
  h[156] = '0';
  std::memcpy(h + 257, "ustar", 6);
  std::memcpy(h + 263, "00", 2);
  std::memset(h + 148, ' ', 8);
  unsigned sum = 0;
  for (unsigned char c : h) sum += c;
  std::snprintf(h + 148, 8, "%06o", sum);
  std::string out(h, 512);
  out += data;
  out.append((512 - data.size() % 512) % 512, '\0');
  return out;
}

SourceConfig WebDataset(const std::string& pattern) {
  SourceConfig s;
  s.type = "webdataset";
  s.path = pattern;
  s.fields = {{"image", {"jpg", "png"}}, {"text", {"txt"}}};
  return s;
}

TEST(WebDatasetTest, GroupsMembersByKeyWithoutUnpacking) {
  TempDir dir;
  std::string jpg = testing::ReadFile(testing::TestData("photos/photo01.jpg"));
  for (int s = 0; s < 2; ++s) {
    std::string tar;
    for (int i = 0; i < 3; ++i) {
      std::string key = "sub/s" + std::to_string(s) + "_" + std::to_string(i);
      tar += TarMember(key + ".jpg", jpg) + TarMember(key + ".txt", "caption " + key) + TarMember(key + ".json", "{}");
    }
    tar += std::string(1024, '\0');
    WriteFile(dir / ("shard-0" + std::to_string(s) + ".tar"), tar);
  }
  Result<Catalog> cat = LoadWebDataset(WebDataset(dir / "shard-{00..01}.tar"), {"image", "text"});
  ASSERT_TRUE(cat.ok()) << cat.status().message();
  EXPECT_TRUE(cat->errors.empty()) << cat->errors[0].reason;
  ASSERT_EQ(cat->entries.size(), 6u);
  const CatalogEntry& e = cat->entries[4];
  EXPECT_EQ(e.id, "sub/s1_1");
  ASSERT_EQ(e.fields.size(), 2u);
  std::string storage;
  for (auto& [name, value] : e.fields) {
    Result<std::string_view> bytes = FieldBytes(value, &storage);
    ASSERT_TRUE(bytes.ok());
    if (name == "text") EXPECT_EQ(*bytes, "caption sub/s1_1");
    else EXPECT_EQ(*bytes, jpg);
  }
}

TEST(WebDatasetTest, TarCutInTheMiddleKeepsTheSamplesBeforeAndReportsTheRest) {
  TempDir dir;
  std::string tar;
  for (int i = 0; i < 4; ++i)
    tar += TarMember("k" + std::to_string(i) + ".jpg", std::string(3000, 'x')) + TarMember("k" + std::to_string(i) + ".txt", "t");
  WriteFile(dir / "cut.tar", tar.substr(0, 3 * 4096 + 700));  // inside k3.jpg's data
  Result<Catalog> cat = LoadWebDataset(WebDataset(dir / "cut.tar"), {"image", "text"});
  ASSERT_TRUE(cat.ok());
  ASSERT_EQ(cat->entries.size(), 2u);  // k0 and k1; the cut falls in k2.txt
  EXPECT_EQ(cat->entries[1].id, "k1");
  ASSERT_GE(cat->errors.size(), 1u);
  bool truncated = false;
  for (auto& e : cat->errors) truncated |= e.reason.find("tar truncated") != std::string::npos;
  EXPECT_TRUE(truncated);
  EXPECT_NE(cat->errors.back().origin.find("cut.tar"), std::string::npos);
}

TEST(ManifestTest, MalformedLinesAreReportedWithLineNumbers) {
  TempDir dir;
  WriteFile(dir / "m.jsonl",
            "{\"id\": \"a\", \"image\": \"x.jpg\", \"text\": \"hi\"}\n"
            "\n"
            "{\"id\": \"b\", \"image\": \"x.jpg\"\n"
            "[1, 2]\n"
            "{\"id\": \"c\", \"image\": \"x.jpg\"}\n"
            "{\"id\": \"d\", \"image\": {\"path\": \"/abs/y.jpg\"}, \"text\": {\"path\": \"t.txt\"}}\n"
            "{\"id\": \"e\", \"image\": 5, \"text\": \"x\"}\n");
  Result<Catalog> cat = LoadManifest(dir / "m.jsonl", {"image", "text"}, {"image"});
  ASSERT_TRUE(cat.ok());
  ASSERT_EQ(cat->entries.size(), 2u);
  EXPECT_EQ(cat->entries[0].fields[0].second.data, dir / "x.jpg");
  EXPECT_EQ(cat->entries[0].fields[0].second.kind, FieldValue::Kind::kPath);
  EXPECT_EQ(cat->entries[0].fields[1].second.kind, FieldValue::Kind::kText);
  EXPECT_EQ(cat->entries[1].fields[0].second.data, "/abs/y.jpg");
  EXPECT_EQ(cat->entries[1].fields[1].second.data, dir / "t.txt");
  ASSERT_EQ(cat->errors.size(), 4u);
  EXPECT_EQ(cat->errors[0].origin, dir / "m.jsonl:3");
  EXPECT_EQ(cat->errors[1].origin, dir / "m.jsonl:4");
  EXPECT_EQ(cat->errors[2].reason, "missing field 'text'");
  EXPECT_EQ(cat->errors[3].origin, dir / "m.jsonl:7");
}

TEST(EpochOrderTest, NodesGetDisjointEqualShares) {
  SourceConfig s;
  s.shuffle = true;
  s.seed = 3;
  s.num_nodes = 3;
  std::set<uint32_t> all;
  for (int node = 0; node < 3; ++node) {
    s.node_rank = node;
    std::vector<uint32_t> o = EpochOrder(100, s, 0, 4);
    EXPECT_EQ(o.size(), 32u);  // 33 per node, trimmed to a multiple of 4 ranks
    for (uint32_t i : o) EXPECT_TRUE(all.insert(i).second);
    EXPECT_EQ(o, EpochOrder(100, s, 0, 4)) << "deterministic";
    EXPECT_NE(o, EpochOrder(100, s, 1, 4)) << "new order each epoch";
  }
  s.shuffle = false;
  s.num_nodes = 1;
  s.node_rank = 0;
  std::vector<uint32_t> plain = EpochOrder(5, s, 0, 1);
  EXPECT_EQ(plain, (std::vector<uint32_t>{0, 1, 2, 3, 4}));
}

}  // namespace
}  // namespace mmfeed
