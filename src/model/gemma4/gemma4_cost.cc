#include "model/gemma4/gemma4_cost.h"

#include <algorithm>

namespace mx {
namespace {
constexpr double kBf16 = 2;
}  // namespace

double Gemma4Cost::dense_layer_params(size_t l) const {
  const double H = static_cast<double>(c_.hidden_size), hd = static_cast<double>(c_.layer_head_dim[l]);
  const double q = static_cast<double>(c_.num_heads) * hd, kv = static_cast<double>(c_.layer_kv_heads[l]) * hd;
  const bool has_v = c_.layer_is_sliding[l] || !c_.k_eq_v;
  const double attention = (2 * q + kv * (has_v ? 2 : 1)) * H + 2 * hd;
  const double mlp = 3.0 * static_cast<double>(c_.intermediate_size) * H;
  const double router = c_.moe ? static_cast<double>(c_.num_experts) * (H + 1) + H : 0;
  return attention + mlp + router + 7 * H + 1;
}

DecodeStepBytes Gemma4Cost::decode_step_bytes(int64_t batch, double experts_per_layer, int64_t context,
                                              int64_t kv_elem_bytes) const {
  DecodeStepBytes b;
  const double H = static_cast<double>(c_.hidden_size);
  for (size_t l = 0; l < c_.layer_is_sliding.size(); ++l) {
    b.dense += dense_layer_params(l) * kBf16;
    const int64_t keys = c_.layer_is_sliding[l] ? std::min(context, c_.sliding_window) : context;
    b.kv += static_cast<double>(batch) * static_cast<double>(keys) * 2.0 *
            static_cast<double>(c_.layer_kv_heads[l] * c_.layer_head_dim[l]) * static_cast<double>(kv_elem_bytes);
  }
  b.dense += static_cast<double>(c_.vocab_size) * H * kBf16 + H * kBf16 * (1 + static_cast<double>(batch));
  if (c_.moe) b.experts = static_cast<double>(c_.num_layers) * experts_per_layer * expert_params() * kBf16;
  return b;
}

double Gemma4Cost::prefill_flops(int64_t prompt_len, int64_t num_seqs) const {
  const double tokens = static_cast<double>(prompt_len) * static_cast<double>(num_seqs);
  const double P = static_cast<double>(prompt_len);
  const double full_keys = P * (P + 1) / 2.0;
  const double w = static_cast<double>(std::min(c_.sliding_window, prompt_len));
  const double window_keys = w * (w + 1) / 2.0 + (P - w) * w;
  double flops = 0;
  for (size_t l = 0; l < c_.layer_is_sliding.size(); ++l) {
    const double routed = c_.moe ? static_cast<double>(c_.experts_per_token) * expert_params() : 0;
    flops += 2.0 * (dense_layer_params(l) + routed) * tokens;
    const double q_dim = static_cast<double>(c_.num_heads * c_.layer_head_dim[l]);
    flops += static_cast<double>(num_seqs) * (c_.layer_is_sliding[l] ? window_keys : full_keys) * 4.0 * q_dim;
  }
  return flops + 2.0 * static_cast<double>(num_seqs) * static_cast<double>(c_.vocab_size) * c_.hidden_size;
}

}  // namespace mx
