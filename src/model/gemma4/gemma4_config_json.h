// The pieces of Gemma-4's config.json parsing (gemma4_config.cc) that its MTP assistant's config
// (gemma4_assistant_config.cc) reads from its text_config the same way: the text model's sizes, the refused
// E-series features, the layer types, the per-layer head dims (and KV heads), and the two RoPE entries.
// `where` names the object in error messages.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "io/json_fields.h"
#include "model/gemma4/gemma4_config.h"

namespace mx {

// The sizes of a Gemma-4 text model (Gemma4Config or Gemma4AssistantConfig): vocab_size, hidden_size,
// intermediate_size (the dense MLP), num_hidden_layers, num_attention_heads, sliding_window, all required and
// >= 1, and rms_norm_eps (> 0; absent keeps the default).
template <typename Config>
Status parse_gemma4_text_sizes(const JsonFieldReader& r, Config* c) {
  MX_RETURN_IF_ERROR(r.required_int("vocab_size", &c->vocab_size, 1));
  MX_RETURN_IF_ERROR(r.required_int("hidden_size", &c->hidden_size, 1));
  MX_RETURN_IF_ERROR(r.required_int("intermediate_size", &c->intermediate_size, 1));
  MX_RETURN_IF_ERROR(r.required_int("num_hidden_layers", &c->num_layers, 1));
  MX_RETURN_IF_ERROR(r.required_int("num_attention_heads", &c->num_heads, 1));
  MX_RETURN_IF_ERROR(r.required_int("sliding_window", &c->sliding_window, 1));
  MX_RETURN_IF_ERROR(r.optional_double("rms_norm_eps", &c->rms_norm_eps));
  if (c->rms_norm_eps <= 0) return invalid_argument(r.source() + ": rms_norm_eps must be > 0");
  return Status::ok();
}

// Per-layer embeddings, the double-wide MLP, attention biases and activations other than
// gelu_pytorch_tanh are refused by name (num_kv_shared_layers is the caller's: the target must have
// none, the assistant must share every layer).
Status check_gemma4_refused_features(const nlohmann::json& text, const std::string& where);

// layer_types (sliding_attention / full_attention), one per layer. Absent: with `default_pattern`
// transformers' default (every sixth layer full, the last one forced full), else an error.
Status parse_gemma4_layer_types(const nlohmann::json& text, int64_t num_layers, bool default_pattern,
                                const std::string& where, std::vector<bool>* sliding);

// Head dim (and KV heads, where `kv_heads` is not null) of every layer: head_dim / num_key_value_heads on
// sliding layers, the released global_head_dim / num_global_key_value_heads (default: the sliding values)
// on full ones, then transformers 5.x's per_layer_config overrides of any layer.
Status parse_gemma4_layer_geometry(const nlohmann::json& text, const std::vector<bool>& sliding,
                                   const std::string& where, std::vector<int64_t>* head_dim,
                                   std::vector<int64_t>* kv_heads);

// rope_parameters (required): its sliding_attention and full_attention entries; an absent entry keeps
// the caller's defaults.
Status parse_gemma4_rope_parameters(const nlohmann::json& text, const std::string& where, Gemma4Rope* sliding,
                                    Gemma4Rope* full);

}  // namespace mx
