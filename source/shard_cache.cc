#include "source/shard_cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "base/clock.h"
#include "base/dir_fd.h"
#include "base/rng.h"
#include "source/cache_policy.h"
#include "source/index_file.h"

namespace mmfeed {
namespace {

// Version 2 added the checksums; a file of version 1 (no checksums) is removed when met.
// Format 3: XXH3 block checksums (source/cache_policy.h). Formats 1 (no checksums) and 2 (the
// checksum before XXH3) are removed when met, and the shard fetched again.
constexpr char kShardCacheMagic[8] = {'M', 'M', 'F', 'S', 'H', 'R', 'D', '3'};
constexpr char kShardCacheMagicV1[8] = {'M', 'M', 'F', 'S', 'H', 'R', 'D', '1'};
constexpr char kShardCacheMagicV2[8] = {'M', 'M', 'F', 'S', 'H', 'R', 'D', '2'};
constexpr uint64_t kTail = 16;  // the trailer's length, then the magic
constexpr uint64_t kMostTrailer = 1 << 16;
constexpr int64_t kAsideNs = 60'000'000'000;
constexpr const char* kSuffix = ".shard";
constexpr uint64_t kChunk = 16 * ShardCache::kBlock;  // what one read verifies

uint64_t BlocksOf(uint64_t size) { return (size + ShardCache::kBlock - 1) / ShardCache::kBlock; }

// The trailer of a cached file of `file_size` bytes, null when it has none (`why` says so).
nlohmann::json ReadTrailer(int fd, uint64_t file_size, std::string* why) {
  char tail[kTail];
  *why = "truncated or damaged (no valid trailer)";
  if (file_size < kTail || !index_file::FullPread(fd, tail, kTail, file_size - kTail))
    return nullptr;
  if (std::memcmp(tail + 8, kShardCacheMagicV1, 8) == 0) {
    *why = "written by an older mmfeed, without checksums";
    return nullptr;
  }
  if (std::memcmp(tail + 8, kShardCacheMagicV2, 8) == 0) {
    *why = "written by an older mmfeed, with another checksum";
    return nullptr;
  }
  if (std::memcmp(tail + 8, kShardCacheMagic, 8) != 0) return nullptr;
  uint64_t n;
  std::memcpy(&n, tail, 8);
  if (n > kMostTrailer || n > file_size - kTail) return nullptr;
  std::string text(n, '\0');
  if (!index_file::FullPread(fd, text.data(), n, file_size - kTail - n)) return nullptr;
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (!j.is_object() || !j["url"].is_string() || !j["size"].is_number_unsigned() ||
      !j["stamp"].is_string() || j["block"] != ShardCache::kBlock)
    return nullptr;
  const uint64_t size = j["size"].get<uint64_t>();
  // The shard's bytes, a checksum per block, the trailer.
  if (size > file_size || BlocksOf(size) > (file_size - size) / 8 ||
      size + 8 * BlocksOf(size) + n + kTail != file_size)
    return nullptr;
  return j;
}

// An exclusive flock on `<dir>/.lock` while alive.
class FolderLock {
 public:
  explicit FolderLock(const DirFd& dir) {
    fd_ = dir.OpenFile(".lock", O_RDWR | O_CREAT, 0644);
    if (fd_ >= 0)
      while (::flock(fd_, LOCK_EX) != 0 && errno == EINTR) {
      }
  }
  ~FolderLock() {
    if (fd_ >= 0) ::close(fd_);
  }
  bool ok() const { return fd_ >= 0; }

