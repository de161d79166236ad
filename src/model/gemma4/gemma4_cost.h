// Gemma-4's floors for `mxserve bench latency`: bf16 weights, the dense MLP beside the routed experts,
// per-layer head dims and KV heads (full layers with K=V have no v_proj but still store V).
#pragma once

#include "model/gemma4/gemma4_config.h"
#include "model/model_cost.h"

namespace mx {

class Gemma4Cost : public ModelCost {
 public:
  explicit Gemma4Cost(const Gemma4Config& config) : c_(config) {}
  int64_t num_experts() const override { return c_.moe ? c_.num_experts : 0; }
  int64_t experts_per_token() const override { return c_.moe ? c_.experts_per_token : 0; }
  DecodeStepBytes decode_step_bytes(int64_t batch, double experts_per_layer, int64_t context,
                                    int64_t kv_elem_bytes) const override;
  double prefill_flops(int64_t prompt_len, int64_t num_seqs) const override;

 private:
  // Weights every token reads in layer l (attention, dense MLP, router, norms), in elements.
  double dense_layer_params(size_t l) const;
  double expert_params() const { return 3.0 * static_cast<double>(c_.moe_intermediate_size) * c_.hidden_size; }

  const Gemma4Config& c_;
};

}  // namespace mx
