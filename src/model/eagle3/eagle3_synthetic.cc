#include "model/eagle3/eagle3_synthetic.h"

#include <cmath>

#include "model/eagle3/eagle3_weights.h"
#include "model/synthetic_writer.h"

namespace mx {
namespace {

Eagle3Config published_gpt_oss_draft() {
  Eagle3Config c;
  c.hidden_size = 2880;
  c.intermediate_size = 17280;
  c.num_heads = 64;
  c.num_kv_heads = 8;
  c.head_dim = 64;
  c.vocab_size = 201088;
  c.draft_vocab_size = 32000;
  c.target_hidden_size = 2880;
  c.max_position_embeddings = 131072;
  c.rms_norm_eps = 1e-5;
  c.rope = YarnRope{150000.0, 32.0, 4096, 32.0, 1.0, false, 0.0};
  return c;
}

Eagle3Config tiny_draft(int64_t hidden, int64_t vocab, int64_t draft_vocab, std::vector<int64_t> aux_ids) {
  Eagle3Config c;
  c.hidden_size = hidden;
  c.target_hidden_size = hidden;
  c.intermediate_size = 96;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 32;
  c.vocab_size = vocab;
  c.draft_vocab_size = draft_vocab;
  c.max_position_embeddings = 131072;
  c.rms_norm_eps = 1e-5;
  c.rope = YarnRope{150000.0, 32.0, 4096, 32.0, 1.0, false, 0.0};
  c.aux_layer_ids = std::move(aux_ids);
  return c;
}

// Norms near 1, linears with std 1/sqrt(fan-in) (as the gpt-oss presets are filled), d2t zero.
SyntheticFill rule_for(const WeightSpec& spec) {
  using Kind = SyntheticFill::Kind;
  if (spec.name == "d2t") return {Kind::kConstantByte, 0, 0, 0};
  if (spec.name.ends_with("norm.weight")) return {Kind::kNormal, 1.0f, 0.1f, 0};
  if (spec.name == "embed_tokens.weight") return {Kind::kNormal, 0, 1.0f, 0};
  return {Kind::kNormal, 0, static_cast<float>(1.0 / std::sqrt(static_cast<double>(spec.shape[spec.shape.rank - 1]))), 0};
}

std::vector<WeightSpec> specs_of(const Eagle3Config& c) {
  Eagle3Weights scratch;  // the specs' destinations; unused here
  const bool own_head = !c.lm_head_from_target;
  return eagle3_weight_specs(c, Eagle3OptionalTensors{own_head, own_head, false, false}, scratch);
}

}  // namespace

std::vector<std::string> eagle3_preset_names() {
  return {"gpt-oss-20b-eagle3", "gpt-oss-120b-eagle3", "demo-eagle3", "tiny-gpt-oss-eagle3", "tiny-gpt-oss-b-eagle3",
          "tiny-eagle3"};
}

Result<Eagle3Config> eagle3_preset(const std::string& name) {
  if (name == "gpt-oss-20b-eagle3") {
    Eagle3Config c = published_gpt_oss_draft();
    c.aux_layer_ids = {1, 11, 21};  // SpecForge's gpt-oss-20b draft config
    return c;
  }
  if (name == "gpt-oss-120b-eagle3") {
    Eagle3Config c = published_gpt_oss_draft();
    c.aux_layer_ids = {1, 17, 33};  // the same rule for 36 layers: 1, L/2 - 1, L - 3
    return c;
  }
  if (name == "demo-eagle3") return tiny_draft(128, 201088, 4096, {0, 0, 0});  // the demo model: 2 layers, H 128
  if (name == "tiny-gpt-oss-eagle3") return tiny_draft(256, 1024, 600, {0, 1, 2});  // 4 target layers
  if (name == "tiny-gpt-oss-b-eagle3") return tiny_draft(320, 1500, 700, {0, 1, 1});  // 3 target layers
  if (name == "tiny-eagle3") {  // the `tiny` gpt-oss preset: 2 layers, H 64
    Eagle3Config c = tiny_draft(64, 1024, 1024, {0, 0, 0});
    c.lm_head_from_target = true;
    return c;
  }
  return invalid_argument("unknown EAGLE-3 preset '" + name + "'");
}

Status write_eagle3_checkpoint(const Eagle3Config& config, const std::string& dir, const SyntheticOptions& options) {
  return write_synthetic_checkpoint(specs_of(config), rule_for, SyntheticConfigFiles{eagle3_config_to_json(config), "{}\n"},
                                    dir, options);
}

Result<Checkpoint> eagle3_checkpoint_in_memory(const Eagle3Config& config, const SyntheticOptions& options) {
  return synthetic_tensors_in_memory(specs_of(config), rule_for, options);
}

}  // namespace mx
