#include "engine/sample_cache.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <list>
#include <set>
#include <unordered_map>
#include <vector>

#include "source/permutation.h"
#include "tests/test_util.h"

namespace mmfeed {
namespace {

constexpr uint32_t kSamples = 400, kEpochs = 4;

// Epoch e's order: a permutation of the samples seeded by e (as EpochOrder's).
Permutation OrderOf(uint32_t epoch) { return Permutation(kSamples, 1000 + epoch); }

uint64_t NextUse(uint32_t entry, uint32_t after) {
  if (after + 1 >= kEpochs) return SampleCache::kNever;
  return (uint64_t{after + 1} << 32) | OrderOf(after + 1).Inverse(entry);
}

// The whole run's reads, in order.
std::vector<uint32_t> Reads() {
  std::vector<uint32_t> reads;
  for (uint32_t e = 0; e < kEpochs; ++e) {
    const Permutation p = OrderOf(e);
    for (uint32_t i = 0; i < kSamples; ++i) reads.push_back(static_cast<uint32_t>(p(i)));
  }
  return reads;
}

// Belady's MIN with bypass, offline, for `capacity` equal-sized items: on a miss with the cache
// full, the item whose next read is furthest (the new one included) is not kept.
uint64_t MinHits(const std::vector<uint32_t>& reads, size_t capacity) {
  auto next_after = [&](size_t t) {
    for (size_t u = t + 1; u < reads.size(); ++u)
      if (reads[u] == reads[t]) return u;
    return reads.size();
  };
  std::unordered_map<uint32_t, size_t> next;  // kept item -> its next read
  uint64_t hits = 0;
  for (size_t t = 0; t < reads.size(); ++t) {
    const size_t n = next_after(t);
    if (next.count(reads[t])) {
      ++hits;
      next[reads[t]] = n;
      continue;
    }
    if (next.size() < capacity) {
      next[reads[t]] = n;
      continue;
    }
    auto worst = std::max_element(next.begin(), next.end(),
                                  [](const auto& a, const auto& b) { return a.second < b.second; });
    if (worst->second > n) {
      next.erase(worst);
      next[reads[t]] = n;
    }
  }
  return hits;
}

uint64_t LruHits(const std::vector<uint32_t>& reads, size_t capacity) {
  std::list<uint32_t> recent;
  uint64_t hits = 0;
  for (uint32_t r : reads) {
    auto it = std::find(recent.begin(), recent.end(), r);
    if (it != recent.end()) {
      ++hits;
      recent.erase(it);
    } else if (recent.size() == capacity) {
      recent.pop_back();
    }
    recent.push_front(r);
  }
  return hits;
}

uint64_t CacheHits(const std::vector<uint32_t>& reads, size_t capacity, size_t item_bytes) {
  SampleCache cache(capacity * item_bytes, NextUse);
  for (size_t t = 0; t < reads.size(); ++t) {
    const uint32_t epoch = static_cast<uint32_t>(t / kSamples);
    if (auto kept = cache.Find(reads[t], epoch)) {
      EXPECT_EQ(*kept, std::string(item_bytes, static_cast<char>(reads[t])));
      continue;
    }
    cache.Offer(reads[t], epoch, std::string(item_bytes, static_cast<char>(reads[t])));
  }
  const SampleCache::Stats s = cache.stats();
  EXPECT_LE(s.bytes, capacity * item_bytes);
  EXPECT_EQ(s.hits + s.misses, reads.size());
  return s.hits;
}

// Half the samples fit: the cache's hits are MIN's (it sees the same future), well above LRU's
// (which, on a fresh shuffle every epoch, does no better than chance).
TEST(SampleCacheTest, HitsWhatMinHitsWithHalfTheSamples) {
  const std::vector<uint32_t> reads = Reads();
  const uint64_t min = MinHits(reads, kSamples / 2), lru = LruHits(reads, kSamples / 2);
  const uint64_t hits = CacheHits(reads, kSamples / 2, 100);
  EXPECT_EQ(hits, min);
  EXPECT_GT(hits, lru * 5 / 4) << "min " << min << ", lru " << lru;
}

// Every sample fits: every read after the first epoch is a hit; the last epoch's samples (read
// by no later epoch) are never evicted for nothing.
TEST(SampleCacheTest, KeepsEverythingThatFits) {
  const std::vector<uint32_t> reads = Reads();
  EXPECT_EQ(CacheHits(reads, kSamples, 64), uint64_t{kSamples} * (kEpochs - 1));
}

// A sample larger than the cache is not kept, and evicts nothing; a sample no read needs again
// takes only free room.
TEST(SampleCacheTest, NeverKeepsWhatCannotHelp) {
  SampleCache cache(1000, NextUse);
  cache.Offer(1, 0, std::string(600, 'a'));
  cache.Offer(2, 0, std::string(2000, 'b'));
  EXPECT_TRUE(cache.Find(1, 1));
  EXPECT_FALSE(cache.Find(2, 1));
  cache.Offer(3, kEpochs - 1, std::string(600, 'c'));  // the last epoch: never read again
  EXPECT_TRUE(cache.Find(1, 2));
  EXPECT_FALSE(cache.Find(3, 2));
  const SampleCache::Stats s = cache.stats();
  EXPECT_EQ(s.not_kept, 2u);
  EXPECT_EQ(s.evicted_bytes, 0u);
  EXPECT_EQ(s.bytes, 600u);
  EXPECT_EQ(s.samples, 1u);
}

// A kept sample whose read was missed (it failed, or another node read it) is ranked anew when
// the epoch moves on, not kept forever as "needed soonest".
TEST(SampleCacheTest, RanksAgainWhatMissedItsRead) {
  // Sample 7 is read at epoch 1 only; sample 9 at epoch 3.
  auto next_use = [](uint32_t entry, uint32_t after) -> uint64_t {
    if (entry == 7 && after < 1) return (uint64_t{1} << 32) | 5;
    if (entry == 9 && after < 3) return uint64_t{3} << 32;
    return SampleCache::kNever;
  };
  SampleCache cache(100, next_use);
  cache.Offer(7, 0, std::string(100, 'x'));
  // Epoch 1 passes without reading 7; at epoch 2 it is needed by no read, so 9 displaces it.
  cache.Offer(9, 2, std::string(100, 'z'));
  EXPECT_TRUE(cache.Find(9, 3));
  EXPECT_EQ(cache.stats().evicted_bytes, 100u);
}

// A sample's bytes: different for every entry and every offset.
std::string Item(uint32_t entry, size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(entry * 31 + i * 7);
  return s;
}

std::unique_ptr<SampleDisk> OpenDisk(const std::string& dir) {
  Result<std::unique_ptr<SampleDisk>> disk = SampleDisk::Open(dir, "image", 1 << 20);
  EXPECT_TRUE(disk.ok()) << disk.status().message();
  if (!disk.ok()) return nullptr;
  return std::move(disk.value());
}

size_t FilesIn(const std::string& folder) {
  size_t n = 0;
  for (const auto& f : std::filesystem::directory_iterator(folder))
    n += f.path().filename().string()[0] != '.';
  return n;
}

// Runs the whole run's reads through `cache`, checking every hit's bytes.
void ReadAll(SampleCache* cache, size_t item_bytes) {
  const std::vector<uint32_t> reads = Reads();
  for (size_t t = 0; t < reads.size(); ++t) {
    const uint32_t epoch = static_cast<uint32_t>(t / kSamples);
    if (auto kept = cache->Find(reads[t], epoch)) {
      ASSERT_EQ(*kept, Item(reads[t], item_bytes)) << reads[t];
      continue;
    }
    cache->Offer(reads[t], epoch, Item(reads[t], item_bytes));
  }
}

// Memory holds 20 samples, the disk half of them: the disk is a MIN of its own size over the
// same reads, so the hits are (nearly) MIN's at the disk's size, far above memory's alone; each
// tier stays within its bytes, and the disk's folder holds one file per sample it counts.
TEST(SampleCacheTest, TheDiskTierHitsWhatMinHitsAtItsSize) {
  testing::TempDir tmp;
  std::unique_ptr<SampleDisk> disk = OpenDisk(tmp.path());
  ASSERT_TRUE(disk);
  SampleDisk* files = disk.get();
  SampleCache cache(20 * 100, NextUse, std::move(disk), kSamples / 2 * 100);
  ReadAll(&cache, 100);
  const SampleCache::Stats s = cache.stats();
  const std::vector<uint32_t> reads = Reads();
  const uint64_t min = MinHits(reads, kSamples / 2), memory_only = MinHits(reads, 20);
  EXPECT_GE(s.hits, min * 98 / 100) << "min " << min;
  EXPECT_LE(s.hits, min);
  EXPECT_GE(s.disk_hits, s.hits - memory_only) << "memory alone hits what MIN at its size does";
  EXPECT_GT(s.hits, 3 * memory_only) << "memory only " << memory_only;
  EXPECT_LE(s.bytes, 20u * 100);
  EXPECT_LE(s.disk_bytes, kSamples / 2 * 100);
  EXPECT_EQ(s.disk_bytes, s.disk_samples * 100);
  EXPECT_EQ(FilesIn(files->folder()), s.disk_samples);
  EXPECT_EQ(s.disk_damaged + s.disk_write_failures, 0u);
}

// A file truncated, scribbled on, swapped for another sample's, deleted or replaced by a FIFO
// is a miss (counted; a FIFO does not block the read), never wrong bytes; the stage's next
// offer writes it again.
TEST(SampleCacheTest, ADamagedDiskFileIsAMissNeverWrongBytes) {
  testing::TempDir tmp;
  std::unique_ptr<SampleDisk> disk = OpenDisk(tmp.path());
  ASSERT_TRUE(disk);
  const std::string folder = disk->folder();
  SampleCache cache(0, NextUse, std::move(disk), 1 << 20);  // nothing in memory
  for (uint32_t e = 0; e < 5; ++e) cache.Offer(e, 0, Item(e, 1000));
  ASSERT_EQ(FilesIn(folder), 5u);
  ASSERT_EQ(truncate((folder + "/0").c_str(), 500), 0);
  {
    std::fstream f(folder + "/1", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(700);
    f.put('!');
  }
  std::filesystem::copy_file(folder + "/3", folder + "/2",
                             std::filesystem::copy_options::overwrite_existing);
  std::filesystem::remove(folder + "/3");
  std::filesystem::remove(folder + "/4");
  ASSERT_EQ(mkfifo((folder + "/4").c_str(), 0600), 0);  // never opened for writing
  for (uint32_t e = 0; e < 5; ++e) EXPECT_FALSE(cache.Find(e, 1)) << e;
  cache.Offer(5, 0, Item(5, 1000));
  ASSERT_TRUE(cache.Find(5, 1));
  EXPECT_EQ(*cache.Find(5, 1), Item(5, 1000));
  SampleCache::Stats s = cache.stats();
  EXPECT_EQ(s.disk_damaged, 5u);
  EXPECT_EQ(s.disk_samples, 1u);
  EXPECT_EQ(FilesIn(folder), 1u) << "the bad files are removed";
  cache.Offer(1, 1, Item(1, 1000));
  ASSERT_TRUE(cache.Find(1, 2));
  EXPECT_EQ(*cache.Find(1, 2), Item(1, 1000));
}

// Out of descriptors, a kept file cannot be opened: a miss, not damage; the file is kept and
// hits again once descriptors are free.
TEST(SampleCacheTest, NoDescriptorsLeftIsAMissThatKeepsTheFile) {
  testing::TempDir tmp;
  std::unique_ptr<SampleDisk> disk = OpenDisk(tmp.path());
  ASSERT_TRUE(disk);
  SampleCache cache(0, NextUse, std::move(disk), 1 << 20);
  cache.Offer(3, 0, Item(3, 100));
  const int lowest_free = dup(0);  // a new descriptor takes the lowest free number
  ASSERT_GE(lowest_free, 0);
  close(lowest_free);
  rlimit old;
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &old), 0);
  rlimit none = old;
  none.rlim_cur = static_cast<rlim_t>(lowest_free);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &none), 0);
  const bool hit = cache.Find(3, 1) != nullptr;
  setrlimit(RLIMIT_NOFILE, &old);
  EXPECT_FALSE(hit);
  ASSERT_TRUE(cache.Find(3, 2));
  EXPECT_EQ(*cache.Find(3, 2), Item(3, 100));
  EXPECT_EQ(cache.stats().disk_damaged, 0u);
}

