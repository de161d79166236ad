#include "core/log.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include "core/status.h"

namespace mx {
namespace {

std::atomic<int> g_log_level{static_cast<int>(LogLevel::kInfo)};

const char* level_letter(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return "D";
    case LogLevel::kInfo: return "I";
    case LogLevel::kWarning: return "W";
    case LogLevel::kError: return "E";
  }
  return "?";
}

const char* base_name(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash ? slash + 1 : path;
}

}  // namespace

void set_log_level(LogLevel level) { g_log_level.store(static_cast<int>(level)); }
LogLevel log_level() { return static_cast<LogLevel>(g_log_level.load(std::memory_order_relaxed)); }

bool parse_log_level(const std::string& name, LogLevel* out) {
  if (name == "debug") *out = LogLevel::kDebug;
  else if (name == "info") *out = LogLevel::kInfo;
  else if (name == "warning") *out = LogLevel::kWarning;
  else if (name == "error") *out = LogLevel::kError;
  else return false;
  return true;
}

namespace detail {

LogLine::LogLine(LogLevel level, const char* file, int line) {
  using namespace std::chrono;
  // ISO-8601 in UTC with milliseconds (2026-11-23T22:41:07.123Z): what log shippers parse without a pattern.
  const auto now = system_clock::now();
  const std::time_t seconds = system_clock::to_time_t(now);
  const auto millis = duration_cast<milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%S", &utc);
  char prefix[128];
  std::snprintf(prefix, sizeof(prefix), "%s %s.%03dZ %s:%d] ", level_letter(level), stamp, static_cast<int>(millis),
                base_name(file), line);
  stream_ << prefix;
}

LogLine::~LogLine() {
  stream_ << '\n';
  const std::string text = stream_.str();
  std::fwrite(text.data(), 1, text.size(), stderr);
}

CheckFailure::CheckFailure(const char* condition, const char* file, int line) {
  stream_ << "CHECK failed at " << base_name(file) << ":" << line << ": " << condition << " ";
}

CheckFailure::~CheckFailure() {
  stream_ << '\n';
  const std::string text = stream_.str();
  std::fwrite(text.data(), 1, text.size(), stderr);
  std::fflush(stderr);
  std::abort();
}

}  // namespace detail
}  // namespace mx
