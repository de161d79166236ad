// The EAGLE-3 draft's tensor table (the published drafts' safetensors names, no "model." prefix; SGLang and
// vLLM load the same): one decoder layer `midlayer.*` whose q/k/v read 2H columns (the normed token
// embedding, then the normed hidden state), `fc` [H, 3 Ht] fusing the target's low/mid/high hidden states,
// the final `norm`, `lm_head` [Vd, H] over the draft vocabulary and `d2t` (i64 [Vd]: target id = draft id +
// d2t[draft id]). Optional: `t2d` (bool [V], the draft vocabulary as a mask over the target's; checked
// against d2t, else unused), `embed_tokens.weight` (drafts usually borrow the target's embedding), and
// lm_head / d2t when the config has no draft_vocab_size (the target's lm_head, identity map). The loader and
// the synthetic writer share the table.
#pragma once

#include <vector>

#include "io/safetensors.h"
#include "model/eagle3/eagle3_config.h"
#include "model/weight_loader.h"

namespace mx {

struct Eagle3Weights {
  TensorView input_norm;           // bf16 [H] midlayer.input_layernorm: the token embedding's norm
  TensorView hidden_norm;          // bf16 [H] midlayer.hidden_norm: the fused hidden state's norm
  TensorView q_weight, k_weight, v_weight;  // bf16 [n * hd, 2H]
  TensorView qkv_weight;           // q|k|v fused at load: bf16 [(n_q + 2 n_kv) hd, 2H]
  TensorView o_weight;             // bf16 [H, n_q hd]
  TensorView post_attention_norm;  // bf16 [H]
  TensorView gate_weight, up_weight;  // bf16 [I, H]
  TensorView down_weight;          // bf16 [H, I]
  TensorView fc;                   // bf16 [H, 3 Ht]
  TensorView final_norm;           // bf16 [H]
  TensorView lm_head;              // bf16 [Vd, H]; empty when the target's is used
  TensorView d2t;                  // i64 [Vd]; empty = identity
  TensorView t2d;                  // bool [V]; may be empty
  TensorView embed;                // bf16 [V, H]; empty = the target's
};

// Which optional tensors a checkpoint holds (the specs list exactly these).
struct Eagle3OptionalTensors {
  bool lm_head = true, d2t = true, t2d = true, embed = false;
  static Eagle3OptionalTensors in(const Checkpoint& checkpoint);
};

std::vector<WeightSpec> eagle3_weight_specs(const Eagle3Config& config, const Eagle3OptionalTensors& present,
                                            Eagle3Weights& weights);

}  // namespace mx
