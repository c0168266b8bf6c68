// A sample's fields as a source finds them, and what a sample may open: FieldValue (a text, a
// path, bytes, a range of a file, a list), FieldFile (an open file or range, checked against the
// thread's FilePolicy), the per-sample deadline, and the RemoteReader that URL fields are read
// through. Sources make FieldValues; stages (engine/stage.h) read them.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"

namespace mmfeed {

// The most values a field's list may hold (a manifest's "images": [...]).
constexpr size_t kMaxListItems = 256;

// One field of a sample as the source found it.
struct FieldValue {
  enum class Kind { kText, kPath, kBytes, kFileRange, kList };
  Kind kind = Kind::kText;
  std::string data;  // the text itself, a file path, or the bytes
  // kFileRange: `size` bytes at `offset` of the file `data` (a tar member, read in place)
  uint64_t offset = 0;
  uint64_t size = 0;
  std::string member;  // kFileRange: the tar member's name, when known (remote reads check it)
  // kList (a manifest's JSON array, e.g. "images": [...]): the values, none of them a list.
  // Only stages that take several values read one; FieldFile::Open and FieldBytes refuse it.
  std::vector<FieldValue> items;
};

// `path` as seen from the folder `base_dir` (a config's or a manifest's): absolute paths and
// "" are returned as they are.
// URLs (IsRemotePath) are returned as they are too.
std::string ResolvePath(const std::string& base_dir, const std::string& path);
// Whether `path` is an http://, https:// or s3:// URL (read through source/remote_store.h).
bool IsRemotePath(std::string_view path);

// What a sample may open. A sample's paths come from a dataset that may be hostile: only
// regular files (a FIFO, device, socket or directory is refused without blocking), at most
// `max_bytes` (checked with fstat before reading), and, when `roots` is not empty, only files
// whose real path (symlinks resolved, from the open descriptor) lies inside one of the roots.
class FieldFile;

// Where URL fields (IsRemotePath: tar members of shards in object storage) are read: the
// pipeline's RemoteStore (source/remote_store.h). Called from worker threads.
class RemoteReader {
 public:
  virtual ~RemoteReader() = default;
  // `size` bytes at `offset` of the object at `url`, as an open file. `member`: the tar member
  // those bytes are (its name; empty when unknown), checked against its header.
  virtual Result<FieldFile> OpenRange(const std::string& url, uint64_t offset, uint64_t size,
                                      const std::string& member) = 0;
};

struct FilePolicy {
  static constexpr uint64_t kDefaultMaxBytes = 256ull << 20;
  uint64_t max_bytes = kDefaultMaxBytes;
  std::vector<std::string> roots;  // real paths of folders, each ending in '/'; empty: anywhere
  int read_delay_ms = 0;           // an injected fault (config `faults:`): sleeps before each open
  RemoteReader* remote = nullptr;  // reads URL fields; none: they are refused
};

// Whether the real path `real` lies inside one of `roots` (FilePolicy::roots; empty: anywhere).
bool InsideRoots(std::string_view real, const std::vector<std::string>& roots);

// Makes `policy` the calling thread's for FieldFile::Open while it lives (the pipeline's
// workers run every sample under one; elsewhere the defaults above apply, without roots).
class ScopedFilePolicy {
 public:
  explicit ScopedFilePolicy(const FilePolicy* policy);
  ~ScopedFilePolicy();
  ScopedFilePolicy(const ScopedFilePolicy&) = delete;
  ScopedFilePolicy& operator=(const ScopedFilePolicy&) = delete;

 private:
  const FilePolicy* previous_;
};

// The time limit of the sample the calling thread works on (`sample_timeout_s`): while a
// ScopedSampleDeadline lives, SampleDeadlinePassed() says whether it ran out. Stages check it
// where they loop over input they do not control (FFmpeg's demuxing and decoding loops, reads)
// and give up with an error; the pipeline then reports the sample as timed out, naming its
// file, and the worker takes the next one. A read blocked in the kernel (a hung network
// mount) is not interrupted.
class ScopedSampleDeadline {
 public:
  explicit ScopedSampleDeadline(double seconds);  // <= 0: no limit
  ~ScopedSampleDeadline();
  ScopedSampleDeadline(const ScopedSampleDeadline&) = delete;
  ScopedSampleDeadline& operator=(const ScopedSampleDeadline&) = delete;

 private:
  int64_t previous_;
};
bool SampleDeadlinePassed();
// While it lives, the calling thread's sample has no time limit (it waits for something that
// says nothing about the sample: a store that answers no one); after, its limit starts again
// in full. No limit stays none.
class SampleDeadlinePause {
 public:
  SampleDeadlinePause();
  ~SampleDeadlinePause();
  SampleDeadlinePause(const SampleDeadlinePause&) = delete;
  SampleDeadlinePause& operator=(const SampleDeadlinePause&) = delete;

 private:
  bool had_;
};

// The file behind a kPath or kFileRange field, open: `size` bytes at `offset` of `fd`.
// Move-only; closes the file.
class FieldFile {
 public:
  FieldFile() = default;
  FieldFile(FieldFile&& o) noexcept { *this = std::move(o); }
  FieldFile& operator=(FieldFile&& o) noexcept;
  ~FieldFile();
  // Errors: missing file (kNotFound), unreadable, not a regular file, larger than max_bytes
  // (kTooLarge), outside the data roots, a range past the end of the file; out of file
  // descriptors or memory is kResourceExhausted (a condition of the machine, not of the file).
  static Result<FieldFile> Open(const FieldValue& field, uint64_t max_bytes = 0);
  // Takes ownership of `fd`, whose bytes [offset, offset + size) are the field's.
  static FieldFile Adopt(int fd, uint64_t offset, uint64_t size, std::string identity);

  int fd() const { return fd_; }
  uint64_t offset() const { return offset_; }
  uint64_t size() const { return size_; }
  // Path, range, size and mtime: names the contents for caches.
  const std::string& identity() const { return identity_; }

 private:
  int fd_ = -1;
  uint64_t offset_ = 0, size_ = 0;
  std::string identity_;
};

// Returns the bytes of a field: the file's contents (or range of it) for kPath and kFileRange,
// the data itself otherwise.
// `storage` receives file contents; the view points into it or into `field`.
// `max_bytes` (when not 0) replaces the thread's FilePolicy limit.
Result<std::string_view> FieldBytes(const FieldValue& field, std::string* storage,
                                    uint64_t max_bytes = 0);

}  // namespace mmfeed
