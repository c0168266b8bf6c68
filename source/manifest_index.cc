#include "source/manifest_index.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <vector>

#include "source/index_file.h"

namespace mmfeed {

using index_file::FullPread;
using index_file::FullWrite;

struct ManifestIndex::Header {
  char magic[8];
  index_file::Stamp manifest;
  uint64_t count;
  uint64_t marks;
  uint64_t reserved;
};

namespace {

constexpr char kManifestIndexMagic[8] = {'M', 'M', 'F', 'I', 'D', 'X', '1', '\0'};
constexpr uint64_t kMaxLineBytes = 16 << 20;    // a longer line is a failed sample
constexpr size_t kManifestEndBytes = 64 << 10;  // hashed at each end of the manifest

// Why an index file does not describe the manifest (empty: it does).
std::string Stale(const ManifestIndex::Header& have, const index_file::Stamp& want,
                  uint64_t file_bytes) {
  if (file_bytes < sizeof have ||
      std::memcmp(have.magic, kManifestIndexMagic, sizeof kManifestIndexMagic) != 0)
    return "not an index of this version";
  if (std::string why = index_file::Differs(have.manifest, want); !why.empty())
    return "the manifest changed: " + why;
  if (file_bytes != sizeof(ManifestIndex::Header) + (have.count + 1) * 8 +
                        have.marks * sizeof(ManifestIndex::Mark))
    return "the index file is truncated or damaged";
  return "";
}

// Streams through the manifest: the offsets of its non-blank lines go to `emit`, the
// line-number marks to `mark`, in order. Fails only when the manifest cannot be read.
Status Scan(int fd, const std::string& manifest, uint64_t size,
            const std::function<void(uint64_t)>& emit,
            const std::function<void(const ManifestIndex::Mark&)>& mark) {
  const size_t cap = static_cast<size_t>(std::min<uint64_t>(size, 8 << 20));
  auto buf = std::make_unique_for_overwrite<char[]>(std::max<size_t>(cap, 1));
  uint64_t pos = 0, line_start = 0, line_no = 1, entries = 0, last_line = 0;
  bool blank = true;
  auto end_line = [&](uint64_t next_start) {
    if (!blank) {
      if (line_no != last_line + 1) mark({entries, line_no});
      last_line = line_no;
      ++entries;
      emit(line_start);
    }
    ++line_no;
    line_start = next_start;
    blank = true;
  };
  while (pos < size) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(cap, size - pos));
    if (!FullPread(fd, buf.get(), n, pos))
      return Status::Io(fmt::format("{}: read failed at offset {}", manifest, pos));
    const char* p = buf.get();
    const char* end = p + n;
    while (p < end) {
      const char* nl = static_cast<const char*>(std::memchr(p, '\n', end - p));
      const char* seg_end = nl ? nl : end;
      for (const char* c = p; blank && c < seg_end; ++c)
        blank = *c == ' ' || *c == '\t' || *c == '\r';
      if (!nl) break;
      end_line(pos + static_cast<uint64_t>(nl - buf.get()) + 1);
      p = nl + 1;
    }
    pos += n;
  }
  end_line(size);  // a last line without '\n'
  return Status::Ok();
}

// Appends records of type T to a file in chunks of 256 KiB (bounded memory). The first failed
// write is kept (ok(), error()); later records are dropped.
template <typename T>
class ChunkWriter {
 public:
  explicit ChunkWriter(int fd) : fd_(fd) { buf_.reserve(kChunk); }
  void Add(const T& v) {
    ++count_;
    buf_.push_back(v);
    if (buf_.size() == kChunk) Flush();
  }
  bool Flush() {
    if (error_ == 0 && !FullWrite(fd_, buf_.data(), buf_.size() * sizeof(T)))
      error_ = errno ? errno : EIO;
    buf_.clear();
    return error_ == 0;
  }
  bool ok() const { return error_ == 0; }
  int error() const { return error_; }
  uint64_t count() const { return count_; }

