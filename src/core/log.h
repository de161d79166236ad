// Levelled logging to stderr and CHECK macros for internal invariants.
// A CHECK aborts with file:line: it must never be reachable from user input (validate at the door instead).
#pragma once

#include <sstream>
#include <string>

namespace mx {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// The process-wide threshold; set once at start-up from the CLI (--log-level), read everywhere.
void set_log_level(LogLevel level);
LogLevel log_level();
bool parse_log_level(const std::string& name, LogLevel* out);

namespace detail {

// Collects one log line and writes it atomically when destroyed.
class LogLine {
 public:
  LogLine(LogLevel level, const char* file, int line);
  ~LogLine();
  std::ostream& stream() { return stream_; }

 private:
  std::ostringstream stream_;
};

// Prints the failed condition with file:line and aborts.
class CheckFailure {
 public:
  CheckFailure(const char* condition, const char* file, int line);
  [[noreturn]] ~CheckFailure();
  std::ostream& stream() { return stream_; }

 private:
  std::ostringstream stream_;
};

}  // namespace detail
}  // namespace mx

#define MX_LOG(level)                                                        \
  if (::mx::LogLevel::k##level < ::mx::log_level()) {                        \
  } else                                                                     \
    ::mx::detail::LogLine(::mx::LogLevel::k##level, __FILE__, __LINE__).stream()

#define MX_CHECK(cond)                                                    \
  if (__builtin_expect(static_cast<bool>(cond), 1)) {                     \
  } else                                                                  \
    ::mx::detail::CheckFailure(#cond, __FILE__, __LINE__).stream()

#define MX_CHECK_EQ(a, b) MX_CHECK((a) == (b)) << "(" << (a) << " vs " << (b) << ") "
#define MX_CHECK_LE(a, b) MX_CHECK((a) <= (b)) << "(" << (a) << " vs " << (b) << ") "
#define MX_CHECK_LT(a, b) MX_CHECK((a) < (b)) << "(" << (a) << " vs " << (b) << ") "
#define MX_CHECK_OK(expr)                                         \
  do {                                                            \
    ::mx::Status mx_check_status_ = (expr);                       \
    MX_CHECK(mx_check_status_.is_ok()) << mx_check_status_.to_string(); \
  } while (0)
