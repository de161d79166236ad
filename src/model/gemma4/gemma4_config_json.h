// The pieces of Gemma-4's config.json parsing (gemma4_config.cc) that its MTP assistant's config
// (gemma4_assistant_config.cc) reads from its text_config the same way: the refused E-series features, the
// layer types, the per-layer head dims (and KV heads), and the two RoPE entries. `where` names the object
// in error messages.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "model/gemma4/gemma4_config.h"

namespace mx {

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
