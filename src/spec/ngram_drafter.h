// Prompt lookup (n-gram) drafting: no model. The sequence's last n tokens (n from ngram_max down to
// ngram_min, the longest that matches wins) are looked up earlier in the same sequence (prompt and output);
// the tokens that followed that earlier occurrence are the proposal. Ties between occurrences of the
// longest suffix go to the earliest one, as vLLM's prompt_lookup_min/max proposer picks them. Wins on
// repetitive outputs (code edits, quoting the prompt, JSON over known keys); costs a verify step when it
// guesses wrong.
#pragma once

#include "spec/drafter.h"

namespace mx {

class NgramDrafter : public Drafter {
 public:
  NgramDrafter(int64_t min_n, int64_t max_n) : min_n_(min_n), max_n_(max_n) {}
  void propose(std::span<const int32_t> tokens, int64_t max_tokens, std::vector<int32_t>* out) const override;

 private:
  int64_t min_n_;
  int64_t max_n_;
};

}  // namespace mx
