// The Gemma-4 tensor table: every text-model tensor's name, dtype and shape for a config (the released
// Hugging Face layout, ref-gemma4-mtp-spec.md 1.7), bound to the fields that receive it, and the prefixes
// of the multimodal checkpoint's vision and audio towers, which a text server skips by name (every other
// tensor is still checked).
#pragma once

#include <string>
#include <vector>

#include "model/gemma4/gemma4_config.h"
#include "model/weight_loader.h"

namespace mx {

struct Gemma4LayerWeights {
  TensorView input_norm, post_attention_norm;                  // bf16 [H]
  TensorView q_weight, k_weight, v_weight;                     // bf16 [n*hd, H]; v_weight absent on K=V layers
  TensorView q_norm, k_norm;                                   // bf16 [hd]
  TensorView o_weight;                                         // bf16 [H, n_q hd]
  TensorView pre_mlp_norm, post_mlp_norm;                      // dense branch: pre_feedforward_layernorm, _1
  TensorView mlp_gate, mlp_up, mlp_down;                       // bf16 [I, H], [I, H], [H, I]
  TensorView pre_moe_norm, post_moe_norm;                      // pre_feedforward_layernorm_2, post_..._2
  TensorView post_ffn_norm;                                    // post_feedforward_layernorm (of the sum)
  TensorView router_weight, router_scale, per_expert_scale;    // bf16 [E, H], [H], [E]
  TensorView experts_gate_up, experts_down;                    // bf16 [E, 2 I_moe, H] (gate rows first), [E, H, I_moe]
  TensorView layer_scalar;                                     // bf16 [1]
};

struct Gemma4Weights {
  TensorView embed;       // bf16 [V, H], also the (tied) lm_head
  TensorView final_norm;  // bf16 [H]
  std::vector<Gemma4LayerWeights> layers;
};

// Sizes `weights.layers` and returns one spec per text-model tensor.
std::vector<WeightSpec> gemma4_weight_specs(const Gemma4Config& config, Gemma4Weights& weights);
// Name prefixes of the multimodal checkpoint's non-text towers (empty for the text-only layout).
std::vector<std::string> gemma4_skipped_prefixes(const Gemma4Config& config);

}  // namespace mx
