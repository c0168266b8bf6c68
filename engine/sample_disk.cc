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
#include "base/dir_fd.h"
#include "source/cache_policy.h"
#include "source/index_file.h"

namespace mmfeed {
namespace {

constexpr char kPrefix[] = "mmfeed-samples-";
constexpr uint64_t kMagic = 0x3230504d53464d4dull;  // "MMFSMP02": an XXH3 checksum
constexpr size_t kHeader = 32;                      // magic, entry (8 bytes), size, hash
constexpr int64_t kAsideNs = 60'000'000'000;

struct Header {
  uint64_t magic, entry, size, hash;
};
static_assert(sizeof(Header) == kHeader);

// Removes the tier folders in `dir` that no living cache holds (their `.lock` free or gone),
// and hidden ones (a folder being made: `.` + its name until its lock is taken and it is
// renamed, microseconds) older than a minute: a daemon killed in between left them.
void RemoveOrphans(const DirFd& dir) {
  const time_t minute_ago = ::time(nullptr) - 60;
  for (const std::string& name : dir.List()) {
    const bool hidden = name[0] == '.';
    if (name.compare(hidden, sizeof(kPrefix) - 1, kPrefix) != 0) continue;
    struct stat st;
    if (!dir.Stat(name, &st) || !S_ISDIR(st.st_mode)) continue;
    bool orphan = hidden && st.st_mtime < minute_ago;
    if (!hidden) {
      // A folder or lock that cannot be opened (another user's daemon in a shared folder, a
      // symlink put there) says nothing about its folder: kept. No lock at all: nobody holds it.
      Result<DirFd> folder = dir.Sub(name, /*create=*/false);
      if (!folder.ok()) continue;
      const int fd = folder->OpenFile(".lock", O_RDONLY | O_NONBLOCK);
      if (fd < 0 && errno != ENOENT) continue;
      const bool held = fd >= 0 && ::flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
      if (fd >= 0) ::close(fd);
      orphan = !held;
    }
    if (!orphan) continue;
    if (dir.RemoveTree(name))
      spdlog::info("stage cache: removed {}/{}, left by a daemon that is gone", dir.path(), name);
    else
      spdlog::warn("stage cache: cannot remove {}/{}, left by a daemon that is gone: {}",
                   dir.path(), name, std::strerror(errno));
  }
}

}  // namespace

Result<std::unique_ptr<SampleDisk>> SampleDisk::Open(const std::string& dir,
                                                     const std::string& stage, uint64_t max_bytes) {
  MMFEED_ASSIGN_OR_RETURN(
      DirFd dir_fd,
      DirFd::Open(dir, fmt::format("stage '{}': cache.disk.dir", stage), /*create=*/true));
  RemoveOrphans(dir_fd);
  static std::atomic<uint64_t> serial{0};
  const std::string name = fmt::format("{}{}-{}", kPrefix, ::getpid(), serial.fetch_add(1));
  std::unique_ptr<SampleDisk> disk(new SampleDisk(dir, stage, name, std::move(dir_fd)));
  MMFEED_RETURN_IF_ERROR(disk->MakeFolder());
  if (const uint64_t free = disk->dir_fd_.FreeBytes(); free > 0 && free < max_bytes)
    spdlog::warn(
        "stage '{}': cache.disk.max_bytes is {:.1f} GiB but {} has {:.1f} GiB free: the tier "
        "will fill the disk and then step aside (lower max_bytes or free room)",
        stage, max_bytes / 1073741824.0, dir, free / 1073741824.0);
  return disk;
}

std::shared_ptr<const DirFd> SampleDisk::Folder() const {
  std::lock_guard<std::mutex> made(make_mu_);
  return folder_;
}

Status SampleDisk::MakeFolder() {
  std::lock_guard<std::mutex> made(make_mu_);
  if (folder_ && !folder_->Gone()) return Status::Ok();  // another thread made it again
  auto fail = [&](const std::string& why) {
    dir_fd_.RemoveTree("." + name_);
    return Status::Io(fmt::format(
        "stage '{}': cache.disk.dir {}: {}; name a folder on a local file system the daemon's "
        "user may write",
        stage_, dir_, why));
  };
  // `dir` itself may have been deleted: made again where it was, never through a symlink.
  if (Status st = dir_fd_.Refresh(/*create=*/true); !st.ok()) return fail(st.message());
  const std::string hidden = "." + name_;
  Result<DirFd> made_hidden = dir_fd_.Sub(hidden, /*create=*/true, 0700);
  if (!made_hidden.ok()) return fail(made_hidden.status().message());
  const int lock = made_hidden->OpenFile(".lock", O_RDWR | O_CREAT | O_EXCL, 0600);
  if (lock < 0) return fail(fmt::format("cannot create a file in it ({})", std::strerror(errno)));
  if (::flock(lock, LOCK_EX) != 0 || !dir_fd_.Rename(hidden, name_)) {
    const std::string why = std::strerror(errno);
    ::close(lock);
    return fail(fmt::format("cannot rename a folder in it ({})", why));
  }
  // Opened again under its name (for its messages' path): still the folder made above.
  Result<DirFd> folder = dir_fd_.Sub(name_, /*create=*/false);
  struct stat a {
  }, b{};
  if (!folder.ok() || ::fstat(folder->fd(), &a) != 0 || ::fstat(made_hidden->fd(), &b) != 0 ||
      a.st_ino != b.st_ino) {
    ::close(lock);
    return fail("its folder was swapped as it was made");
  }
  if (lock_fd_ >= 0) ::close(lock_fd_);
  lock_fd_ = lock;
  folder_ = std::make_shared<const DirFd>(std::move(folder.value()));
  return Status::Ok();
}

SampleDisk::~SampleDisk() {
  dir_fd_.RemoveTree(name_);  // in the folder `dir` was when opened, whatever its path names now
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

std::string SampleDisk::PathOf(uint32_t entry) const {
  return fmt::format("{}/{}", folder_path_, entry);
}

void SampleDisk::StepAside(const std::string& why) {
  write_failures_.fetch_add(1, std::memory_order_relaxed);
  const int64_t now = static_cast<int64_t>(NowNs());
  if (aside_until_ns_.exchange(now + kAsideNs) > now) return;  // already aside: logged
  spdlog::warn(
      "stage '{}': cache disk tier {}: {}; samples are kept in memory only for a minute (the "
      "stage computes what memory does not hold)",
      stage_, folder_path_, why);
}

int SampleDisk::Write(uint32_t entry, const std::string& bytes) {
  if (static_cast<int64_t>(NowNs()) < aside_until_ns_.load(std::memory_order_relaxed)) return -1;
  std::shared_ptr<const DirFd> folder = Folder();
  int fd = folder->OpenUnnamed(0600);
  if (fd < 0 && (errno == ENOENT || folder->Gone())) {  // the folder was deleted: make it again
    Status made = MakeFolder();
    if (!made.ok()) {
      StepAside(made.message());
      return -1;
    }
    fd = Folder()->OpenUnnamed(0600);
  }
  if (fd < 0) {
    StepAside(fmt::format("cannot create a file ({})", std::strerror(errno)));
    return -1;
  }
  const Header h{kMagic, entry, bytes.size(), Checksum(bytes.data(), bytes.size())};
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
  const bool ok = Folder()->Link(fd, std::to_string(entry));
  if (!ok) StepAside(fmt::format("cannot name {} ({})", PathOf(entry), std::strerror(errno)));
  ::close(fd);
  return ok;
}

void SampleDisk::Discard(int fd) {
  if (fd >= 0) ::close(fd);
}

void SampleDisk::Remove(uint32_t entry) { Folder()->Unlink(std::to_string(entry)); }

Result<std::string> SampleDisk::Read(uint32_t entry) const {
  const std::string path = PathOf(entry);
  // O_NONBLOCK: a FIFO planted there must not block the read (fstat then refuses it).
  const int fd = Folder()->OpenFile(std::to_string(entry), O_RDONLY | O_NONBLOCK);
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
    if (Checksum(bytes.data(), bytes.size()) != h.hash)
      return Status::Io("its bytes differ from those written (checksum)");
    return Status::Ok();
  }();
  ::close(fd);
  if (!st.ok()) return Status::Io(fmt::format("{}: {}", path, st.message()));
  return bytes;
}

}  // namespace mmfeed
