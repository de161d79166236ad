// Gemma-4 config.json (ref-gemma4-mtp-spec.md 1.2 and 6). Two checkpoint layouts: the released multimodal
// one (model_type "gemma4", Gemma4ForConditionalGeneration, the text model under `text_config` and its
// tensors under `model.language_model.`) and a text-only one (model_type "gemma4_text",
// Gemma4ForCausalLM, fields at the top level, tensors under `model.`). The full-attention layers' head dim
// and KV heads come in two spellings: the released `global_head_dim` + `num_global_key_value_heads`, and
// transformers 5.x's `per_layer_config: {"<layer>": {"head_dim", "num_key_value_heads"}}`. Both are read
// into per-layer values. Features of the E-series (per-layer embeddings, KV-shared layers, double-wide
// MLPs) are refused by name.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace mx {

struct Gemma4Rope {
  double theta = 10000.0;
  // "proportional" RoPE (full layers): only the first int(partial_rotary_factor * head_dim / 2) frequency
  // pairs rotate, with exponents over the whole head dim; the rest pass through. 1.0 = default RoPE.
  double partial_rotary_factor = 1.0;
};

struct Gemma4Config {
  bool multimodal = true;  // Gemma4ForConditionalGeneration layout (tensor prefix model.language_model.)
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;      // the dense MLP beside the experts
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t sliding_window = 0;         // keys a sliding layer sees, the current one included
  std::vector<bool> layer_is_sliding; // [num_layers]
  std::vector<int64_t> layer_head_dim;     // [num_layers]
  std::vector<int64_t> layer_kv_heads;     // [num_layers]
  bool k_eq_v = false;                // full layers have no v_proj: V = weightless-norm(k_proj(x))
  bool moe = true;                    // enable_moe_block
  int64_t num_experts = 0;
  int64_t experts_per_token = 0;
  int64_t moe_intermediate_size = 0;
  double rms_norm_eps = 1e-6;
  double final_logit_softcap = 0.0;   // 0 = none
  int64_t max_position_embeddings = 0;
  Gemma4Rope sliding_rope{10000.0, 1.0};
  Gemma4Rope full_rope{1000000.0, 1.0};

  // Full layers share one geometry (checked at parse); 0 when the model has none.
  int64_t global_head_dim() const;
  int64_t global_kv_heads() const;
  // The tensor name prefix of the text model.
  std::string prefix() const { return multimodal ? "model.language_model." : "model."; }
};

// Parses config.json text; `source` names the file in error messages.
Result<Gemma4Config> parse_gemma4_config(const std::string& text, const std::string& source);

}  // namespace mx
