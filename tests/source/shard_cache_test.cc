#include "source/shard_cache.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <filesystem>
#include <map>

#include "tests/test_util.h"

namespace mmfeed {
namespace {

using testing::TempDir;

std::string Bytes(int fd, size_t n) {
  std::string s(n, '\0');
  EXPECT_EQ(::pread(fd, s.data(), n, 0), static_cast<ssize_t>(n));
  return s;
}

// Fetches `body` for `url` into the cache as the store does: Begin, write, Commit.
void Put(ShardCache* c, const std::string& url, const std::string& body,
         const ShardCache::Rank& rank = nullptr, uint64_t self = 0) {
  const int fd = c->Begin();
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::pwrite(fd, body.data(), body.size(), 0), static_cast<ssize_t>(body.size()));
  c->Commit(fd, {url, body.size(), "etag-1|5"}, rank, self);
  EXPECT_EQ(Bytes(fd, body.size()), body);  // readable whether kept or not
  ::close(fd);
}

bool Has(ShardCache* c, const std::string& url, size_t size) {
  const int fd = c->Find({url, size, "etag-1|5"}, true);
  if (fd >= 0) ::close(fd);
  return fd >= 0;
}

std::vector<std::string> CachedFiles(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".shard") out.push_back(e.path().string());
  return out;
}

TEST(ShardCacheTest, KeepsAShardAndServesItToTheNextOpenerOnly) {
  TempDir tmp;
  const std::string body(5000, 'x');
  {
    auto c = ShardCache::Open(tmp / "cache", 1 << 20);
    ASSERT_TRUE(c.ok()) << c.status().message();
    EXPECT_EQ((*c)->Find({"http://h/a.tar", body.size(), "etag-1|5"}, true), -1);
    Put(c->get(), "http://h/a.tar", body);
  }
  auto c = ShardCache::Open(tmp / "cache", 1 << 20);  // a restart finds it
  const int fd = (*c)->Find({"http://h/a.tar", body.size(), "etag-1|5"}, true);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(Bytes(fd, body.size()), body);
  ::close(fd);
  const nlohmann::json st = (*c)->Stats();
  EXPECT_EQ(st["hits"], 1u);
  EXPECT_EQ(st["files"], 1u);
  // Another stamp (the object changed), another size, another URL: not served; a stale copy is
  // removed.
  EXPECT_FALSE(Has(c->get(), "http://h/b.tar", body.size()));
  EXPECT_EQ((*c)->Find({"http://h/a.tar", body.size(), "etag-2|6"}, true), -1);
  EXPECT_TRUE(CachedFiles(tmp / "cache").empty());
  EXPECT_EQ((*c)->Stats()["damaged"], 1u);
}

TEST(ShardCacheTest, ADamagedFileIsRemovedNeverServed) {
  TempDir tmp;
  auto c = ShardCache::Open(tmp / "cache", 1 << 20);
  const std::string body(4096, 'y');
  for (const char* damage : {"truncate", "zero tail", "extend"}) {
    Put(c->get(), "http://h/a.tar", body);
    const std::vector<std::string> files = CachedFiles(tmp / "cache");
    ASSERT_EQ(files.size(), 1u);
    const auto size = std::filesystem::file_size(files[0]);
    if (std::string(damage) == "truncate") std::filesystem::resize_file(files[0], size - 3);
    if (std::string(damage) == "extend") std::filesystem::resize_file(files[0], size + 1);
    if (std::string(damage) == "zero tail") {
      const int fd = ::open(files[0].c_str(), O_WRONLY);
      ASSERT_EQ(::pwrite(fd, "\0\0\0\0", 4, static_cast<off_t>(size - 4)), 4);
      ::close(fd);
    }
    EXPECT_FALSE(Has(c->get(), "http://h/a.tar", body.size())) << damage;
    EXPECT_TRUE(CachedFiles(tmp / "cache").empty()) << damage;
  }
  // A symlink or a folder planted under a shard's name is not followed or served.
  Put(c->get(), "http://h/a.tar", body);
  const std::string name = CachedFiles(tmp / "cache")[0];
  std::filesystem::remove(name);
  testing::WriteFile(tmp / "secret", std::string(body.size() + 200, 's'));
  std::filesystem::create_symlink(tmp / "secret", name);
  EXPECT_FALSE(Has(c->get(), "http://h/a.tar", body.size()));
  EXPECT_TRUE(std::filesystem::exists(tmp / "secret"));
  EXPECT_FALSE(std::filesystem::is_symlink(name));
  // A folder under the name: that shard is not kept, and the cache goes on for the others.
  std::filesystem::create_directory(name);
  Put(c->get(), "http://h/a.tar", body);
  EXPECT_FALSE(Has(c->get(), "http://h/a.tar", body.size()));
  Put(c->get(), "http://h/b.tar", body);
  EXPECT_TRUE(Has(c->get(), "http://h/b.tar", body.size()));
  EXPECT_EQ((*c)->Stats()["write_failures"], 0u);
}