// The tier's folder (here with the `dir` holding it) deleted while it runs: its samples are
// misses, and the next write makes both again.
TEST(SampleCacheTest, TheDiskTierMakesItsFolderAgainWhenDeleted) {
  testing::TempDir tmp;
  std::unique_ptr<SampleDisk> disk = OpenDisk(tmp.path());
  ASSERT_TRUE(disk);
  const std::string folder = disk->folder();
  SampleCache cache(0, NextUse, std::move(disk), 1 << 20);
  for (uint32_t e = 0; e < 3; ++e) cache.Offer(e, 0, Item(e, 100));
  std::filesystem::remove_all(tmp.path());
  EXPECT_FALSE(cache.Find(0, 1));
  cache.Offer(0, 1, Item(0, 100));
  ASSERT_TRUE(cache.Find(0, 2));
  EXPECT_EQ(*cache.Find(0, 2), Item(0, 100));
  EXPECT_TRUE(std::filesystem::exists(folder + "/.lock"));
  EXPECT_EQ(cache.stats().disk_write_failures, 0u);
}

// Writes that fail (here: the file size limit, as a full disk fails them) make the tier step
// aside: samples stay in memory, nothing fails, and the failure is counted.
TEST(SampleCacheTest, FailingWritesLeaveMemoryServing) {
  testing::TempDir tmp;
  std::unique_ptr<SampleDisk> disk = OpenDisk(tmp.path());
  ASSERT_TRUE(disk);
  SampleCache cache(1 << 20, NextUse, std::move(disk), 1 << 20);
  rlimit old;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  rlimit small = old;
  small.rlim_cur = 1000;
  auto previous = std::signal(SIGXFSZ, SIG_IGN);
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  for (uint32_t e = 0; e < 4; ++e) cache.Offer(e, 0, Item(e, 5000));
  setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, previous);
  for (uint32_t e = 0; e < 4; ++e) {
    ASSERT_TRUE(cache.Find(e, 1)) << e;
    EXPECT_EQ(*cache.Find(e, 1), Item(e, 5000));
  }
  const SampleCache::Stats s = cache.stats();
  EXPECT_EQ(s.disk_write_failures, 1u) << "one failure, then a minute aside";
  EXPECT_EQ(s.disk_samples, 0u);
  EXPECT_EQ(s.disk_bytes, 0u);
}

