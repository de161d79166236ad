// load_draft_model: config.json's model_type (or, for EAGLE-3 drafts, whose model_type is "llama", the
// architectures list) -> the draft model's family.
#include "model/draft_model.h"

#include "io/json_fields.h"
#include "io/mapped_file.h"
#include "model/eagle3/eagle3_draft_model.h"
#include "model/gemma4/gemma4_assistant_model.h"
#include "model/gpt_oss/gpt_oss_model.h"

namespace mx {

Result<std::unique_ptr<DraftModel>> load_draft_model(const std::string& dir, const Model& target) {
  const std::string source = dir + "/config.json";
  MX_ASSIGN_OR_RETURN(std::string text, read_text_file(source));
  MX_ASSIGN_OR_RETURN(nlohmann::json root, parse_json_object(text, source));
  std::string type;
  if (auto it = root.find("model_type"); it != root.end() && it->is_string()) type = it->get<std::string>();
  if (type == "gemma4_assistant") {
    const auto* gemma = dynamic_cast<const Gemma4Model*>(&target);
    if (!gemma)
      return invalid_argument(source + ": a Gemma-4 assistant drafts for a single-device Gemma-4 target, not for this " +
                              target.family() + " model");
    MX_ASSIGN_OR_RETURN(Gemma4AssistantConfig config, parse_gemma4_assistant_config(text, source));
    MX_ASSIGN_OR_RETURN(Checkpoint checkpoint, Checkpoint::open_dir(dir));
    MX_ASSIGN_OR_RETURN(auto model, Gemma4AssistantModel::from_checkpoint(std::move(config), std::move(checkpoint), *gemma, source));
    return std::unique_ptr<DraftModel>(std::move(model));
  }
  bool eagle3 = false;
  if (auto it = root.find("architectures"); it != root.end() && it->is_array())
    for (const nlohmann::json& a : *it) eagle3 = eagle3 || a == "LlamaForCausalLMEagle3" || a == "Eagle3LlamaForCausalLM";
  if (eagle3) {
    const auto* gpt_oss = dynamic_cast<const GptOssModel*>(&target);
    if (!gpt_oss)
      return invalid_argument(source + ": an EAGLE-3 draft here drafts for a single-device gpt-oss target, not for this " +
                              target.family() + " model");
    MX_ASSIGN_OR_RETURN(auto model, Eagle3DraftModel::load(dir, text, *gpt_oss));
    return std::unique_ptr<DraftModel>(std::move(model));
  }
  return unimplemented(source + ": model_type '" + type +
                       "' is not a draft model this server runs (supported: gemma4_assistant, LlamaForCausalLMEagle3)");
}

}  // namespace mx