 private:
  static constexpr size_t kChunk = (256 << 10) / sizeof(T);
  int fd_;
  int error_ = 0;
  uint64_t count_ = 0;
  std::vector<T> buf_;
};

// Builds the index file at `path`: offsets and marks written in chunks as the scan finds them
// (the marks into a temporary file of their own, appended after the offsets at the end), then
// renamed into place. A manifest that cannot be read is the returned error; an index that
// cannot be written (no folder, read-only, disk full) leaves no file behind and says why in
// *write_error.
Status WriteIndex(int manifest_fd, const std::string& manifest, const index_file::Stamp& want,
                  const std::string& path, std::string* write_error) {
  using Mark = ManifestIndex::Mark;
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  index_file::RemoveStaleTemps(std::filesystem::path(path).parent_path().string());
  const std::string tmp = index_file::TempPath(path),
                    marks_tmp = index_file::TempPath(path, "marks.tmp");
  const int out = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out < 0) {
    *write_error = std::strerror(errno);
    return Status::Ok();
  }
  const int marks_out = ::open(marks_tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  int error = marks_out < 0 ? errno : 0;
  ChunkWriter<uint64_t> offsets(out);
  ChunkWriter<Mark> marks(marks_out);
  Status st = Status::Ok();
  if (error == 0) {
    constexpr off_t kHeader = sizeof(ManifestIndex::Header);
    if (::lseek(out, kHeader, SEEK_SET) != kHeader) error = errno;
    st = Scan(
        manifest_fd, manifest, want.size, [&](uint64_t off) { offsets.Add(off); },
        [&](const Mark& m) { marks.Add(m); });
    if (!st.ok()) error = EIO;  // not a write error: reported as st, *write_error unset
    const uint64_t count = offsets.count();
    offsets.Add(want.size);
    if (error == 0 && !offsets.Flush()) error = offsets.error();
    if (error == 0 && !marks.Flush()) error = marks.error();
    if (error == 0 && ::lseek(marks_out, 0, SEEK_SET) != 0) error = errno;
    ChunkWriter<Mark> marks_after(out);  // the marks, after the offsets
    std::vector<Mark> chunk;
    for (uint64_t done = 0; error == 0 && done < marks.count(); done += chunk.size()) {
      chunk.resize(std::min<uint64_t>(marks.count() - done, 1 << 12));
      if (!FullPread(marks_out, chunk.data(), chunk.size() * sizeof(Mark), done * sizeof(Mark)))
        error = errno ? errno : EIO;
      for (const Mark& m : chunk) marks_after.Add(m);
    }
    if (error == 0 && !marks_after.Flush()) error = marks_after.error();
    ManifestIndex::Header h{};
    std::memcpy(h.magic, kManifestIndexMagic, sizeof kManifestIndexMagic);
    h.manifest = want;
    h.count = count;
    h.marks = marks.count();
    if (error == 0 &&
        (::pwrite(out, &h, sizeof h, 0) != static_cast<ssize_t>(sizeof h) || ::fsync(out) != 0))
      error = errno ? errno : EIO;
  }
  if (marks_out >= 0) {
    ::close(marks_out);
    ::unlink(marks_tmp.c_str());
  }
  if (::close(out) != 0 && error == 0) error = errno;
  if (error == 0 && std::rename(tmp.c_str(), path.c_str()) != 0) error = errno;
  if (error != 0) ::unlink(tmp.c_str());
  if (error != 0 && st.ok()) *write_error = std::strerror(error);
  return st;
}

}  // namespace

ManifestIndex::~ManifestIndex() {
  if (fd_ >= 0) ::close(fd_);
}

