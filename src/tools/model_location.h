// Where `--model` points: a checkpoint directory, or a Hugging Face id (`openai/gpt-oss-20b`) found in the
// local Hugging Face cache ($HF_HOME/hub, default ~/.cache/huggingface/hub), as vLLM and SGLang accept it.
// mxserve never downloads: a missing id is an error that names the download command.
#pragma once

#include <string>

#include "core/status.h"

namespace mx {

struct ModelLocation {
  std::string dir;          // a directory holding config.json
  std::string served_name;  // the default served model name: the id as given, or the directory's name
};

Result<ModelLocation> resolve_model_location(const std::string& model);

}  // namespace mx
