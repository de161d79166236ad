// Synthetic Gemma-4 assistants (MTP drafters): a config made to fit a target (the released 26B-A4B
// assistant's shape: 4 layers, 3 sliding + 1 full, hidden 1024, MLP 8192, the target's query heads and head
// dims) and a checkpoint of seeded random bf16 weights in transformers' layout, conditioned as the tiny
// Gemma-4 fixtures are. Random drafts are rarely accepted: these measure the draft step's cost and test the
// rollback, not acceptance.
#pragma once

#include <string>

#include "model/gemma4/gemma4_assistant_config.h"
#include "model/gemma4/gemma4_config.h"
#include "model/synthetic_model.h"

namespace mx {

// An assistant for `target`: `layers` layers (the last one full, the rest sliding), the given widths.
Gemma4AssistantConfig gemma4_assistant_for(const Gemma4Config& target, int64_t layers, int64_t hidden, int64_t intermediate);
// The "gemma-4-26b-a4b-assistant" preset: gemma4_assistant_for(the 26B-A4B, 4, 1024, 8192).
Gemma4AssistantConfig gemma4_26b_a4b_assistant();

// config.json and model.safetensors of `config` into `dir` (created if missing). Same seed, same bytes.
Status write_gemma4_assistant_checkpoint(const Gemma4AssistantConfig& config, const std::string& dir,
                                         const SyntheticOptions& options);

}  // namespace mx
