// Incremental decoding: the new token's text is decode(window + token) minus decode(window), where the
// window is the few tokens before it; that is exact for byte-level BPE and right for tokenizers whose
// pieces depend on neighbours. Stop strings are searched only in the tail that the new text can complete.
#include "runtime/stop_strings.h"

#include <algorithm>

namespace mx {
namespace {

constexpr int64_t kDecodeWindow = 4;

// Bytes at the end of `s` that start a UTF-8 character not yet complete (0..3).
int64_t incomplete_utf8_tail(const std::string& s) {
  const auto n = static_cast<int64_t>(s.size());
  for (int64_t back = 1; back <= std::min<int64_t>(3, n); ++back) {
    const auto c = static_cast<unsigned char>(s[static_cast<size_t>(n - back)]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    int64_t need = 1;
    if ((c & 0xE0) == 0xC0) need = 2;
    else if ((c & 0xF0) == 0xE0) need = 3;
    else if ((c & 0xF8) == 0xF0) need = 4;
    return need > back ? back : 0;
  }
  return 0;
}

}  // namespace

StopStringMatcher::StopStringMatcher(const DetokenizeFn* detokenize, std::vector<std::string> stops,
                                     int64_t reserve_tokens)
    : detokenize_(detokenize), stops_(std::move(stops)) {
  for (const auto& s : stops_) max_stop_ = std::max<int64_t>(max_stop_, static_cast<int64_t>(s.size()));
  token_end_.reserve(static_cast<size_t>(std::max<int64_t>(reserve_tokens, 0)));
}

bool StopStringMatcher::append(std::span<const int32_t> tokens) {
  if (tokens.empty() || matched()) return matched();
  const size_t n = tokens.size();
  const size_t w = std::min<size_t>(n - 1, kDecodeWindow);
  std::string delta;
  if (w == 0) {
    delta = (*detokenize_)(tokens.subspan(n - 1));
  } else {
    const std::string before = (*detokenize_)(tokens.subspan(n - 1 - w, w));
    std::string after = (*detokenize_)(tokens.subspan(n - 1 - w, w + 1));
    if (after.compare(0, before.size(), before) == 0) delta = after.substr(before.size());
    else delta = (*detokenize_)(tokens.subspan(n - 1));
  }
  const int64_t old_size = static_cast<int64_t>(text_.size());
  text_ += delta;
  token_end_.push_back(static_cast<int64_t>(text_.size()));
  // A stop string completed by this token ends inside the new text and starts at most max_stop - 1 bytes
  // before it; the earliest such start wins.
  const int64_t from = std::max<int64_t>(0, old_size - max_stop_ + 1);
  for (size_t i = 0; i < stops_.size(); ++i) {
    const size_t pos = text_.find(stops_[i], static_cast<size_t>(from));
    if (pos != std::string::npos && (match_ < 0 || static_cast<int64_t>(pos) < match_)) {
      match_ = static_cast<int64_t>(pos);
      match_index_ = static_cast<int64_t>(i);
    }
  }
  return matched();
}

int64_t StopStringMatcher::hold_back() const {
  // The longest suffix of the text that is a proper prefix of some stop string.
  const auto n = static_cast<int64_t>(text_.size());
  int64_t hold = 0;
  for (const auto& s : stops_) {
    for (int64_t k = std::min<int64_t>(static_cast<int64_t>(s.size()) - 1, n); k > hold; --k) {
      if (text_.compare(static_cast<size_t>(n - k), static_cast<size_t>(k), s, 0, static_cast<size_t>(k)) == 0) {
        hold = k;
        break;
      }
    }
  }
  return std::max(hold, incomplete_utf8_tail(text_));
}

int64_t StopStringMatcher::safe_text_end() const {
  if (matched()) return match_;
  if (finished_) return static_cast<int64_t>(text_.size());
  return static_cast<int64_t>(text_.size()) - hold_back();
}

int64_t StopStringMatcher::safe_tokens() const {
  const auto n = static_cast<int64_t>(token_end_.size());
  if (matched() || finished_ || stops_.empty()) return n;
  const int64_t end = safe_text_end();
  return std::upper_bound(token_end_.begin(), token_end_.end(), end) - token_end_.begin();
}

}  // namespace mx
