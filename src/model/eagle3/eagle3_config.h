// EAGLE-3 draft config.json, as the published gpt-oss drafts spell it (LlamaForCausalLMEagle3: e.g.
// lmsys/EAGLE3-gpt-oss-120b-bf16, nvidia/gpt-oss-120b-Eagle3; SGLang's and vLLM's loaders read the same
// files). One Llama-style decoder layer; everything this code does not run (more layers, biases, tied
// embeddings, the norm-before-residual / norm-before-fc variants, other activations or RoPE types) is refused
// with the field's name rather than run wrong.
//
// Which target hidden states feed the draft (the low / mid / high features fc fuses): the residual stream
// entering target layer i, for i in
//   - eagle_config.eagle_aux_hidden_state_layer_ids (or a top-level eagle_aux_hidden_state_layer_ids) + 1:
//     SGLang reads an id as "the output of layer id" (set_eagle3_layers_to_capture adds 1), as the EAGLE and
//     ModelOpt trainers that wrote these configs do (SpecForge's gpt-oss-20b config names [1, 11, 21]);
//   - else {2, L / 2, L - 3} for a target of L layers (SGLang's and vLLM's default; the EAGLE trainer's).
// vLLM reads explicit ids without the + 1 (its index k is hidden_states[k]); we follow SGLang, whose
// reading matches the trainers'. The indices are those of HiddenObserver (model.h): k = the residual after
// layer k - 1.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/rope.h"

namespace mx {

struct Eagle3Config {
  int64_t hidden_size = 0;         // H: the draft layer's width
  int64_t intermediate_size = 0;   // I: its SwiGLU MLP
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t vocab_size = 0;          // the target's vocabulary (embedding rows, the range of d2t's map)
  int64_t draft_vocab_size = 0;    // Vd: lm_head rows (the tokens the draft can propose)
  // draft_vocab_size absent from config.json: SGLang then takes the target's lm_head (the draft proposes over
  // the whole vocabulary); the checkpoint then has no lm_head.weight.
  bool lm_head_from_target = false;
  int64_t target_hidden_size = 0;  // width of each captured target hidden state (fc reads 3 of them)
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-5;
  YarnRope rope;
  std::vector<int64_t> aux_layer_ids;  // as written (output-of-layer ids); empty = the default layers

  int64_t q_dim() const { return num_heads * head_dim; }
  int64_t kv_dim() const { return num_kv_heads * head_dim; }
};

// Parses config.json text; `source` names the file in error messages.
Result<Eagle3Config> parse_eagle3_config(const std::string& text, const std::string& source);
Result<Eagle3Config> load_eagle3_config(const std::string& model_dir);
// config.json text in the published drafts' spelling.
std::string eagle3_config_to_json(const Eagle3Config& config);

// The HiddenObserver indices (low, mid, high) of a target with `target_layers` layers whose residual streams
// the draft reads, by the rule in the header comment; an error names the ids that fall outside the target.
Result<std::array<int64_t, 3>> eagle3_aux_hidden_indices(const Eagle3Config& config, int64_t target_layers);

}  // namespace mx
