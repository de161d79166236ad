#include "model/gpt_oss/gpt_oss_synthetic.h"

#include <cmath>

#include "model/gpt_oss/gpt_oss_weights.h"
#include "model/synthetic_writer.h"

namespace mx {
namespace {

GptOssConfig base_config() {
  GptOssConfig c;
  c.vocab_size = 201088;
  c.hidden_size = 2880;
  c.intermediate_size = 2880;
  c.num_layers = 24;
  c.num_heads = 64;
  c.num_kv_heads = 8;
  c.head_dim = 64;
  c.num_experts = 32;
  c.experts_per_token = 4;
  c.sliding_window = 128;
  c.max_position_embeddings = 131072;
  c.rms_norm_eps = 1e-5;
  c.swiglu_limit = 7.0;
  c.rope = YarnRope{150000.0, 32.0, 4096, 32.0, 1.0, false, 0.0};
  return c;
}

void set_layers(GptOssConfig& c, int64_t layers) {
  c.num_layers = layers;
  c.layer_is_sliding.assign(static_cast<size_t>(layers), false);
  for (int64_t i = 0; i < layers; i += 2) c.layer_is_sliding[static_cast<size_t>(i)] = true;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// How each tensor is filled, following the tiny fixtures' scheme: unit embeddings, norms near 1, linears
// with std 1/sqrt(fan-in), small biases, unit sinks, experts with std ~1/sqrt(fan-in).
SyntheticFill rule_for(const WeightSpec& spec) {
  using Kind = SyntheticFill::Kind;
  const std::string& n = spec.name;
  if (ends_with(n, "layernorm.weight") || n == "model.norm.weight") return {Kind::kNormal, 1.0f, 0.1f, 0};
  if (ends_with(n, "_blocks")) return {Kind::kRandomBytes, 0, 0, 0};
  if (ends_with(n, "_scales")) {
    // Uniform random FP4 codes have rms 2.93; pick the power of two that brings that to 1/sqrt(fan-in).
    const double fan_in = static_cast<double>(spec.shape[2]) * 32.0;
    const double e = std::round(std::log2(1.0 / std::sqrt(fan_in) / 2.926));
    return {Kind::kConstantByte, 0, 0, static_cast<uint8_t>(127 + static_cast<int>(e))};
  }
  if (ends_with(n, "bias")) return {Kind::kNormal, 0, 0.1f, 0};
  if (ends_with(n, "sinks") || n == "model.embed_tokens.weight") return {Kind::kNormal, 0, 1.0f, 0};
  return {Kind::kNormal, 0, static_cast<float>(1.0 / std::sqrt(static_cast<double>(spec.shape[spec.shape.rank - 1]))), 0};
}

std::vector<WeightSpec> specs_of(const GptOssConfig& config) {
  GptOssWeights scratch;  // the specs' destinations; unused here
  return gpt_oss_weight_specs(config, scratch);
}

}  // namespace

std::vector<std::string> gpt_oss_preset_names() { return {"gpt-oss-20b", "gpt-oss-120b", "demo", "tiny"}; }

Result<GptOssConfig> gpt_oss_preset(const std::string& name) {
  GptOssConfig c = base_config();
  if (name == "gpt-oss-20b") {
    set_layers(c, 24);
  } else if (name == "gpt-oss-120b") {
    set_layers(c, 36);
    c.num_experts = 128;
  } else if (name == "demo") {
    // The real vocabulary and tokenizer with tiny widths: starts in a second, speaks gibberish.
    c.hidden_size = 128;
    c.intermediate_size = 128;
    c.num_heads = 8;
    c.num_kv_heads = 1;
    c.num_experts = 8;
    set_layers(c, 2);
  } else if (name == "tiny") {
    c.vocab_size = 1024;
    c.hidden_size = 64;
    c.intermediate_size = 64;
    c.num_heads = 4;
    c.num_kv_heads = 2;
    c.head_dim = 32;
    c.num_experts = 4;
    c.experts_per_token = 2;
    c.sliding_window = 8;
    set_layers(c, 2);
  } else {
    return invalid_argument("unknown preset '" + name + "' (gpt-oss-20b, gpt-oss-120b, demo or tiny)");
  }
  return c;
}

Status write_gpt_oss_checkpoint(const GptOssConfig& config, const std::string& dir, const SyntheticOptions& options) {
  const SyntheticConfigFiles files{
      gpt_oss_config_to_json(config),
      R"({"bos_token_id": 199998, "do_sample": true, "eos_token_id": [200002, 199999, 200012],)"
      R"( "pad_token_id": 199999})" "\n"};
  return write_synthetic_checkpoint(specs_of(config), rule_for, files, dir, options);
}

GenerationConfig gpt_oss_generation_config() {
  GenerationConfig g;
  g.eos_token_ids = {200002, 199999, 200012};
  g.bos_token_id = 199998;
  g.pad_token_id = 199999;
  return g;
}

Result<Checkpoint> gpt_oss_checkpoint_in_memory(const GptOssConfig& config, const SyntheticOptions& options) {
  return synthetic_tensors_in_memory(specs_of(config), rule_for, options);
}

}  // namespace mx
