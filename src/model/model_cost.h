// What a model's forward pass must move and compute at least: the floors `mxserve bench latency` reports
// beside measured times. Each family implements it from its own config (model/<family>/*_cost.h).
#pragma once

#include <cstdint>

namespace mx {

struct DecodeStepBytes {
  double dense = 0;    // attention projections, router, norms, lm_head, embedding rows of the batch
  double experts = 0;  // distinct experts per layer x one expert's bytes x layers
  double kv = 0;       // keys and values of every sequence (windowed layers: at most the window)
  double total() const { return dense + experts + kv; }
};

class ModelCost {
 public:
  virtual ~ModelCost() = default;
  // Routed experts per layer and per token (both 0 for a dense model).
  virtual int64_t num_experts() const = 0;
  virtual int64_t experts_per_token() const = 0;
  // A decode step of `batch` sequences at `context` tokens each (the token being decoded included), with
  // `experts_per_layer` distinct experts activated per layer; KV elements of `kv_elem_bytes` bytes.
  virtual DecodeStepBytes decode_step_bytes(int64_t batch, double experts_per_layer, int64_t context,
                                            int64_t kv_elem_bytes) const = 0;
  // Multiply-add FLOPs (2 per MAC) of prefilling `num_seqs` prompts of `prompt_len` tokens from an empty
  // cache, the lm_head for each prompt's last token only.
  virtual double prefill_flops(int64_t prompt_len, int64_t num_seqs) const = 0;

  // Distinct experts a layer activates for `tokens` tokens picking uniformly (0 for a dense model).
  double expected_distinct_experts(int64_t tokens) const;
};

// E (1 - (1 - k/E)^T): distinct experts among T tokens that each pick k of E uniformly.
double expected_distinct_experts(int64_t experts, int64_t top_k, int64_t tokens);

}  // namespace mx
