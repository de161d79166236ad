#include "tokenizer/detokenizer.h"

namespace mx {

void IncrementalDetokenizer::push(int32_t id, std::string* out) {
  if (skip_special_ && tokenizer_->is_special(id)) return;
  bytes_.clear();
  if (!tokenizer_->append_token_bytes(id, &bytes_)) {
    ++unknown_ids_;
    utf8_.finish(out);  // what was pending can no longer complete across the unknown id
    out->append(kReplacementChar);
    return;
  }
  utf8_.push(bytes_, out);
}

}  // namespace mx
