#include "base/dir_fd.h"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <pwd.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "base/atomic_file.h"

namespace mmfeed {
namespace {

std::string UserName(uid_t uid) {
  passwd pw{}, *found = nullptr;
  char buf[1024];
  if (::getpwuid_r(uid, &pw, buf, sizeof buf, &found) == 0 && found) return pw.pw_name;
  return fmt::format("uid {}", uid);
}

}  // namespace

Result<int> OpenCheckedFolder(int parent, const std::string& name, const std::string& path,
                              bool create, mode_t mode) {
  if (create && ::mkdirat(parent, name.c_str(), mode) != 0 && errno != EEXIST)
    return Status::Io(fmt::format("{}: cannot create it ({})", path, std::strerror(errno)));
  const int fd = ::openat(parent, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    struct stat st {};
    if (err == ELOOP || err == EMLINK ||
        (err == ENOTDIR && ::fstatat(parent, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
         S_ISLNK(st.st_mode)))
      return Status::Invalid(fmt::format(
          "{} is a symbolic link: refused (a link can be swapped to send the daemon's files "
          "elsewhere; name the folder it points to)",
          path));
    if (err == ENOTDIR) return Status::Invalid(fmt::format("{} is not a folder", path));
    return Status::Io(fmt::format("{}: cannot open it ({})", path, std::strerror(err)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return Status::Io(fmt::format("{}: {}", path, std::strerror(err)));
  }
  if (st.st_uid != ::geteuid()) {
    ::close(fd);
    return Status::Invalid(fmt::format(
        "{} belongs to user {}, not to the daemon's user ({}): that user could swap what is in "
        "it; name a folder of the daemon's own (or chown it)",
        path, UserName(st.st_uid), UserName(::geteuid())));
  }
  return fd;
}

Result<DirFd> DirFd::Open(const std::string& path, const std::string& what, bool create,
                          mode_t mode) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  if (p.empty()) return Status::Invalid(what + " is empty");
  const size_t slash = p.rfind('/');
  const std::string parent = slash == std::string::npos ? "."
                             : slash == 0               ? "/"
                                                        : p.substr(0, slash);
  const std::string name = slash == std::string::npos ? p : p.substr(slash + 1);
  if (name.empty() || name == "." || name == "..")
    return Status::Invalid(fmt::format("{} {}: name the folder itself", what, path));
  if (create) {
    std::error_code ec;
    std::filesystem::create_directories(parent, ec);  // at start: the folders above it
  }
  const int pfd = ::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (pfd < 0)
    return Status::Io(
        fmt::format("{} {}: cannot open {} ({})", what, path, parent, std::strerror(errno)));
  Result<int> fd = OpenCheckedFolder(pfd, name, p, create, mode);
  if (!fd.ok()) {
    ::close(pfd);
    return fd.status().WithContext(what);
  }
  return DirFd(*fd, pfd, p, name);
}

Result<DirFd> DirFd::Sub(const std::string& name, bool create, mode_t mode) const {
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
    return Status::Invalid(fmt::format("{}: '{}' is not a folder name", path_, name));
  const int pfd = ::fcntl(fd_, F_DUPFD_CLOEXEC, 0);
  if (pfd < 0) return Status::ResourceExhausted(fmt::format("{}: {}", path_, std::strerror(errno)));
  Result<int> fd = OpenCheckedFolder(fd_, name, path_ + "/" + name, create, mode);
  if (!fd.ok()) {
    ::close(pfd);
    return fd.status();
  }
  return DirFd(*fd, pfd, path_ + "/" + name, name);
}

DirFd& DirFd::operator=(DirFd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    if (parent_ >= 0) ::close(parent_);
    fd_ = o.fd_;
    parent_ = o.parent_;
    path_ = std::move(o.path_);
    name_ = std::move(o.name_);
    o.fd_ = o.parent_ = -1;
  }
  return *this;
}

DirFd::~DirFd() {
  if (fd_ >= 0) ::close(fd_);
  if (parent_ >= 0) ::close(parent_);
}

bool DirFd::Gone() const {
  struct stat st {};
  return ::fstat(fd_, &st) != 0 || st.st_nlink == 0;
}

Status DirFd::Refresh(bool create, mode_t mode) {
  if (!Gone()) return Status::Ok();
  if (parent_ < 0) return Status::Io(fmt::format("{} was deleted", path_));
  MMFEED_ASSIGN_OR_RETURN(int fd, OpenCheckedFolder(parent_, name_, path_, create, mode));
  ::close(fd_);
  fd_ = fd;
  return Status::Ok();
}

Result<DirFd> DirFd::Reopen(bool create, mode_t mode) const {
  if (parent_ < 0) return Status::Io(fmt::format("{} was deleted", path_));
  const int pfd = ::fcntl(parent_, F_DUPFD_CLOEXEC, 0);
  if (pfd < 0) return Status::ResourceExhausted(fmt::format("{}: {}", path_, std::strerror(errno)));
  Result<int> fd = OpenCheckedFolder(parent_, name_, path_, create, mode);
  if (!fd.ok()) {
    ::close(pfd);
    return fd.status();
  }
  return DirFd(*fd, pfd, path_, name_);
}

int DirFd::OpenUnnamed(mode_t mode) const {
  return ::openat(fd_, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, mode);
}

bool DirFd::Link(int fd, const std::string& name) const {
  const std::string proc = fmt::format("/proc/self/fd/{}", fd);
  ::unlinkat(fd_, name.c_str(), 0);
  return ::linkat(AT_FDCWD, proc.c_str(), fd_, name.c_str(), AT_SYMLINK_FOLLOW) == 0;
}

int DirFd::OpenFile(const std::string& name, int flags, mode_t mode) const {
  return ::openat(fd_, name.c_str(), flags | O_NOFOLLOW | O_CLOEXEC, mode);
}

bool DirFd::Unlink(const std::string& name) const { return ::unlinkat(fd_, name.c_str(), 0) == 0; }

bool DirFd::Rename(const std::string& from, const std::string& to) const {
  return ::renameat(fd_, from.c_str(), fd_, to.c_str()) == 0;
}

bool DirFd::RemoveTree(const std::string& name) const {
  struct stat st {};
  if (::fstatat(fd_, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return errno == ENOENT;
  if (!S_ISDIR(st.st_mode)) return ::unlinkat(fd_, name.c_str(), 0) == 0;
  const int sub = ::openat(fd_, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (sub < 0) return false;
  DirFd inside(sub, -1, path_ + "/" + name, name);
  bool ok = true;
  for (const std::string& n : inside.List()) ok = inside.RemoveTree(n) && ok;
  return ::unlinkat(fd_, name.c_str(), AT_REMOVEDIR) == 0 && ok;
}

std::vector<std::string> DirFd::List() const {
  std::vector<std::string> out;
  const int dup = ::openat(fd_, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);  // its own offset
  if (dup < 0) return out;
  DIR* d = ::fdopendir(dup);
  if (!d) {
    ::close(dup);
    return out;
  }
  while (dirent* e = ::readdir(d)) {
    if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
    out.emplace_back(e->d_name);
  }
  ::closedir(d);
  return out;
}

bool DirFd::Stat(const std::string& name, struct stat* st) const {
  return ::fstatat(fd_, name.c_str(), st, AT_SYMLINK_NOFOLLOW) == 0;
}

Status DirFd::WriteAtomically(const std::string& name, const std::string& text) const {
  MMFEED_RETURN_IF_ERROR(WriteAtomicallyAt(fd_, name, path_ + "/" + name, text));
  ::fsync(fd_);
  return Status::Ok();
}

uint64_t DirFd::FreeBytes() const {
  struct statvfs fs {};
  if (::fstatvfs(fd_, &fs) != 0) return 0;
  return uint64_t{fs.f_bavail} * fs.f_frsize;
}

}  // namespace mmfeed
