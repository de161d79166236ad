// gpt-oss config.json (model_type "gpt_oss"). Accepts both spellings real files use for RoPE:
// `rope_scaling` + top-level `rope_theta` (the released checkpoints) and `rope_parameters` with
// `rope_theta` inside (newer transformers). Required fields missing or mistyped are errors naming the field.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/rope.h"

namespace mx {

struct GptOssConfig {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t num_experts = 0;
  int64_t experts_per_token = 0;
  int64_t sliding_window = 0;              // keys a sliding layer sees, the current one included
  std::vector<bool> layer_is_sliding;      // [num_layers]
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-5;
  double swiglu_limit = 7.0;
  double swiglu_alpha = 1.702;
  YarnRope rope;
  bool experts_mxfp4 = true;               // quantization_config.quant_method == "mxfp4"

  int64_t q_dim() const { return num_heads * head_dim; }
  int64_t kv_dim() const { return num_kv_heads * head_dim; }
};

// Parses config.json text; `source` names the file in error messages.
Result<GptOssConfig> parse_gpt_oss_config(const std::string& text, const std::string& source);
Result<GptOssConfig> load_gpt_oss_config(const std::string& model_dir);
// config.json text in the released checkpoints' spelling (rope_scaling + rope_theta, mxfp4 quantization).
std::string gpt_oss_config_to_json(const GptOssConfig& config);

}  // namespace mx
