#include "model/gemma4/gemma4_assistant_synthetic.h"

#include <cmath>
#include <filesystem>

#include "model/gemma4/gemma4_assistant_weights.h"
#include "model/gemma4/gemma4_synthetic.h"
#include "model/synthetic_writer.h"

namespace mx {
namespace {

bool has_suffix(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// As the target's synthetic weights: 1-D weights near 1, q norms near hd^-1/4 (attention scale 1.0), layer
// scalars in [0.5, 1], matrices with std 1/sqrt(fan-in).
SyntheticFill assistant_fill(const WeightSpec& spec) {
  using Kind = SyntheticFill::Kind;
  if (has_suffix(spec.name, "layer_scalar")) return {Kind::kNormal, 0.75f, 0.1f, 0};
  if (has_suffix(spec.name, "q_norm.weight")) {
    const float s = static_cast<float>(std::pow(static_cast<double>(spec.shape[0]), -0.25));
    return {Kind::kNormal, s, 0.1f * s, 0};
  }
  if (spec.shape.rank == 1) return {Kind::kNormal, 1.0f, 0.1f, 0};
  const double fan_in = static_cast<double>(spec.shape[spec.shape.rank - 1]);
  return {Kind::kNormal, 0, static_cast<float>(1.0 / std::sqrt(fan_in)), 0};
}

}  // namespace

Gemma4AssistantConfig gemma4_assistant_for(const Gemma4Config& t, int64_t layers, int64_t hidden, int64_t intermediate) {
  Gemma4AssistantConfig c;
  c.backbone_hidden_size = t.hidden_size;
  c.vocab_size = t.vocab_size;
  c.hidden_size = hidden;
  c.intermediate_size = intermediate;
  c.num_layers = layers;
  c.num_heads = t.num_heads;
  c.sliding_window = t.sliding_window;
  c.rms_norm_eps = t.rms_norm_eps;
  c.sliding_rope = t.sliding_rope;
  c.full_rope = t.full_rope;
  // Head dims of the target layers whose KV each assistant layer reads (the last of its type).
  int64_t sliding_hd = 0, full_hd = 0;
  for (size_t l = 0; l < t.layer_is_sliding.size(); ++l) (t.layer_is_sliding[l] ? sliding_hd : full_hd) = t.layer_head_dim[l];
  for (int64_t l = 0; l < layers; ++l) {
    const bool sliding = l + 1 < layers;
    c.layer_is_sliding.push_back(sliding);
    c.layer_head_dim.push_back(sliding ? sliding_hd : full_hd);
  }
  return c;
}

Gemma4AssistantConfig gemma4_26b_a4b_assistant() {
  auto target = gemma4_preset("gemma-4-26b-a4b");
  return gemma4_assistant_for(target->text, 4, 1024, 8192);
}

Status write_gemma4_assistant_checkpoint(const Gemma4AssistantConfig& config, const std::string& dir,
                                         const SyntheticOptions& options) {
  Gemma4AssistantWeights scratch;  // the specs' destinations; unused here
  std::vector<WeightSpec> specs = gemma4_assistant_weight_specs(config, scratch);
  for (WeightSpec& s : specs) s.destination = nullptr;
  SyntheticConfigFiles files;
  files.config_json = gemma4_assistant_config_to_json(config);
  files.generation_config_json = "{}\n";
  return write_synthetic_checkpoint(specs, assistant_fill, files, dir, options);
}

}  // namespace mx
