#include "tools/bench/sse_parser.h"

namespace mx::bench {

bool SseParser::feed(std::string_view bytes, std::vector<SseEvent>* events) {
  if (!error_.empty()) return false;
  size_t pos = 0;
  if (skip_lf_ && !bytes.empty()) {
    skip_lf_ = false;
    if (bytes[0] == '\n') pos = 1;
  }
  while (pos < bytes.size()) {
    const size_t end = bytes.find_first_of("\r\n", pos);
    if (end == std::string_view::npos) {
      line_.append(bytes.substr(pos));
      break;
    }
    if (line_.empty()) {
      take_line(bytes.substr(pos, end - pos), events);  // the common case: the whole line is in this read
    } else {
      line_.append(bytes.substr(pos, end - pos));
      take_line(line_, events);
      line_.clear();
    }
    pos = end + 1;
    if (bytes[end] == '\r') {
      if (pos == bytes.size()) skip_lf_ = true;  // the LF may be the first byte of the next read
      else if (bytes[pos] == '\n') ++pos;
    }
    if (!error_.empty()) return false;
  }
  if (line_.size() + data_.size() > max_event_bytes_) {
    error_ = "server-sent event larger than " + std::to_string(max_event_bytes_) + " bytes";
    return false;
  }
  return true;
}

void SseParser::finish(std::vector<SseEvent>* events) {
  if (!error_.empty()) return;
  if (!line_.empty()) {
    std::string last;
    last.swap(line_);
    take_line(last, events);
  }
  dispatch(events);
}

void SseParser::take_line(std::string_view line, std::vector<SseEvent>* events) {
  if (first_line_) {
    first_line_ = false;
    if (line.substr(0, 3) == "\xEF\xBB\xBF") line.remove_prefix(3);
  }
  if (line.empty()) return dispatch(events);
  if (line[0] == ':') {
    ++comments_;
    return;
  }
  const size_t colon = line.find(':');
  const std::string_view field = line.substr(0, colon);
  std::string_view value;
  if (colon != std::string_view::npos) {
    value = line.substr(colon + 1);
    if (!value.empty() && value[0] == ' ') value.remove_prefix(1);
  }
  if (field == "data") {
    if (data_.size() + value.size() > max_event_bytes_) {
      error_ = "server-sent event larger than " + std::to_string(max_event_bytes_) + " bytes";
      return;
    }
    if (has_data_) data_.push_back('\n');
    data_.append(value);
    has_data_ = true;
  } else if (field == "event") {
    event_.assign(value);
  } else if (field == "id") {
    if (value.find('\0') == std::string_view::npos) last_id_.assign(value);
  }  // "retry" and unknown fields are ignored, as the spec says
}

void SseParser::dispatch(std::vector<SseEvent>* events) {
  if (has_data_) events->push_back(SseEvent{event_, std::move(data_), last_id_});
  data_.clear();
  event_.clear();
  has_data_ = false;
}

}  // namespace mx::bench