Result<std::unique_ptr<ManifestIndex>> ManifestIndex::Open(const std::string& manifest,
                                                           const std::string& index_dir) {
  std::unique_ptr<ManifestIndex> idx(new ManifestIndex());
  idx->manifest_ = manifest;
  idx->fd_ = ::open(manifest.c_str(), O_RDONLY | O_CLOEXEC);
  if (idx->fd_ < 0)
    return Status::NotFound(
        fmt::format("{}: cannot open manifest: {}", manifest, std::strerror(errno)));
  MMFEED_ASSIGN_OR_RETURN(index_file::Stamp want,
                          index_file::Describe(idx->fd_, manifest, kManifestEndBytes));
  idx->manifest_size_ = want.size;
  idx->fingerprint_ = index_file::Hash(want);
  const std::string path = index_file::IndexPath(manifest, index_dir);

  // An index that describes the manifest: map it.
  std::string why = "none yet";
  if (idx->map_.Map(path)) {
    Header have{};
    if (idx->map_.size() >= sizeof have) std::memcpy(&have, idx->map_.data(), sizeof have);
    why = Stale(have, want, idx->map_.size());
    if (why.empty()) {
      idx->path_ = path;
      idx->count_ = have.count;
      idx->mark_count_ = have.marks;
      idx->offsets_ = reinterpret_cast<const uint64_t*>(idx->map_.data() + sizeof(Header));
      idx->marks_ = reinterpret_cast<const Mark*>(idx->offsets_ + have.count + 1);
      return idx;
    }
  }

  // Build it: into the index file, or, when that cannot be written, in memory.
  const auto t0 = std::chrono::steady_clock::now();
  std::string write_error;
  MMFEED_RETURN_IF_ERROR(WriteIndex(idx->fd_, manifest, want, path, &write_error));
  if (write_error.empty()) {
    Result<std::unique_ptr<ManifestIndex>> again = Open(manifest, index_dir);
    if (!again.ok()) return again;
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    spdlog::info("{}: indexed {} samples in {:.1f} s ({:.0f} MB/s) into {} (previous index: {})",
                 manifest, (*again)->size(), secs, want.size / 1e6 / std::max(secs, 1e-9), path,
                 why);
    (*again)->built_ = true;
    return again;
  }
  spdlog::warn("{}: cannot write its index at {} ({}): keeping it in memory, 8 bytes per sample",
               manifest, path, write_error);
  MMFEED_RETURN_IF_ERROR(Scan(
      idx->fd_, manifest, want.size, [&](uint64_t off) { idx->heap_offsets_.push_back(off); },
      [&](const Mark& m) { idx->heap_marks_.push_back(m); }));
  idx->count_ = idx->heap_offsets_.size();
  idx->heap_offsets_.push_back(want.size);
  idx->mark_count_ = idx->heap_marks_.size();
  idx->offsets_ = idx->heap_offsets_.data();
  idx->marks_ = idx->heap_marks_.data();
  idx->built_ = true;
  return idx;
}

Status ManifestIndex::Line(size_t i, std::string* line, uint64_t* line_no) const {
  const Mark* m = std::upper_bound(marks_, marks_ + mark_count_, static_cast<uint64_t>(i),
                                   [](uint64_t v, const Mark& k) { return v < k.entry; });
  *line_no = m == marks_ ? i + 1 : (m - 1)->line + (i - (m - 1)->entry);
  const uint64_t start = offsets_[i], end = offsets_[i + 1];
  if (end < start || end > manifest_size_)
    return Status::Corrupt(fmt::format("the index of {} is damaged at entry {}", manifest_, i));
  const uint64_t n = std::min(end - start, kMaxLineBytes + 1);
  line->resize(static_cast<size_t>(n));
  if (!FullPread(fd_, line->data(), line->size(), start))
    return Status::Io(fmt::format("{}: read failed at offset {} (was the manifest truncated?)",
                                  manifest_, start));
  const size_t nl = line->find('\n');
  if (nl != std::string::npos) line->resize(nl);
  if (line->size() > kMaxLineBytes)
    return Status::TooLarge(fmt::format("line longer than {} bytes", kMaxLineBytes));
  return Status::Ok();
}

}  // namespace mmfeed
