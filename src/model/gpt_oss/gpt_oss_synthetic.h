// Synthetic gpt-oss checkpoints (the gpt-oss rows of model/synthetic_model.h's preset table): the released
// Hugging Face layout (config.json in the released spelling, generation_config.json, sharded safetensors
// with model.safetensors.index.json, MXFP4 experts) filled with seeded random weights scaled so activations
// stay sane, as the tiny fixtures are. They load through the same path as a downloaded checkpoint;
// benchmarks and the demo model use them.
#pragma once

#include <string>
#include <vector>

#include "io/generation_config.h"
#include "io/safetensors.h"
#include "model/gpt_oss/gpt_oss_config.h"
#include "model/synthetic_model.h"

namespace mx {

// "gpt-oss-20b", "gpt-oss-120b" (the real shapes), "demo" (real 201,088 vocabulary, tiny widths) and
// "tiny" (everything small; for tests).
Result<GptOssConfig> gpt_oss_preset(const std::string& name);
std::vector<std::string> gpt_oss_preset_names();

// Writes the checkpoint into `dir` (created if missing). Same seed, same bytes.
Status write_gpt_oss_checkpoint(const GptOssConfig& config, const std::string& dir, const SyntheticOptions& options);

// The same tensors (same seed, same bytes) in an anonymous in-memory file, for benchmarks of models larger
// than the disk at hand (gpt-oss-120b is 65 GB); costs that much host memory while the checkpoint lives.
Result<Checkpoint> gpt_oss_checkpoint_in_memory(const GptOssConfig& config, const SyntheticOptions& options);
// The generation_config.json written next to synthetic checkpoints.
GenerationConfig gpt_oss_generation_config();

}  // namespace mx
