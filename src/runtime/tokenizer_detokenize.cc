// See tokenizer_detokenize.h. Called from the engine thread; Tokenizer is safe to share across threads.
#include "runtime/tokenizer_detokenize.h"

namespace mx {

DetokenizeFn make_detokenize_fn(std::shared_ptr<const Tokenizer> tokenizer, bool skip_special_tokens) {
  return [tokenizer = std::move(tokenizer), skip_special_tokens](std::span<const int32_t> ids) {
    std::string out;
    for (int32_t id : ids) {
      if (skip_special_tokens && tokenizer->is_special(id)) continue;
      tokenizer->append_token_bytes(id, &out);  // an unknown id adds nothing
    }
    return out;
  };
}

}  // namespace mx
