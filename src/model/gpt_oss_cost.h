// What a gpt-oss forward pass must move and compute at least, for the benchmarks' floors: bytes one decode
// step reads (weights touched + KV) and FLOPs of a prefill. Weights as stored: bf16 dense, MXFP4 experts
// (4.25 bits per weight with their e8m0 scales) plus bf16 expert biases.
#pragma once

#include <cstdint>

#include "io/gpt_oss_config.h"

namespace mx {

struct DecodeStepBytes {
  double dense = 0;    // attention q/k/v/o, router, norms, sinks, lm_head, embedding rows of the batch
  double experts = 0;  // distinct experts per layer x one expert's bytes x layers
  double kv = 0;       // keys and values of every sequence (sliding layers: at most the window)
  double total() const { return dense + experts + kv; }
};

// One expert's bytes in one layer (both projections, blocks + scales + biases).
double expert_bytes(const GptOssConfig& c);

// A decode step of `batch` sequences at `context` tokens each (the token being decoded included), with
// `experts_per_layer` distinct experts activated per layer; KV elements of `kv_elem_bytes` bytes.
DecodeStepBytes decode_step_bytes(const GptOssConfig& c, int64_t batch, double experts_per_layer, int64_t context,
                                  int64_t kv_elem_bytes = 2);

// Distinct experts a layer activates for `tokens` tokens when each picks top_k of `experts` uniformly:
// E (1 - (1 - k/E)^T).
double expected_distinct_experts(int64_t experts, int64_t top_k, int64_t tokens);

// Multiply-add FLOPs (2 per MAC) of prefilling `num_seqs` prompts of `prompt_len` tokens from an empty
// cache: projections and active experts per token, causal attention (windowed on sliding layers: q.k and
// p.v), and the lm_head for each prompt's last token only.
double prefill_flops(const GptOssConfig& c, int64_t prompt_len, int64_t num_seqs);

}  // namespace mx
