// The engine's DetokenizeFn over the real tokenizer: raw bytes (the stop-string matcher holds back an
// incomplete UTF-8 tail itself), special tokens (a chat format's control tokens) skipped by default as
// OpenAI-compatible servers do, unknown ids decoding to nothing rather than failing the request.
#pragma once

#include <memory>

#include "runtime/stop_strings.h"
#include "tokenizer/tokenizer.h"

namespace mx {

DetokenizeFn make_detokenize_fn(std::shared_ptr<const Tokenizer> tokenizer, bool skip_special_tokens = true);

}  // namespace mx
