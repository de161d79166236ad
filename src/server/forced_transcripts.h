// TEST ONLY: scripted model output for `mxserve serve --test-forced-tokens FILE` and the server tests.
// Each transcript is a token sequence the engine emits instead of sampling (RequestInput::forced_tokens),
// so real chat-format outputs (Harmony: analysis then a tool call, analysis then final, malformed ones)
// travel the real engine, parser, formatter and HTTP path on a random-weight model.
//
// FILE is JSON: {"transcripts": [{"match": "weather", "text": "<|channel|>analysis<|message|>...<|call|>"},
//                                {"ids": [200005, 17196, ...]}]}
// `text` is encoded with the special tokens recognised; `ids` are taken as they are. A request uses the
// first transcript whose `match` occurs in its last user message (chat, responses) or prompt text
// (completions); a transcript without `match` matches everything. No match: the model samples as usual.
// The output ends at the transcript's stop token (<|return|>, <|call|>) or, when it has none, with
// finish_reason "length" once the transcript runs out.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "tokenizer/tokenizer.h"

namespace mx::server {

struct ForcedTranscript {
  std::string match;
  std::vector<int32_t> ids;
};

class ForcedTranscripts {
 public:
  static Result<ForcedTranscripts> load(const std::string& path, const Tokenizer& tokenizer);
  static Result<ForcedTranscripts> parse(const std::string& json_text, const Tokenizer& tokenizer);

  bool empty() const { return transcripts_.empty(); }
  // The ids for a request whose text is `text`, or nullptr.
  const std::vector<int32_t>* select(const std::string& text) const;

 private:
  std::vector<ForcedTranscript> transcripts_;
};

}  // namespace mx::server
