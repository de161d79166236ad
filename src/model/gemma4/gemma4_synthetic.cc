#include "model/gemma4/gemma4_synthetic.h"

#include <cmath>

#include <nlohmann/json.hpp>

#include "model/gemma4/gemma4_weights.h"
#include "model/synthetic_writer.h"

namespace mx {
namespace {

using nlohmann::json;

// 26B-A4B's text model (ref-gemma4-mtp-spec.md 1.2): 30 layers, every sixth full; sliding layers 8 KV heads
// of 256 with a 1024-token window, full layers 2 KV heads of 512 with K = V and proportional RoPE.
Gemma4Config gemma_26b_a4b_text() {
  Gemma4Config c;
  c.multimodal = true;
  c.vocab_size = 262144;
  c.hidden_size = 2816;
  c.intermediate_size = 2112;
  c.num_layers = 30;
  c.num_heads = 16;
  c.sliding_window = 1024;
  c.k_eq_v = true;
  c.moe = true;
  c.num_experts = 128;
  c.experts_per_token = 8;
  c.moe_intermediate_size = 704;
  c.rms_norm_eps = 1e-6;
  c.final_logit_softcap = 30.0;
  c.max_position_embeddings = 262144;
  c.sliding_rope = {10000.0, 1.0};
  c.full_rope = {1000000.0, 0.25};
  return c;
}

// Transformers' default pattern: every sixth layer full, the last layer full.
void set_layers(Gemma4Config& c, int64_t layers, int64_t head_dim, int64_t kv_heads, int64_t global_head_dim,
                int64_t global_kv_heads) {
  c.num_layers = layers;
  const size_t L = static_cast<size_t>(layers);
  c.layer_is_sliding.assign(L, true);
  for (size_t i = 0; i < L; ++i) c.layer_is_sliding[i] = (i + 1) % 6 != 0;
  c.layer_is_sliding.back() = false;
  c.layer_head_dim.assign(L, head_dim);
  c.layer_kv_heads.assign(L, kv_heads);
  for (size_t i = 0; i < L; ++i)
    if (!c.layer_is_sliding[i]) c.layer_head_dim[i] = global_head_dim, c.layer_kv_heads[i] = global_kv_heads;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The tiny fixture's conditioning (make_tiny_gemma4.py): 1-D weights near 1, q/k norms near hd^-1/4 (the
// attention scale is 1.0), layer scalars in [0.5, 1], matrices and expert stacks with std 1/sqrt(fan-in);
// the embedding too, so that the sqrt(H)-scaled input rows have unit size and the tied logits stay modest.
SyntheticFill gemma4_fill(const WeightSpec& spec) {
  using Kind = SyntheticFill::Kind;
  const std::string& n = spec.name;
  if (ends_with(n, "layer_scalar")) return {Kind::kNormal, 0.75f, 0.1f, 0};
  if (ends_with(n, "q_norm.weight") || ends_with(n, "k_norm.weight")) {
    const float s = static_cast<float>(std::pow(static_cast<double>(spec.shape[0]), -0.25));
    return {Kind::kNormal, s, 0.1f * s, 0};
  }
  if (spec.shape.rank == 1) return {Kind::kNormal, 1.0f, 0.1f, 0};
  const double fan_in = static_cast<double>(spec.shape[spec.shape.rank - 1]);
  return {Kind::kNormal, 0, static_cast<float>(1.0 / std::sqrt(fan_in)), 0};
}

std::vector<WeightSpec> vision_specs(const Gemma4VisionShape& v, int64_t text_hidden, bool standardize) {
  const DType bf16 = DType::kBF16;
  const int64_t vh = v.hidden_size, attn = v.num_heads * v.head_dim, I = v.intermediate_size;
  const std::string tower = "model.vision_tower.";
  std::vector<WeightSpec> specs = {
      {tower + "patch_embedder.input_proj.weight", bf16, {vh, v.patch_size * v.patch_size * 3}, nullptr},
      {tower + "patch_embedder.position_embedding_table", bf16, {2, v.position_embedding_size, vh}, nullptr},
  };
  for (int64_t l = 0; l < v.num_layers; ++l) {
    const std::string p = tower + "encoder.layers." + std::to_string(l) + ".";
    for (const char* norm : {"input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                             "post_feedforward_layernorm"})
      specs.push_back({p + norm + ".weight", bf16, {vh}, nullptr});
    for (const char* proj : {"q_proj", "k_proj", "v_proj"})
      specs.push_back({p + "self_attn." + proj + ".linear.weight", bf16, {attn, vh}, nullptr});
    specs.push_back({p + "self_attn.o_proj.linear.weight", bf16, {vh, attn}, nullptr});
    specs.push_back({p + "self_attn.q_norm.weight", bf16, {v.head_dim}, nullptr});
    specs.push_back({p + "self_attn.k_norm.weight", bf16, {v.head_dim}, nullptr});
    specs.push_back({p + "mlp.gate_proj.linear.weight", bf16, {I, vh}, nullptr});
    specs.push_back({p + "mlp.up_proj.linear.weight", bf16, {I, vh}, nullptr});
    specs.push_back({p + "mlp.down_proj.linear.weight", bf16, {vh, I}, nullptr});
  }
  if (standardize) {
    specs.push_back({tower + "std_bias", bf16, {vh}, nullptr});
    specs.push_back({tower + "std_scale", bf16, {vh}, nullptr});
  }
  specs.push_back({"model.embed_vision.embedding_projection.weight", bf16, {text_hidden, vh}, nullptr});
  return specs;
}

// The released checkpoint standardizes the pooled vision features (std_bias/std_scale); the demo's tiny
// tower does not, as the tiny fixture's does not.
bool standardizes(const Gemma4Preset& p) { return p.vision.num_layers > 1; }

}  // namespace

std::vector<std::string> gemma4_preset_names() { return {"gemma-4-26b-a4b", "gemma-demo"}; }

Result<Gemma4Preset> gemma4_preset(const std::string& name) {
  Gemma4Preset p;
  p.text = gemma_26b_a4b_text();
  if (name == "gemma-4-26b-a4b") {
    set_layers(p.text, 30, 256, 8, 512, 2);
    // The vision tower (~550 M parameters): 27 layers of 1152, 16 heads of 72, MLP 4304, 16x16 patches.
    p.vision = {1152, 4304, 27, 16, 72, 16, 10240};
  } else if (name == "gemma-demo") {
    // The real vocabulary size with tiny widths: one sliding and one full layer; starts at once, speaks gibberish.
    p.text.hidden_size = 64;
    p.text.intermediate_size = 128;
    p.text.num_heads = 2;
    p.text.num_experts = 8;
    p.text.experts_per_token = 2;
    p.text.moe_intermediate_size = 32;
    p.text.sliding_window = 512;
    set_layers(p.text, 2, 64, 1, 128, 1);
    p.vision = {32, 64, 1, 2, 16, 16, 64};
  } else {
    return invalid_argument("unknown preset '" + name + "'");
  }
  return p;
}

std::vector<WeightSpec> gemma4_checkpoint_specs(const Gemma4Preset& preset) {
  Gemma4Weights scratch;  // the specs' destinations; unused here
  std::vector<WeightSpec> specs = gemma4_weight_specs(preset.text, scratch);
  for (WeightSpec& s : specs) s.destination = nullptr;
  if (preset.text.multimodal) {
    const auto vision = vision_specs(preset.vision, preset.text.hidden_size, standardizes(preset));
    specs.insert(specs.end(), vision.begin(), vision.end());
  }
  return specs;
}

std::string gemma4_config_to_json(const Gemma4Preset& preset) {
  const Gemma4Config& c = preset.text;
  json layer_types = json::array();
  for (bool sliding : c.layer_is_sliding) layer_types.push_back(sliding ? "sliding_attention" : "full_attention");
  const size_t first = 0;
  json text = {
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"attention_k_eq_v", c.k_eq_v},
      {"bos_token_id", 2},
      {"enable_moe_block", c.moe},
      {"eos_token_id", {1, 106}},
      {"final_logit_softcapping", c.final_logit_softcap},
      {"global_head_dim", c.global_head_dim()},
      {"head_dim", c.layer_head_dim[first]},
      {"hidden_activation", "gelu_pytorch_tanh"},
      {"hidden_size", c.hidden_size},
      {"hidden_size_per_layer_input", 0},
      {"intermediate_size", c.intermediate_size},
      {"layer_types", layer_types},
      {"max_position_embeddings", c.max_position_embeddings},
      {"model_type", "gemma4_text"},
      {"moe_intermediate_size", c.moe_intermediate_size},
      {"num_attention_heads", c.num_heads},
      {"num_experts", c.num_experts},
      {"num_global_key_value_heads", c.global_kv_heads()},
      {"num_hidden_layers", c.num_layers},
      {"num_key_value_heads", c.layer_kv_heads[first]},
      {"num_kv_shared_layers", 0},
      {"pad_token_id", 0},
      {"rms_norm_eps", c.rms_norm_eps},
      {"rope_parameters",
       {{"full_attention",
         {{"partial_rotary_factor", c.full_rope.partial_rotary_factor}, {"rope_theta", c.full_rope.theta},
          {"rope_type", "proportional"}}},
        {"sliding_attention", {{"rope_theta", c.sliding_rope.theta}, {"rope_type", "default"}}}}},
      {"sliding_window", c.sliding_window},
      {"tie_word_embeddings", true},
      {"top_k_experts", c.experts_per_token},
      {"use_double_wide_mlp", false},
      {"vocab_size", c.vocab_size},
  };
  if (!c.multimodal) {
    text["architectures"] = {"Gemma4ForCausalLM"};
    return text.dump(2) + "\n";
  }
  const Gemma4VisionShape& v = preset.vision;
  json vision = {
      {"head_dim", v.head_dim},
      {"hidden_activation", "gelu_pytorch_tanh"},
      {"hidden_size", v.hidden_size},
      {"intermediate_size", v.intermediate_size},
      {"model_type", "gemma4_vision"},
      {"num_attention_heads", v.num_heads},
      {"num_hidden_layers", v.num_layers},
      {"num_key_value_heads", v.num_heads},
      {"patch_size", v.patch_size},
      {"pooling_kernel_size", 3},
      {"position_embedding_size", v.position_embedding_size},
      {"rms_norm_eps", 1e-6},
      {"rope_parameters", {{"rope_theta", 100.0}, {"rope_type", "axial"}}},
      {"standardize", standardizes(preset)},
  };
  json root = {
      {"architectures", {"Gemma4ForConditionalGeneration"}},
      {"audio_config", nullptr},
      {"audio_token_id", 258881},
      {"boa_token_id", 256000},
      {"boi_token_id", 255999},
      {"eoa_token_index", 258883},
      {"eoi_token_id", 258882},
      {"eos_token_id", {1, 106}},
      {"image_token_id", 258880},
      {"model_type", "gemma4"},
      {"text_config", text},
      {"tie_word_embeddings", true},
      {"video_token_id", 258884},
      {"vision_config", vision},
  };
  return root.dump(2) + "\n";
}

std::string gemma4_generation_config_json() {
  return R"({"bos_token_id": 2, "do_sample": true, "eos_token_id": [1, 106], "pad_token_id": 0, "temperature": 1.0,)"
         R"( "top_k": 64, "top_p": 0.95})" "\n";
}

Status write_gemma4_checkpoint(const Gemma4Preset& preset, const std::string& dir, const SyntheticOptions& options) {
  const SyntheticConfigFiles files{gemma4_config_to_json(preset), gemma4_generation_config_json()};
  return write_synthetic_checkpoint(gemma4_checkpoint_specs(preset), gemma4_fill, files, dir, options);
}

Result<Checkpoint> gemma4_checkpoint_in_memory(const Gemma4Preset& preset, const SyntheticOptions& options) {
  return synthetic_tensors_in_memory(gemma4_checkpoint_specs(preset), gemma4_fill, options);
}

}  // namespace mx
