// The tiny assistant fixture (tests/fixtures/tiny-gemma4-text-assistant, made by
// scripts/make_tiny_gemma4_assistant.py): transformers' drafts for each prompt of the tiny-gemma4-text target,
// and one draft round run the same way on any backend: the target prefills the prompt, the assistant drafts
// k tokens greedily from the target's next token and its final hidden state at the last prompt position.
// Shared by the unit (CPU) and GPU tests.
#pragma once

#include <cstdint>
#include <vector>

#include "model/gemma4/gemma4_assistant_model.h"
#include "model/model.h"

namespace mx::test {

struct DraftRound {
  std::vector<std::vector<float>> logits;  // per draft step: f32 [vocab]
  std::vector<int32_t> tokens;             // the argmax of each step (fed to the next)
};

// `ids`: the prompt followed by the target's next token (the fixture's prompt_<i>_ids).
Result<DraftRound> run_draft_round(const Model& target, const Gemma4AssistantModel& assistant, const std::vector<int32_t>& ids,
                                   int64_t k);

}  // namespace mx::test
