// Stage and StageWorker: the interface every processing stage type implements.
//
// A Stage is built once from its config (on the supervisor thread) and is immutable afterwards.
// It creates one StageWorker per worker thread; a worker keeps whatever per-thread state it
// needs (decoder handles, scratch buffers) and is only ever called from its own thread.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"
#include "base/tensor.h"

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

// What a worker may know about the sample it processes. Random choices must be drawn from
// Rng(seed, epoch, id, stage name) so they do not depend on the worker that runs the sample.
struct SampleContext {
  uint64_t seed = 0;
  uint32_t epoch = 0;
  std::string_view id;
  std::string_view origin;  // where the sample came from, for error messages
  // What Stage::Inputs() asked for, in its order: the sample's other fields, and other stages'
  // outputs for this sample (each tensor's one-sample bytes, laid out as its TensorSpec says).
  const FieldValue* const* fields = nullptr;
  const uint8_t* const* tensors = nullptr;
  const TensorSpec* const* tensor_specs = nullptr;  // the tensors' shapes
};

// `path` as seen from the folder `base_dir` (a config's or a manifest's): absolute paths and
// "" are returned as they are.
// URLs (IsRemotePath) are returned as they are too.
std::string ResolvePath(const std::string& base_dir, const std::string& path);
// Whether `path` is an http://, https:// or s3:// URL (read through stages/source/remote_store.h).
bool IsRemotePath(std::string_view path);

// What a sample may open. A sample's paths come from a dataset that may be hostile: only
// regular files (a FIFO, device, socket or directory is refused without blocking), at most
// `max_bytes` (checked with fstat before reading), and, when `roots` is not empty, only files
// whose real path (symlinks resolved, from the open descriptor) lies inside one of the roots.
class FieldFile;

// Where URL fields (IsRemotePath: tar members of shards in object storage) are read: the
// pipeline's RemoteStore (stages/source/remote_store.h). Called from worker threads.
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

// Where a worker writes one sample's outputs: out[k] has room for exactly
// OutputSpecs()[k].NumBytes() bytes. In the daemon these point straight into the batch's
// shared-memory slot, so a sample is written once and never copied.
class OutputRow {
 public:
  OutputRow(uint8_t* const* ptrs, size_t count) : ptrs_(ptrs), count_(count) {}
  uint8_t* operator[](size_t k) const { return ptrs_[k]; }
  size_t size() const { return count_; }
  template <typename T>
  T* As(size_t k) const {
    return reinterpret_cast<T*>(ptrs_[k]);
  }

 private:
  uint8_t* const* ptrs_;
  size_t count_;
};

class StageWorker {
 public:
  virtual ~StageWorker() = default;
  // Turns one field into the stage's outputs, written to `out` in the order of
  // Stage::OutputSpecs(). Errors are per-sample (the pipeline applies its on_error policy);
  // after an error the contents of `out` are undefined.
  virtual Status Process(const SampleContext& ctx, const FieldValue& in, const OutputRow& out) = 0;
  // For token-budget batches (stages/runtime/budget.h): writes what the outputs will say of
  // the sample's size without the costly work (an image's grid from its header, a text's
  // tokens), i.e. every output but the one Stage::Costs().patches names, whose
  // pointers are null. Its errors are the sample's. Unsupported by default.
  virtual Status Measure(const SampleContext& ctx, const FieldValue& in, const OutputRow& out) {
    (void)ctx, (void)in, (void)out;
    return Status::Unsupported("this stage cannot measure a sample before processing it");
  }
};

class Stage {
 public:
  virtual ~Stage() = default;
  // Per-sample outputs (name, dtype, shape); fixed for the life of the stage so the ring can
  // size its slots up front.
  virtual std::vector<TensorSpec> OutputSpecs() const = 0;
  virtual std::unique_ptr<StageWorker> NewWorker() const = 0;
  // What a worker reads besides its own field: other fields of the sample (the source loads
  // them as it loads `field:`; a sample without one fails), and outputs of other stages for the
  // same sample (by tensor name; the stage then runs on a sample after the stages that make
  // them, e.g. a chat template that needs the image's patch grid). None by default.
  struct Inputs {
    std::vector<std::string> fields, tensors;
  };
  virtual Inputs ExtraInputs() const { return {}; }
  // Figures a stage keeps about its own work, shown in the profile (the video stage: frames
  // decoded per frame sampled, seeks); none by default. Called from any thread.
  virtual std::vector<std::pair<std::string, double>> Metrics() const { return {}; }
  // What token-budget batches count of this stage's outputs: `tokens`, an int32 [] output
  // holding the sample's text tokens; `patches`, a ragged output whose rows are vision patches.
  // Empty names: the stage adds nothing to a budget.
  struct CostOutputs {
    std::string tokens, patches;
  };
  virtual CostOutputs Costs() const { return {}; }
};

}  // namespace mmfeed
