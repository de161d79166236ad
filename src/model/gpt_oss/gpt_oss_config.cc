#include "model/gpt_oss/gpt_oss_config.h"

#include <cmath>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "io/json_fields.h"
#include "io/mapped_file.h"

namespace mx {
namespace {

using nlohmann::json;

Status parse_rope(const json& root, const std::string& source, YarnRope* rope) {
  const json* params = nullptr;
  std::string where = source;
  if (auto it = root.find("rope_parameters"); it != root.end() && !it->is_null()) {
    params = &*it;
    where = source + " rope_parameters";
  } else if (auto it2 = root.find("rope_scaling"); it2 != root.end() && !it2->is_null()) {
    params = &*it2;
    where = source + " rope_scaling";
  }
  JsonFieldReader top(root, source);
  MX_RETURN_IF_ERROR(top.optional_double("rope_theta", &rope->theta));
  if (!params) return Status::ok();  // plain RoPE with rope_theta
  if (!params->is_object()) return invalid_argument(where + " must be an object");
  JsonFieldReader r(*params, where);
  MX_RETURN_IF_ERROR(r.optional_double("rope_theta", &rope->theta));
  std::string type = "default";
  for (const char* key : {"rope_type", "type"}) {
    if (auto it = params->find(key); it != params->end() && it->is_string()) type = it->get<std::string>();
  }
  if (type == "default") return Status::ok();
  if (type != "yarn") return invalid_argument(where + ": rope_type '" + type + "' is not supported (gpt-oss uses yarn)");
  MX_RETURN_IF_ERROR(r.optional_double("factor", &rope->factor));
  MX_RETURN_IF_ERROR(r.optional_int("original_max_position_embeddings", &rope->original_max_position, 1));
  MX_RETURN_IF_ERROR(r.optional_double("beta_fast", &rope->beta_fast));
  MX_RETURN_IF_ERROR(r.optional_double("beta_slow", &rope->beta_slow));
  MX_RETURN_IF_ERROR(r.optional_bool("truncate", &rope->truncate));
  MX_RETURN_IF_ERROR(r.optional_double("attention_factor", &rope->attention_factor));
  if (rope->factor < 1.0) return invalid_argument(where + ": factor must be >= 1");
  return Status::ok();
}

}  // namespace

Result<GptOssConfig> parse_gpt_oss_config(const std::string& text, const std::string& source) {
  MX_ASSIGN_OR_RETURN(json root, parse_json_object(text, source));
  GptOssConfig c;
  JsonFieldReader r(root, source);
  MX_RETURN_IF_ERROR(r.required_int("vocab_size", &c.vocab_size, 1));
  MX_RETURN_IF_ERROR(r.required_int("hidden_size", &c.hidden_size, 1));
  MX_RETURN_IF_ERROR(r.required_int("intermediate_size", &c.intermediate_size, 1));
  MX_RETURN_IF_ERROR(r.required_int("num_hidden_layers", &c.num_layers, 1));
  MX_RETURN_IF_ERROR(r.required_int("num_attention_heads", &c.num_heads, 1));
  MX_RETURN_IF_ERROR(r.required_int("num_key_value_heads", &c.num_kv_heads, 1));
  // The released configs spell the expert counts both ways; either is accepted.
  if (root.contains("num_local_experts")) MX_RETURN_IF_ERROR(r.required_int("num_local_experts", &c.num_experts, 1));
  else MX_RETURN_IF_ERROR(r.required_int("num_experts", &c.num_experts, 1));
  if (root.contains("num_experts_per_tok")) MX_RETURN_IF_ERROR(r.required_int("num_experts_per_tok", &c.experts_per_token, 1));
  else MX_RETURN_IF_ERROR(r.required_int("experts_per_token", &c.experts_per_token, 1));
  c.head_dim = c.hidden_size / c.num_heads;
  MX_RETURN_IF_ERROR(r.optional_int("head_dim", &c.head_dim, 2));
  MX_RETURN_IF_ERROR(r.required_int("sliding_window", &c.sliding_window, 1));
  MX_RETURN_IF_ERROR(r.required_int("max_position_embeddings", &c.max_position_embeddings, 1));
  MX_RETURN_IF_ERROR(r.optional_double("rms_norm_eps", &c.rms_norm_eps));
  MX_RETURN_IF_ERROR(r.optional_double("swiglu_limit", &c.swiglu_limit));
  MX_RETURN_IF_ERROR(parse_rope(root, source, &c.rope));

  if (c.num_heads % c.num_kv_heads != 0)
    return invalid_argument(source + ": num_attention_heads (" + std::to_string(c.num_heads) +
                            ") must be a multiple of num_key_value_heads (" + std::to_string(c.num_kv_heads) + ")");
  if (c.head_dim % 2 != 0) return invalid_argument(source + ": head_dim must be even for RoPE");
  if (c.experts_per_token > c.num_experts)
    return invalid_argument(source + ": num_experts_per_tok exceeds num_local_experts");
  if (c.hidden_size % 32 != 0 || c.intermediate_size % 32 != 0)
    return invalid_argument(source + ": hidden_size and intermediate_size must be multiples of 32 (MXFP4 blocks)");
  if (c.rms_norm_eps <= 0) return invalid_argument(source + ": rms_norm_eps must be > 0");
  if (c.swiglu_limit <= 0) return invalid_argument(source + ": swiglu_limit must be > 0");

  // layer_types when given; otherwise the gpt-oss pattern: even layers slide, odd layers attend fully.
  c.layer_is_sliding.resize(static_cast<size_t>(c.num_layers));
  if (auto it = root.find("layer_types"); it != root.end() && !it->is_null()) {
    if (!it->is_array() || it->size() != static_cast<size_t>(c.num_layers))
      return invalid_argument(source + ": layer_types must be an array of num_hidden_layers entries");
    for (size_t i = 0; i < it->size(); ++i) {
      const json& t = (*it)[i];
      if (t == "sliding_attention") c.layer_is_sliding[i] = true;
      else if (t == "full_attention") c.layer_is_sliding[i] = false;
      else return invalid_argument(source + ": layer_types[" + std::to_string(i) + "] must be sliding_attention or full_attention");
    }
  } else {
    for (int64_t i = 0; i < c.num_layers; ++i) c.layer_is_sliding[static_cast<size_t>(i)] = (i % 2 == 0);
  }

  c.experts_mxfp4 = false;
  if (auto it = root.find("quantization_config"); it != root.end() && it->is_object()) {
    auto method = it->find("quant_method");
    if (method != it->end() && *method == "mxfp4") c.experts_mxfp4 = true;
    else return unimplemented(source + ": quantization_config.quant_method must be mxfp4");
  }
  if (!c.experts_mxfp4) return unimplemented(source + ": only MXFP4 expert checkpoints are supported (quantization_config)");
  return c;
}

Result<GptOssConfig> load_gpt_oss_config(const std::string& model_dir) {
  const std::string path = (std::filesystem::path(model_dir) / "config.json").string();
  MX_ASSIGN_OR_RETURN(std::string text, read_text_file(path));
  return parse_gpt_oss_config(text, path);
}

std::string gpt_oss_config_to_json(const GptOssConfig& c) {
  json layer_types = json::array();
  for (bool sliding : c.layer_is_sliding) layer_types.push_back(sliding ? "sliding_attention" : "full_attention");
  json rope_scaling = {{"beta_fast", c.rope.beta_fast},
                       {"beta_slow", c.rope.beta_slow},
                       {"factor", c.rope.factor},
                       {"original_max_position_embeddings", c.rope.original_max_position},
                       {"rope_type", "yarn"},
                       {"truncate", c.rope.truncate}};
  json root = {
      {"architectures", {"GptOssForCausalLM"}},
      {"attention_bias", true},
      {"attention_dropout", 0.0},
      {"eos_token_id", 200002},
      {"experts_per_token", c.experts_per_token},
      {"head_dim", c.head_dim},
      {"hidden_act", "silu"},
      {"hidden_size", c.hidden_size},
      {"initial_context_length", c.rope.original_max_position},
      {"intermediate_size", c.intermediate_size},
      {"layer_types", layer_types},
      {"max_position_embeddings", c.max_position_embeddings},
      {"model_type", "gpt_oss"},
      {"num_attention_heads", c.num_heads},
      {"num_experts_per_tok", c.experts_per_token},
      {"num_hidden_layers", c.num_layers},
      {"num_key_value_heads", c.num_kv_heads},
      {"num_local_experts", c.num_experts},
      {"pad_token_id", 199999},
      {"quantization_config",
       {{"modules_to_not_convert",
         {"model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"}},
        {"quant_method", "mxfp4"}}},
      {"rms_norm_eps", c.rms_norm_eps},
      {"rope_scaling", rope_scaling},
      {"rope_theta", c.rope.theta},
      {"sliding_window", c.sliding_window},
      {"swiglu_limit", c.swiglu_limit},
      {"tie_word_embeddings", false},
      {"vocab_size", c.vocab_size},
  };
  return root.dump(2) + "\n";
}

}  // namespace mx
