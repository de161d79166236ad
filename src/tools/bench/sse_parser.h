// Incremental parser for a text/event-stream body (the WHATWG Server-Sent Events format). Bytes may arrive
// split anywhere (inside a field name, a CRLF pair or a UTF-8 sequence): whole lines are buffered before they
// are read, so a split never changes the result. Lines end in CRLF, LF or CR; `:` lines are comments (pings);
// several `data:` lines join with "\n"; an empty line dispatches the event.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace mx::bench {

struct SseEvent {
  std::string event;  // the `event:` field; empty means the default type, "message"
  std::string data;   // the `data:` lines joined by "\n"
  std::string id;     // the last `id:` seen on the stream (the spec keeps it across events)
};

class SseParser {
 public:
  // An event (or one line) longer than this is an error rather than unbounded memory.
  explicit SseParser(size_t max_event_bytes = size_t{16} << 20) : max_event_bytes_(max_event_bytes) {}

  // Parses `bytes` and appends every event they complete to *events. False once the size limit is
  // exceeded; the parser then ignores further input and error() says why.
  bool feed(std::string_view bytes, std::vector<SseEvent>* events);

  // The body ended cleanly: a last line without a line ending is read, and an event whose blank line never
  // came is still dispatched. (The spec drops it, but at a clean end of body nothing was cut off, and some
  // servers end the body right after their last `data:` line.)
  void finish(std::vector<SseEvent>* events);

  const std::string& error() const { return error_; }
  int64_t comments() const { return comments_; }  // `:` lines seen (keep-alive pings)

 private:
  void take_line(std::string_view line, std::vector<SseEvent>* events);
  void dispatch(std::vector<SseEvent>* events);

  size_t max_event_bytes_;
  std::string line_;        // bytes of the current, unfinished line
  bool skip_lf_ = false;    // the previous byte was CR: an LF right after it belongs to the same line ending
  bool first_line_ = true;  // a UTF-8 byte order mark is stripped from the first line only
  std::string data_;
  std::string event_;
  std::string last_id_;
  bool has_data_ = false;
  int64_t comments_ = 0;
  std::string error_;
};

}  // namespace mx::bench
