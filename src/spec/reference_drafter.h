// Forced acceptance for tests and benchmarks: a drafter that knows each sequence's continuation in advance
// (the target's own greedy output, recorded by a plain run of the same prompts) and proposes its next
// tokens. At temperature 0 on the backend that recorded it, every draft is accepted: the all-accepted path
// is tested and the cost of verification measured (k + 1 tokens per verify step). Sequences are found by
// their prompt (the longest that matches); the proposal is the continuation at the sequence's position past the prompt, whatever the
// sequence generated so far: where a backend's numerics part from the recording (near-ties in argmax), the
// drafts are rejected but every step still verifies k of them, so step costs stay measurable.
#pragma once

#include <unordered_map>

#include "spec/drafter.h"

namespace mx {

class ReferenceDrafter : public Drafter {
 public:
  struct Reference {
    std::vector<int32_t> prompt;
    std::vector<int32_t> continuation;
  };
  explicit ReferenceDrafter(std::vector<Reference> references);
  void propose(std::span<const int32_t> tokens, int64_t max_tokens, std::vector<int32_t>* out) const override;

 private:
  std::vector<Reference> references_;
  std::vector<size_t> prompt_lengths_;                    // distinct, ascending
  std::unordered_multimap<uint64_t, size_t> by_prompt_;  // prompt hash -> reference
};

}  // namespace mx
