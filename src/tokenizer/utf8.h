// UTF-8 helpers shared by the tokenizer, the detokenizer and the chat formats' stream parsers.
//
// Invalid input is handled the way tiktoken's decode(errors="replace") and Python's bytes.decode do:
// each "maximal subpart" of an ill-formed sequence becomes one U+FFFD (Unicode 15, section 3.9, U+FFFD
// substitution of maximal subparts). Utf8StreamDecoder applies the same rule to a byte stream, so that
// concatenating its deltas equals decoding everything at once.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace mx {

inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

// True when `text` is well-formed UTF-8 (no surrogates, no overlongs, nothing above U+10FFFF).
bool utf8_is_valid(std::string_view text);

// `text` with every maximal ill-formed subpart replaced by U+FFFD.
std::string utf8_make_valid(std::string_view text);

// Length of the well-formed sequence starting at text[pos], or 0 when the bytes there are not a complete
// well-formed sequence. `*maximal_subpart` (when given) receives the length of the longest prefix that
// could still start a valid sequence (>= 1 when the result is 0 and pos < size).
int utf8_sequence_length(std::string_view text, size_t pos, int* maximal_subpart = nullptr);

// Length of the unfinished character at the end of `text`: the bytes after its last whole character when they
// are a prefix of a well-formed sequence (1..3), else 0 (it ends on a whole character or an ill-formed byte).
int utf8_unfinished_tail(std::string_view text);

// Appends the UTF-8 encoding of a code point (callers pass valid scalar values).
void utf8_append(uint32_t code_point, std::string* out);

// Turns a byte stream into valid UTF-8 text deltas. A sequence split across push() calls is held back until
// it completes; bytes that can no longer complete become U+FFFD at once; finish() flushes a dangling prefix
// as U+FFFD.
class Utf8StreamDecoder {
 public:
  // Appends to *out the text that is complete after adding `bytes`.
  void push(std::string_view bytes, std::string* out);
  // Appends U+FFFD for an incomplete trailing sequence, if any, and resets.
  void finish(std::string* out);
  bool has_pending() const { return pending_size_ != 0; }

 private:
  char pending_[4] = {};  // bytes of an incomplete but still valid sequence prefix (at most 3 used)
  int pending_size_ = 0;
};

}  // namespace mx
