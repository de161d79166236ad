// The gpt-oss tensor table: every checkpoint tensor's name, dtype and shape for a config (the released
// Hugging Face layout, ref-gpt-oss-model.md 2.2), bound to the fields that receive it. The model loader
// and the synthetic checkpoint writer share it, so the two cannot disagree.
#pragma once

#include <vector>

#include "backend/backend.h"
#include "model/gpt_oss/gpt_oss_config.h"
#include "model/weight_loader.h"

namespace mx {

struct GptOssLayerWeights {
  TensorView input_norm, post_attention_norm;                       // bf16 [H]
  TensorView q_weight, k_weight, v_weight, q_bias, k_bias, v_bias;  // bf16 [n*hd, H] / [n*hd]
  TensorView qkv_weight, qkv_bias;  // q|k|v fused at load: [(n_q + 2 n_kv) hd, H] / [(n_q + 2 n_kv) hd]
  TensorView o_weight, o_bias;      // bf16 [H, n_q hd] / [H]
  TensorView qkv_scale, o_scale;    // f32 [rows] with fp8 dense weights (--dense-dtype fp8), else empty
  TensorView sinks;                 // bf16 [n_q]
  TensorView router_weight, router_bias;  // bf16 [E, H] / [E]
  ExpertWeights experts;
};

struct GptOssWeights {
  TensorView embed;       // bf16 [V, H]
  TensorView final_norm;  // bf16 [H]
  TensorView lm_head;     // bf16 [V, H] (fp8 e4m3 with --dense-dtype fp8)
  TensorView lm_head_scale;  // f32 [V] with fp8 dense weights, else empty
  std::vector<GptOssLayerWeights> layers;
};

// Sizes `weights.layers` and returns one spec per checkpoint tensor, in checkpoint order.
std::vector<WeightSpec> gpt_oss_weight_specs(const GptOssConfig& config, GptOssWeights& weights);

}  // namespace mx
