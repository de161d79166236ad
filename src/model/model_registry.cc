#include "model/model_registry.h"

#include <filesystem>
#include <functional>
#include <vector>

#include "io/json_fields.h"
#include "io/mapped_file.h"
#include "model/gemma4/gemma4_model.h"
#include "model/gpt_oss/gpt_oss_model.h"

namespace mx {
namespace {

using BuildFn = std::function<Result<std::unique_ptr<Model>>(const std::string& config_json, const std::string& source,
                                                             GenerationConfig, Checkpoint, Backend&, const ModelShard&,
                                                             const ModelLoadOptions&)>;

struct Family {
  const char* model_type;                  // config.json's model_type
  std::vector<std::string> architectures;  // accepted when model_type is absent
  const char* chat_format;                 // chat/chat_formats.h: how its instruction-tuned checkpoints talk
  BuildFn build;
};

Result<std::unique_ptr<Model>> build_gpt_oss(const std::string& text, const std::string& source, GenerationConfig g,
                                             Checkpoint checkpoint, Backend& backend, const ModelShard& shard,
                                             const ModelLoadOptions& options) {
  MX_ASSIGN_OR_RETURN(GptOssConfig config, parse_gpt_oss_config(text, source));
  MX_ASSIGN_OR_RETURN(auto model, GptOssModel::from_checkpoint(std::move(config), std::move(g), std::move(checkpoint),
                                                               backend, shard, options));
  return std::unique_ptr<Model>(std::move(model));
}

Result<std::unique_ptr<Model>> build_gemma4(const std::string& text, const std::string& source, GenerationConfig g,
                                            Checkpoint checkpoint, Backend& backend, const ModelShard& shard,
                                            const ModelLoadOptions& options) {
  if (options.dense_dtype != DType::kBF16) return unimplemented(source + ": Gemma-4 has no FP8 dense weights yet (--dense-dtype)");
  if (shard.size > 1 && options.moe_split == MoeSplit::kByExpert)
    return unimplemented(source + ": Gemma-4's experts split by the intermediate dimension only (--enable-expert-parallel)");
  MX_ASSIGN_OR_RETURN(Gemma4Config config, parse_gemma4_config(text, source));
  MX_ASSIGN_OR_RETURN(auto model, Gemma4Model::from_checkpoint(std::move(config), std::move(g), std::move(checkpoint), backend,
                                                               shard));
  return std::unique_ptr<Model>(std::move(model));
}

const std::vector<Family>& families() {
  static const std::vector<Family> table = {
      {"gpt_oss", {"GptOssForCausalLM"}, "harmony", build_gpt_oss},
      {"gemma4", {"Gemma4ForConditionalGeneration"}, "gemma4", build_gemma4},
      {"gemma4_text", {"Gemma4ForCausalLM"}, "gemma4", build_gemma4},
  };
  return table;
}

std::string known_names() {
  std::string names;
  for (const Family& f : families()) names += (names.empty() ? "" : ", ") + std::string(f.model_type);
  return names;
}

Result<const Family*> find_family(const std::string& config_json, const std::string& source) {
  MX_ASSIGN_OR_RETURN(nlohmann::json root, parse_json_object(config_json, source));
  if (auto it = root.find("model_type"); it != root.end() && !it->is_null()) {
    if (!it->is_string()) return invalid_argument(source + ": field 'model_type' must be a string");
    const std::string type = it->get<std::string>();
    for (const Family& f : families())
      if (type == f.model_type) return &f;
    return unimplemented(source + ": model_type '" + type + "' is not supported (supported: " + known_names() + ")");
  }
  if (auto it = root.find("architectures"); it != root.end() && it->is_array()) {
    for (const auto& a : *it)
      for (const Family& f : families())
        if (a.is_string() && std::find(f.architectures.begin(), f.architectures.end(), a.get<std::string>()) != f.architectures.end())
          return &f;
    return unimplemented(source + ": architectures " + it->dump() + " are not supported (supported model_type: " +
                         known_names() + ")");
  }
  return invalid_argument(source + ": missing field 'model_type' (supported: " + known_names() + ")");
}

}  // namespace

Result<std::string> model_family(const std::string& config_json, const std::string& source) {
  MX_ASSIGN_OR_RETURN(const Family* f, find_family(config_json, source));
  return std::string(f->model_type);
}

Result<std::string> model_chat_format(const std::string& model_dir) {
  const std::string path = (std::filesystem::path(model_dir) / "config.json").string();
  MX_ASSIGN_OR_RETURN(std::string text, read_text_file(path));
  return model_chat_format_of_config(text, path);
}

Result<std::string> model_chat_format_of_config(const std::string& config_json, const std::string& source) {
  MX_ASSIGN_OR_RETURN(const Family* f, find_family(config_json, source));
  return std::string(f->chat_format);
}

Result<std::unique_ptr<Model>> model_from_checkpoint(const std::string& config_json, const std::string& source,
                                                     GenerationConfig generation_config, Checkpoint checkpoint,
                                                     Backend& backend, const ModelLoadOptions& options) {
  MX_ASSIGN_OR_RETURN(const Family* f, find_family(config_json, source));
  return f->build(config_json, source, std::move(generation_config), std::move(checkpoint), backend, ModelShard{},
                  options);
}

Result<std::unique_ptr<Model>> load_model(const std::string& model_dir, Backend& backend, const ModelShard& shard,
                                          const ModelLoadOptions& options) {
  const std::string path = (std::filesystem::path(model_dir) / "config.json").string();
  MX_ASSIGN_OR_RETURN(std::string text, read_text_file(path));
  MX_ASSIGN_OR_RETURN(const Family* f, find_family(text, path));
  MX_ASSIGN_OR_RETURN(GenerationConfig generation_config, load_generation_config(model_dir));
  MX_ASSIGN_OR_RETURN(Checkpoint checkpoint, Checkpoint::open_dir(model_dir));
  auto model = f->build(text, path, std::move(generation_config), std::move(checkpoint), backend, shard, options);
  if (!model.is_ok()) return model.status().with_context(model_dir);
  return model;
}

}  // namespace mx