// Bytes edited in place, the file's size kept (its trailer intact): caught by the checksums,
// whether the whole shard is checked or only the blocks a member covers; never served.
TEST(ShardCacheTest, BytesEditedInPlaceAreCaughtByTheChecksums) {
  TempDir tmp;
  auto c = ShardCache::Open(tmp / "cache", 16 << 20);
  std::string body(5 * ShardCache::kBlock + 777, '\0');
  for (size_t i = 0; i < body.size(); ++i) body[i] = static_cast<char>(i * 7 + i / 251);
  const ShardCache::Key key{"http://h/a.tar", body.size(), "etag-1|5"};
  auto tamper = [&](uint64_t at) {
    const std::vector<std::string> files = CachedFiles(tmp / "cache");
    ASSERT_EQ(files.size(), 1u);
    const int fd = ::open(files[0].c_str(), O_RDWR);
    char b;
    ASSERT_EQ(::pread(fd, &b, 1, static_cast<off_t>(at)), 1);
    b ^= 0x20;
    ASSERT_EQ(::pwrite(fd, &b, 1, static_cast<off_t>(at)), 1);
    ::close(fd);
  };
  uint64_t damaged = 0;
  // The whole shard checked: one byte of the last, short block.
  Put(c->get(), key.url, body);
  tamper(body.size() - 5);
  EXPECT_EQ((*c)->Find(key, true), -1);
  EXPECT_EQ((*c)->Stats()["damaged"], ++damaged);
  EXPECT_TRUE(CachedFiles(tmp / "cache").empty());
  // A member's blocks only: a member away from the edit is served, the edited one is not.
  Put(c->get(), key.url, body);
  tamper(3 * ShardCache::kBlock + 10);
  int fd = (*c)->Find(key, false);
  ASSERT_GE(fd, 0);
  auto read_at = [](int f, uint64_t at, uint64_t n) {
    std::string s(n, '\0');
    EXPECT_EQ(::pread(f, s.data(), n, static_cast<off_t>(at)), static_cast<ssize_t>(n));
    return s;
  };
  const int near = (*c)->CheckedCopy(fd, key, 100, 2 * ShardCache::kBlock);
  ASSERT_GE(near, 0);
  EXPECT_EQ(read_at(near, 100, 2 * ShardCache::kBlock), body.substr(100, 2 * ShardCache::kBlock));
  const int last =
      (*c)->CheckedCopy(fd, key, 4 * ShardCache::kBlock, body.size() - 4 * ShardCache::kBlock);
  ASSERT_GE(last, 0);
  // What was checked stays what is read, whatever is done to the file afterwards.
  tamper(4 * ShardCache::kBlock + 1);
  EXPECT_EQ(read_at(last, 4 * ShardCache::kBlock, 20), body.substr(4 * ShardCache::kBlock, 20));
  ::close(near);
  ::close(last);
  EXPECT_EQ((*c)->CheckedCopy(fd, key, 3 * ShardCache::kBlock - 10, 30), -1);
  ::close(fd);
  EXPECT_EQ((*c)->Stats()["damaged"], ++damaged);
  EXPECT_TRUE(CachedFiles(tmp / "cache").empty());
  // A private copy of the whole shard: checked as it is copied, and unaffected by later edits.
  Put(c->get(), key.url, body);
  fd = (*c)->Find(key, true, /*private_copy=*/true);
  ASSERT_GE(fd, 0);
  tamper(9);
  EXPECT_EQ(read_at(fd, 0, body.size()), body);
  ::close(fd);
  std::filesystem::remove(CachedFiles(tmp / "cache")[0]);
  // Streamed: Verify says which bytes differ.
  Put(c->get(), key.url, body);
  tamper(7);
  fd = (*c)->Find(key, false);
  ASSERT_GE(fd, 0);
  std::string chunk(2 * ShardCache::kBlock, '\0');
  ASSERT_EQ(::pread(fd, chunk.data(), chunk.size(), 0), static_cast<ssize_t>(chunk.size()));
  EXPECT_NE((*c)->Verify(fd, body.size(), chunk.data(), 0, chunk.size()).find("checksum"),
            std::string::npos);
  ASSERT_EQ(::pread(fd, chunk.data(), chunk.size(), 2 * ShardCache::kBlock),
            static_cast<ssize_t>(chunk.size()));
  EXPECT_EQ((*c)->Verify(fd, body.size(), chunk.data(), 2 * ShardCache::kBlock, chunk.size()), "");
  ::close(fd);
  // A checksum edited (not the bytes): caught the same way.
  std::filesystem::remove(CachedFiles(tmp / "cache")[0]);
  Put(c->get(), key.url, body);
  tamper(body.size() + 3);
  EXPECT_EQ((*c)->Find(key, true), -1);
}

