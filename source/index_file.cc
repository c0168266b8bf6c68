#include "source/index_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "base/rng.h"

namespace mmfeed::index_file {

bool FullPwrite(int fd, const void* buf, size_t n, uint64_t off) {
  auto* p = static_cast<const char*>(buf);
  while (n > 0) {
    ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(off));
    if (w < 0 && errno == EINTR) continue;
    if (w == 0) errno = ENOSPC;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
    off += static_cast<uint64_t>(w);
  }
  return true;
}

bool FullPread(int fd, void* buf, size_t n, uint64_t off) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    ssize_t r = ::pread(fd, p, n, static_cast<off_t>(off));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
    off += static_cast<uint64_t>(r);
  }
  return true;
}

bool FullWrite(int fd, const void* buf, size_t n) {
  auto* p = static_cast<const char*>(buf);
  while (n > 0) {
    ssize_t r = ::write(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

Result<Stamp> Describe(int fd, const std::string& path, size_t end_bytes) {
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
    return Status::Invalid(fmt::format("{}: not a regular file", path));
  Stamp s{};
  s.size = static_cast<uint64_t>(st.st_size);
  s.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  s.inode = static_cast<uint64_t>(st.st_ino);
  std::string ends(std::min<uint64_t>(s.size, 2 * end_bytes), '\0');
  const size_t head = std::min<uint64_t>(s.size, end_bytes);
  if (!FullPread(fd, ends.data(), head, 0) ||
      !FullPread(fd, ends.data() + head, ends.size() - head, s.size - (ends.size() - head)))
    return Status::Io(fmt::format("{}: read failed: {}", path, std::strerror(errno)));
  s.ends_hash = HashString(ends, HashString(std::to_string(s.size)));
  return s;
}

std::string Differs(const Stamp& have, const Stamp& want) {
  if (have.size != want.size)
    return fmt::format("the size changed ({} -> {} bytes)", have.size, want.size);
  if (have.mtime_ns != want.mtime_ns) return "it was modified since";
  if (have.inode != want.inode) return "it was replaced since";
  if (have.ends_hash != want.ends_hash) return "its contents changed";
  return "";
}

uint64_t Hash(const Stamp& s) {
  return HashString(fmt::format("{}|{}|{}|{}", s.size, s.mtime_ns, s.inode, s.ends_hash));
}

std::string IndexPath(const std::string& path, const std::string& index_dir) {
  if (index_dir.empty()) return path + ".mmfidx";
  std::error_code ec;
  const bool url = path.find("://") != std::string::npos;  // a remote shard: named by its URL
  const std::string abs =
      url ? path : std::filesystem::absolute(path, ec).lexically_normal().string();
  const std::string name = std::filesystem::path(path).filename().string();
  return fmt::format("{}/index/{}-{:016x}.mmfidx", index_dir, name, HashString(abs));
}

std::string TempPath(const std::string& path, const char* what) {
  return fmt::format("{}.{}.{}", path, ::getpid(), what);
}

void RemoveStaleTemps(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto old = fs::file_time_type::clock::now() - std::chrono::hours(1);
  for (fs::directory_iterator it(dir.empty() ? "." : dir, ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const size_t at = name.rfind(".mmfidx.");
    if (at == std::string::npos || name.size() < 4 || name.compare(name.size() - 4, 4, ".tmp"))
      continue;
    const size_t pid_end = name.find('.', at + 8);
    if (pid_end == at + 8 || name.find_first_not_of("0123456789", at + 8) != pid_end) continue;
    std::error_code e;
    if (fs::last_write_time(it->path(), e) < old && !e) fs::remove(it->path(), e);
  }
}

bool WriteAtomically(const std::string& path, const std::string& bytes) {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  const std::string tmp = TempPath(path);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  bool ok = FullWrite(fd, bytes.data(), bytes.size()) && ::fsync(fd) == 0;
  int err = ok ? 0 : errno;
  if (::close(fd) != 0 && ok) {
    ok = false;
    err = errno;
  }
  if (ok && std::rename(tmp.c_str(), path.c_str()) != 0) {
    ok = false;
    err = errno;
  }
  if (!ok) {
    ::unlink(tmp.c_str());
    errno = err ? err : EIO;
  }
  return ok;
}

MappedFile::~MappedFile() { Unmap(); }

void MappedFile::Unmap() {
  if (map_) ::munmap(map_, bytes_);
  map_ = nullptr;
  bytes_ = 0;
}

bool MappedFile::Map(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = Map(fd);
  const int err = errno;
  ::close(fd);
  errno = err;
  return ok;
}

bool MappedFile::Map(int fd) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return false;
  Unmap();
  if (st.st_size == 0) return true;
  void* m = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) return false;
  map_ = m;
  bytes_ = static_cast<size_t>(st.st_size);
  return true;
}

}  // namespace mmfeed::index_file
