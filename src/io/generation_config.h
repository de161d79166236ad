// generation_config.json: the ids a model's own generation stops at and its bos/pad ids. Shared by every
// model family (the file's format is Hugging Face's, not a family's).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace mx {

struct GenerationConfig {
  std::vector<int64_t> eos_token_ids;
  int64_t bos_token_id = -1;
  int64_t pad_token_id = -1;
};

Result<GenerationConfig> parse_generation_config(const std::string& text, const std::string& source);
// A missing generation_config.json gives an empty GenerationConfig (no eos ids).
Result<GenerationConfig> load_generation_config(const std::string& model_dir);

}  // namespace mx
