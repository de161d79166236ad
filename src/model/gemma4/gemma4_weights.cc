#include "model/gemma4/gemma4_weights.h"

namespace mx {

std::vector<WeightSpec> gemma4_weight_specs(const Gemma4Config& c, Gemma4Weights& w) {
  const int64_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size;
  const int64_t E = c.num_experts, Im = c.moe_intermediate_size, nq = c.num_heads;
  const DType bf16 = DType::kBF16;
  const std::string root = c.prefix();
  w.layers.resize(static_cast<size_t>(c.num_layers));
  std::vector<WeightSpec> specs = {{root + "embed_tokens.weight", bf16, {V, H}, &w.embed}};
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const size_t li = static_cast<size_t>(l);
    Gemma4LayerWeights& L = w.layers[li];
    const int64_t hd = c.layer_head_dim[li], kv = c.layer_kv_heads[li];
    const std::string p = root + "layers." + std::to_string(l) + ".";
    std::vector<WeightSpec> layer = {
        {p + "input_layernorm.weight", bf16, {H}, &L.input_norm},
        {p + "self_attn.q_proj.weight", bf16, {nq * hd, H}, &L.q_weight},
        {p + "self_attn.k_proj.weight", bf16, {kv * hd, H}, &L.k_weight},
        {p + "self_attn.q_norm.weight", bf16, {hd}, &L.q_norm},
        {p + "self_attn.k_norm.weight", bf16, {hd}, &L.k_norm},
        {p + "self_attn.o_proj.weight", bf16, {H, nq * hd}, &L.o_weight},
        {p + "post_attention_layernorm.weight", bf16, {H}, &L.post_attention_norm},
        {p + "pre_feedforward_layernorm.weight", bf16, {H}, &L.pre_mlp_norm},
        {p + "mlp.gate_proj.weight", bf16, {I, H}, &L.mlp_gate},
        {p + "mlp.up_proj.weight", bf16, {I, H}, &L.mlp_up},
        {p + "mlp.down_proj.weight", bf16, {H, I}, &L.mlp_down},
        {p + "post_feedforward_layernorm.weight", bf16, {H}, &L.post_ffn_norm},
        {p + "layer_scalar", bf16, {1}, &L.layer_scalar},
    };
    // Full layers with attention_k_eq_v have no v_proj: V comes from the raw k projection.
    if (c.layer_is_sliding[li] || !c.k_eq_v) layer.push_back({p + "self_attn.v_proj.weight", bf16, {kv * hd, H}, &L.v_weight});
    if (c.moe) {
      std::vector<WeightSpec> moe = {
          {p + "post_feedforward_layernorm_1.weight", bf16, {H}, &L.post_mlp_norm},
          {p + "pre_feedforward_layernorm_2.weight", bf16, {H}, &L.pre_moe_norm},
          {p + "post_feedforward_layernorm_2.weight", bf16, {H}, &L.post_moe_norm},
          {p + "router.proj.weight", bf16, {E, H}, &L.router_weight},
          {p + "router.scale", bf16, {H}, &L.router_scale},
          {p + "router.per_expert_scale", bf16, {E}, &L.per_expert_scale},
          {p + "experts.gate_up_proj", bf16, {E, 2 * Im, H}, &L.experts_gate_up},
          {p + "experts.down_proj", bf16, {E, H, Im}, &L.experts_down},
      };
      layer.insert(layer.end(), moe.begin(), moe.end());
    }
    specs.insert(specs.end(), layer.begin(), layer.end());
  }
  specs.push_back({root + "norm.weight", bf16, {H}, &w.final_norm});
  return specs;
}

std::vector<std::string> gemma4_skipped_prefixes(const Gemma4Config& c) {
  if (!c.multimodal) return {};
  return {"model.vision_tower.", "model.embed_vision.", "model.audio_tower.", "model.embed_audio."};
}

}  // namespace mx
