#include "source/sample.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

#include "base/clock.h"

namespace mmfeed {

bool IsRemotePath(std::string_view path) {
  return path.rfind("http://", 0) == 0 || path.rfind("https://", 0) == 0 ||
         path.rfind("s3://", 0) == 0;
}

std::string ResolvePath(const std::string& base_dir, const std::string& path) {
  if (path.empty() || path[0] == '/' || IsRemotePath(path)) return path;
  return (std::filesystem::path(base_dir) / path).lexically_normal().string();
}

FieldFile& FieldFile::operator=(FieldFile&& o) noexcept {
  std::swap(fd_, o.fd_);
  std::swap(offset_, o.offset_);
  std::swap(size_, o.size_);
  std::swap(identity_, o.identity_);
  return *this;
}

FieldFile::~FieldFile() {
  if (fd_ >= 0) ::close(fd_);
}

namespace {
thread_local const FilePolicy* t_file_policy = nullptr;
thread_local int64_t t_deadline_ns = 0;  // steady clock; 0: none
thread_local int64_t t_limit_ns = 0;     // the sample's whole time limit

const FilePolicy kDefaultFilePolicy;
}  // namespace

ScopedFilePolicy::ScopedFilePolicy(const FilePolicy* policy) : previous_(t_file_policy) {
  t_file_policy = policy;
}
ScopedFilePolicy::~ScopedFilePolicy() { t_file_policy = previous_; }

ScopedSampleDeadline::ScopedSampleDeadline(double seconds) : previous_(t_deadline_ns) {
  t_limit_ns = seconds > 0 ? static_cast<int64_t>(seconds * 1e9) : 0;
  t_deadline_ns = seconds > 0 ? static_cast<int64_t>(NowNs()) + t_limit_ns : 0;
}
ScopedSampleDeadline::~ScopedSampleDeadline() { t_deadline_ns = previous_; }

bool SampleDeadlinePassed() {
  return t_deadline_ns != 0 && static_cast<int64_t>(NowNs()) > t_deadline_ns;
}

SampleDeadlinePause::SampleDeadlinePause() : had_(t_deadline_ns != 0) { t_deadline_ns = 0; }
SampleDeadlinePause::~SampleDeadlinePause() {
  if (had_) t_deadline_ns = static_cast<int64_t>(NowNs()) + t_limit_ns;
}

bool InsideRoots(std::string_view real, const std::vector<std::string>& roots) {
  if (roots.empty()) return true;
  for (const std::string& root : roots)
    if (real.substr(0, root.size()) == root) return true;
  return false;
}

Result<FieldFile> FieldFile::Open(const FieldValue& field, uint64_t max_bytes) {
  const FilePolicy& policy = t_file_policy ? *t_file_policy : kDefaultFilePolicy;
  if (policy.read_delay_ms > 0)  // an injected fault (faults.read_delay_ms): slow storage
    std::this_thread::sleep_for(std::chrono::milliseconds(policy.read_delay_ms));
  if (field.kind == FieldValue::Kind::kList)
    return Status::Invalid(
        fmt::format("the field is a list of {} values; this stage takes one", field.items.size()));
  if (IsRemotePath(field.data)) {
    if (field.kind != FieldValue::Kind::kFileRange)
      return Status::Invalid(field.data + ": only tar members of remote shards can be read");
    if (!max_bytes) max_bytes = policy.max_bytes;
    if (field.size > max_bytes)
      return Status::TooLarge(
          fmt::format("{}: member at offset {} is {} bytes, more than "
                      "max_bytes {}",
                      field.data, field.offset, field.size, max_bytes));
    if (!policy.remote) return Status::Invalid(field.data + ": no remote store to read it from");
    return policy.remote->OpenRange(field.data, field.offset, field.size, field.member);
  }
  FieldFile f;
  // O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused below).
  f.fd_ = ::open(field.data.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (f.fd_ < 0) {
    int e = errno;
    if (e == ENOENT) return Status::NotFound(field.data + ": no such file");
    if (e == EMFILE || e == ENFILE || e == ENOMEM)
      return Status::ResourceExhausted(field.data + ": " + std::strerror(e));
    return Status::Io(field.data + ": " + std::strerror(e));
  }
  struct stat st;
  if (fstat(f.fd_, &st) != 0) return Status::Io(field.data + ": " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) {
    const char* what = S_ISDIR(st.st_mode)    ? "a directory"
                       : S_ISFIFO(st.st_mode) ? "a FIFO"
                       : S_ISSOCK(st.st_mode) ? "a socket"
                                              : "a device";
    return Status::Invalid(fmt::format("{}: is {}, not a regular file", field.data, what));
  }
  if (!policy.roots.empty()) {
    char real[4096];
    ssize_t n = readlink(fmt::format("/proc/self/fd/{}", f.fd_).c_str(), real, sizeof(real) - 1);
    if (n <= 0) return Status::Io(field.data + ": cannot resolve its real path");
    std::string_view path(real, static_cast<size_t>(n));
    if (!InsideRoots(path, policy.roots))
      return Status::Invalid(
          fmt::format("{}: outside the data roots (it is {})", field.data, path));
  }
  const bool range = field.kind == FieldValue::Kind::kFileRange;
  f.offset_ = range ? field.offset : 0;
  f.size_ = range ? field.size : static_cast<uint64_t>(st.st_size);
  if (!max_bytes) max_bytes = policy.max_bytes;
  if (f.size_ > max_bytes)
    return Status::TooLarge(
        fmt::format("{}: {} bytes, more than max_bytes {}", field.data, f.size_, max_bytes));
  if (f.offset_ + f.size_ > static_cast<uint64_t>(st.st_size))
    return Status::Corrupt(fmt::format("{}: member at offset {} runs past the end of the file",
                                       field.data, f.offset_));
  f.identity_ = fmt::format("{}@{}+{}:{}.{}", field.data, f.offset_, f.size_, st.st_mtim.tv_sec,
                            st.st_mtim.tv_nsec);
  return f;
}

FieldFile FieldFile::Adopt(int fd, uint64_t offset, uint64_t size, std::string identity) {
  FieldFile f;
  f.fd_ = fd;
  f.offset_ = offset;
  f.size_ = size;
  f.identity_ = std::move(identity);
  return f;
}

Result<std::string_view> FieldBytes(const FieldValue& field, std::string* storage,
                                    uint64_t max_bytes) {
  if (field.kind == FieldValue::Kind::kText || field.kind == FieldValue::Kind::kBytes)
    return std::string_view(field.data);
  MMFEED_ASSIGN_OR_RETURN(FieldFile file, FieldFile::Open(field, max_bytes));
  storage->resize(file.size());
  size_t done = 0;
  while (done < storage->size()) {
    ssize_t n =
        ::pread(file.fd(), storage->data() + done, storage->size() - done, file.offset() + done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      return Status::Io(field.data +
                        ": read failed: " + (n == 0 ? "short file" : std::strerror(errno)));
    done += static_cast<size_t>(n);
  }
  return std::string_view(*storage);
}

}  // namespace mmfeed
