#include "stages/runtime/stage.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace mmfeed {

std::string ResolvePath(const std::string& base_dir, const std::string& path) {
  if (path.empty() || path[0] == '/') return path;
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

Result<FieldFile> FieldFile::Open(const FieldValue& field) {
  FieldFile f;
  f.fd_ = ::open(field.data.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd_ < 0) {
    int e = errno;
    if (e == ENOENT) return Status::NotFound(field.data + ": no such file");
    return Status::Io(field.data + ": " + std::strerror(e));
  }
  struct stat st;
  if (fstat(f.fd_, &st) != 0) return Status::Io(field.data + ": " + std::strerror(errno));
  const bool range = field.kind == FieldValue::Kind::kFileRange;
  f.offset_ = range ? field.offset : 0;
  f.size_ = range ? field.size : static_cast<uint64_t>(st.st_size);
  if (f.offset_ + f.size_ > static_cast<uint64_t>(st.st_size))
    return Status::Corrupt(fmt::format("{}: member at offset {} runs past the end of the file",
                                       field.data, f.offset_));
  f.identity_ = fmt::format("{}@{}+{}:{}.{}", field.data, f.offset_, f.size_, st.st_mtim.tv_sec,
                            st.st_mtim.tv_nsec);
  return f;
}

Result<std::string_view> FieldBytes(const FieldValue& field, std::string* storage) {
  if (field.kind == FieldValue::Kind::kText || field.kind == FieldValue::Kind::kBytes)
    return std::string_view(field.data);
  Result<FieldFile> file = FieldFile::Open(field);
  if (!file.ok()) return file.status();
  storage->resize(file->size());
  size_t done = 0;
  while (done < storage->size()) {
    ssize_t n =
        ::pread(file->fd(), storage->data() + done, storage->size() - done, file->offset() + done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      return Status::Io(field.data +
                        ": read failed: " + (n == 0 ? "short file" : std::strerror(errno)));
    done += static_cast<size_t>(n);
  }
  return std::string_view(*storage);
}

}  // namespace mmfeed
