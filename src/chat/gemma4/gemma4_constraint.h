// Structured outputs for Gemma-4: one choice's walk through what the model writes after `<|turn>model\n`:
//   [<|channel>thought\n REASONING <channel|>] then either ANSWER <turn|>
//   or <|tool_call>call:NAME{ARGUMENTS}<tool_call|> ... <|tool_response>.
// - A thought may open only at the start and only when the prompt turned thinking on (with thinking off the
//   prompt already holds the empty thought); its label is forced, its text is free for at most the
//   reasoning budget, then only <channel|> is allowed (once a character the budget cut is whole).
// - The answer follows the answer's grammar (free text when there is none; a free answer may be followed by
//   tool calls, as the model writes them) and ends with <turn|> or <eos> once the grammar may end.
// - A call names one of the tools (call:NAME, a literal choice), its arguments follow the tool's grammar in
//   the template's notation (strings between <|"|> tokens: the argument grammars see that token as the byte
//   kQuoteByte), then <tool_call|>; after a call, another call (parallel_tool_calls) or <|tool_response>,
//   which ends the turn. A required or named tool_choice allows nothing but a call after the thought.
// The name and the arguments are matched one after the other, so a token spanning both ("er{") is not
// offered: calls are written in tokens that end at the name.
#pragma once

#include <memory>
#include <unordered_map>

#include "chat/chat_constraint.h"

namespace mx::gemma4 {

inline constexpr char kQuoteByte[] = "\xff";  // <|"|> in argument grammars: a byte no UTF-8 text holds

struct ConstraintIds {
  int32_t channel_open = -1, channel_close = -1, tool_call_open = -1, tool_call_close = -1;
  int32_t turn_end = -1, eos = -1, tool_response = -1;
};

struct ConstraintPlan final : TurnConstraintPlan {
  ConstraintIds ids;
  bool thinking = false;  // the prompt left the thought to the model
  std::shared_ptr<const grammar::CompiledGrammar> answer;  // null: free text, if allowed
  bool answer_allowed = true;
  bool parallel_tool_calls = true;
  std::shared_ptr<const grammar::CompiledGrammar> label;  // "thought\n" after <|channel>
  std::shared_ptr<const grammar::CompiledGrammar> names;  // "call:NAME" for each tool
  std::unordered_map<std::string, std::shared_ptr<const grammar::CompiledGrammar>> tools;  // arguments by name
  std::shared_ptr<const std::vector<uint32_t>> text_tokens;

  // The bytes of the text tokens (the label and name grammars are compiled over them).
  const grammar::TokenVocabulary& text_vocab() const { return label->vocab(); }

  std::shared_ptr<TokenConstraint> make(int64_t reasoning_budget) const override;
};

Result<std::shared_ptr<const TurnConstraintPlan>> plan_constraint(const TurnConstraintSpec& spec, const ConstraintIds& ids,
                                                                  GrammarCompiler& compiler);

}  // namespace mx::gemma4
