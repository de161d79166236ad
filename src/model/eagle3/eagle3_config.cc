#include "model/eagle3/eagle3_config.h"

#include <filesystem>

#include <nlohmann/json.hpp>

#include "io/json_fields.h"
#include "io/mapped_file.h"

namespace mx {
namespace {

using nlohmann::json;

// Llama's RoPE: rope_theta (Llama's default 10000) and an optional YaRN rope_scaling. transformers' YaRN
// truncates the correction range unless the file says "truncate": false (gpt-oss does), and takes the
// original context from max_position_embeddings when rope_scaling does not name it.
Status parse_rope(const json& root, const std::string& source, int64_t max_positions, YarnRope* rope) {
  rope->theta = 10000.0;
  rope->truncate = true;
  rope->original_max_position = max_positions;
  JsonFieldReader top(root, source);
  MX_RETURN_IF_ERROR(top.optional_double("rope_theta", &rope->theta));
  auto it = root.find("rope_scaling");
  if (it == root.end() || it->is_null()) return Status::ok();
  const std::string where = source + " rope_scaling";
  if (!it->is_object()) return invalid_argument(where + " must be an object or null");
  std::string type = "default";
  for (const char* key : {"rope_type", "type"})
    if (auto t = it->find(key); t != it->end() && t->is_string()) type = t->get<std::string>();
  if (type == "default") return Status::ok();
  if (type != "yarn") return invalid_argument(where + ": rope_type '" + type + "' is not supported (default or yarn)");
  JsonFieldReader r(*it, where);
  MX_RETURN_IF_ERROR(r.optional_double("factor", &rope->factor));
  MX_RETURN_IF_ERROR(r.optional_int("original_max_position_embeddings", &rope->original_max_position, 1));
  MX_RETURN_IF_ERROR(r.optional_double("beta_fast", &rope->beta_fast));
  MX_RETURN_IF_ERROR(r.optional_double("beta_slow", &rope->beta_slow));
  MX_RETURN_IF_ERROR(r.optional_bool("truncate", &rope->truncate));
  MX_RETURN_IF_ERROR(r.optional_double("attention_factor", &rope->attention_factor));
  if (rope->factor < 1.0) return invalid_argument(where + ": factor must be >= 1");
  return Status::ok();
}

// A field that, when present, must hold `expected` (a variant of the layout this code does not run).
Status require_value(const json& root, const std::string& source, const char* key, const json& expected,
                     const std::string& why) {
  auto it = root.find(key);
  if (it == root.end() || it->is_null() || *it == expected) return Status::ok();
  return unimplemented(source + ": " + key + " = " + it->dump() + " is not supported (" + why + ")");
}

Status parse_aux_ids(const json& ids, const std::string& where, std::vector<int64_t>* out) {
  if (!ids.is_array() || ids.size() != 3)
    return invalid_argument(where + " must be an array of 3 layer ids (low, mid, high)");
  for (const json& id : ids) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0)
      return invalid_argument(where + " must hold layer ids >= 0");
    out->push_back(id.get<int64_t>());
  }
  return Status::ok();
}

}  // namespace

