// Status and Result<T>: how launchers, I/O and loaders report failure without exceptions.
// A Status carries a code and a one-line message meant for the person who gave us the bad input.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace mx {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // bad input from a user or a file they gave us
  kNotFound,         // a file, tensor or key that should exist does not
  kOutOfRange,       // sizes or offsets outside what is allowed
  kIoError,          // the operating system refused (open, mmap, read, write)
  kUnimplemented,    // a valid request for something we do not support yet
  kInternal,         // our bug or a device failure
  kResourceExhausted // out of memory, pages, queue slots
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return Status(); }

  bool is_ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "invalid argument: <message>"
  std::string to_string() const;

  // Prefixes the message with context, e.g. the file or tensor being processed.
  Status with_context(const std::string& context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status invalid_argument(std::string msg) { return {StatusCode::kInvalidArgument, std::move(msg)}; }
inline Status not_found(std::string msg) { return {StatusCode::kNotFound, std::move(msg)}; }
inline Status out_of_range(std::string msg) { return {StatusCode::kOutOfRange, std::move(msg)}; }
inline Status io_error(std::string msg) { return {StatusCode::kIoError, std::move(msg)}; }
inline Status unimplemented(std::string msg) { return {StatusCode::kUnimplemented, std::move(msg)}; }
inline Status internal_error(std::string msg) { return {StatusCode::kInternal, std::move(msg)}; }
inline Status resource_exhausted(std::string msg) { return {StatusCode::kResourceExhausted, std::move(msg)}; }

// Either a value or a non-ok Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {  // NOLINT: implicit by design
    if (status_.is_ok()) status_ = internal_error("Result constructed from an ok Status without a value");
  }

  bool is_ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }

  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }

 private:
  std::optional<T> value_;
  Status status_;
};

}  // namespace mx

#define MX_STATUS_CONCAT_INNER(a, b) a##b
#define MX_STATUS_CONCAT(a, b) MX_STATUS_CONCAT_INNER(a, b)

// Returns from the enclosing function when `expr` (a Status) is not ok.
#define MX_RETURN_IF_ERROR(expr)                     \
  do {                                               \
    ::mx::Status mx_status_tmp_ = (expr);            \
    if (!mx_status_tmp_.is_ok()) return mx_status_tmp_; \
  } while (0)

// `MX_ASSIGN_OR_RETURN(auto x, make_x());` declares x from a Result or returns its Status.
#define MX_ASSIGN_OR_RETURN(lhs, expr) \
  MX_ASSIGN_OR_RETURN_IMPL(MX_STATUS_CONCAT(mx_result_, __LINE__), lhs, expr)
#define MX_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.is_ok()) return tmp.status();         \
  lhs = std::move(tmp).value()
