#include "server/content_stop.h"

#include <algorithm>

namespace mx::server {

ContentStopMatcher::ContentStopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
}

std::string ContentStopMatcher::feed(const std::string& text) {
  if (matched_) return "";
  if (!active()) return text;
  held_ += text;
  size_t first = std::string::npos;
  for (const auto& stop : stops_) first = std::min(first, held_.find(stop));
  if (first != std::string::npos) {
    matched_ = true;
    std::string out = held_.substr(0, first);
    held_.clear();
    return out;
  }
  // Hold the longest tail that is a proper prefix of some stop string.
  size_t keep = 0;
  for (const auto& stop : stops_) {
    for (size_t k = std::min(stop.size() - 1, held_.size()); k > keep; --k) {
      if (held_.compare(held_.size() - k, k, stop, 0, k) == 0) {
        keep = k;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string ContentStopMatcher::flush() {
  std::string out;
  out.swap(held_);
  return out;
}

}  // namespace mx::server
