#include "source/catalog.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <set>
#include <tuple>

#include "source/brace.h"
#include "source/shard_index.h"
#include "tests/source/tar_util.h"
#include "tests/test_util.h"

namespace mmfeed {
namespace {

using testing::TarRecord;
using testing::TempDir;
using testing::WebDataset;
using testing::WriteFile;

TEST(WebDatasetTest, GroupsMembersByKeyWithoutUnpacking) {
  TempDir dir;
  std::string jpg = testing::ReadFile(testing::TestData("photos/photo01.jpg"));
  for (int s = 0; s < 2; ++s) {
    std::string tar;
    for (int i = 0; i < 3; ++i) {
      std::string key = "sub/s" + std::to_string(s) + "_" + std::to_string(i);
      tar += TarRecord(key + ".jpg", jpg) + TarRecord(key + ".txt", "caption " + key) +
             TarRecord(key + ".json", "{}");
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
    if (name == "text")
      EXPECT_EQ(*bytes, "caption sub/s1_1");
    else
      EXPECT_EQ(*bytes, jpg);
  }
}

// A remote shard is indexed from its stream: the walker over what the keeper kept sees the
// samples it sees in the file, while the keeper holds the headers and long names only.
TEST(WebDatasetTest, IndexingAStreamKeepsItsHeadersNotItsData) {
  TempDir dir;
  std::string tar;
  std::string long_key(300, 'k');  // a GNU long name ('L' member holding the next one's name)
  for (int i = 0; i < 40; ++i) {
    const std::string key = i % 7 == 3 ? long_key + std::to_string(i) : "s" + std::to_string(i);
    if (key.size() >= 100) {
      std::string l = TarRecord("././@LongLink", key + ".jpg");
      l[156] = 'L';
      std::memset(&l[148], ' ', 8);
      unsigned sum = 0;
      for (int c = 0; c < 512; ++c) sum += static_cast<unsigned char>(l[c]);
      std::snprintf(&l[148], 8, "%06o", sum);
      tar += l;
    }
    tar += TarRecord(key.substr(0, 99) + ".jpg", std::string(200000 + i * 513, 'x'));
    tar += TarRecord("s" + std::to_string(i) + ".txt", "caption " + std::to_string(i));
  }
  tar += std::string(1024, '\0');
  WriteFile(dir / "a.tar", tar);
  auto walk = [](const TarReader& r) {
    std::string out;
    WalkTarSamples(
        r, "a.tar", 4096,
        [&](const std::string& key, const std::vector<TarMember>& members) {
          out += key;
          for (auto& m : members) out += fmt::format(" {}@{}+{}", m.ext, m.offset, m.size);
          out += "\n";
        },
        [&](const std::string& origin, const std::string& reason) {
          out += "damage " + origin + ": " + reason + "\n";
        });
    return out;
  };
  int fd = ::open((dir / "a.tar").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  const std::string want = walk(TarFile(fd));
  ::close(fd);
  ASSERT_NE(want.find(long_key + "3 jpg@"), std::string::npos) << want;
  ASSERT_EQ(want.find("damage"), std::string::npos) << want;
  for (size_t chunk : {1ul, 511ul, 512ul, 4097ul, 65536ul, tar.size()}) {
    TarHeaderKeeper keeper;
    keeper.Add("garbage of a first try", 22);
    keeper.Reset();  // a retry starts over
    for (size_t at = 0; at < tar.size(); at += chunk)
      ASSERT_TRUE(keeper.Add(tar.data() + at, std::min(chunk, tar.size() - at)));
    EXPECT_EQ(walk(keeper.Reader(tar.size())), want) << "chunks of " << chunk;
    // 81 headers, 6 long names and the end block: 512 bytes each (and the names' bytes).
    EXPECT_LT(keeper.kept_bytes(), 100u * 512) << "chunks of " << chunk;
  }
  // A stream cut short (the server sent less than its size) and a damaged header are
  // reported as the file's would be.
  TarHeaderKeeper cut;
  cut.Add(tar.data(), 300000);
  EXPECT_NE(walk(cut.Reader(tar.size())).find("damage a.tar: read failed"), std::string::npos);
  std::string bad = tar;
  const size_t header = bad.find("s20.txt");  // the header of a member in the middle
  ASSERT_EQ(header % 512, 0u);
  bad[header + 1] ^= 1;
  TarHeaderKeeper damaged;
  damaged.Add(bad.data(), bad.size());
  WriteFile(dir / "b.tar", bad);
  fd = ::open((dir / "b.tar").c_str(), O_RDONLY);
  const std::string damage = walk(TarFile(fd));
  EXPECT_NE(damage.find("damaged tar header at offset " + std::to_string(header)),
            std::string::npos);
  EXPECT_EQ(walk(damaged.Reader(bad.size())), damage);
  ::close(fd);
}

TEST(WebDatasetTest, TarCutInTheMiddleKeepsTheSamplesBeforeAndReportsTheRest) {
  TempDir dir;
  std::string tar;
  for (int i = 0; i < 4; ++i)
    tar += TarRecord("k" + std::to_string(i) + ".jpg", std::string(3000, 'x')) +
           TarRecord("k" + std::to_string(i) + ".txt", "t");
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

// index: on reads the same samples from per-shard index files: good samples equal the scanned
// catalog's, a sample without a needed member is a failed read instead of a start-up error,
// damage and unopenable shards are reported at every start.
TEST(ShardIndexTest, IndexedShardsGiveTheScannedCatalogsSamples) {
  TempDir dir;
  std::string a, b;
  for (int i = 0; i < 5; ++i) {
    const std::string key = "a/" + std::to_string(i);
    a += TarRecord(key + ".jpg", std::string(700 + i, 'j'));
    if (i != 2) a += TarRecord(key + ".txt", "caption " + key);  // a/2 has no text
    a += TarRecord(key + ".json", "{}");
  }
  WriteFile(dir / "shard-0.tar", a + std::string(1024, '\0'));
  for (int i = 0; i < 4; ++i)
    b += TarRecord("b" + std::to_string(i) + ".png", std::string(3000, 'p')) +
         TarRecord("b" + std::to_string(i) + ".txt", "t");
  WriteFile(dir / "shard-1.tar", b.substr(0, 3 * 4096 + 700));  // cut in b2.txt's header
  // shard-2.tar does not exist.
  SourceConfig s = WebDataset(dir / "shard-{0..2}.tar");
  s.index = "off";
  Result<Catalog> scanned = LoadWebDataset(s, {"image", "text"});
  ASSERT_TRUE(scanned.ok());
  ASSERT_EQ(scanned->entries.size(), 6u);  // a/0 a/1 a/3 a/4 b0 b1
  s.index = "on";
  Result<Catalog> cat = LoadWebDataset(s, {"image", "text"});
  ASSERT_TRUE(cat.ok()) << cat.status().message();
  ASSERT_TRUE(cat->indexed());
  EXPECT_EQ(cat->shards->built(), 2u);
  EXPECT_TRUE(std::filesystem::exists(dir / "shard-0.tar.mmfidx"));
  ASSERT_EQ(cat->size(), 8u);  // a/2 and b2 (its .png whole, its .txt cut) are in the index
  std::vector<std::string> good;
  std::vector<std::string> failed;
  CatalogEntry e;
  for (size_t i = 0; i < cat->size(); ++i) {
    Status st = cat->Read(i, &e);
    if (!st.ok()) {
      EXPECT_EQ(st.code(), Status::Code::kCorrupt);
      failed.push_back(e.origin + " " + st.message());
      continue;
    }
    good.push_back(e.id);
    const CatalogEntry& want = scanned->entries[good.size() - 1];
    EXPECT_EQ(e.id, want.id);
    EXPECT_EQ(e.origin, want.origin);
    ASSERT_EQ(e.fields.size(), want.fields.size());
    for (size_t f = 0; f < e.fields.size(); ++f) {
      EXPECT_EQ(e.fields[f].first, want.fields[f].first);
      EXPECT_EQ(e.fields[f].second.data, want.fields[f].second.data);
      EXPECT_EQ(e.fields[f].second.offset, want.fields[f].second.offset);
      EXPECT_EQ(e.fields[f].second.size, want.fields[f].second.size);
    }
  }
  EXPECT_EQ(good.size(), 6u);
  EXPECT_EQ(failed, (std::vector<std::string>{
                        dir / "shard-0.tar:a/2 sample has no member for field 'text'",
                        dir / "shard-1.tar:b2 sample has no member for field 'text'"}));
  auto reasons = [](const Catalog& c) {
    std::vector<std::string> v;
    for (const LoadError& l : c.errors) v.push_back(l.origin + " " + l.reason.substr(0, 20));
    return v;
  };
  const std::vector<std::string> damage = {dir / "shard-1.tar tar truncated at off",
                                           dir / "shard-2.tar cannot open: No such"};
  EXPECT_EQ(reasons(*cat), damage);

  // The next start maps the files, reports the same damage; a changed shard is indexed again.
  Result<Catalog> again = LoadWebDataset(s, {"image", "text"});
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->shards->built(), 0u);
  EXPECT_EQ(again->size(), 8u);
  EXPECT_EQ(reasons(*again), damage);
  EXPECT_EQ(again->index_fingerprint(), cat->index_fingerprint());
  WriteFile(dir / "shard-1.tar", b + std::string(1024, '\0'));
  Result<Catalog> changed = LoadWebDataset(s, {"image", "text"});
  ASSERT_TRUE(changed.ok());
  EXPECT_EQ(changed->shards->built(), 1u);
  EXPECT_EQ(changed->size(), 9u);
  EXPECT_NE(changed->index_fingerprint(), cat->index_fingerprint());
  ASSERT_TRUE(changed->Read(8, &e).ok());
  EXPECT_EQ(e.id, "b3");

  // A damaged index file is rebuilt; with a state dir the files go there; where nothing can be
  // written, they stay in memory.
  WriteFile(dir / "shard-0.tar.mmfidx", "garbage");
  Result<Catalog> mended = LoadWebDataset(s, {"image", "text"});
  ASSERT_TRUE(mended.ok());
  EXPECT_EQ(mended->shards->built(), 1u);
  ASSERT_TRUE(mended->Read(4, &e).ok());
  EXPECT_EQ(e.id, "a/4");
  s.index_dir = dir / "state";
  Result<Catalog> kept = LoadWebDataset(s, {"image", "text"});
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(kept->shards->built(), 2u);
  EXPECT_EQ(kept->shards->in_memory(), 0u);
  EXPECT_FALSE(std::filesystem::is_empty(dir / "state/index"));
  WriteFile(dir / "not-a-dir", "x");
  s.index_dir = dir / "not-a-dir";
  Result<Catalog> memory = LoadWebDataset(s, {"image", "text"});
  ASSERT_TRUE(memory.ok());
  EXPECT_EQ(memory->shards->in_memory(), 2u);
  EXPECT_EQ(memory->size(), 9u);
  ASSERT_TRUE(memory->Read(8, &e).ok());
  EXPECT_EQ(e.id, "b3");
}

TEST(ManifestTest, MalformedLinesAreReportedWithLineNumbers) {
  TempDir dir;
  WriteFile(
      dir / "m.jsonl",
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

// A mixture's source (SourceConfig::fields_optional): a sample may lack some of the fields the
// stages read, not all of them.
TEST(ManifestTest, AMixturesSampleMayLackSomeFieldsNotAll) {
  TempDir dir;
  WriteFile(dir / "m.jsonl",
            "{\"id\": \"a\", \"image\": \"x.jpg\", \"text\": \"hi\"}\n"
            "{\"id\": \"b\", \"text\": \"text only\"}\n"
            "{\"id\": \"c\", \"answer\": \"neither\"}\n");
  Result<Catalog> cat = LoadManifest(dir / "m.jsonl", {"image", "text"}, {"image"}, {}, true);
  ASSERT_TRUE(cat.ok());
  ASSERT_EQ(cat->entries.size(), 2u);
  ASSERT_EQ(cat->entries[1].fields.size(), 1u);
  EXPECT_EQ(cat->entries[1].fields[0].first, "text");
  ASSERT_EQ(cat->errors.size(), 1u);
  EXPECT_EQ(cat->errors[0].reason, "has none of the fields the stages read (image, text)");
  Result<Catalog> strict = LoadManifest(dir / "m.jsonl", {"image", "text"}, {"image"});
  ASSERT_TRUE(strict.ok());
  EXPECT_EQ(strict->entries.size(), 1u) << "one source: every field is needed";
}

TEST(ManifestTest, AFieldMayListSeveralValues) {
  TempDir dir;
  std::string many = "[";
  for (int i = 0; i < 257; ++i) many += std::string(i ? "," : "") + "\"x.jpg\"";
  many += "]";
  WriteFile(
      dir / "m.jsonl",
      "{\"id\": \"a\", \"images\": [\"x.jpg\", {\"path\": \"/abs/y.jpg\"}], \"text\": \"hi\"}\n"
      "{\"id\": \"b\", \"images\": [], \"text\": \"hi\"}\n"
      "{\"id\": \"c\", \"images\": [\"x.jpg\", [\"nested.jpg\"]], \"text\": \"hi\"}\n"
      "{\"id\": \"d\", \"images\": [\"\"], \"text\": \"hi\"}\n"
      "{\"id\": \"e\", \"images\": " +
          many +
          ", \"text\": \"hi\"}\n"
          "{\"id\": \"f\", \"images\": \"z.jpg\", \"text\": [\"one\", \"two\"]}\n");
  Result<Catalog> cat = LoadManifest(dir / "m.jsonl", {"images", "text"}, {"images"});
  ASSERT_TRUE(cat.ok());
  ASSERT_EQ(cat->entries.size(), 3u);
  const FieldValue& a = cat->entries[0].fields[0].second;
  ASSERT_EQ(a.kind, FieldValue::Kind::kList);
  ASSERT_EQ(a.items.size(), 2u);
  EXPECT_EQ(a.items[0].kind, FieldValue::Kind::kPath);
  EXPECT_EQ(a.items[0].data, dir / "x.jpg") << "resolved against the manifest's folder";
  EXPECT_EQ(a.items[1].data, "/abs/y.jpg");
  const FieldValue& none = cat->entries[1].fields[0].second;
  EXPECT_EQ(none.kind, FieldValue::Kind::kList) << "an empty list: no images";
  EXPECT_TRUE(none.items.empty());
  EXPECT_EQ(cat->entries[2].fields[0].second.kind, FieldValue::Kind::kPath) << "one value";
  const FieldValue& texts = cat->entries[2].fields[1].second;
  ASSERT_EQ(texts.kind, FieldValue::Kind::kList);
  EXPECT_EQ(texts.items[1].kind, FieldValue::Kind::kText);
  EXPECT_EQ(texts.items[1].data, "two");
  ASSERT_EQ(cat->errors.size(), 3u);
  EXPECT_NE(cat->errors[0].reason.find("must be a string, {\"path\": ...} or a list"),
            std::string::npos);
  EXPECT_EQ(cat->errors[1].reason, "field 'images' has an empty path");
  EXPECT_EQ(cat->errors[2].reason,
            "field 'images' is a list of 257 values: at most 256 are allowed");
}

// The same manifest through its index: entries are located at start and parsed when read;
// blank lines keep the line numbers right, a malformed line is a failed read naming its line.
TEST(ManifestIndexTest, LocatesLinesAndParsesThemWhenRead) {
  TempDir dir;
  const std::string text =
      "{\"id\": \"a\", \"image\": \"x.jpg\", \"text\": \"hi\"}\n"
      "\n"
      "  \t\r\n"
      "{\"id\": \"b\", \"image\": \"x.jpg\"\n"
      "{\"id\": \"c\", \"image\": \"y.jpg\", \"text\": \"crlf\"}\r\n"
      "{\"image\": \"z.jpg\", \"text\": \"no newline, no id\"}";
  WriteFile(dir / "m.jsonl", text);
  SourceConfig s;
  s.type = "manifest";
  s.path = dir / "m.jsonl";
  s.index = "on";
  Result<Catalog> cat = LoadCatalog(s, {"image", "text"}, {"image"});
  ASSERT_TRUE(cat.ok()) << cat.status().message();
  ASSERT_NE(cat->index, nullptr);
  EXPECT_TRUE(cat->index->built());
  EXPECT_EQ(cat->index->path(), dir / "m.jsonl.mmfidx");
  ASSERT_EQ(cat->size(), 4u);
  CatalogEntry e;
  ASSERT_TRUE(cat->Read(0, &e).ok());
  EXPECT_EQ(e.id, "a");
  EXPECT_EQ(e.fields[0].second.data, dir / "x.jpg");
  Status bad = cat->Read(1, &e);
  EXPECT_EQ(bad.code(), Status::Code::kCorrupt);
  EXPECT_EQ(e.origin, dir / "m.jsonl:4");
  ASSERT_TRUE(cat->Read(2, &e).ok());
  EXPECT_EQ(e.id, "c");
  EXPECT_EQ(e.origin, dir / "m.jsonl:5");
  ASSERT_TRUE(cat->Read(3, &e).ok());
  EXPECT_EQ(e.id, "m.jsonl:6");
  EXPECT_EQ(e.fields[1].second.data, "no newline, no id");

  // The next open maps the same index; a changed manifest is indexed again.
  Result<Catalog> again = LoadCatalog(s, {"image", "text"}, {"image"});
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->index->built());
  EXPECT_EQ(again->index->fingerprint(), cat->index->fingerprint());
  WriteFile(dir / "m.jsonl", text + "\n{\"id\": \"d\", \"image\": \"x.jpg\", \"text\": \"t\"}\n");
  Result<Catalog> changed = LoadCatalog(s, {"image", "text"}, {"image"});
  ASSERT_TRUE(changed.ok());
  EXPECT_TRUE(changed->index->built());
  EXPECT_EQ(changed->size(), 5u);
  EXPECT_NE(changed->index->fingerprint(), cat->index->fingerprint());
  ASSERT_TRUE(changed->Read(4, &e).ok());
  EXPECT_EQ(e.id, "d");

  // With a state dir, the index goes there; where nothing can be written, it stays in memory.
  s.index_dir = dir / "state";
  Result<Catalog> kept = LoadCatalog(s, {"image", "text"}, {"image"});
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(kept->index->path().rfind(dir / "state/index/m.jsonl-", 0), 0u) << kept->index->path();
  WriteFile(dir / "not-a-dir", "x");
  s.index_dir = dir / "not-a-dir";
  Result<Catalog> memory = LoadCatalog(s, {"image", "text"}, {"image"});
  ASSERT_TRUE(memory.ok());
  EXPECT_EQ(memory->index->path(), "");
  EXPECT_EQ(memory->size(), 5u);
  ASSERT_TRUE(memory->Read(2, &e).ok());
  EXPECT_EQ(e.id, "c");
}

// A write that fails inside the scan (here the file-size limit, as a full disk would) leaves
// no index file behind and keeps the index in memory, like a folder that cannot be written.
TEST(ManifestIndexTest, AWriteFailureWhileIndexingKeepsTheIndexInMemory) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 20000; ++i)
    text += "{\"id\": \"s" + std::to_string(i) + "\", \"text\": \"t\"}\n" + (i % 7 ? "" : "\n");
  WriteFile(dir / "m.jsonl", text);
  SourceConfig s;
  s.type = "manifest";
  s.path = dir / "m.jsonl";
  s.index = "on";
  struct rlimit old;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old;
  small.rlim_cur = 64 << 10;  // the offsets alone are 160 KB
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  Result<Catalog> cat = LoadCatalog(s, {"text"}, {});
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &old), 0);
  ASSERT_TRUE(cat.ok()) << cat.status().message();
  EXPECT_EQ(cat->index->path(), "");
  EXPECT_TRUE(cat->index->built());
  EXPECT_FALSE(std::filesystem::exists(dir / "m.jsonl.mmfidx"));
  EXPECT_FALSE(std::filesystem::exists(dir / "m.jsonl.mmfidx.tmp"));
  EXPECT_FALSE(std::filesystem::exists(dir / "m.jsonl.mmfidx.marks.tmp"));
  ASSERT_EQ(cat->size(), 20000u);
  CatalogEntry e;
  ASSERT_TRUE(cat->Read(19999, &e).ok());
  EXPECT_EQ(e.id, "s19999");
  EXPECT_EQ(e.origin, dir / "m.jsonl:22857");  // the 20000th entry, after 2857 blank lines
}

// Daemons on several nodes may index one manifest on a shared file system at once: each builds
// through its own temporary file and every one gets the whole index; one index file is left,
// and no temporary beside it. A temporary file left an hour ago (a daemon killed while
// indexing) is removed by the next build; a recent one (a live build) is not.
TEST(ManifestIndexTest, ProcessesIndexingOneManifestAtOnceAllSucceed) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 200000; ++i)
    text += "{\"id\": \"s" + std::to_string(i) + "\", \"text\": \"caption\"}\n";
  WriteFile(dir / "m.jsonl", text);
  WriteFile(dir / "m.jsonl.mmfidx.4242.tmp", "left by a killed daemon");
  WriteFile(dir / "m.jsonl.mmfidx.4343.marks.tmp", "and its marks");
  WriteFile(dir / "m.jsonl.mmfidx.4444.tmp", "a live build elsewhere");
  const auto hours_ago = std::filesystem::file_time_type::clock::now() - std::chrono::hours(2);
  std::filesystem::last_write_time(dir / "m.jsonl.mmfidx.4242.tmp", hours_ago);
  std::filesystem::last_write_time(dir / "m.jsonl.mmfidx.4343.marks.tmp", hours_ago);
  SourceConfig s;
  s.type = "manifest";
  s.path = dir / "m.jsonl";
  s.index = "on";
  std::vector<pid_t> children;
  for (int c = 0; c < 4; ++c) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      Result<Catalog> cat = LoadCatalog(s, {"text"}, {});
      CatalogEntry e;
      const bool ok =
          cat.ok() && cat->size() == 200000 && cat->Read(199999, &e).ok() && e.id == "s199999";
      ::_exit(ok ? 0 : 1);
    }
    children.push_back(pid);
  }
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  }
  std::set<std::string> files;
  for (const auto& f : std::filesystem::directory_iterator(dir.path()))
    files.insert(f.path().filename());
  EXPECT_EQ(files, (std::set<std::string>{"m.jsonl", "m.jsonl.mmfidx", "m.jsonl.mmfidx.4444.tmp"}));
  Result<Catalog> after = LoadCatalog(s, {"text"}, {});
  ASSERT_TRUE(after.ok());
  EXPECT_FALSE(after->index->built());
}

// A manifest below kIndexAutoBytes is parsed at start with index: auto; index: off always.
TEST(ManifestIndexTest, AutoIndexesOnlyLargeManifests) {
  TempDir dir;
  WriteFile(dir / "m.jsonl", "{\"id\": \"a\", \"text\": \"hi\"}\n");
  SourceConfig s;
  s.type = "manifest";
  s.path = dir / "m.jsonl";
  Result<Catalog> small = LoadCatalog(s, {"text"}, {});
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(small->index, nullptr);
  EXPECT_EQ(small->size(), 1u);
  EXPECT_FALSE(std::filesystem::exists(dir / "m.jsonl.mmfidx"));
}

}  // namespace
}  // namespace mmfeed
