// Synthetic EAGLE-3 drafts (rows of model/synthetic_model.h's preset table): the published layout
// (config.json, safetensors with midlayer.* / fc / norm / lm_head / d2t) with seeded random weights, for
// benchmarks (the draft-step cost; random drafts are rarely accepted) and tests (the rollback). d2t is zero:
// draft id d proposes target id d. Each preset fits one target:
//   gpt-oss-20b-eagle3, gpt-oss-120b-eagle3: the published gpt-oss drafts' shapes (H 2880, 64 q / 8 kv heads of
//     64, I 17280, a 32,000-token draft vocabulary) for the gpt-oss-20b / -120b presets and checkpoints;
//   demo-eagle3: the demo model (the real vocabulary, H 128, 2 layers), a 4,096-token draft vocabulary;
//   tiny-gpt-oss-eagle3, tiny-gpt-oss-b-eagle3: the fixtures tests/fixtures/tiny-gpt-oss and tiny-gpt-oss-b;
//   tiny-eagle3: the gpt-oss `tiny` preset, with no draft vocabulary of its own (the target's lm_head).
#pragma once

#include <string>
#include <vector>

#include "io/safetensors.h"
#include "model/eagle3/eagle3_config.h"
#include "model/synthetic_model.h"

namespace mx {

std::vector<std::string> eagle3_preset_names();
Result<Eagle3Config> eagle3_preset(const std::string& name);
Status write_eagle3_checkpoint(const Eagle3Config& config, const std::string& dir, const SyntheticOptions& options);
Result<Checkpoint> eagle3_checkpoint_in_memory(const Eagle3Config& config, const SyntheticOptions& options);

}  // namespace mx
