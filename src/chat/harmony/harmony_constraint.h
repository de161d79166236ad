// Structured outputs for Harmony (gpt-oss): one choice's walk through the message structure
//   <|channel|>HEADER<|message|>BODY then <|end|> (analysis, then <|start|>assistant and the next header),
//   <|return|> (final) or <|call|> (a tool call).
// - The analysis body runs free (only the structural special tokens are withheld, <|end|> is allowed) for at
//   most the reasoning budget; then only <|end|> is allowed (once a character the budget cut is whole).
//   Budget 0: the first header cannot be analysis.
// - The header is limited to what the request allows: "analysis" once, "final" unless a tool call is
//   required, "commentary to=functions.NAME" for the callable tools (all with required, one when named),
//   which may go on with " <|constrain|>json" as gpt-oss writes its calls.
// - The final body follows the answer's grammar (free text when there is none) and a call's arguments the
//   tool's, and the end token is allowed once the value may end.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>

#include "chat/chat_constraint.h"

namespace mx::harmony {

// What one request's constraints compile to; shared by its choices (each gets its own matchers).
struct ConstraintPlan final : TurnConstraintPlan {
  std::shared_ptr<const grammar::CompiledGrammar> header;  // the allowed headers (text between channel and message)
  std::shared_ptr<const grammar::CompiledGrammar> header_after_analysis;  // the same without "analysis"
  std::shared_ptr<const grammar::CompiledGrammar> role;    // "assistant" after <|start|>
  std::shared_ptr<const grammar::CompiledGrammar> content_type;  // "json" after a tool header's <|constrain|>
  std::shared_ptr<const grammar::CompiledGrammar> answer;  // the final body (null: free text, if allowed)
  bool answer_allowed = true;
  std::unordered_map<std::string, std::shared_ptr<const grammar::CompiledGrammar>> tools;  // arguments by name
  std::shared_ptr<const std::vector<uint32_t>> text_tokens;

  // The bytes of the text tokens (every grammar above is compiled over them).
  const grammar::TokenVocabulary& text_vocab() const { return role->vocab(); }

  std::shared_ptr<TokenConstraint> make(int64_t reasoning_budget) const override;
};

Result<std::shared_ptr<const TurnConstraintPlan>> plan_constraint(const TurnConstraintSpec& spec, GrammarCompiler& compiler);

}  // namespace mx::harmony
