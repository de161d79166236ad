// The Gemma-4 ChatFormat: prompts rendered as its chat template renders them (gemma4_render.h), outputs
// parsed by gemma4::StreamParser. Thinking is off unless the request turns it on (Conversation::thinking:
// chat_template_kwargs.enable_thinking, or a reasoning_effort other than "none"), as the template's default.
// Control tokens are looked up by their text in the checkpoint's own tokenizer.json (the format adds none):
// a tokenizer without them is not a Gemma-4 tokenizer and fails to make the format.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "chat/chat_format.h"
#include "chat/gemma4/gemma4_constraint.h"
#include "chat/gemma4/gemma4_parser.h"
#include "chat/gemma4/gemma4_render.h"

namespace mx {

class Gemma4Format final : public ChatFormat {
 public:
  static Result<std::shared_ptr<const Gemma4Format>> create(std::shared_ptr<const Tokenizer> tokenizer);

  std::string name() const override { return "gemma4"; }
  const Tokenizer& tokenizer() const override { return *tokenizer_; }
  Result<std::vector<int32_t>> render(const Conversation& conversation) const override;
  const std::vector<int32_t>& stop_ids() const override { return stop_ids_; }
  std::unique_ptr<ChatStreamParser> make_parser() const override;
  // Structured outputs (gemma4_constraint.h): arguments in the template's notation, <|"|> as kQuoteByte.
  grammar::JsonSchemaOptions tool_argument_notation() const override;
  std::vector<std::pair<int32_t, std::string>> tool_argument_special_tokens() const override;
  Result<std::shared_ptr<const TurnConstraintPlan>> plan_constraint(const TurnConstraintSpec& spec,
                                                                    GrammarCompiler& compiler) const override;

  // The ids of a rendered prompt: text pieces encoded as ordinary text, control tokens as their ids.
  Result<std::vector<int32_t>> encode(const gemma4::RenderedPrompt& prompt) const;

  Gemma4Format(std::shared_ptr<const Tokenizer> tokenizer, gemma4::ControlIds ids);  // use create()

 private:
  std::shared_ptr<const Tokenizer> tokenizer_;
  gemma4::ControlIds ids_;
  gemma4::ConstraintIds constraint_ids_;
  std::vector<int32_t> stop_ids_;
};

}  // namespace mx
