// The Harmony ChatFormat (gpt-oss): an OpenAI conversation mapped onto Harmony messages, rendered by
// harmony_renderer and parsed back by HarmonyStreamParser.
//
// Mapping (as openai/harmony documents it for chat completions): system and developer messages become the
// developer message's instructions (the Harmony system message is the model's own: identity, reasoning
// effort, channels); an assistant turn becomes its reasoning on the analysis channel, its tool calls as
// commentary messages to functions.NAME, and its text on the final channel; a tool message becomes a
// message from functions.NAME. gpt-oss cannot turn reasoning off, so thinking=false renders low effort.
// Chat stops at <|return|> (the answer) and <|call|> (a tool call), never at <|end|>, which only closes a
// message inside the turn (the analysis before the answer).
#pragma once

#include <memory>

#include "chat/chat_format.h"
#include "chat/harmony/harmony_renderer.h"

namespace mx {

HarmonyConversation conversation_to_harmony(const Conversation& conversation);

class HarmonyFormat final : public ChatFormat {
 public:
  // Fails when the tokenizer's Harmony specials are missing or have other ids (load it with
  // harmony::special_tokens()).
  static Result<std::shared_ptr<const HarmonyFormat>> create(std::shared_ptr<const Tokenizer> tokenizer);

  std::string name() const override { return "harmony"; }
  const Tokenizer& tokenizer() const override { return *tokenizer_; }
  Result<std::vector<int32_t>> render(const Conversation& conversation) const override;
  const std::vector<int32_t>& stop_ids() const override { return stop_ids_; }
  std::unique_ptr<ChatStreamParser> make_parser() const override;
  // harmony_constraint.h
  Result<std::shared_ptr<const TurnConstraintPlan>> plan_constraint(const TurnConstraintSpec& spec,
                                                                    GrammarCompiler& compiler) const override;

  explicit HarmonyFormat(std::shared_ptr<const Tokenizer> tokenizer);  // use create()

 private:
  std::shared_ptr<const Tokenizer> tokenizer_;
  std::vector<int32_t> stop_ids_;
};

}  // namespace mx
