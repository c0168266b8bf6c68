#include "base/atomic_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace mmfeed {

Status WriteAtomicallyAt(int dir_fd, const std::string& name, const std::string& shown,
                         const std::string& text) {
  // A fresh name per call (pid, a counter): two writers never share a temporary file, and
  // O_EXCL | O_NOFOLLOW refuse anything already there, a planted symlink included.
  // A name taken by something planted there is skipped.
  static std::atomic<uint64_t> counter{0};
  std::string tmp;
  int fd = -1;
  for (int attempt = 0; fd < 0 && attempt < 100; ++attempt) {
    tmp = fmt::format("{}.tmp.{}.{}", name, ::getpid(), counter.fetch_add(1));
    fd = ::openat(dir_fd, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0)
    return Status::Io(
        fmt::format("cannot write {}: {}", dir_fd == AT_FDCWD ? tmp : shown, std::strerror(errno)));
  int err = 0;
  size_t done = 0;
  while (done < text.size() && !err) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno != EINTR) err = errno;
    if (n > 0) done += static_cast<size_t>(n);
  }
  if (!err && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && !err) err = errno;
  if (!err && ::renameat(dir_fd, tmp.c_str(), dir_fd, name.c_str()) != 0) err = errno;
  if (err) {
    ::unlinkat(dir_fd, tmp.c_str(), 0);
    return Status::Io(fmt::format("cannot write {}: {}", shown, std::strerror(err)));
  }
  return Status::Ok();
}

Status WriteFileAtomically(const std::string& path, const std::string& text) {
  MMFEED_RETURN_IF_ERROR(WriteAtomicallyAt(AT_FDCWD, path, path, text));
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return Status::Ok();
}

Result<std::optional<std::string>> ReadSmallFile(const std::string& path, size_t max_bytes) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused just below).
  int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return std::optional<std::string>();
    if (errno == ELOOP) return Status::Invalid(fmt::format("{} is a symbolic link: refused", path));
    return Status::Io(fmt::format("cannot read {}: {}", path, std::strerror(errno)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::Invalid(fmt::format("{} is not a regular file", path));
  }
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    ::close(fd);
    return Status::TooLarge(fmt::format("{} has {} bytes, more than the {} such a file may have",
                                        path, static_cast<uint64_t>(st.st_size), max_bytes));
  }
  std::string text(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::pread(fd, text.data() + done, text.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = n < 0 ? errno : EIO;
      ::close(fd);
      return Status::Io(fmt::format("cannot read {}: {}", path, std::strerror(err)));
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return std::optional<std::string>(std::move(text));
}

}  // namespace mmfeed
