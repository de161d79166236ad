// Gemma-4's MTP drafter ("assistant", Gemma4AssistantForCausalLM, model_type gemma4_assistant;
// ref-gemma4-mtp-spec.md 2.1): config.json holds `backbone_hidden_size` (the target's hidden size) and a
// `text_config` of a small Gemma-4 text model whose every layer is KV-shared (Q-only attention over the
// target's cache), with a dense GeGLU MLP and no experts. The E2B/E4B assistants' centroid-masked head
// (use_ordered_embeddings) is refused by name: the 26B-A4B and 31B assistants use the dense tied lm_head.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/gemma4/gemma4_config.h"

namespace mx {

struct Gemma4AssistantConfig {
  int64_t backbone_hidden_size = 0;  // Hb: the target's hidden size (its embeddings and final hidden state)
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;           // h
  int64_t intermediate_size = 0;     // the dense MLP
  int64_t num_layers = 0;
  int64_t num_heads = 0;             // query heads
  int64_t sliding_window = 0;        // keys a sliding layer's query sees
  std::vector<bool> layer_is_sliding;
  std::vector<int64_t> layer_head_dim;
  double rms_norm_eps = 1e-6;
  Gemma4Rope sliding_rope{10000.0, 1.0};
  Gemma4Rope full_rope{1000000.0, 1.0};
};

// Parses an assistant's config.json text; `source` names the file in error messages.
Result<Gemma4AssistantConfig> parse_gemma4_assistant_config(const std::string& text, const std::string& source);

// config.json for `config` (the released spelling: global_head_dim), as make-model and the tests write it.
std::string gemma4_assistant_config_to_json(const Gemma4AssistantConfig& config);

// Checks that the assistant can draft for `target`: the same vocabulary, backbone_hidden_size equal to the
// target's hidden size, each layer's head dim equal to the head dim of the target layer whose KV it reads
// (the target's last layer of its type), query heads a multiple of that layer's KV heads, a window no wider
// than the target's.
Status check_assistant_fits_target(const Gemma4AssistantConfig& assistant, const Gemma4Config& target,
                                   const std::string& source);

}  // namespace mx
