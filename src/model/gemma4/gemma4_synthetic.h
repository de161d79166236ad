// Synthetic Gemma-4 checkpoints (the Gemma rows of model/synthetic_model.h's preset table): the released
// multimodal layout (Gemma4ForConditionalGeneration: config.json in the released spelling with
// text_config/vision_config, generation_config.json, sharded safetensors with the text model under
// model.language_model.* and a vision tower beside it, which a text server skips by name) filled with
// seeded random bf16 weights scaled so activations stay sane. Presets: "gemma-4-26b-a4b" (the real shapes,
// ref-gemma4-mtp-spec.md 1.1-1.2) and "gemma-demo" (the real 262,144-token vocabulary size, tiny widths).
#pragma once

#include <string>
#include <vector>

#include "model/gemma4/gemma4_config.h"
#include "model/synthetic_model.h"
#include "model/weight_loader.h"

namespace mx {

// The vision tower's geometry (only its tensor list matters here: the text server never runs it).
struct Gemma4VisionShape {
  int64_t hidden_size = 0, intermediate_size = 0, num_layers = 0, num_heads = 0, head_dim = 0;
  int64_t patch_size = 16;               // input_proj reads patch_size^2 * 3 values
  int64_t position_embedding_size = 0;   // rows of each of the two position tables
};

struct Gemma4Preset {
  Gemma4Config text;
  Gemma4VisionShape vision;
};

std::vector<std::string> gemma4_preset_names();
Result<Gemma4Preset> gemma4_preset(const std::string& name);

// Every tensor of the checkpoint in file order: the text model's (gemma4_weight_specs, destinations unset)
// followed by the vision tower's.
std::vector<WeightSpec> gemma4_checkpoint_specs(const Gemma4Preset& preset);

// config.json in the released spelling (global_head_dim, num_global_key_value_heads).
std::string gemma4_config_to_json(const Gemma4Preset& preset);
// generation_config.json as the released instruction-tuned checkpoints have it.
std::string gemma4_generation_config_json();

Status write_gemma4_checkpoint(const Gemma4Preset& preset, const std::string& dir, const SyntheticOptions& options);
Result<Checkpoint> gemma4_checkpoint_in_memory(const Gemma4Preset& preset, const SyntheticOptions& options);

}  // namespace mx
