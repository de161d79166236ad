// The model registry: config.json's `model_type` (or, without it, `architectures`) picks the family that
// builds the Model. A new family adds one row to the table in model_registry.cc. An unknown model_type or a
// config the family cannot read is one clear error naming the file and what is wrong.
#pragma once

#include <memory>
#include <string>

#include "backend/backend.h"
#include "io/generation_config.h"
#include "io/safetensors.h"
#include "model/load_options.h"
#include "model/model.h"
#include "model/model_shard.h"

namespace mx {

// Builds the model in `model_dir` (config.json, generation_config.json, safetensors) on `backend`, which
// must outlive it; with a `shard` of size > 1, one tensor-parallel rank of it (model_shard.h; families that
// cannot be split say so). `options` as in load_options.h (families refuse what they cannot do).
Result<std::unique_ptr<Model>> load_model(const std::string& model_dir, Backend& backend, const ModelShard& shard = {},
                                          const ModelLoadOptions& options = {});

// Builds a model from config.json text (`source` names it in errors) and an open checkpoint, which the
// model keeps (e.g. a synthetic checkpoint in memory).
Result<std::unique_ptr<Model>> model_from_checkpoint(const std::string& config_json, const std::string& source,
                                                     GenerationConfig generation_config, Checkpoint checkpoint,
                                                     Backend& backend, const ModelLoadOptions& options = {});

// The chat format (chat/chat_formats.h) of the family in `model_dir`, from its config.json: "harmony" for
// gpt_oss, "gemma4" for gemma4/gemma4_text. Known before the model loads, so the tokenizer can be loaded
// with the format's special tokens.
Result<std::string> model_chat_format(const std::string& model_dir);
// The same from config.json's text (`source` names it in errors), e.g. a synthetic checkpoint's.
Result<std::string> model_chat_format_of_config(const std::string& config_json, const std::string& source);

// The family name config.json asks for ("gpt_oss"), or an error naming the file and the known names.
Result<std::string> model_family(const std::string& config_json, const std::string& source);

}  // namespace mx
