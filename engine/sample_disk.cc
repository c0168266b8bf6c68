#include "engine/sample_disk.h"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>

#include "base/clock.h"
#include "base/rng.h"
#include "source/index_file.h"

namespace mmfeed {
namespace {

constexpr char kPrefix[] = "mmfeed-samples-";
constexpr uint64_t kMagic = 0x3130504d53464d4dull;  // "MMFSMP01"
constexpr size_t kHeader = 32;                      // magic, entry (8 bytes), size, hash
constexpr int64_t kAsideNs = 60'000'000'000;

struct Header {
  uint64_t magic, entry, size, hash;
};
static_assert(sizeof(Header) == kHeader);

// Removes the tier folders in `dir` that no living cache holds (their `.lock` free or gone),
// and hidden ones (a folder being made: `.` + its name until its lock is taken and it is
// renamed, microseconds) older than a minute: a daemon killed in between left them.
void RemoveOrphans(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) return;
  std::vector<std::string> orphans;
  const time_t minute_ago = ::time(nullptr) - 60;
  while (dirent* e = ::readdir(d)) {
    const bool hidden = e->d_name[0] == '.';
    if (std::strncmp(e->d_name + hidden, kPrefix, sizeof(kPrefix) - 1) != 0) continue;
    struct stat st;
    if (::fstatat(::dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(st.st_mode))
      continue;
    const std::string folder = dir + "/" + e->d_name;
    if (hidden) {
      if (st.st_mtime < minute_ago) orphans.push_back(folder);
      continue;
    }
    const int fd =
        ::open((folder + "/.lock").c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    // A lock that cannot be opened (another user's daemon in a shared folder, a symlink put
    // there) says nothing about its folder: kept. No lock at all: a folder nobody holds.
    if (fd < 0 && errno != ENOENT) continue;
    const bool held = fd >= 0 && ::flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
    if (fd >= 0) ::close(fd);
    if (!held) orphans.push_back(folder);
  }
  ::closedir(d);
  for (const std::string& folder : orphans) {
    std::error_code ec;
    const auto n = std::filesystem::remove_all(folder, ec);  // does not follow symlinks
    if (ec)
      spdlog::warn("stage cache: cannot remove {}, left by a daemon that is gone: {}", folder,
                   ec.message());
    else
      spdlog::info("stage cache: removed {} ({} files), left by a daemon that is gone", folder, n);
  }
}

}  // namespace

Result<std::unique_ptr<SampleDisk>> SampleDisk::Open(const std::string& dir,
                                                     const std::string& stage, uint64_t max_bytes) {
  RemoveOrphans(dir);
  static std::atomic<uint64_t> serial{0};
  const std::string name = fmt::format("{}{}-{}", kPrefix, ::getpid(), serial.fetch_add(1));
  std::unique_ptr<SampleDisk> disk(new SampleDisk(dir, stage, name));
  MMFEED_RETURN_IF_ERROR(disk->MakeFolder());
  struct statvfs fs;
  if (::statvfs(dir.c_str(), &fs) == 0 && uint64_t{fs.f_bavail} * fs.f_frsize < max_bytes)
    spdlog::warn(
        "stage '{}': cache.disk.max_bytes is {:.1f} GiB but {} has {:.1f} GiB free: the tier "
        "will fill the disk and then step aside (lower max_bytes or free room)",
        stage, max_bytes / 1073741824.0, dir, uint64_t{fs.f_bavail} * fs.f_frsize / 1073741824.0);
  return disk;
}

Status SampleDisk::MakeFolder() {
  std::lock_guard<std::mutex> made(make_mu_);
  struct stat st;
  if (::lstat(folder_.c_str(), &st) == 0) return Status::Ok();  // another thread made it again
  std::error_code made_dir;
  std::filesystem::create_directories(dir_, made_dir);  // `dir` itself may have been deleted
  const std::string hidden = fmt::format("{}/.{}", dir_, name_);
  auto fail = [&](const char* what) {
    const std::string why = std::strerror(errno);
    std::error_code ec;
    std::filesystem::remove_all(hidden, ec);
    return Status::Io(fmt::format(
        "stage '{}': cache.disk.dir {}: cannot {} ({}); name a folder on a local file system "
        "the daemon's user may write",
        stage_, dir_, what, why));
  };
  if (::mkdir(hidden.c_str(), 0700) != 0) return fail("create a folder in it");
  const int lock =
      ::open((hidden + "/.lock").c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (lock < 0) return fail("create a file in it");
  if (::flock(lock, LOCK_EX) != 0 || ::rename(hidden.c_str(), folder_.c_str()) != 0) {
    ::close(lock);
    return fail("rename a folder in it");
  }
  if (lock_fd_ >= 0) ::close(lock_fd_);
  lock_fd_ = lock;
  return Status::Ok();
}

SampleDisk::~SampleDisk() {
  std::error_code ec;
  std::filesystem::remove_all(folder_, ec);
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

std::string SampleDisk::PathOf(uint32_t entry) const {
  return fmt::format("{}/{}", folder_, entry);
}

void SampleDisk::StepAside(const std::string& why) {
  write_failures_.fetch_add(1, std::memory_order_relaxed);
  const int64_t now = static_cast<int64_t>(NowNs());
  if (aside_until_ns_.exchange(now + kAsideNs) > now) return;  // already aside: logged
  spdlog::warn(
      "stage '{}': cache disk tier {}: {}; samples are kept in memory only for a minute (the "
      "stage computes what memory does not hold)",
      stage_, folder_, why);
}

int SampleDisk::Write(uint32_t entry, const std::string& bytes) {
  if (static_cast<int64_t>(NowNs()) < aside_until_ns_.load(std::memory_order_relaxed)) return -1;
  int fd = ::open(folder_.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0 && errno == ENOENT) {  // the folder was deleted: make it again
    Status made = MakeFolder();
    if (!made.ok()) {
      StepAside(made.message());
      return -1;
    }
    fd = ::open(folder_.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  }
  if (fd < 0) {
    StepAside(fmt::format("cannot create a file ({})", std::strerror(errno)));
    return -1;
  }
  const Header h{kMagic, entry, bytes.size(), HashBytes(bytes.data(), bytes.size())};
  if (!index_file::FullWrite(fd, &h, sizeof(h)) ||
      !index_file::FullWrite(fd, bytes.data(), bytes.size())) {
    StepAside(fmt::format("cannot write a sample of {} bytes ({})", bytes.size(),
                          errno ? std::strerror(errno) : "short write"));
    ::close(fd);
    return -1;
  }
  return fd;
}

bool SampleDisk::Link(int fd, uint32_t entry) {
  const std::string proc = fmt::format("/proc/self/fd/{}", fd), path = PathOf(entry);
  ::unlink(path.c_str());
  const bool ok = ::linkat(AT_FDCWD, proc.c_str(), AT_FDCWD, path.c_str(), AT_SYMLINK_FOLLOW) == 0;
  if (!ok) StepAside(fmt::format("cannot name {} ({})", path, std::strerror(errno)));
  ::close(fd);
  return ok;
}

void SampleDisk::Discard(int fd) {
  if (fd >= 0) ::close(fd);
}

void SampleDisk::Remove(uint32_t entry) { ::unlink(PathOf(entry).c_str()); }

Result<std::string> SampleDisk::Read(uint32_t entry) const {
  const std::string path = PathOf(entry);
  // O_NONBLOCK: a FIFO planted there must not block the read (fstat then refuses it).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) {
    const std::string why = fmt::format("{}: {}", path, std::strerror(errno));
    if (errno == EMFILE || errno == ENFILE || errno == ENOMEM)  // the file may be fine
      return Status::ResourceExhausted(why);
    return Status::Io(why);
  }
  std::string bytes;
  Status st = [&]() -> Status {
    struct stat s;
    Header h;
    if (::fstat(fd, &s) != 0 || !S_ISREG(s.st_mode)) return Status::Io("not a regular file");
    if (static_cast<uint64_t>(s.st_size) < kHeader ||
        !index_file::FullPread(fd, reinterpret_cast<char*>(&h), kHeader, 0))
      return Status::Io(fmt::format("{} bytes, shorter than its header", s.st_size));
    if (h.magic != kMagic || h.entry != entry)
      return Status::Io("not this sample's file (its header differs)");
    if (h.size != static_cast<uint64_t>(s.st_size) - kHeader)
      return Status::Io(fmt::format("{} bytes of {}", s.st_size - kHeader, h.size));
    bytes.resize(h.size);
    if (!index_file::FullPread(fd, bytes.data(), h.size, kHeader))
      return Status::Io(std::strerror(errno));
    if (HashBytes(bytes.data(), bytes.size()) != h.hash)
      return Status::Io("its bytes differ from those written (checksum)");
    return Status::Ok();
  }();
  ::close(fd);
  if (!st.ok()) return Status::Io(fmt::format("{}: {}", path, st.message()));
  return bytes;
}

}  // namespace mmfeed
