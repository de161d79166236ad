// Reads the events of one streamed OpenAI response (/v1/completions or /v1/chat/completions) and says, per
// event, whether it carried generated text, ended the stream or reported an error. Tolerant of what real
// servers send: a role-only first chunk, empty deltas, a usage chunk with `choices: []`, reasoning text in
// `reasoning_content` or `reasoning`, tool-call argument deltas, and an error object in place of a chunk.
#pragma once

#include <cstdint>
#include <string>

#include "tools/bench/sse_parser.h"

namespace mx::bench {

class OpenAiStreamReader {
 public:
  enum class Kind {
    kNothing,  // no generated text (role-only chunk, empty delta, usage-only chunk)
    kTokens,   // a chunk carrying generated text: a token arrival for TTFT/ITL
    kDone,     // `data: [DONE]`
    kError,    // an error event; error() has the message
  };

  Kind read(const SseEvent& event);

  const std::string& error() const { return error_; }
  bool done() const { return done_; }
  bool finish_reason_seen() const { return finish_reason_seen_; }
  int64_t token_chunks() const { return token_chunks_; }
  // From the last usage object seen; -1 when the server sent none.
  int64_t usage_completion_tokens() const { return usage_completion_tokens_; }
  int64_t usage_prompt_tokens() const { return usage_prompt_tokens_; }

 private:
  Kind fail(std::string message);

  std::string error_;
  bool done_ = false;
  bool finish_reason_seen_ = false;
  int64_t token_chunks_ = 0;
  int64_t usage_completion_tokens_ = -1;
  int64_t usage_prompt_tokens_ = -1;
};

// The message of an OpenAI error body ({"error": {"message": ...}} or {"error": "..."}, else {"message": ...}
// or {"detail": ...}), or the first bytes of `body` when it is not one.
std::string error_message_from_body(const std::string& body);

}  // namespace mx::bench
