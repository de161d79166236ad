// Synthetic gpt-oss checkpoints: the released Hugging Face layout (config.json in the released spelling,
// generation_config.json, sharded safetensors with model.safetensors.index.json, MXFP4 experts) filled with
// seeded random weights scaled so activations stay sane, as the tiny fixtures are. They load through the
// same path as a downloaded checkpoint; benchmarks and the demo model use them.
#pragma once

#include <string>
#include <vector>

#include "io/gpt_oss_config.h"
#include "io/safetensors.h"

namespace mx {

// "gpt-oss-20b", "gpt-oss-120b" (the real shapes), "demo" (real 201,088 vocabulary, tiny widths) and
// "tiny" (everything small; for tests).
Result<GptOssConfig> synthetic_preset(const std::string& name);
std::vector<std::string> synthetic_preset_names();

struct SyntheticOptions {
  uint64_t seed = 0;
  int threads = 0;                      // 0 = all hardware threads
  int64_t max_shard_bytes = 4ll << 30;  // a shard closes once it passes this size
};

// Writes the checkpoint into `dir` (created if missing). Same seed, same bytes.
Status write_synthetic_checkpoint(const GptOssConfig& config, const std::string& dir, const SyntheticOptions& options);

// The same tensors (same seed, same bytes) in an anonymous in-memory file, for benchmarks of models larger
// than the disk at hand (gpt-oss-120b is 65 GB); costs that much host memory while the checkpoint lives.
Result<Checkpoint> synthetic_checkpoint_in_memory(const GptOssConfig& config, const SyntheticOptions& options);
// The generation_config.json written next to synthetic checkpoints.
GenerationConfig synthetic_generation_config();

}  // namespace mx