// A tier folder nobody holds (its daemon died) is removed when a tier opens in the same dir; a
// living tier's is not, and each tier removes its own folder when it goes.
TEST(SampleCacheTest, OrphanedDiskFoldersAreRemovedLiveOnesKept) {
  testing::TempDir tmp;
  const std::string orphan = tmp / "mmfeed-samples-999999999-0";
  std::filesystem::create_directories(orphan);
  testing::WriteFile(orphan + "/.lock", "");
  testing::WriteFile(orphan + "/7", "old bytes");
  // Hidden: a folder being made (a daemon killed before renaming it), kept for a minute.
  const std::string half_made = tmp / ".mmfeed-samples-999999999-1";
  const std::string being_made = tmp / ".mmfeed-samples-999999999-2";
  for (const std::string& f : {half_made, being_made}) {
    std::filesystem::create_directories(f);
    testing::WriteFile(f + "/.lock", "");
  }
  // A lock that cannot be opened (here a symlink; another user's unreadable lock is the same
  // case): nothing known of the folder, kept. No lock: nobody holds it, removed.
  const std::string planted = tmp / "mmfeed-samples-999999999-3";
  const std::string unlocked = tmp / "mmfeed-samples-999999999-4";
  std::filesystem::create_directories(planted);
  std::filesystem::create_directories(unlocked);
  std::filesystem::create_symlink(tmp / "elsewhere", planted + "/.lock");
  const timespec two_minutes_ago[2] = {{::time(nullptr) - 120, 0}, {::time(nullptr) - 120, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, half_made.c_str(), two_minutes_ago, 0), 0);
  std::unique_ptr<SampleDisk> a = OpenDisk(tmp.path());
  ASSERT_TRUE(a);
  EXPECT_FALSE(std::filesystem::exists(orphan));
  EXPECT_FALSE(std::filesystem::exists(half_made));
  EXPECT_TRUE(std::filesystem::exists(being_made)) << "may be a living daemon's, being made";
  EXPECT_TRUE(std::filesystem::exists(planted)) << "its lock cannot be opened: not judged";
  EXPECT_FALSE(std::filesystem::exists(unlocked));
  std::unique_ptr<SampleDisk> b = OpenDisk(tmp.path());
  ASSERT_TRUE(b);
  EXPECT_NE(a->folder(), b->folder());
  EXPECT_TRUE(std::filesystem::exists(a->folder())) << "held by a living tier";
  const std::string gone = a->folder();
  a.reset();
  EXPECT_FALSE(std::filesystem::exists(gone));
  EXPECT_TRUE(std::filesystem::exists(b->folder()));
}

}  // namespace
}  // namespace mmfeed
