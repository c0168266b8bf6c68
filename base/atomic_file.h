// Small state files (saved cursors, a trainer's cursor, a trace) that a crash, a hostile
// neighbour or a full disk must not corrupt.
//
// WriteFileAtomically replaces a file so that a crash at any point leaves either the old or
// the new content: it writes a temporary file of a fresh name beside it (created with O_EXCL
// and O_NOFOLLOW, so a symlink planted there is never followed), fsyncs it, renames it over the
// old one and fsyncs the folder. On any failure the temporary file is removed and the old
// content is left as it was.
//
// ReadSmallFile reads a whole regular file of at most `max_bytes`: a symlink (the last
// component), a directory, a FIFO or a device is refused with a message naming the path, never
// followed, opened for blocking or thrown on.
#pragma once

#include <optional>
#include <string>

#include "base/status.h"

namespace mmfeed {

Status WriteFileAtomically(const std::string& path, const std::string& text);
// The same for `name` in the folder open as `dir_fd` (AT_FDCWD: `name` is a path), without the
// folder's fsync (the caller's, who holds the folder): DirFd::WriteAtomically and the above.
// `shown` names the file in errors.
Status WriteAtomicallyAt(int dir_fd, const std::string& name, const std::string& shown,
                         const std::string& text);

// std::nullopt when the file does not exist.
Result<std::optional<std::string>> ReadSmallFile(const std::string& path, size_t max_bytes);

}  // namespace mmfeed
