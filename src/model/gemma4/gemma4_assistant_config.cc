#include "model/gemma4/gemma4_assistant_config.h"

#include <nlohmann/json.hpp>

#include "io/json_fields.h"
#include "model/gemma4/gemma4_config_json.h"

namespace mx {

using nlohmann::json;

Result<Gemma4AssistantConfig> parse_gemma4_assistant_config(const std::string& text_json, const std::string& source) {
  MX_ASSIGN_OR_RETURN(json root, parse_json_object(text_json, source));
  if (auto it = root.find("model_type"); it == root.end() || *it != "gemma4_assistant")
    return invalid_argument(source + ": model_type must be 'gemma4_assistant' (a Gemma4AssistantForCausalLM)");
  Gemma4AssistantConfig c;
  JsonFieldReader top(root, source);
  MX_RETURN_IF_ERROR(top.required_int("backbone_hidden_size", &c.backbone_hidden_size, 1));
  bool ordered = false;
  MX_RETURN_IF_ERROR(top.optional_bool("use_ordered_embeddings", &ordered));
  if (ordered)
    return unimplemented(source + ": use_ordered_embeddings (the E2B/E4B assistants' centroid-masked lm_head) is not supported");
  auto it = root.find("text_config");
  if (it == root.end() || !it->is_object()) return invalid_argument(source + ": missing field 'text_config'");
  const json& text = *it;
  const std::string where = source + " text_config";
  JsonFieldReader r(text, where);
  MX_RETURN_IF_ERROR(parse_gemma4_text_sizes(r, &c));
  // Every layer reads the target's KV: the assistant has no K/V projections at all.
  int64_t shared = 0;
  MX_RETURN_IF_ERROR(r.optional_int("num_kv_shared_layers", &shared, 0));
  if (shared != c.num_layers)
    return invalid_argument(where + ": num_kv_shared_layers (" + std::to_string(shared) +
                            ") must equal num_hidden_layers: every assistant layer reads the target's KV");
  bool moe = false;
  MX_RETURN_IF_ERROR(r.optional_bool("enable_moe_block", &moe));
  if (moe) return unimplemented(where + ": enable_moe_block (experts in an assistant) is not supported");
  MX_RETURN_IF_ERROR(check_gemma4_refused_features(text, where));
  // The layout fields as the target's parser reads them, less the KV heads (no K/V projections here) and
  // without transformers' default layer pattern (an assistant lists its layer types).
  MX_RETURN_IF_ERROR(parse_gemma4_layer_types(text, c.num_layers, /*default_pattern=*/false, where, &c.layer_is_sliding));
  MX_RETURN_IF_ERROR(parse_gemma4_layer_geometry(text, c.layer_is_sliding, where, &c.layer_head_dim, nullptr));
  for (size_t l = 0; l < c.layer_head_dim.size(); ++l)
    if (c.layer_head_dim[l] % 2 != 0)
      return invalid_argument(where + ": layer " + std::to_string(l) + ": head_dim must be even for RoPE");
  MX_RETURN_IF_ERROR(parse_gemma4_rope_parameters(text, where, &c.sliding_rope, &c.full_rope));
  return c;
}

std::string gemma4_assistant_config_to_json(const Gemma4AssistantConfig& c) {
  json layer_types = json::array();
  int64_t head_dim = 0, global_head_dim = 0;
  for (size_t l = 0; l < c.layer_is_sliding.size(); ++l) {
    layer_types.push_back(c.layer_is_sliding[l] ? "sliding_attention" : "full_attention");
    (c.layer_is_sliding[l] ? head_dim : global_head_dim) = c.layer_head_dim[l];
  }
  if (head_dim == 0) head_dim = global_head_dim;
  if (global_head_dim == 0) global_head_dim = head_dim;
  auto rope = [](const Gemma4Rope& r, bool proportional) {
    json j = {{"rope_theta", r.theta}, {"rope_type", proportional ? "proportional" : "default"}};
    if (proportional) j["partial_rotary_factor"] = r.partial_rotary_factor;
    return j;
  };
  const json text = {
      {"model_type", "gemma4_text"},
      {"vocab_size", c.vocab_size},
      {"hidden_size", c.hidden_size},
      {"intermediate_size", c.intermediate_size},
      {"num_hidden_layers", c.num_layers},
      {"num_attention_heads", c.num_heads},
      {"num_key_value_heads", 1},
      {"head_dim", head_dim},
      {"global_head_dim", global_head_dim},
      {"sliding_window", c.sliding_window},
      {"layer_types", layer_types},
      {"num_kv_shared_layers", c.num_layers},
      {"enable_moe_block", false},
      {"hidden_size_per_layer_input", 0},
      {"hidden_activation", "gelu_pytorch_tanh"},
      {"rms_norm_eps", c.rms_norm_eps},
      {"tie_word_embeddings", true},
      {"rope_parameters",
       {{"sliding_attention", rope(c.sliding_rope, false)}, {"full_attention", rope(c.full_rope, true)}}},
  };
  const json root = {
      {"architectures", {"Gemma4AssistantForCausalLM"}},
      {"model_type", "gemma4_assistant"},
      {"backbone_hidden_size", c.backbone_hidden_size},
      {"use_ordered_embeddings", false},
      {"tie_word_embeddings", true},
      {"text_config", text},
  };
  return root.dump(2) + "\n";
}

Status check_assistant_fits_target(const Gemma4AssistantConfig& a, const Gemma4Config& t, const std::string& source) {
  const std::string what = source + ": this assistant cannot draft for the target: ";
  if (a.vocab_size != t.vocab_size)
    return invalid_argument(what + "vocab_size " + std::to_string(a.vocab_size) + " != the target's " + std::to_string(t.vocab_size));
  if (a.backbone_hidden_size != t.hidden_size)
    return invalid_argument(what + "backbone_hidden_size " + std::to_string(a.backbone_hidden_size) +
                            " != the target's hidden_size " + std::to_string(t.hidden_size));
  for (size_t l = 0; l < a.layer_is_sliding.size(); ++l) {
    const bool sliding = a.layer_is_sliding[l];
    int64_t source_layer = -1;
    for (size_t m = 0; m < t.layer_is_sliding.size(); ++m)
      if (t.layer_is_sliding[m] == sliding) source_layer = static_cast<int64_t>(m);
    const std::string layer = "layer " + std::to_string(l) + " (" + (sliding ? "sliding" : "full") + ")";
    if (source_layer < 0) return invalid_argument(what + layer + ": the target has no layer of that type");
    const auto s = static_cast<size_t>(source_layer);
    if (a.layer_head_dim[l] != t.layer_head_dim[s])
      return invalid_argument(what + layer + ": head_dim " + std::to_string(a.layer_head_dim[l]) + " != " +
                              std::to_string(t.layer_head_dim[s]) + " of target layer " + std::to_string(source_layer));
    if (a.num_heads % t.layer_kv_heads[s] != 0)
      return invalid_argument(what + layer + ": num_attention_heads " + std::to_string(a.num_heads) +
                              " is not a multiple of target layer " + std::to_string(source_layer) + "'s " +
                              std::to_string(t.layer_kv_heads[s]) + " KV heads");
  }
  if (a.sliding_window > t.sliding_window)
    return invalid_argument(what + "sliding_window " + std::to_string(a.sliding_window) + " is wider than the target's " +
                            std::to_string(t.sliding_window) + " (the target's window pages hold no more)");
  return Status::ok();
}

}  // namespace mx
