// What the index files of stages/source (manifest_index.h, shard_index.h) share: the stamp that
// ties an index to the file it describes, where index files live, whole reads and writes.
#pragma once

#include <cstdint>
#include <string>

#include "base/status.h"

namespace mmfeed::index_file {

// The indexed file's size, mtime, inode and a hash of its first and last `end_bytes`: an index
// whose stamp differs from the file's describes another file (or an older version of it).
struct Stamp {
  uint64_t size;
  int64_t mtime_ns;
  uint64_t inode;
  uint64_t ends_hash;
};
Result<Stamp> Describe(int fd, const std::string& path, size_t end_bytes);
// Why an index stamped `have` does not describe the file stamped `want` ("" when it does).
std::string Differs(const Stamp& have, const Stamp& want);
uint64_t Hash(const Stamp& s);

// `<index_dir>/index/<name>-<hash of the absolute path>.mmfidx` when index_dir is given, else
// `<path>.mmfidx` beside the data.
std::string IndexPath(const std::string& path, const std::string& index_dir);

// The temporary file this process writes index `path` through: daemons on several nodes may
// index the same data on a shared file system at once, and each writes its own (sharing one
// would let a late opener truncate what an early one already renamed into place).
std::string TempPath(const std::string& path, const char* what = "tmp");
// Removes the temporary index files in `dir` that were last written over an hour ago: those a
// daemon killed while indexing left (a live build writes as it goes).
void RemoveStaleTemps(const std::string& dir);

// Write `bytes` to `path` through TempPath renamed over it (fsync'd first), creating its
// folder; false with errno set when it cannot, leaving nothing behind.
bool WriteAtomically(const std::string& path, const std::string& bytes);

// A whole file mapped read-only; unmapped when destroyed.
class MappedFile {
 public:
  MappedFile() = default;
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  // False, with errno set, when `path` cannot be opened or mapped.
  bool Map(const std::string& path);
  bool Map(int fd);  // the whole of an open file
  void Unmap();
  const char* data() const { return static_cast<const char*>(map_); }
  size_t size() const { return bytes_; }

 private:
  void* map_ = nullptr;
  size_t bytes_ = 0;
};

bool FullPread(int fd, void* buf, size_t n, uint64_t off);
// All n bytes at `off`; false with errno set (ENOSPC when the file system took nothing) when not.
bool FullPwrite(int fd, const void* buf, size_t n, uint64_t off);
bool FullWrite(int fd, const void* buf, size_t n);

}  // namespace mmfeed::index_file
