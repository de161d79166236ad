// What a gpt-oss forward pass must move and compute at least, for the benchmarks' floors: bytes one decode
// step reads (weights touched + KV) and FLOPs of a prefill. Weights as stored: bf16 dense, MXFP4 experts
// (4.25 bits per weight with their e8m0 scales) plus bf16 expert biases.
#pragma once

#include <cstdint>

#include "model/gpt_oss/gpt_oss_config.h"
#include "model/model_cost.h"

namespace mx {

// One expert's bytes in one layer (both projections, blocks + scales + biases).
double expert_bytes(const GptOssConfig& c);

// A decode step of `batch` sequences at `context` tokens each (the token being decoded included), with
// `experts_per_layer` distinct experts activated per layer; KV elements of `kv_elem_bytes` bytes; the qkv,
// o_proj and lm_head weights at `dense_weight_bytes` each (1 with --dense-dtype fp8, whose per-row scales
// are counted too).
DecodeStepBytes decode_step_bytes(const GptOssConfig& c, int64_t batch, double experts_per_layer, int64_t context,
                                  int64_t kv_elem_bytes = 2, double dense_weight_bytes = 2);

// Multiply-add FLOPs (2 per MAC) of prefilling `num_seqs` prompts of `prompt_len` tokens from an empty
// cache: projections and active experts per token, causal attention (windowed on sliding layers: q.k and
// p.v), and the lm_head for each prompt's last token only.
double prefill_flops(const GptOssConfig& c, int64_t prompt_len, int64_t num_seqs);

// The functions above behind the ModelCost interface.
class GptOssCost : public ModelCost {
 public:
  explicit GptOssCost(const GptOssConfig& config) : c_(config) {}
  void set_dense_weight_bytes(double bytes) { dense_weight_bytes_ = bytes; }
  int64_t num_experts() const override { return c_.num_experts; }
  int64_t experts_per_token() const override { return c_.experts_per_token; }
  DecodeStepBytes decode_step_bytes(int64_t batch, double experts_per_layer, int64_t context,
                                    int64_t kv_elem_bytes) const override {
    return mx::decode_step_bytes(c_, batch, experts_per_layer, context, kv_elem_bytes, dense_weight_bytes_);
  }
  double prefill_flops(int64_t prompt_len, int64_t num_seqs) const override {
    return mx::prefill_flops(c_, prompt_len, num_seqs);
  }

 private:
  const GptOssConfig& c_;
  double dense_weight_bytes_ = 2;
};

}  // namespace mx
