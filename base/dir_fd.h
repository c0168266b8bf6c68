// DirFd: a folder the daemon writes (a cache's, the state directory), opened once and then used
// only through its descriptor: every file is made, opened, renamed, listed and removed with
// the *at() calls relative to it, never by a path. A folder swapped for a symlink, or a parent
// renamed, after the open cannot redirect a write: the descriptor still names the folder that
// was checked. Opening refuses a folder that is a symlink (O_NOFOLLOW), not a folder, or not
// owned by the daemon's user (another user could swap what is inside it).
//
// A folder deleted while in use is made again from its parent's descriptor (Refresh), with the
// same checks: a symlink planted under its name is refused, never followed.
//
// Not thread-safe for Refresh (the owner serializes it); the file calls are.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"

namespace mmfeed {

class DirFd {
 public:
  // `path` (made with `mode` when missing, its parents too when `create`), checked as above.
  // `what` names it in errors ("source.cache.dir").
  static Result<DirFd> Open(const std::string& path, const std::string& what, bool create,
                            mode_t mode = 0755);
  // `name` (one path component) inside this folder, made with `mode` when missing and
  // `create`, checked as above.
  Result<DirFd> Sub(const std::string& name, bool create, mode_t mode = 0755) const;

  DirFd() = default;
  DirFd(DirFd&& o) noexcept { *this = std::move(o); }
  DirFd& operator=(DirFd&& o) noexcept;
  DirFd(const DirFd&) = delete;
  DirFd& operator=(const DirFd&) = delete;
  ~DirFd();

  bool valid() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  const std::string& path() const { return path_; }  // for messages only

  // Whether the folder was deleted (no longer linked); a folder can then be made again under its
  // name with Refresh.
  bool Gone() const;
  // When Gone(): the folder made again (`create`) or opened from the parent's descriptor kept
  // at Open, with the same checks. Ok when it is not gone.
  Status Refresh(bool create, mode_t mode = 0755);
  // The folder of the same name in the same parent, opened (made when `create`) anew with the
  // same checks: what Refresh does, as a new value (for owners that share theirs).
  Result<DirFd> Reopen(bool create, mode_t mode = 0755) const;

  // An unnamed file in the folder (O_TMPFILE), -1 with errno on failure.
  int OpenUnnamed(mode_t mode) const;
  // Names the unnamed file `fd` `name`, replacing what had that name (a file). false: errno.
  bool Link(int fd, const std::string& name) const;
  // openat(name) with O_NOFOLLOW and O_CLOEXEC added.
  int OpenFile(const std::string& name, int flags, mode_t mode = 0) const;
  bool Unlink(const std::string& name) const;
  bool Rename(const std::string& from, const std::string& to) const;
  // Removes `name` and, when it is a folder, everything in it (never following a symlink).
  bool RemoveTree(const std::string& name) const;
  // The names in the folder (not . or ..).
  std::vector<std::string> List() const;
  // lstat of `name` in the folder.
  bool Stat(const std::string& name, struct stat* st) const;
  // Replaces `name` so that a crash leaves the old content or the new (base/atomic_file.h's
  // way: a fresh temporary name with O_EXCL, fsync, renameat, fsync of the folder).
  Status WriteAtomically(const std::string& name, const std::string& text) const;
  // free bytes on the folder's file system (0 if unknown).
  uint64_t FreeBytes() const;

 private:
  DirFd(int fd, int parent, std::string path, std::string name)
      : fd_(fd), parent_(parent), path_(std::move(path)), name_(std::move(name)) {}
  int fd_ = -1;
  int parent_ = -1;  // the folder it lies in (for Refresh), -1: none kept
  std::string path_, name_;
};

// Opens (making it when `create`) the folder `name` in the folder `parent` (a descriptor) and
// checks it: not a symlink, a folder, owned by the daemon's user. Returns its descriptor, or an
// error naming `path` (for messages) and what is wrong.
Result<int> OpenCheckedFolder(int parent, const std::string& name, const std::string& path,
                              bool create, mode_t mode);

}  // namespace mmfeed
