// The Gemma-4 assistant's tensor table (transformers' Gemma4AssistantForCausalLM as saved: the inner text
// model under `model.`, Q-only attention layers, the two projections at the top level; lm_head is tied to
// model.embed_tokens and not stored), bound to the fields that receive it.
#pragma once

#include <vector>

#include "model/gemma4/gemma4_assistant_config.h"
#include "model/weight_loader.h"

namespace mx {

struct Gemma4AssistantLayerWeights {
  TensorView input_norm, post_attention_norm, pre_ffn_norm, post_ffn_norm;  // bf16 [h]
  TensorView q_weight;                                                      // bf16 [n_q hd, h]
  TensorView q_norm;                                                        // bf16 [hd]
  TensorView o_weight;                                                      // bf16 [h, n_q hd]
  TensorView mlp_gate, mlp_up, mlp_down;                                    // bf16 [I, h], [I, h], [h, I]
  TensorView layer_scalar;                                                  // bf16 [1]
};

struct Gemma4AssistantWeights {
  TensorView embed;            // bf16 [V, h]: the tied lm_head (the input side embeds with the TARGET's table)
  TensorView final_norm;       // bf16 [h]
  TensorView pre_projection;   // bf16 [h, 2 Hb]: input columns [target embedding | target hidden]
  TensorView post_projection;  // bf16 [Hb, h]
  std::vector<Gemma4AssistantLayerWeights> layers;
};

// Sizes `weights.layers` and returns one spec per tensor.
std::vector<WeightSpec> gemma4_assistant_weight_specs(const Gemma4AssistantConfig& config, Gemma4AssistantWeights& weights);

}  // namespace mx
