#include "model/eagle3/eagle3_weights.h"

namespace mx {

Eagle3OptionalTensors Eagle3OptionalTensors::in(const Checkpoint& ck) {
  return Eagle3OptionalTensors{ck.has("lm_head.weight"), ck.has("d2t"), ck.has("t2d"), ck.has("embed_tokens.weight")};
}

std::vector<WeightSpec> eagle3_weight_specs(const Eagle3Config& c, const Eagle3OptionalTensors& present,
                                            Eagle3Weights& w) {
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  const DType bf16 = DType::kBF16;
  const std::string p = "midlayer.";
  std::vector<WeightSpec> specs = {
      {p + "input_layernorm.weight", bf16, {H}, &w.input_norm},
      {p + "hidden_norm.weight", bf16, {H}, &w.hidden_norm},
      {p + "self_attn.q_proj.weight", bf16, {c.q_dim(), 2 * H}, &w.q_weight},
      {p + "self_attn.k_proj.weight", bf16, {c.kv_dim(), 2 * H}, &w.k_weight},
      {p + "self_attn.v_proj.weight", bf16, {c.kv_dim(), 2 * H}, &w.v_weight},
      {p + "self_attn.o_proj.weight", bf16, {H, c.q_dim()}, &w.o_weight},
      {p + "post_attention_layernorm.weight", bf16, {H}, &w.post_attention_norm},
      {p + "mlp.gate_proj.weight", bf16, {I, H}, &w.gate_weight},
      {p + "mlp.up_proj.weight", bf16, {I, H}, &w.up_weight},
      {p + "mlp.down_proj.weight", bf16, {H, I}, &w.down_weight},
      {"fc.weight", bf16, {H, 3 * c.target_hidden_size}, &w.fc},
      {"norm.weight", bf16, {H}, &w.final_norm},
  };
  if (present.lm_head) specs.push_back({"lm_head.weight", bf16, {c.draft_vocab_size, H}, &w.lm_head});
  if (present.d2t) specs.push_back({"d2t", DType::kI64, {c.draft_vocab_size}, &w.d2t});
  if (present.t2d) specs.push_back({"t2d", DType::kBool, {c.vocab_size}, &w.t2d});
  if (present.embed) specs.push_back({"embed_tokens.weight", bf16, {c.vocab_size, H}, &w.embed});
  return specs;
}

}  // namespace mx
