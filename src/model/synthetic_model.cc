#include "model/synthetic_model.h"

#include <functional>

#include <filesystem>

#include "model/eagle3/eagle3_synthetic.h"
#include "model/gemma4/gemma4_demo_tokenizer.h"
#include "model/gemma4/gemma4_assistant_synthetic.h"
#include "model/gemma4/gemma4_synthetic.h"
#include "model/gpt_oss/gpt_oss_synthetic.h"
#include "model/synthetic_writer.h"

namespace mx {
namespace {

struct Preset {
  std::string name;
  std::function<Status(const std::string& dir, const SyntheticOptions&)> write;
  std::function<Result<SyntheticCheckpoint>(const SyntheticOptions&)> in_memory;
};

Preset gpt_oss_row(const std::string& name) {
  return Preset{
      name,
      [name](const std::string& dir, const SyntheticOptions& options) -> Status {
        MX_ASSIGN_OR_RETURN(GptOssConfig config, gpt_oss_preset(name));
        return write_gpt_oss_checkpoint(config, dir, options);
      },
      [name](const SyntheticOptions& options) -> Result<SyntheticCheckpoint> {
        MX_ASSIGN_OR_RETURN(GptOssConfig config, gpt_oss_preset(name));
        MX_ASSIGN_OR_RETURN(Checkpoint checkpoint, gpt_oss_checkpoint_in_memory(config, options));
        return SyntheticCheckpoint{gpt_oss_config_to_json(config), gpt_oss_generation_config(), std::move(checkpoint)};
      }};
}

// Gemma-4 presets are written with a tokenizer (the released layout has one; `serve --model` needs it).
Preset gemma4_row(const std::string& name) {
  return Preset{
      name,
      [name](const std::string& dir, const SyntheticOptions& options) -> Status {
        MX_ASSIGN_OR_RETURN(Gemma4Preset preset, gemma4_preset(name));
        MX_RETURN_IF_ERROR(write_gemma4_checkpoint(preset, dir, options));
        const std::filesystem::path d(dir);
        MX_RETURN_IF_ERROR(write_text_file((d / "tokenizer.json").string(),
                                           gemma4_demo_tokenizer_json(preset.text.vocab_size)));
        return write_text_file((d / "tokenizer_config.json").string(), gemma4_demo_tokenizer_config_json());
      },
      [name](const SyntheticOptions& options) -> Result<SyntheticCheckpoint> {
        MX_ASSIGN_OR_RETURN(Gemma4Preset preset, gemma4_preset(name));
        MX_ASSIGN_OR_RETURN(Checkpoint checkpoint, gemma4_checkpoint_in_memory(preset, options));
        MX_ASSIGN_OR_RETURN(GenerationConfig g, parse_generation_config(gemma4_generation_config_json(), name));
        return SyntheticCheckpoint{gemma4_config_to_json(preset), std::move(g), std::move(checkpoint)};
      }};
}

// A draft model (Gemma-4's MTP assistant for the 26B-A4B preset): written to a folder for
// --speculative-draft-model; it is no servable model of its own.
Preset gemma4_assistant_row(const std::string& name) {
  return Preset{
      name,
      [](const std::string& dir, const SyntheticOptions& options) -> Status {
        return write_gemma4_assistant_checkpoint(gemma4_26b_a4b_assistant(), dir, options);
      },
      [name](const SyntheticOptions&) -> Result<SyntheticCheckpoint> {
        return invalid_argument("preset '" + name + "' is a draft model: write it with make-model and pass its folder "
                                "to --speculative-draft-model");
      }};
}

// EAGLE-3 drafts for gpt-oss targets: draft models too (--speculative-draft-model reads the folder).
Preset eagle3_row(const std::string& name) {
  return Preset{
      name,
      [name](const std::string& dir, const SyntheticOptions& options) -> Status {
        MX_ASSIGN_OR_RETURN(Eagle3Config config, eagle3_preset(name));
        return write_eagle3_checkpoint(config, dir, options);
      },
      [name](const SyntheticOptions&) -> Result<SyntheticCheckpoint> {
        return invalid_argument("preset '" + name + "' is a draft model: write it with make-model and pass its folder "
                                "to --speculative-draft-model");
      }};
}

const std::vector<Preset>& presets() {
  static const std::vector<Preset> table = [] {
    std::vector<Preset> t;
    for (const std::string& name : gpt_oss_preset_names()) t.push_back(gpt_oss_row(name));
    for (const std::string& name : gemma4_preset_names()) t.push_back(gemma4_row(name));
    t.push_back(gemma4_assistant_row("gemma-4-26b-a4b-assistant"));
    for (const std::string& name : eagle3_preset_names()) t.push_back(eagle3_row(name));
    return t;
  }();
  return table;
}

Result<const Preset*> find_preset(const std::string& name) {
  for (const Preset& p : presets())
    if (p.name == name) return &p;
  return invalid_argument("unknown preset '" + name + "' (" + synthetic_preset_list() + ")");
}

}  // namespace

std::vector<std::string> synthetic_preset_names() {
  std::vector<std::string> names;
  for (const Preset& p : presets()) names.push_back(p.name);
  return names;
}

std::string synthetic_preset_list() {
  const std::vector<std::string> names = synthetic_preset_names();
  std::string list;
  for (size_t i = 0; i < names.size(); ++i) list += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return list;
}

Status write_synthetic_model(const std::string& preset, const std::string& dir, const SyntheticOptions& options) {
  MX_ASSIGN_OR_RETURN(const Preset* p, find_preset(preset));
  return p->write(dir, options);
}

Result<SyntheticCheckpoint> synthetic_checkpoint_in_memory(const std::string& preset, const SyntheticOptions& options) {
  MX_ASSIGN_OR_RETURN(const Preset* p, find_preset(preset));
  return p->in_memory(options);
}

}  // namespace mx
