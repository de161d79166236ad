// Prompt lookup: scan for earlier occurrences of the sequence's suffix (see ngram_drafter.h).
#include "spec/ngram_drafter.h"

#include <algorithm>

namespace mx {

void NgramDrafter::propose(std::span<const int32_t> tokens, int64_t max_tokens, std::vector<int32_t>* out) const {
  out->clear();
  const auto len = static_cast<int64_t>(tokens.size());
  if (max_tokens <= 0 || len < min_n_ + 1) return;
  // One pass per start position: the length of the match between the suffix and the tokens ending just
  // before `end` (compared backwards, at most max_n). The longest match wins; the earliest start breaks ties.
  int64_t best_n = 0, best_end = -1;
  for (int64_t end = 1; end < len; ++end) {  // tokens[end] follows a candidate occurrence ending at end - 1
    int64_t n = 0;
    while (n < max_n_ && n < end && tokens[static_cast<size_t>(end - 1 - n)] == tokens[static_cast<size_t>(len - 1 - n)]) ++n;
    if (n > best_n) {
      best_n = n;
      best_end = end;
      if (n == max_n_) break;  // nothing longer counts, and later ones lose the tie
    }
  }
  if (best_n < min_n_ || best_end < 0) return;
  const int64_t count = std::min(max_tokens, len - best_end);
  out->insert(out->end(), tokens.begin() + best_end, tokens.begin() + best_end + count);
}

}  // namespace mx