 private:
  int fd_;
};

struct Cached {
  std::string name;
  uint64_t bytes, inode;
  int64_t mtime_ns;
  uint64_t rank = 0;
};

// The cached files in `dir` (names of 16 hex digits and the suffix, regular files).
std::vector<Cached> List(const DirFd& dir) {
  std::vector<Cached> out;
  for (const std::string& name : dir.List()) {
    if (name.size() != 16 + std::strlen(kSuffix) || name.compare(16, std::string::npos, kSuffix))
      continue;
    struct stat st;
    if (!dir.Stat(name, &st) || !S_ISREG(st.st_mode)) continue;
    out.push_back({name, static_cast<uint64_t>(st.st_size), static_cast<uint64_t>(st.st_ino),
                   st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec});
  }
  return out;
}

// Removes `name` if it is still the file of inode `inode` (0: whatever is there now): another
// daemon may have put a good file there since it was checked. REQUIRES: the folder lock held.
bool UnlinkIfStill(const DirFd& dir, const std::string& name, uint64_t inode) {
  struct stat now;
  return dir.Stat(name, &now) && (inode == 0 || static_cast<uint64_t>(now.st_ino) == inode) &&
         dir.Unlink(name);
}

}  // namespace

Result<std::unique_ptr<ShardCache>> ShardCache::Open(const std::string& dir, uint64_t max_bytes) {
  Result<DirFd> folder = DirFd::Open(dir, "source.cache.dir", /*create=*/true);
  if (!folder.ok())
    return Status::Io(
        fmt::format("{}; name a folder on a local file system the daemon's user "
                    "owns and may write",
                    folder.status().message()));
  const int probe = folder->OpenUnnamed(0644);
  if (probe < 0)
    return Status::Io(fmt::format(
        "source.cache.dir {}: cannot create files there ({}); name a folder on a local file "
        "system the daemon's user may write",
        dir, std::strerror(errno)));
  ::close(probe);
  std::unique_ptr<ShardCache> c(new ShardCache(dir, max_bytes));
  c->dir_fd_ = std::make_shared<const DirFd>(std::move(folder.value()));
  for (const Cached& f : List(*c->dir_fd_)) {
    c->held_bytes_ += f.bytes;
    ++c->held_files_;
  }
  spdlog::info("shard cache {}: {} shards, {:.0f} of {:.0f} MB", dir, c->held_files_,
               c->held_bytes_ / 1e6, max_bytes / 1e6);
  return c;
}

std::string ShardCache::NameOf(const std::string& url) const {
  return fmt::format("{:016x}{}", HashString(url), kSuffix);
}

std::shared_ptr<const DirFd> ShardCache::Dir(bool create) {
  std::lock_guard<std::mutex> l(dir_mu_);
  if (dir_fd_->Gone()) {  // deleted: made again where it was, never through a symlink
    Result<DirFd> again = dir_fd_->Reopen(create);
    if (again.ok())
      dir_fd_ = std::make_shared<const DirFd>(std::move(again.value()));
    else if (create)
      spdlog::warn("shard cache: {}", again.status().message());
  }
  return dir_fd_;
}

std::string ShardCache::UrlOf(int fd) const {
  struct stat st;
  if (::fstat(fd, &st) != 0) return "";
  std::string why;
  const nlohmann::json t = ReadTrailer(fd, static_cast<uint64_t>(st.st_size), &why);
  return t.is_null() ? "" : t["url"].get<std::string>();
}

std::string ShardCache::Verify(int fd, uint64_t size, const char* data, uint64_t offset,
                               uint64_t n) const {
  if (offset % kBlock != 0 || offset + n > size || (n % kBlock != 0 && offset + n != size))
    return fmt::format("bytes {}+{} are not whole blocks of the shard", offset, n);
  const uint64_t first = offset / kBlock, count = BlocksOf(n);
  std::vector<uint64_t> want(count);
  if (count > 0 && !index_file::FullPread(fd, want.data(), 8 * count, size + 8 * first))
    return fmt::format("its checksums cannot be read ({})", std::strerror(errno));
  for (uint64_t b = 0; b < count; ++b) {
    const uint64_t len = std::min(kBlock, n - b * kBlock);
    if (Checksum(data + b * kBlock, len) != want[b])
      return fmt::format("bytes {}..{} differ from those written (checksum)", offset + b * kBlock,
                         offset + b * kBlock + len);
  }
  return "";
}

std::string ShardCache::ReadChunks(int fd, uint64_t from, uint64_t to, const ChunkFn& each,
                                   int copy_to) const {
  std::vector<char> buf(std::max<uint64_t>(std::min(kChunk, to - std::min(to, from)), 1));
  std::string why;
  for (uint64_t at = from; why.empty() && at < to; at += buf.size()) {
    const uint64_t len = std::min<uint64_t>(buf.size(), to - at);
    why = index_file::FullPread(fd, buf.data(), len, at)
              ? each(at, buf.data(), len)
              : fmt::format("bytes at {} cannot be read ({})", at,
                            std::strerror(errno ? errno : EIO));
    if (why.empty() && copy_to >= 0 && !index_file::FullPwrite(copy_to, buf.data(), len, at))
      why = fmt::format("copy: {}", std::strerror(errno));
  }
  return why;
}

std::string ShardCache::ReadAndVerify(int fd, uint64_t size, uint64_t from, uint64_t to,
                                      int copy_to) const {
  return ReadChunks(
      fd, from, to,
      [&](uint64_t at, const char* data, uint64_t len) { return Verify(fd, size, data, at, len); },
      copy_to);
}

int ShardCache::MemoryFile(const char* name) { return ::memfd_create(name, MFD_CLOEXEC); }

int ShardCache::CheckedCopy(int fd, const Key& key, uint64_t offset, uint64_t n) {
  const uint64_t from = offset / kBlock * kBlock;
  const uint64_t to = std::min(key.size, (offset + n + kBlock - 1) / kBlock * kBlock);
  const int copy = MemoryFile("mmfeed-shard-copy");
  if (copy < 0) return -1;
  const std::string why = ReadAndVerify(fd, key.size, from, to, copy);
  if (why.empty()) return copy;
  ::close(copy);
  if (why.rfind("copy: ", 0) != 0) Damaged(fd, key, why);  // out of memory is not damage
  return -1;
}

void ShardCache::Damaged(int fd, const Key& key, const std::string& why) {
  const std::string name = NameOf(key.url);
  struct stat st {};
  const bool known = ::fstat(fd, &st) == 0;
  spdlog::warn("shard cache: {}/{} for {}: {}; removed, fetching it again", dir_, name, key.url,
               why);
  // Counted once: two readers of one copy may both find it damaged; the one that removes it
  // counts it.
  bool counted = true;
  {
    const std::shared_ptr<const DirFd> dir = Dir(false);
    FolderLock lock(*dir);
    // Only this copy (by inode): another daemon may have put a good one there since.
    if (lock.ok() && known) counted = UnlinkIfStill(*dir, name, static_cast<uint64_t>(st.st_ino));
  }
  std::lock_guard<std::mutex> l(mu_);
  if (counted) ++damaged_;
}

int ShardCache::Find(const Key& key, bool check_all, bool private_copy) {
  const std::string name = NameOf(key.url), path = dir_ + "/" + name;
  const std::shared_ptr<const DirFd> dir = Dir(false);
  const int fd = dir->OpenFile(name, O_RDONLY | O_NONBLOCK);
  std::string why;
  struct stat st {};
  if (fd < 0) {
    // Not there, or not openable now (out of descriptors, no permission): a miss that removes
    // nothing. A symlink planted under the name (ELOOP) is removed below.
    if (errno != ELOOP) {
      std::lock_guard<std::mutex> l(mu_);
      ++misses_;
      return -1;
    }
    why = "a symbolic link (not followed)";
  } else if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    why = "not a regular file";
  } else {
    const nlohmann::json t = ReadTrailer(fd, static_cast<uint64_t>(st.st_size), &why);
    if (t.is_null())
      ;  // `why` says what is wrong
    else if (t["url"] != key.url)
      why = fmt::format("holds another URL ({})", t["url"].get<std::string>());
    else if (t["size"] != key.size || t["stamp"] != key.stamp)
      why = fmt::format("stale (size {}, stamp '{}'; the store now says size {}, stamp '{}')",
                        t["size"].get<uint64_t>(), t["stamp"].get<std::string>(), key.size,
                        key.stamp);
    else
      why.clear();
  }
  int copy = -1;
  if (why.empty() && check_all) {
    // Every block against its checksum, one pass (the reads that follow find the bytes in the
    // page cache), into a private copy when asked.
    if (private_copy && (copy = MemoryFile("mmfeed-shard-copy")) < 0) {
      ::close(fd);
      return -1;  // no memory file now: not a miss of the cache's making
    }
    why = ReadAndVerify(fd, key.size, 0, key.size, copy);
    if (!why.empty() && copy >= 0) {
      ::close(copy);
      copy = -1;
      if (why.rfind("copy: ", 0) == 0) {  // out of memory: the copy on disk may be good
        ::close(fd);
        return -1;
      }
    }
  }
  if (why.empty()) {
    ::futimens(fd, nullptr);  // recently used (the order-less eviction reads mtimes)
    spdlog::debug("shard cache: hit {}", key.url);
    std::lock_guard<std::mutex> l(mu_);
    ++hits_;
    if (copy >= 0) {
      ::close(fd);
      return copy;
    }
    return fd;
  }
  if (fd >= 0) ::close(fd);
  bool counted = true;
  spdlog::warn("shard cache: {} for {}: {}; removed, fetching it again", path, key.url, why);
  {
    FolderLock lock(*dir);
    if (lock.ok())
      counted = UnlinkIfStill(*dir, name, fd < 0 ? 0 : static_cast<uint64_t>(st.st_ino));
  }
  std::lock_guard<std::mutex> l(mu_);
  ++misses_;
  if (counted) ++damaged_;  // once: a second reader of the same copy finds it gone
  return -1;
}

