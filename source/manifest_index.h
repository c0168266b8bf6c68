// ManifestIndex: where each sample's line starts in a JSONL manifest, built once by streaming
// through the manifest and kept in a file that later starts map, so that a catalog of any size
// costs 8 bytes per sample (the line's offset, in the page cache) instead of its parsed
// fields, and a start with the index present costs a header check.
//
// File (little-endian; the host's byte order, checked by the magic):
//   Header                       magic "MMFIDX1\0", the manifest's size, mtime, inode and a
//                                hash of its first and last 64 KiB, the entry count, the count
//                                of line-number marks
//   uint64 offsets[count + 1]    entry i's line starts at offsets[i]; offsets[count] = size
//   Mark marks[marks]            entries after blank lines: line number of entry `entry`
//                                (entry j >= entry has line mark.line + j - mark.entry)
// A blank (whitespace-only) line is not an entry. Lines are parsed when read (Catalog): a
// malformed line is a failed sample, counted with its line, not a start-up error.
//
// Where: `<index_dir>/<hash of the manifest's absolute path>.mmfidx` when index_dir is given
// (the daemon's --state-dir), else `<manifest>.mmfidx` beside it when that folder is
// writable, else in memory (8 bytes per sample of heap, with a warning). A stale index (the
// manifest's size, mtime, inode or hashed ends differ) is rebuilt, and the log says why.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "source/index_file.h"

namespace mmfeed {

class ManifestIndex {
 public:
  ~ManifestIndex();
  ManifestIndex(const ManifestIndex&) = delete;
  ManifestIndex& operator=(const ManifestIndex&) = delete;

  static Result<std::unique_ptr<ManifestIndex>> Open(const std::string& manifest,
                                                     const std::string& index_dir);

  size_t size() const { return count_; }
  // Entry i's line (without its newline) and its 1-based line number in the manifest.
  // REQUIRES: i < size().
  Status Line(size_t i, std::string* line, uint64_t* line_no) const;
  // Names the manifest's contents (size, mtime, inode, hashed ends).
  uint64_t fingerprint() const { return fingerprint_; }
  // Where the index lives ("" when in memory), and whether this Open built it.
  const std::string& path() const { return path_; }
  bool built() const { return built_; }

  struct Header;
  struct Mark {
    uint64_t entry, line;
  };

 private:
  ManifestIndex() = default;

  std::string manifest_, path_;
  int fd_ = -1;  // the manifest, for pread
  bool built_ = false;
  uint64_t count_ = 0, fingerprint_ = 0, manifest_size_ = 0;
  const uint64_t* offsets_ = nullptr;
  const Mark* marks_ = nullptr;
  uint64_t mark_count_ = 0;
  index_file::MappedFile map_;          // the index file
  std::vector<uint64_t> heap_offsets_;  // or the index in memory
  std::vector<Mark> heap_marks_;
};

}  // namespace mmfeed
