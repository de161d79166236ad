// load_draft_model: config.json's model_type -> the draft model's family.
#include "model/draft_model.h"

#include "io/json_fields.h"
#include "io/mapped_file.h"
#include "model/gemma4/gemma4_assistant_model.h"

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
  return unimplemented(source + ": model_type '" + type + "' is not a draft model this server runs (supported: gemma4_assistant)");
}

}  // namespace mx