bool ShardCache::Usable() {
  std::lock_guard<std::mutex> l(mu_);
  return static_cast<int64_t>(NowNs()) >= aside_until_ns_;
}

int ShardCache::Begin() {
  if (!Usable()) return -1;
  const int fd = Dir(/*create=*/true)->OpenUnnamed(0644);  // a deleted folder is made again
  if (fd < 0) WriteFailed(errno);
  return fd;
}

void ShardCache::WriteFailed(int err) {
  std::lock_guard<std::mutex> l(mu_);
  ++write_failures_;
  const int64_t now = static_cast<int64_t>(NowNs());
  if (now < aside_until_ns_) return;
  aside_until_ns_ = now + kAsideNs;
  spdlog::warn(
      "shard cache {}: cannot write ({}): fetching shards into memory for the next {} s, then "
      "trying again",
      dir_, std::strerror(err), kAsideNs / 1000000000);
}

bool ShardCache::Commit(int fd, const Key& key, const Rank& next, uint64_t self, int copy_to) {
  // A checksum per block, of the bytes as written (read back from the page cache), copied as
  // they are read when asked.
  std::string tail;
  tail.reserve(8 * BlocksOf(key.size) + 256);
  const std::string why = ReadChunks(
      fd, 0, key.size,
      [&](uint64_t, const char* data, uint64_t len) {
        for (uint64_t b = 0; b < len; b += kBlock) {
          const uint64_t h = Checksum(data + b, std::min(kBlock, len - b));
          tail.append(reinterpret_cast<const char*>(&h), 8);
        }
        return std::string();
      },
      copy_to);
  if (!why.empty()) {
    const int err = errno ? errno : EIO;  // before anything else can change it
    if (why.rfind("copy: ", 0) == 0)      // memory ran out, not the cache: it stays in use
      spdlog::warn("shard cache: {} not kept: {}", key.url, why);
    else
      WriteFailed(err);  // logs, and the cache steps aside
    return false;
  }
  const std::string trailer = nlohmann::json{
      {"url", key.url},
      {"size", key.size},
      {"stamp", key.stamp},
      {"block", kBlock}}.dump();
  tail += trailer;
  const uint64_t n = trailer.size();
  tail.append(reinterpret_cast<const char*>(&n), 8).append(kShardCacheMagic, 8);
  if (!index_file::FullPwrite(fd, tail.data(), tail.size(), key.size) || ::fdatasync(fd) != 0) {
    WriteFailed(errno);
    return true;  // the bytes were read (and copied); only keeping them failed
  }
  const uint64_t bytes = key.size + tail.size();
  const std::string name = NameOf(key.url);
  const std::shared_ptr<const DirFd> dir = Dir(/*create=*/true);
  FolderLock lock(*dir);
  if (!lock.ok()) {
    WriteFailed(errno);
    return true;  // the bytes were read (and copied); only keeping them failed
  }
  // The folder's listing is the truth (other daemons write it too); each file ranked by when
  // its shard is needed next, or, without an order, by how long ago it was used.
  std::vector<Cached> files = List(*dir);
  uint64_t total = bytes;
  size_t listed = 0;
  std::vector<Cached> others;
  for (Cached& f : files) {
    if (f.name == name) continue;  // replaced
    total += f.bytes;
    ++listed;
    bool readable = true;
    if (next) {
      std::string url;
      {
        std::lock_guard<std::mutex> l(mu_);
        auto it = urls_.find(f.name);
        if (it != urls_.end() && it->second.first == f.inode) url = it->second.second;
      }
      if (url.empty()) {
        const int rfd = dir->OpenFile(f.name, O_RDONLY | O_NONBLOCK);
        if (rfd >= 0) {
          url = UrlOf(rfd);
          ::close(rfd);
          std::lock_guard<std::mutex> l(mu_);
          urls_[f.name] = {f.inode, url};
        }
        readable = rfd >= 0;
      }
      f.rank = url.empty() ? UINT64_MAX : next(url);  // a file without a trailer goes first
    } else {
      f.rank = kNeverRead;  // no order: the least recently used goes first
    }
    // One that cannot be opened now (out of descriptors) is never a victim for that.
    if (readable) others.push_back(f);
  }
  // The caches' one rule (source/cache_policy.h): needed furthest in the future first, and a
  // shard needed later than one it would displace is not kept (MIN); without an order the
  // least recently used go and the new shard stays.
  std::vector<EvictionCandidate> candidates;
  for (const Cached& f : others)
    candidates.push_back(
        {f.rank, f.bytes, static_cast<uint64_t>(std::max<int64_t>(f.mtime_ns, 0))});
  const Eviction plan = PlanEviction(candidates, total - bytes, bytes, next ? self : kNeverRead,
                                     max_bytes_, /*bypass=*/static_cast<bool>(next));
  const bool keep = plan.keep;
  const size_t victims = plan.victims.size();
  spdlog::debug("shard cache: {} (next use {}): {}, {} evicted", key.url, self,
                keep ? "kept" : "not kept", victims);
  uint64_t held = total - bytes, evicted = 0;
  bool linked = keep;
  if (keep) {
    for (size_t v : plan.victims) {
      if (UnlinkIfStill(*dir, others[v].name, others[v].inode)) {
        evicted += others[v].bytes;
        held -= others[v].bytes;
      }
    }
    if (!dir->Link(fd, name)) {
      // Something that is not a file sits under the name (a folder): this shard is not kept.
      if (errno != EEXIST) WriteFailed(errno);
      linked = false;
    } else {
      held += bytes;
    }
  }
  struct stat own;
  const uint64_t inode = ::fstat(fd, &own) == 0 ? static_cast<uint64_t>(own.st_ino) : 0;
  std::lock_guard<std::mutex> l(mu_);
  held_bytes_ = held;
  held_files_ = listed + (linked ? 1 : 0) - (keep ? victims : 0);
  evicted_bytes_ += evicted;
  evicted_files_ += keep ? victims : 0;
  if (!linked) ++not_kept_;
  if (linked) urls_[name] = {inode, key.url};
  return true;
}

nlohmann::json ShardCache::Stats() const {
  std::lock_guard<std::mutex> l(mu_);
  return {{"dir", dir_},
          {"hits", hits_},
          {"misses", misses_},
          {"bytes", held_bytes_},
          {"files", held_files_},
          {"max_bytes", max_bytes_},
          {"evicted_bytes", evicted_bytes_},
          {"evicted_files", evicted_files_},
          {"not_kept", not_kept_},
          {"damaged", damaged_},
          {"write_failures", write_failures_}};
}

}  // namespace mmfeed
