#include "io/generation_config.h"

#include <filesystem>

#include "io/json_fields.h"
#include "io/mapped_file.h"

namespace mx {

using nlohmann::json;

Result<GenerationConfig> parse_generation_config(const std::string& text, const std::string& source) {
  MX_ASSIGN_OR_RETURN(json root, parse_json_object(text, source));
  GenerationConfig g;
  if (auto it = root.find("eos_token_id"); it != root.end() && !it->is_null()) {
    auto add = [&](const json& v) -> Status {
      if (!v.is_number_integer() || v.get<int64_t>() < 0)
        return invalid_argument(source + ": eos_token_id entries must be integers >= 0");
      g.eos_token_ids.push_back(v.get<int64_t>());
      return Status::ok();
    };
    if (it->is_array()) {
      for (const auto& v : *it) MX_RETURN_IF_ERROR(add(v));
    } else {
      MX_RETURN_IF_ERROR(add(*it));
    }
  }
  JsonFieldReader r(root, source);
  MX_RETURN_IF_ERROR(r.optional_int("bos_token_id", &g.bos_token_id, 0));
  MX_RETURN_IF_ERROR(r.optional_int("pad_token_id", &g.pad_token_id, 0));
  return g;
}

Result<GenerationConfig> load_generation_config(const std::string& model_dir) {
  const std::string path = (std::filesystem::path(model_dir) / "generation_config.json").string();
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return GenerationConfig{};
  MX_ASSIGN_OR_RETURN(std::string text, read_text_file(path));
  return parse_generation_config(text, path);
}

}  // namespace mx
