#include "model/gpt_oss/gpt_oss_weights.h"

#include <string>

namespace mx {

std::vector<WeightSpec> gpt_oss_weight_specs(const GptOssConfig& c, GptOssWeights& w) {
  const int64_t H = c.hidden_size, I = c.intermediate_size, E = c.num_experts, V = c.vocab_size;
  const int64_t q_dim = c.q_dim(), kv_dim = c.kv_dim();
  const DType bf16 = DType::kBF16, u8 = DType::kU8;
  w.layers.resize(static_cast<size_t>(c.num_layers));
  std::vector<WeightSpec> specs = {{"model.embed_tokens.weight", bf16, {V, H}, &w.embed}};
  for (int64_t l = 0; l < c.num_layers; ++l) {
    GptOssLayerWeights& L = w.layers[static_cast<size_t>(l)];
    ExpertWeights& x = L.experts;
    x.num_experts = E;
    x.hidden = H;
    x.intermediate = I;
    const std::string p = "model.layers." + std::to_string(l) + ".";
    std::vector<WeightSpec> layer = {
        {p + "input_layernorm.weight", bf16, {H}, &L.input_norm},
        {p + "self_attn.q_proj.weight", bf16, {q_dim, H}, &L.q_weight},
        {p + "self_attn.q_proj.bias", bf16, {q_dim}, &L.q_bias},
        {p + "self_attn.k_proj.weight", bf16, {kv_dim, H}, &L.k_weight},
        {p + "self_attn.k_proj.bias", bf16, {kv_dim}, &L.k_bias},
        {p + "self_attn.v_proj.weight", bf16, {kv_dim, H}, &L.v_weight},
        {p + "self_attn.v_proj.bias", bf16, {kv_dim}, &L.v_bias},
        {p + "self_attn.o_proj.weight", bf16, {H, q_dim}, &L.o_weight},
        {p + "self_attn.o_proj.bias", bf16, {H}, &L.o_bias},
        {p + "self_attn.sinks", bf16, {c.num_heads}, &L.sinks},
        {p + "post_attention_layernorm.weight", bf16, {H}, &L.post_attention_norm},
        {p + "mlp.router.weight", bf16, {E, H}, &L.router_weight},
        {p + "mlp.router.bias", bf16, {E}, &L.router_bias},
        {p + "mlp.experts.gate_up_proj_blocks", u8, {E, 2 * I, H / 32, 16}, &x.w1_blocks},
        {p + "mlp.experts.gate_up_proj_scales", u8, {E, 2 * I, H / 32}, &x.w1_scales},
        {p + "mlp.experts.gate_up_proj_bias", bf16, {E, 2 * I}, &x.w1_bias},
        {p + "mlp.experts.down_proj_blocks", u8, {E, H, I / 32, 16}, &x.w2_blocks},
        {p + "mlp.experts.down_proj_scales", u8, {E, H, I / 32}, &x.w2_scales},
        {p + "mlp.experts.down_proj_bias", bf16, {E, H}, &x.w2_bias},
    };
    specs.insert(specs.end(), layer.begin(), layer.end());
  }
  specs.push_back({"model.norm.weight", bf16, {H}, &w.final_norm});
  specs.push_back({"lm_head.weight", bf16, {V, H}, &w.lm_head});
  return specs;
}

}  // namespace mx
