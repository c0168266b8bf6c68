// Strict UTF-8 validation (no overlong forms, no surrogates, nothing above U+10FFFF).
#pragma once

#include <string_view>

namespace mmfeed {

// Returns the byte offset of the first invalid sequence, or npos if `s` is valid UTF-8.
size_t FindInvalidUtf8(std::string_view s);

}  // namespace mmfeed