Result<Eagle3Config> parse_eagle3_config(const std::string& text, const std::string& source) {
  MX_ASSIGN_OR_RETURN(json root, parse_json_object(text, source));
  auto arch = root.find("architectures");
  bool known = false;
  if (arch != root.end() && arch->is_array())
    for (const json& a : *arch) known = known || a == "LlamaForCausalLMEagle3" || a == "Eagle3LlamaForCausalLM";
  if (!known)
    return invalid_argument(source + ": architectures must name LlamaForCausalLMEagle3 (an EAGLE-3 draft for a "
                                     "Llama-style layer); got " + (arch == root.end() ? std::string("nothing") : arch->dump()));

  Eagle3Config c;
  JsonFieldReader r(root, source);
  MX_RETURN_IF_ERROR(r.required_int("hidden_size", &c.hidden_size, 1));
  MX_RETURN_IF_ERROR(r.required_int("intermediate_size", &c.intermediate_size, 1));
  MX_RETURN_IF_ERROR(r.required_int("num_attention_heads", &c.num_heads, 1));
  c.num_kv_heads = c.num_heads;
  MX_RETURN_IF_ERROR(r.optional_int("num_key_value_heads", &c.num_kv_heads, 1));
  c.head_dim = c.hidden_size / c.num_heads;
  MX_RETURN_IF_ERROR(r.optional_int("head_dim", &c.head_dim, 2));
  MX_RETURN_IF_ERROR(r.required_int("vocab_size", &c.vocab_size, 1));
  c.lm_head_from_target = !root.contains("draft_vocab_size") || root["draft_vocab_size"].is_null();
  c.draft_vocab_size = c.vocab_size;
  if (!c.lm_head_from_target) MX_RETURN_IF_ERROR(r.required_int("draft_vocab_size", &c.draft_vocab_size, 1));
  c.target_hidden_size = c.hidden_size;
  MX_RETURN_IF_ERROR(r.optional_int("target_hidden_size", &c.target_hidden_size, 1));
  c.max_position_embeddings = 131072;
  MX_RETURN_IF_ERROR(r.optional_int("max_position_embeddings", &c.max_position_embeddings, 1));
  MX_RETURN_IF_ERROR(r.optional_double("rms_norm_eps", &c.rms_norm_eps));
  MX_RETURN_IF_ERROR(parse_rope(root, source, c.max_position_embeddings, &c.rope));

  int64_t layers = 1;
  MX_RETURN_IF_ERROR(r.optional_int("num_hidden_layers", &layers, 1));
  if (layers != 1)
    return unimplemented(source + ": num_hidden_layers = " + std::to_string(layers) +
                         " is not supported (an EAGLE-3 draft here is one decoder layer)");
  MX_RETURN_IF_ERROR(require_value(root, source, "hidden_act", "silu", "the draft's MLP is SwiGLU"));
  MX_RETURN_IF_ERROR(require_value(root, source, "tie_word_embeddings", false, "the draft has its own lm_head"));
  for (const char* key : {"attention_bias", "mlp_bias", "bias"})
    MX_RETURN_IF_ERROR(require_value(root, source, key, false, "the draft layer has no biases"));
  for (const char* key : {"norm_before_residual", "norm_before_fc"})
    MX_RETURN_IF_ERROR(require_value(root, source, key, false, "a variant of the EAGLE-3 layer not implemented"));

  if (auto it = root.find("eagle_config"); it != root.end() && !it->is_null()) {
    if (!it->is_object()) return invalid_argument(source + ": eagle_config must be an object");
    MX_RETURN_IF_ERROR(require_value(*it, source + " eagle_config", "use_aux_hidden_state", true,
                                     "EAGLE-3 fuses three target hidden states"));
    if (auto ids = it->find("eagle_aux_hidden_state_layer_ids"); ids != it->end() && !ids->is_null())
      MX_RETURN_IF_ERROR(parse_aux_ids(*ids, source + " eagle_config.eagle_aux_hidden_state_layer_ids", &c.aux_layer_ids));
  }
  if (auto ids = root.find("eagle_aux_hidden_state_layer_ids"); ids != root.end() && !ids->is_null()) {
    std::vector<int64_t> top;
    MX_RETURN_IF_ERROR(parse_aux_ids(*ids, source + " eagle_aux_hidden_state_layer_ids", &top));
    if (!c.aux_layer_ids.empty() && top != c.aux_layer_ids)
      return invalid_argument(source + ": eagle_aux_hidden_state_layer_ids and eagle_config's disagree");
    c.aux_layer_ids = top;
  }

  if (c.num_heads % c.num_kv_heads != 0)
    return invalid_argument(source + ": num_attention_heads (" + std::to_string(c.num_heads) +
                            ") must be a multiple of num_key_value_heads (" + std::to_string(c.num_kv_heads) + ")");
  if (c.head_dim % 2 != 0) return invalid_argument(source + ": head_dim must be even for RoPE");
  if (c.draft_vocab_size > c.vocab_size)
    return invalid_argument(source + ": draft_vocab_size (" + std::to_string(c.draft_vocab_size) +
                            ") exceeds vocab_size (" + std::to_string(c.vocab_size) + ")");
  if (c.rms_norm_eps <= 0) return invalid_argument(source + ": rms_norm_eps must be > 0");
  return c;
}

Result<Eagle3Config> load_eagle3_config(const std::string& model_dir) {
  const std::string path = (std::filesystem::path(model_dir) / "config.json").string();
  MX_ASSIGN_OR_RETURN(std::string text, read_text_file(path));
  return parse_eagle3_config(text, path);
}

std::string eagle3_config_to_json(const Eagle3Config& c) {
  json root = {
      {"architectures", {"LlamaForCausalLMEagle3"}},
      {"attention_bias", false},
      {"head_dim", c.head_dim},
      {"hidden_act", "silu"},
      {"hidden_size", c.hidden_size},
      {"intermediate_size", c.intermediate_size},
      {"max_position_embeddings", c.max_position_embeddings},
      {"model_type", "llama"},
      {"num_attention_heads", c.num_heads},
      {"num_hidden_layers", 1},
      {"num_key_value_heads", c.num_kv_heads},
      {"rms_norm_eps", c.rms_norm_eps},
      {"rope_theta", c.rope.theta},
      {"target_hidden_size", c.target_hidden_size},
      {"tie_word_embeddings", false},
      {"torch_dtype", "bfloat16"},
      {"vocab_size", c.vocab_size},
  };
  if (!c.lm_head_from_target) root["draft_vocab_size"] = c.draft_vocab_size;
  if (c.rope.factor > 1.0)
    root["rope_scaling"] = {{"beta_fast", c.rope.beta_fast},
                            {"beta_slow", c.rope.beta_slow},
                            {"factor", c.rope.factor},
                            {"original_max_position_embeddings", c.rope.original_max_position},
                            {"rope_type", "yarn"},
                            {"truncate", c.rope.truncate}};
  else
    root["rope_scaling"] = nullptr;
  if (!c.aux_layer_ids.empty()) root["eagle_config"] = {{"eagle_aux_hidden_state_layer_ids", c.aux_layer_ids}};
  return root.dump(2) + "\n";
}

Result<std::array<int64_t, 3>> eagle3_aux_hidden_indices(const Eagle3Config& c, int64_t target_layers) {
  std::array<int64_t, 3> index{};
  if (c.aux_layer_ids.empty()) {
    index = {2, target_layers / 2, target_layers - 3};
    if (target_layers < 6)
      return invalid_argument("the EAGLE-3 draft names no eagle_aux_hidden_state_layer_ids and its target has " +
                              std::to_string(target_layers) + " layers: the default layers 2, L/2, L-3 need at least 6");
    return index;
  }
  for (size_t i = 0; i < 3; ++i) {
    const int64_t id = c.aux_layer_ids[i];
    if (id > target_layers - 2)
      return invalid_argument("eagle_aux_hidden_state_layer_ids names layer " + std::to_string(id) +
                              " whose output a target of " + std::to_string(target_layers) +
                              " layers does not feed to a later layer (ids are at most " +
                              std::to_string(target_layers - 2) + ")");
    index[i] = id + 1;
  }
  return index;
}

}  // namespace mx