// A file of the first format (no checksums) is removed when met, never served unchecked.
TEST(ShardCacheTest, AFileWithoutChecksumsIsRemoved) {
  TempDir tmp;
  const std::string body(1000, 'v');
  const std::string trailer =
      nlohmann::json{{"url", "u/a"}, {"size", body.size()}, {"stamp", "etag-1|5"}}.dump();
  const uint64_t n = trailer.size();
  std::string file = body + trailer;
  file.append(reinterpret_cast<const char*>(&n), 8).append("MMFSHRD1", 8);
  auto c = ShardCache::Open(tmp / "cache", 1 << 20);
  Put(c->get(), "u/a", body);
  const std::string name = CachedFiles(tmp / "cache")[0];
  testing::WriteFile(name, file);
  EXPECT_FALSE(Has(c->get(), "u/a", body.size()));
  EXPECT_TRUE(CachedFiles(tmp / "cache").empty());
}

// Room for two shards: the one needed furthest in the future goes (Belady's MIN), and a shard
// needed later than both is not kept at all.
TEST(ShardCacheTest, EvictsTheShardNeededFurthestInTheFuture) {
  TempDir tmp;
  const std::string body(1000, 'z');
  // Each file is the body plus a trailer of under 100 bytes: room for two.
  auto c = ShardCache::Open(tmp / "cache", 2 * 1100);
  std::map<std::string, uint64_t> next = {{"u/a", 10}, {"u/b", 30}, {"u/c", 20}, {"u/d", 99}};
  ShardCache::Rank rank = [&](const std::string& url) { return next.at(url); };
  Put(c->get(), "u/a", body, rank, next["u/a"]);
  Put(c->get(), "u/b", body, rank, next["u/b"]);
  Put(c->get(), "u/c", body, rank, next["u/c"]);  // b (30) is needed last: it goes
  EXPECT_TRUE(Has(c->get(), "u/a", 1000));
  EXPECT_FALSE(Has(c->get(), "u/b", 1000));
  EXPECT_TRUE(Has(c->get(), "u/c", 1000));
  Put(c->get(), "u/d", body, rank, next["u/d"]);  // needed after a and c: not kept
  EXPECT_FALSE(Has(c->get(), "u/d", 1000));
  EXPECT_TRUE(Has(c->get(), "u/a", 1000));
  EXPECT_TRUE(Has(c->get(), "u/c", 1000));
  const nlohmann::json st = (*c)->Stats();
  EXPECT_EQ(st["evicted_files"], 1u);
  EXPECT_EQ(st["not_kept"], 1u);
  EXPECT_LE(st["bytes"].get<uint64_t>(), 2200u);
  // A shard larger than the whole cache is never kept, and evicts nothing.
  Put(c->get(), "u/e", std::string(3000, 'e'), rank, 0);
  EXPECT_EQ(CachedFiles(tmp / "cache").size(), 2u);
}

