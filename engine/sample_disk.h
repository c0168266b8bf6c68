// SampleDisk: the files of a stage cache's disk tier (`cache: {disk: {dir, max_bytes}}`,
// docs/design/cache.md). SampleCache decides what is kept; this class only stores and checks.
//
// The tier's folder is `<dir>/mmfeed-samples-<pid>-<n>`, private to one cache (mode 0700) and
// held by an flock on its `.lock` while the cache lives; the cache removes it when it goes (a
// reload, a stop). A folder whose `.lock` nobody holds was left by a daemon that died: the next
// tier opened in `dir` removes it. A folder is made under a hidden name and renamed into place
// with its lock held, so it is never seen unlocked.
//
// A sample is the file `<folder>/<entry>`: a 32-byte header (magic, entry, size, Checksum (XXH3) of
// the bytes) then the bytes. It is written unnamed (O_TMPFILE) and linked under its name whole, so
// no reader sees a partial file; Read checks all four, so a file truncated, scribbled on,
// replaced or deleted is an error naming it (a miss for the cache), never wrong bytes. A write
// that fails (a full disk, the folder deleted) makes the tier step aside for a minute, logged
// once; then it makes its folder again if it is gone, and writes again.
//
// `dir` and the tier's folder are opened once and used through their descriptors
// (base/dir_fd.h): a folder that is a symlink or belongs to another user is refused, and one
// swapped for a symlink later redirects no write (a deleted folder is made again where it was,
// a symlink planted under its name refused).
//
// Thread-safe; one entry's Link and Remove are ordered by the caller (SampleCache holds its lock).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "base/dir_fd.h"
#include "base/status.h"

namespace mmfeed {

class SampleDisk {
 public:
  // `stage` names the tier in its log lines; a warning says so when `dir`'s file system has
  // less room than `max_bytes`. An error names `dir` when it cannot be created or written.
  static Result<std::unique_ptr<SampleDisk>> Open(const std::string& dir, const std::string& stage,
                                                  uint64_t max_bytes);
  SampleDisk(const SampleDisk&) = delete;
  SampleDisk& operator=(const SampleDisk&) = delete;
  ~SampleDisk();  // removes the folder

  // `bytes` of `entry` written to an unnamed file in the folder: its descriptor, or -1 (the tier
  // steps aside: a failure now, logged, or one within the last minute).
  int Write(uint32_t entry, const std::string& bytes);
  // Gives the written file `fd` its entry's name (replacing a file of that name) and closes it.
  // false (logged, stepping aside) when it cannot be linked.
  bool Link(int fd, uint32_t entry);
  // Closes a written file without naming it (its bytes are dropped). -1: nothing.
  void Discard(int fd);
  void Remove(uint32_t entry);
  // `entry`'s bytes, or an error naming its file and what is wrong with it; ResourceExhausted
  // when it could not be opened for want of descriptors or memory (the file may be good).
  Result<std::string> Read(uint32_t entry) const;
  const std::string& folder() const { return folder_path_; }
  uint64_t write_failures() const { return write_failures_.load(std::memory_order_relaxed); }

 private:
  SampleDisk(std::string dir, std::string stage, std::string name, DirFd dir_fd)
      : dir_(std::move(dir)),
        stage_(std::move(stage)),
        name_(std::move(name)),
        folder_path_(dir_ + "/" + name_),
        dir_fd_(std::move(dir_fd)) {}
  // Makes the folder unless it is there (hidden, locked, renamed into place); holds its lock.
  Status MakeFolder();
  // The folder now (MakeFolder may replace it).
  std::shared_ptr<const DirFd> Folder() const;
  // Logs `why` and steps aside for a minute.
  void StepAside(const std::string& why);
  std::string PathOf(uint32_t entry) const;

  const std::string dir_, stage_, name_, folder_path_;
  // `dir` and the tier's folder, opened once: files are made and read through them, so a
  // folder swapped for a symlink redirects nothing (base/dir_fd.h).
  DirFd dir_fd_;  // guarded by make_mu_ for Refresh
  mutable std::mutex make_mu_;
  std::shared_ptr<const DirFd> folder_;  // guarded by make_mu_
  int lock_fd_ = -1;                     // guarded by make_mu_
  std::atomic<int64_t> aside_until_ns_{0};
  std::atomic<uint64_t> write_failures_{0};
};

}  // namespace mmfeed
