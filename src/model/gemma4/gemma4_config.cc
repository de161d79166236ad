#include "model/gemma4/gemma4_config.h"

#include <stdexcept>

#include <nlohmann/json.hpp>

#include "io/json_fields.h"
#include "model/gemma4/gemma4_config_json.h"

namespace mx {
namespace {

using nlohmann::json;

Status parse_rope_entry(const json& params, const char* layer_type, const std::string& where, Gemma4Rope* rope) {
  auto it = params.find(layer_type);
  if (it == params.end() || it->is_null()) return Status::ok();  // the defaults
  const std::string here = where + "." + layer_type;
  if (!it->is_object()) return invalid_argument(here + " must be an object");
  JsonFieldReader r(*it, here);
  MX_RETURN_IF_ERROR(r.optional_double("rope_theta", &rope->theta));
  std::string type = "default";
  if (auto t = it->find("rope_type"); t != it->end() && t->is_string()) type = t->get<std::string>();
  if (type == "default") {
    rope->partial_rotary_factor = 1.0;
  } else if (type == "proportional") {
    MX_RETURN_IF_ERROR(r.optional_double("partial_rotary_factor", &rope->partial_rotary_factor));
  } else {
    return unimplemented(here + ": rope_type '" + type + "' is not supported (default, proportional)");
  }
  if (rope->theta <= 0) return invalid_argument(here + ": rope_theta must be > 0");
  if (rope->partial_rotary_factor <= 0 || rope->partial_rotary_factor > 1)
    return invalid_argument(here + ": partial_rotary_factor must be in (0, 1]");
  return Status::ok();
}

}  // namespace

Status check_gemma4_refused_features(const json& text, const std::string& where) {
  JsonFieldReader r(text, where);
  int64_t per_layer_input = 0;
  MX_RETURN_IF_ERROR(r.optional_int("hidden_size_per_layer_input", &per_layer_input, 0));
  if (per_layer_input != 0)
    return unimplemented(where + ": hidden_size_per_layer_input != 0 (per-layer embeddings, E-series Gemma-4) is not supported");
  bool double_wide = false;
  MX_RETURN_IF_ERROR(r.optional_bool("use_double_wide_mlp", &double_wide));
  if (double_wide) return unimplemented(where + ": use_double_wide_mlp is not supported");
  bool bias = false;
  MX_RETURN_IF_ERROR(r.optional_bool("attention_bias", &bias));
  if (bias) return unimplemented(where + ": attention_bias is not supported (Gemma-4 has none)");
  if (auto it = text.find("hidden_activation"); it != text.end() && !it->is_null() && *it != "gelu_pytorch_tanh")
    return unimplemented(where + ": hidden_activation " + it->dump() + " is not supported (gelu_pytorch_tanh)");
  return Status::ok();
}

Status parse_gemma4_layer_types(const json& text, int64_t num_layers, bool default_pattern, const std::string& where,
                                std::vector<bool>* sliding) {
  sliding->assign(static_cast<size_t>(num_layers), true);
  auto it = text.find("layer_types");
  if ((it == text.end() || it->is_null()) && default_pattern) {
    for (int64_t i = 0; i < num_layers; ++i) (*sliding)[static_cast<size_t>(i)] = (i + 1) % 6 != 0;
    sliding->back() = false;
    return Status::ok();
  }
  if (it == text.end() || !it->is_array() || it->size() != static_cast<size_t>(num_layers))
    return invalid_argument(where + ": layer_types must be an array of num_hidden_layers entries");
  for (size_t i = 0; i < it->size(); ++i) {
    const json& t = (*it)[i];
    if (t == "sliding_attention") (*sliding)[i] = true;
    else if (t == "full_attention") (*sliding)[i] = false;
    else return invalid_argument(where + ": layer_types[" + std::to_string(i) + "] must be sliding_attention or full_attention");
  }
  return Status::ok();
}

Status parse_gemma4_layer_geometry(const json& text, const std::vector<bool>& sliding, const std::string& where,
                                   std::vector<int64_t>* head_dims, std::vector<int64_t>* kv_heads) {
  JsonFieldReader r(text, where);
  int64_t head_dim = 0, kv = 0;
  MX_RETURN_IF_ERROR(r.required_int("head_dim", &head_dim, 2));
  if (kv_heads) MX_RETURN_IF_ERROR(r.required_int("num_key_value_heads", &kv, 1));
  int64_t global_head_dim = head_dim, global_kv = kv;
  MX_RETURN_IF_ERROR(r.optional_int("global_head_dim", &global_head_dim, 2));
  if (kv_heads) MX_RETURN_IF_ERROR(r.optional_int("num_global_key_value_heads", &global_kv, 1));
  const size_t L = sliding.size();
  head_dims->assign(L, head_dim);
  if (kv_heads) kv_heads->assign(L, kv);
  for (size_t l = 0; l < L; ++l)
    if (!sliding[l]) {
      (*head_dims)[l] = global_head_dim;
      if (kv_heads) (*kv_heads)[l] = global_kv;
    }
  auto it = text.find("per_layer_config");
  if (it == text.end() || it->is_null()) return Status::ok();
  if (!it->is_object()) return invalid_argument(where + ": per_layer_config must be an object");
  for (const auto& [key, entry] : it->items()) {
    const std::string here = where + " per_layer_config." + key;
    size_t layer = 0;
    try {
      size_t used = 0;
      layer = std::stoul(key, &used);
      if (used != key.size()) throw std::invalid_argument(key);
    } catch (const std::exception&) {
      return invalid_argument(here + ": the key must be a layer index");
    }
    if (layer >= L) return invalid_argument(here + ": layer index out of range");
    if (!entry.is_object()) return invalid_argument(here + " must be an object");
    JsonFieldReader er(entry, here);
    MX_RETURN_IF_ERROR(er.optional_int("head_dim", &(*head_dims)[layer], 2));
    if (kv_heads) MX_RETURN_IF_ERROR(er.optional_int("num_key_value_heads", &(*kv_heads)[layer], 1));
  }
  return Status::ok();
}

Status parse_gemma4_rope_parameters(const json& text, const std::string& where, Gemma4Rope* sliding, Gemma4Rope* full) {
  auto it = text.find("rope_parameters");
  if (it == text.end() || it->is_null()) return invalid_argument(where + ": missing field 'rope_parameters'");
  if (!it->is_object()) return invalid_argument(where + ": rope_parameters must be an object");
  MX_RETURN_IF_ERROR(parse_rope_entry(*it, "sliding_attention", where + " rope_parameters", sliding));
  return parse_rope_entry(*it, "full_attention", where + " rope_parameters", full);
}

int64_t Gemma4Config::global_head_dim() const {
  for (size_t l = 0; l < layer_is_sliding.size(); ++l)
    if (!layer_is_sliding[l]) return layer_head_dim[l];
  return 0;
}

int64_t Gemma4Config::global_kv_heads() const {
  for (size_t l = 0; l < layer_is_sliding.size(); ++l)
    if (!layer_is_sliding[l]) return layer_kv_heads[l];
  return 0;
}

Result<Gemma4Config> parse_gemma4_config(const std::string& text_json, const std::string& source) {
  MX_ASSIGN_OR_RETURN(json root, parse_json_object(text_json, source));
  Gemma4Config c;
  std::string type;
  if (auto it = root.find("model_type"); it != root.end() && it->is_string()) type = it->get<std::string>();
  if (type.empty()) {  // the registry accepted it by architectures
    c.multimodal = root.contains("text_config");
  } else if (type == "gemma4") {
    c.multimodal = true;
  } else if (type == "gemma4_text") {
    c.multimodal = false;
  } else {
    return invalid_argument(source + ": model_type '" + type + "' is not a Gemma-4 model (gemma4, gemma4_text)");
  }
  const json* text = &root;
  std::string where = source;
  if (c.multimodal) {
    auto it = root.find("text_config");
    if (it == root.end() || !it->is_object()) return invalid_argument(source + ": missing field 'text_config'");
    text = &*it;
    where = source + " text_config";
  }
  JsonFieldReader r(*text, where);
  MX_RETURN_IF_ERROR(check_gemma4_refused_features(*text, where));
  int64_t kv_shared = 0;
  MX_RETURN_IF_ERROR(r.optional_int("num_kv_shared_layers", &kv_shared, 0));
  if (kv_shared != 0)
    return unimplemented(where + ": num_kv_shared_layers != 0 (KV-shared layers, E-series Gemma-4) is not supported");
  MX_RETURN_IF_ERROR(parse_gemma4_text_sizes(r, &c));
  MX_RETURN_IF_ERROR(r.required_int("max_position_embeddings", &c.max_position_embeddings, 1));
  MX_RETURN_IF_ERROR(r.optional_double("final_logit_softcapping", &c.final_logit_softcap));
  MX_RETURN_IF_ERROR(r.optional_bool("attention_k_eq_v", &c.k_eq_v));
  MX_RETURN_IF_ERROR(r.optional_bool("enable_moe_block", &c.moe));
  if (c.moe) {
    MX_RETURN_IF_ERROR(r.required_int("num_experts", &c.num_experts, 1));
    MX_RETURN_IF_ERROR(r.required_int("top_k_experts", &c.experts_per_token, 1));
    MX_RETURN_IF_ERROR(r.required_int("moe_intermediate_size", &c.moe_intermediate_size, 1));
    if (c.experts_per_token > c.num_experts) return invalid_argument(where + ": top_k_experts exceeds num_experts");
  }
  bool tied = true;
  MX_RETURN_IF_ERROR(r.optional_bool("tie_word_embeddings", &tied));
  if (!tied) return unimplemented(where + ": tie_word_embeddings false is not supported (Gemma-4 ties lm_head)");
  if (c.final_logit_softcap < 0) return invalid_argument(where + ": final_logit_softcapping must be >= 0");

  // layer_types when given; otherwise transformers' default pattern.
  MX_RETURN_IF_ERROR(parse_gemma4_layer_types(*text, c.num_layers, /*default_pattern=*/true, where, &c.layer_is_sliding));
  MX_RETURN_IF_ERROR(parse_gemma4_layer_geometry(*text, c.layer_is_sliding, where, &c.layer_head_dim, &c.layer_kv_heads));
  c.full_rope = {1000000.0, 1.0};
  MX_RETURN_IF_ERROR(parse_gemma4_rope_parameters(*text, where, &c.sliding_rope, &c.full_rope));

  // Every layer's geometry must be usable, and the full layers must agree with each other (one KV group).
  for (size_t l = 0; l < c.layer_is_sliding.size(); ++l) {
    const std::string layer = where + ": layer " + std::to_string(l);
    if (c.num_heads % c.layer_kv_heads[l] != 0)
      return invalid_argument(layer + ": num_attention_heads (" + std::to_string(c.num_heads) +
                              ") must be a multiple of its KV heads (" + std::to_string(c.layer_kv_heads[l]) + ")");
    if (c.layer_head_dim[l] % 2 != 0) return invalid_argument(layer + ": head_dim must be even for RoPE");
    const bool sliding = c.layer_is_sliding[l];
    for (size_t m = 0; m < l; ++m)
      if (c.layer_is_sliding[m] == sliding &&
          (c.layer_head_dim[m] != c.layer_head_dim[l] || c.layer_kv_heads[m] != c.layer_kv_heads[l]))
        return unimplemented(layer + ": layers of one attention type with different head dims or KV heads are not supported");
  }
  return c;
}

}  // namespace mx
