// StateStore: the --state-dir's cursors file, `<dir>/cursors.json` (its contents:
// daemon/stream_state.h). The folder is opened once, on the first Read (base/dir_fd.h: a
// symlink or another user's folder is refused, and one swapped later redirects nothing), and
// the file is replaced through it atomically; a folder deleted meanwhile is made again where it
// was, never through a symlink. A state equal to the last one written is not written again. A
// failed write is logged when it first happens, then once a minute with a count, and the next
// Write tries again.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "base/dir_fd.h"
#include "base/status.h"
#include "daemon/stream_state.h"

namespace mmfeed {

class StateStore {
 public:
  // `dir` empty: no state is kept (every call is a no-op answering "nothing saved").
  explicit StateStore(std::string dir) : dir_(std::move(dir)) {}
  bool enabled() const { return !dir_.empty(); }
  std::string path() const { return dir_ + "/cursors.json"; }
  // The saved stream, or none (no file yet). Opens (or makes) the folder.
  Result<std::optional<StreamState>> Read();
  // Writes `state` unless it is the last one written. REQUIRES: Read() succeeded once.
  Status Write(const StreamState& state);
  // The next Write writes even a state equal to the last one (a job ended: its file is
  // another job's next).
  void Forget() { written_.clear(); }
  // Writes that failed in a row (0 after a success).
  uint64_t failures() const { return failures_; }

 private:
  std::string dir_;
  DirFd fd_;
  std::string written_;  // the last text written
  uint64_t failures_ = 0;
  std::chrono::steady_clock::time_point warned_at_;
};

}  // namespace mmfeed
