#include "model/gemma4/gemma4_assistant_weights.h"

#include <string>

namespace mx {

std::vector<WeightSpec> gemma4_assistant_weight_specs(const Gemma4AssistantConfig& c, Gemma4AssistantWeights& w) {
  const int64_t h = c.hidden_size, I = c.intermediate_size, V = c.vocab_size, Hb = c.backbone_hidden_size, nq = c.num_heads;
  const DType bf16 = DType::kBF16;
  w.layers.resize(static_cast<size_t>(c.num_layers));
  std::vector<WeightSpec> specs = {
      {"model.embed_tokens.weight", bf16, {V, h}, &w.embed},
      {"pre_projection.weight", bf16, {h, 2 * Hb}, &w.pre_projection},
      {"post_projection.weight", bf16, {Hb, h}, &w.post_projection},
  };
  for (int64_t l = 0; l < c.num_layers; ++l) {
    Gemma4AssistantLayerWeights& L = w.layers[static_cast<size_t>(l)];
    const int64_t hd = c.layer_head_dim[static_cast<size_t>(l)];
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const std::vector<WeightSpec> layer = {
        {p + "input_layernorm.weight", bf16, {h}, &L.input_norm},
        {p + "self_attn.q_proj.weight", bf16, {nq * hd, h}, &L.q_weight},
        {p + "self_attn.q_norm.weight", bf16, {hd}, &L.q_norm},
        {p + "self_attn.o_proj.weight", bf16, {h, nq * hd}, &L.o_weight},
        {p + "post_attention_layernorm.weight", bf16, {h}, &L.post_attention_norm},
        {p + "pre_feedforward_layernorm.weight", bf16, {h}, &L.pre_ffn_norm},
        {p + "mlp.gate_proj.weight", bf16, {I, h}, &L.mlp_gate},
        {p + "mlp.up_proj.weight", bf16, {I, h}, &L.mlp_up},
        {p + "mlp.down_proj.weight", bf16, {h, I}, &L.mlp_down},
        {p + "post_feedforward_layernorm.weight", bf16, {h}, &L.post_ffn_norm},
        {p + "layer_scalar", bf16, {1}, &L.layer_scalar},
    };
    specs.insert(specs.end(), layer.begin(), layer.end());
  }
  specs.push_back({"model.norm.weight", bf16, {h}, &w.final_norm});
  return specs;
}

}  // namespace mx
