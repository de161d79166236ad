#include "model/gpt_oss/gpt_oss_cost.h"

#include <algorithm>
#include <cmath>

namespace mx {
namespace {

constexpr double kBf16 = 2;
constexpr double kMxfp4 = 4.25 / 8;  // 4-bit value + one e8m0 scale per 32

// Weights of one layer's attention projections (with biases) and router, in elements.
double attention_params(const GptOssConfig& c) {
  const double qkv = static_cast<double>(c.q_dim() + 2 * c.kv_dim());
  return qkv * c.hidden_size + qkv + static_cast<double>(c.q_dim()) * c.hidden_size + c.hidden_size;
}
double router_params(const GptOssConfig& c) { return static_cast<double>(c.num_experts) * (c.hidden_size + 1); }
double expert_params(const GptOssConfig& c) { return 3.0 * c.intermediate_size * c.hidden_size; }

}  // namespace

double expert_bytes(const GptOssConfig& c) {
  return expert_params(c) * kMxfp4 + (2.0 * c.intermediate_size + c.hidden_size) * kBf16;
}

DecodeStepBytes decode_step_bytes(const GptOssConfig& c, int64_t batch, double experts_per_layer, int64_t context,
                                  int64_t kv_elem_bytes, double dense_weight_bytes) {
  DecodeStepBytes b;
  const double layers = static_cast<double>(c.num_layers);
  // qkv and o_proj weights (without biases) at dense_weight_bytes; below 2 bytes each row has an f32 scale.
  const double qkv_rows = static_cast<double>(c.q_dim() + 2 * c.kv_dim());
  const double projection_weights = (qkv_rows + c.q_dim()) * c.hidden_size;
  const double scale_bytes = dense_weight_bytes < kBf16 ? 4.0 : 0.0;
  const double projections = projection_weights * dense_weight_bytes + (qkv_rows + c.hidden_size) * scale_bytes;
  const double per_layer =
      (attention_params(c) - projection_weights + router_params(c) + 2.0 * c.hidden_size + c.num_heads) * kBf16 +
      projections;
  const double lm_head = static_cast<double>(c.vocab_size) * (c.hidden_size * dense_weight_bytes + scale_bytes);
  b.dense = layers * per_layer + lm_head +
            static_cast<double>(c.hidden_size) * kBf16 * (1 + static_cast<double>(batch));  // final norm, embedding rows
  b.experts = layers * experts_per_layer * expert_bytes(c);
  double keys = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const bool sliding = l < static_cast<int64_t>(c.layer_is_sliding.size()) && c.layer_is_sliding[static_cast<size_t>(l)];
    keys += static_cast<double>(sliding && c.sliding_window > 0 ? std::min(context, c.sliding_window) : context);
  }
  b.kv = static_cast<double>(batch) * keys * 2.0 * static_cast<double>(c.kv_dim()) * static_cast<double>(kv_elem_bytes);
  return b;
}

double prefill_flops(const GptOssConfig& c, int64_t prompt_len, int64_t num_seqs) {
  const double tokens = static_cast<double>(prompt_len) * static_cast<double>(num_seqs);
  const double per_token_params = static_cast<double>(c.num_layers) *
                                  (attention_params(c) + router_params(c) + c.experts_per_token * expert_params(c));
  double flops = 2.0 * per_token_params * tokens;
  // Attention: the token at position p sees min(p + 1, window) keys; q.k and p.v are 2 MACs per key and dim.
  const double full_keys = static_cast<double>(prompt_len) * (prompt_len + 1) / 2.0;
  const double w = static_cast<double>(c.sliding_window > 0 ? std::min(c.sliding_window, prompt_len) : prompt_len);
  const double window_keys = w * (w + 1) / 2.0 + (static_cast<double>(prompt_len) - w) * w;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const bool sliding = l < static_cast<int64_t>(c.layer_is_sliding.size()) && c.layer_is_sliding[static_cast<size_t>(l)];
    flops += static_cast<double>(num_seqs) * (sliding ? window_keys : full_keys) * 4.0 * static_cast<double>(c.q_dim());
  }
  flops += 2.0 * static_cast<double>(num_seqs) * static_cast<double>(c.vocab_size) * c.hidden_size;
  return flops;
}

}  // namespace mx
