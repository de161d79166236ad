// Splits text into pre-tokens with a tiktoken-style regex, compiled by PCRE2 (UTF + UCP, JIT).
//
// tiktoken runs its pattern through Rust's regex engine, where \s is the Unicode White_Space property.
// PCRE2's \s under UCP also matches U+180E, and JavaScript's also matches U+FEFF; we rewrite \s and \S into
// explicit White_Space classes so that our splits follow tiktoken on every code point. Text the pattern does
// not match is kept as its own pre-token (as Hugging Face's Split "Isolated" does) so that nothing is lost.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "core/status.h"

namespace mx {

// The o200k pre-tokenizer pattern (tiktoken's o200k_base / o200k_harmony pat_str).
extern const char kO200kPattern[];

class Pretokenizer {
 public:
  static Result<std::shared_ptr<const Pretokenizer>> compile(const std::string& pattern);
  ~Pretokenizer();
  Pretokenizer(const Pretokenizer&) = delete;
  Pretokenizer& operator=(const Pretokenizer&) = delete;

  // Calls on_piece(std::string_view) for each pre-token of `text`, which must be valid UTF-8. The pieces
  // cover the text exactly, in order.
  template <typename F>
  void split(std::string_view text, F&& on_piece) const {
    size_t pos = 0;
    while (pos < text.size()) {
      size_t begin = 0, end = 0;
      next_match(text, pos, &begin, &end);
      if (begin > pos) on_piece(text.substr(pos, begin - pos));
      if (end > begin) on_piece(text.substr(begin, end - begin));
      pos = end;
    }
  }

  const std::string& pattern() const { return pattern_; }

 private:
  explicit Pretokenizer(std::string pattern) : pattern_(std::move(pattern)) {}
  // The next match at or after `pos`, as [begin, end) with end > pos. With no match, begin = end = size.
  void next_match(std::string_view text, size_t pos, size_t* begin, size_t* end) const;

  std::string pattern_;  // as given (before the \s rewrite)
  void* code_ = nullptr; // pcre2_code_8*
  bool jit_ = false;
};

// `pattern` with \s and \S replaced by explicit Unicode White_Space classes (see the file comment).
std::string rewrite_whitespace_classes(const std::string& pattern);

}  // namespace mx
