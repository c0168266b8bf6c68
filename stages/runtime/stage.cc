#include "stages/runtime/stage.h"

#include <fcntl.h>
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

Result<std::string_view> FieldBytes(const FieldValue& field, std::string* storage) {
  if (field.kind == FieldValue::Kind::kText || field.kind == FieldValue::Kind::kBytes)
    return std::string_view(field.data);
  bool range = field.kind == FieldValue::Kind::kFileRange;
  int fd = ::open(field.data.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    if (e == ENOENT) return Status::NotFound(field.data + ": no such file");
    return Status::Io(field.data + ": " + std::strerror(e));
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    return Status::Io(field.data + ": " + std::strerror(e));
  }
  uint64_t start = range ? field.offset : 0;
  uint64_t size = range ? field.size : static_cast<uint64_t>(st.st_size);
  if (start + size > static_cast<uint64_t>(st.st_size)) {
    ::close(fd);
    return Status::Corrupt(field.data + ": member at offset " + std::to_string(start) +
                           " runs past the end of the file");
  }
  storage->resize(size);
  size_t done = 0;
  while (done < storage->size()) {
    ssize_t n = ::pread(fd, storage->data() + done, storage->size() - done, start + done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int e = errno;
      ::close(fd);
      return Status::Io(field.data + ": read failed: " + (n == 0 ? "short file" : std::strerror(e)));
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return std::string_view(*storage);
}

}  // namespace mmfeed
