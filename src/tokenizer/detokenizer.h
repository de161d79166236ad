// Incremental detokenizer: token ids in, text deltas out, for streaming responses.
//
// A token may end in the middle of a UTF-8 sequence (o200k has byte-level tokens, and emoji or CJK often
// take two or three tokens). Deltas never split a sequence: incomplete bytes wait for the next token, and
// bytes that can no longer complete become U+FFFD at once, so a client never sees a replacement character
// for text that later becomes valid. Concatenated deltas equal Tokenizer::decode of all ids.
#pragma once

#include <cstdint>
#include <string>

#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace mx {

class IncrementalDetokenizer {
 public:
  // `tokenizer` must outlive the detokenizer. With skip_special_tokens, special ids produce no text.
  explicit IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens = false)
      : tokenizer_(&tokenizer), skip_special_(skip_special_tokens) {}

  // Appends the text that became complete with `id`. An unknown id becomes U+FFFD (and is counted).
  void push(int32_t id, std::string* out);
  std::string push(int32_t id) {
    std::string out;
    push(id, &out);
    return out;
  }
  // Flushes an incomplete trailing sequence as U+FFFD (end of the stream).
  void finish(std::string* out) { utf8_.finish(out); }

  int64_t unknown_ids() const { return unknown_ids_; }

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_;
  Utf8StreamDecoder utf8_;
  std::string bytes_;  // scratch, reused between calls
  int64_t unknown_ids_ = 0;
};

}  // namespace mx