// Without an order, the least recently used go first; a hit counts as a use.
TEST(ShardCacheTest, WithoutAnOrderTheLeastRecentlyUsedGoFirst) {
  TempDir tmp;
  const std::string body(1000, 'z');
  auto c = ShardCache::Open(tmp / "cache", 2 * 1100);
  Put(c->get(), "u/a", body);
  Put(c->get(), "u/b", body);
  ::usleep(20000);
  EXPECT_TRUE(Has(c->get(), "u/a", 1000));  // a used after b
  Put(c->get(), "u/c", body);
  EXPECT_TRUE(Has(c->get(), "u/a", 1000));
  EXPECT_FALSE(Has(c->get(), "u/b", 1000));
  EXPECT_TRUE(Has(c->get(), "u/c", 1000));
}

// Two daemons on one folder: each sees the other's shards and keeps the folder under the size
// between them; a folder deleted while running is made again.
TEST(ShardCacheTest, TwoCachesShareAFolderAndSurviveItsRemoval) {
  TempDir tmp;
  const std::string body(1000, 'q');
  auto one = ShardCache::Open(tmp / "cache", 2 * 1100);
  auto two = ShardCache::Open(tmp / "cache", 2 * 1100);
  Put(one->get(), "u/a", body);
  EXPECT_TRUE(Has(two->get(), "u/a", 1000));
  Put(two->get(), "u/b", body);
  Put(one->get(), "u/c", body);
  EXPECT_EQ(CachedFiles(tmp / "cache").size(), 2u);
  std::filesystem::remove_all(tmp / "cache");
  EXPECT_FALSE(Has(one->get(), "u/c", 1000));
  Put(one->get(), "u/c", body);
  EXPECT_TRUE(Has(two->get(), "u/c", 1000));
}

// Out of descriptors, a cached shard cannot be opened: a miss that removes nothing.
TEST(ShardCacheTest, OutOfDescriptorsAMissRemovesNothing) {
  TempDir tmp;
  auto c = ShardCache::Open(tmp / "cache", 1 << 20);
  const std::string body(1000, 'f');
  Put(c->get(), "u/a", body);
  rlimit old;
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &old), 0);
  rlimit low = old;
  low.rlim_cur = 256;
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  std::vector<int> fds;
  for (int fd; (fd = ::dup(0)) >= 0;) fds.push_back(fd);
  const bool found = Has(c->get(), "u/a", 1000);
  for (int fd : fds) ::close(fd);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &old), 0);
  EXPECT_FALSE(found);
  EXPECT_EQ((*c)->Stats()["damaged"], 0u);
  EXPECT_TRUE(Has(c->get(), "u/a", 1000)) << "the file is still there";
}

TEST(ShardCacheTest, AFolderThatCannotBeWrittenIsNamed) {
  TempDir tmp;
  testing::WriteFile(tmp / "file", "not a folder");
  auto c = ShardCache::Open(tmp / "file/cache", 1 << 20);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("source.cache.dir"), std::string::npos);
  EXPECT_NE(c.status().message().find(tmp / "file/cache"), std::string::npos);
}

}  // namespace
}  // namespace mmfeed
