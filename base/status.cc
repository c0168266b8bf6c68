#include "base/status.h"

namespace mmfeed {

const char* Status::CodeName() const {
  switch (code_) {
    case Code::kOk:
      return "ok";
    case Code::kInvalid:
      return "invalid";
    case Code::kNotFound:
      return "not_found";
    case Code::kCorrupt:
      return "corrupt";
    case Code::kIo:
      return "io";
    case Code::kTooLarge:
      return "too_large";
    case Code::kUnsupported:
      return "unsupported";
    case Code::kClosed:
      return "closed";
    case Code::kTimeout:
      return "timeout";
    case Code::kUnavailable:
      return "unavailable";
    case Code::kResourceExhausted:
      return "resource_exhausted";
  }
  return "unknown";
}

std::string Status::ToString() const {
  if (ok()) return "ok";
  return std::string(CodeName()) + ": " + message_;
}

Status Status::WithContext(const std::string& prefix) const {
  if (ok()) return *this;
  return Status(code_, prefix + ": " + message_);
}

}  // namespace mmfeed
