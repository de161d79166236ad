// Structured outputs through a chat format. The server compiles what a request asks for (the answer's
// grammar, each callable tool's argument grammar) and the request's ChatFormat turns it into one
// TokenConstraint per choice, because only the format knows where in its output the answer and a call's
// arguments start and end, which special tokens close them, and how its reasoning span is written.
//
// The contract every format's constraint keeps:
// - The reasoning is free text (only the format's structural special tokens are withheld), but bounded:
//   after `reasoning_budget` reasoning tokens the mask holds only the token that closes the reasoning (after
//   at most three more that finish a UTF-8 character the budget cut: ReasoningBudget), so a request that
//   must answer or call a tool always gets there (as vLLM's thinking_token_budget and SGLang's strict
//   thinking do). Budget 0: no reasoning span at all.
// - The answer matches TurnConstraintSpec::answer (free text when null); its end token is allowed once the
//   grammar may end and forced once nothing else may follow.
// - A tool call names one of TurnConstraintSpec::tools and its arguments match that tool's grammar (compiled
//   in the notation the format writes arguments in: ChatFormat::tool_argument_notation); when
//   answer_allowed is false (tool_choice required or named) the model cannot answer, only call.
// - A token the constraint did not expect (a test's forced transcript) ends the constraint: the rest of the
//   output is unconstrained rather than guessed at.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "grammar/grammar_matcher.h"
#include "runtime/token_constraint.h"

namespace mx {

// Compiles grammars against the vocabulary of ordinary text tokens (special tokens have no bytes), cached by
// `key` (a unique description of what `build` makes). The server's StructuredOutputs implements it.
class GrammarCompiler {
 public:
  virtual ~GrammarCompiler() = default;
  virtual Result<std::shared_ptr<const grammar::CompiledGrammar>> compile(
      const std::string& key, const std::function<Result<grammar::Grammar>()>& build) = 0;
};

struct ConstrainedTool {
  std::string name;
  std::shared_ptr<const grammar::CompiledGrammar> arguments;  // in the format's argument notation
};

// One request's constraints, compiled.
struct TurnConstraintSpec {
  std::shared_ptr<const grammar::CompiledGrammar> answer;  // null: the answer is free text
  bool answer_allowed = true;         // false: the turn must be a tool call (tool_choice required / named)
  std::vector<ConstrainedTool> tools;  // what the model may call (tool_choice applied; empty: nothing)
  bool parallel_tool_calls = true;     // more than one call in the turn (where the format can write that)
  std::optional<bool> thinking;        // the conversation's thinking switch, as the prompt was rendered
  std::shared_ptr<const std::vector<uint32_t>> text_tokens;  // mask of every ordinary text token
};

class TurnConstraintPlan : public std::enable_shared_from_this<TurnConstraintPlan> {
 public:
  virtual ~TurnConstraintPlan() = default;
  // One choice's constraint (each choice of n > 1 gets its own). `reasoning_budget`: reasoning tokens
  // before the reasoning is closed (0: none; < 0: unbounded).
  virtual std::shared_ptr<TokenConstraint> make(int64_t reasoning_budget) const = 0;
};

// ---- Helpers for the formats' constraints ----

inline void set_token(uint32_t* words, int32_t id) { words[id >> 5] |= uint32_t{1} << (id & 31); }
inline void set_token_if_in(uint32_t* words, int64_t vocab, int32_t id) {
  if (id >= 0 && id < vocab) set_token(words, id);
}
// Clears the model's mask (`vocab` ids) and copies `text` (the tokenizer's size) into it.
void write_text_mask(const std::vector<uint32_t>& text, uint32_t* words, int64_t vocab);
// Clears the model's mask and copies the matcher's allowed tokens into it, through `scratch` (the grammar's
// vocabulary may be smaller or larger than the model's).
void write_matcher_mask(grammar::GrammarMatcher& matcher, std::vector<uint32_t>* scratch, uint32_t* words, int64_t vocab);
// The reasoning span's token budget, shared by the formats' constraints. Within the budget the reasoning is
// any text token or the token that closes it; once spent, only the closing token, unless the reasoning stops
// inside a UTF-8 character (byte-level o200k tokens and Gemma's <0xHH> byte-fallback tokens split CJK and
// emoji): then only text tokens that go on with that character are allowed until it is whole, because closing
// there would end the reasoning in U+FFFD (the stream parser flushes the dangling bytes as one). Each such
// token adds at least one of the at most three missing bytes, so the reasoning runs at most kMaxUtf8Overrun
// tokens past the budget; past that (a forced transcript) or when no token continues the character, the
// closing token alone.
class ReasoningBudget {
 public:
  static constexpr int64_t kMaxUtf8Overrun = 3;
  explicit ReasoningBudget(int64_t budget) : budget_(budget) {}  // < 0: unbounded
  // A reasoning token (not the closing one), its bytes in `vocab` (empty for an id outside it).
  void accept(const grammar::TokenVocabulary& vocab, int32_t token);
  // The next reasoning step's mask (`text`: every ordinary text token of `vocab`).
  void fill_mask(const grammar::TokenVocabulary& vocab, const std::vector<uint32_t>& text, int32_t close,
                 uint32_t* words, int64_t model_vocab) const;

 private:
  const int64_t budget_;
  int64_t tokens_ = 0;
  std::string unfinished_;  // the bytes of a character the reasoning has begun and not finished
};

// Alternatives of fixed strings as a grammar.
grammar::Grammar literal_choice(const std::vector<std::string>& options);

}  // namespace mx
