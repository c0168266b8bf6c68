// Status and Result: cheap error values that travel between threads instead of exceptions.
// Any thread may create, copy or move them. A Status is ok() or carries a code and a message
// a person can act on ("decode image img/1.jpg: not a JPEG file").
#pragma once

#include <optional>
#include <string>
#include <utility>

namespace mmfeed {

class [[nodiscard]] Status {
 public:
  enum class Code {
    kOk,
    kInvalid,
    kNotFound,
    kCorrupt,
    kIo,
    kTooLarge,
    kUnsupported,
    kClosed,
    kTimeout,
    kUnavailable,       // the peer (the daemon) is gone
    kResourceExhausted  // out of file descriptors or memory: the machine's state, not the data's
  };
  static constexpr size_t kCodes = static_cast<size_t>(Code::kResourceExhausted) + 1;

  Status() = default;
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  static Status Invalid(std::string m) { return Status(Code::kInvalid, std::move(m)); }
  static Status NotFound(std::string m) { return Status(Code::kNotFound, std::move(m)); }
  static Status Corrupt(std::string m) { return Status(Code::kCorrupt, std::move(m)); }
  static Status Io(std::string m) { return Status(Code::kIo, std::move(m)); }
  static Status TooLarge(std::string m) { return Status(Code::kTooLarge, std::move(m)); }
  static Status Unsupported(std::string m) { return Status(Code::kUnsupported, std::move(m)); }
  static Status Closed(std::string m) { return Status(Code::kClosed, std::move(m)); }
  static Status Timeout(std::string m) { return Status(Code::kTimeout, std::move(m)); }
  static Status Unavailable(std::string m) { return Status(Code::kUnavailable, std::move(m)); }
  static Status ResourceExhausted(std::string m) {
    return Status(Code::kResourceExhausted, std::move(m));
  }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  // Short lower-case name of the code, used as the "reason" key in error counts.
  const char* CodeName() const;
  std::string ToString() const;

  // Returns a copy whose message is "<prefix>: <message>".
  Status WithContext(const std::string& prefix) const;

 private:
  Code code_ = Code::kOk;
  std::string message_;
};

// A value or the Status that explains why there is none.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}          // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {}  // NOLINT: implicit by design

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  // REQUIRES: ok()
  T& value() { return *value_; }
  const T& value() const { return *value_; }
  T& operator*() { return *value_; }
  T* operator->() { return &*value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

#define MMFEED_RETURN_IF_ERROR(expr) \
  do {                               \
    ::mmfeed::Status _st = (expr);   \
    if (!_st.ok()) return _st;       \
  } while (0)

// MMFEED_ASSIGN_OR_RETURN(lhs, expr): evaluates `expr` (a Result<T>); on error returns its
// Status from the enclosing function, else moves the value into `lhs`, which may declare it:
//   MMFEED_ASSIGN_OR_RETURN(BatchPlan plan, PlanBatch(cfg));
#define MMFEED_ASSIGN_OR_RETURN(lhs, expr) \
  MMFEED_ASSIGN_OR_RETURN_IMPL(MMFEED_RESULT_NAME(_mmfeed_result_, __LINE__), lhs, expr)
#define MMFEED_ASSIGN_OR_RETURN_IMPL(result, lhs, expr) \
  auto result = (expr);                                 \
  if (!result.ok()) return result.status();             \
  lhs = std::move(result.value())
#define MMFEED_RESULT_NAME_INNER(a, b) a##b
#define MMFEED_RESULT_NAME(a, b) MMFEED_RESULT_NAME_INNER(a, b)

}  // namespace mmfeed
