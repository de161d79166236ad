// Output text and stop strings for one request, over an injected detokenizer (the tokenizer module is
// separate; tests use a fake byte-level one). The engine thread feeds each generated token; the matcher
// keeps the decoded text, finds stop strings as soon as they complete, and says how much text (and how
// many tokens) can be streamed now: anything that could still turn out to be the start of a stop string
// is held back, as is an incomplete UTF-8 sequence at the end, until it can no longer match.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace mx {

// Token ids -> bytes (UTF-8, possibly ending mid-character). Must be safe to call from the engine thread
// while other threads use the same tokenizer, i.e. stateless.
using DetokenizeFn = std::function<std::string(std::span<const int32_t>)>;

class StopStringMatcher {
 public:
  StopStringMatcher() = default;
  // `detokenize` must outlive the matcher; `stops` are non-empty strings.
  StopStringMatcher(const DetokenizeFn* detokenize, std::vector<std::string> stops, int64_t reserve_tokens);

  // Feeds tokens[size - 1]; `tokens` holds every token fed so far (the decoder looks back a few tokens,
  // because some tokenizers decode a token differently depending on its left neighbours).
  // Returns true when a stop string has just completed; later calls are not expected.
  bool append(std::span<const int32_t> tokens);
  // Releases everything (the request finished for another reason).
  void finish() { finished_ = true; }

  bool matched() const { return match_ >= 0; }
  const std::string& matched_stop() const { return stops_[static_cast<size_t>(match_index_)]; }
  const std::string& text() const { return text_; }
  // Text that may be streamed: [0, safe_text_end()). After a match it ends where the stop string begins.
  int64_t safe_text_end() const;
  // Tokens that may be streamed: every token whose text ends at or before safe_text_end(), or all of them
  // once finished or matched. Without stop strings tokens are never held back.
  int64_t safe_tokens() const;

 private:
  int64_t hold_back() const;

  const DetokenizeFn* detokenize_ = nullptr;
  std::vector<std::string> stops_;
  int64_t max_stop_ = 0;
  std::string text_;
  std::vector<int64_t> token_end_;  // text_ size after each token
  int64_t match_ = -1;              // byte offset where the matched stop string starts
  int64_t match_index_ = -1;
  bool finished_ = false;
};

}  // namespace mx
