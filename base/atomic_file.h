// Replacing a small file so that a crash at any point leaves either the old or the new
// content: write a temporary file beside it, fsync it, rename it over the old one, fsync the
// folder.
#pragma once

#include <string>

#include "base/status.h"

namespace mmfeed {

Status WriteFileAtomically(const std::string& path, const std::string& text);

}  // namespace mmfeed
