// Synthetic models by preset name (make-model, bench latency --preset, the demo model): seeded random
// weights in a family's real checkpoint layout, written to a folder or kept in an in-memory file. One
// table in synthetic_model.cc lists every family's presets; tools name presets, never families.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "io/generation_config.h"
#include "io/safetensors.h"

namespace mx {

struct SyntheticOptions {
  uint64_t seed = 0;
  int threads = 0;                      // 0 = all hardware threads
  int64_t max_shard_bytes = 4ll << 30;  // a shard closes once it passes this size
};

// Every preset's name ("gpt-oss-20b", "gpt-oss-120b", "demo", "tiny", ...).
std::vector<std::string> synthetic_preset_names();
// "a, b, c or d": for help texts and errors.
std::string synthetic_preset_list();

// Writes the preset's checkpoint (config.json, generation_config.json, safetensors) into `dir`, created if
// missing. Same seed, same bytes.
Status write_synthetic_model(const std::string& preset, const std::string& dir, const SyntheticOptions& options);

// The same checkpoint in an anonymous in-memory file, for benchmarks of models larger than the disk at hand
// (costs the checkpoint's size in host memory while it lives). model_from_checkpoint (model_registry.h)
// builds the model from it.
struct SyntheticCheckpoint {
  std::string config_json;  // config.json as write_synthetic_model writes it
  GenerationConfig generation_config;
  Checkpoint checkpoint;
};
Result<SyntheticCheckpoint> synthetic_checkpoint_in_memory(const std::string& preset, const SyntheticOptions& options);

}  // namespace mx
