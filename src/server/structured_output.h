// Structured outputs and enforced tool choice: a chat request's response_format / structured_outputs /
// guided_* and tool_choice compile to grammars (the answer's; each callable tool's arguments, in the
// notation the chat format writes them in), which the model's ChatFormat turns into one TokenConstraint
// per choice (chat/chat_constraint.h: only the format knows where its answer and tool arguments lie, and
// how its reasoning ends). Raw completions have no message structure: their constraint lives here (the
// whole output, then an eos id).
//
// Termination: a constrained chat request's reasoning is bounded, so a required tool call or an answer
// always comes: by `thinking_token_budget` when the request gives one (vLLM's field), else by half of the
// choice's max_tokens (what the context leaves when unset): the other half is the answer's.
//
// Compiled grammars are cached by the hash of what they were built from; a schema, regex or grammar that
// does not compile (unsupported keyword, too large) is a 400 naming the field. A newly compiled grammar's
// node masks are built on background threads (grammar/mask_precompute.h), off the engine thread.
#pragma once

#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "chat/chat_constraint.h"
#include "chat/chat_format.h"
#include "grammar/grammar_matcher.h"
#include "grammar/mask_precompute.h"
#include "runtime/token_constraint.h"
#include "server/api_error.h"
#include "server/openai_types.h"
#include "tokenizer/tokenizer.h"

namespace mx::server {

// /v1/completions: the whole output follows the grammar, then one of the end ids (the engine's eos) once
// the grammar may end; only an end id once nothing else may follow.
struct TextPlan {
  std::shared_ptr<const grammar::CompiledGrammar> grammar;
  std::vector<int32_t> end_ids;
};

class StructuredOutputs final : public GrammarCompiler {
 public:
  // `format`: the chat format constraints go through (its tokenizer is the one masks are built over).
  // `precompute_threads`: background threads building new grammars' node masks (0: masks are built by the
  // engine thread on first use).
  explicit StructuredOutputs(std::shared_ptr<const ChatFormat> format,
                             int precompute_threads = grammar::MaskPrecompute::default_threads());

  // What `request` constrains, compiled (null when nothing), or the 400 naming the field that cannot be enforced.
  std::optional<ApiError> plan_for(const ChatRequest& request, std::shared_ptr<const TurnConstraintPlan>* plan);
  // The reasoning tokens a constrained choice may write before the format closes its reasoning.
  static int64_t reasoning_budget(const ChatRequest& request, int64_t max_tokens);

  // The same for raw completions: null when `output` asks for nothing.
  std::optional<ApiError> plan_for_text(const OutputConstraint& output, std::vector<int32_t> end_ids,
                                        std::shared_ptr<const TextPlan>* plan);
  static std::shared_ptr<TokenConstraint> make_constraint(std::shared_ptr<const TextPlan> plan);

  // GrammarCompiler: over the vocabulary of ordinary text tokens.
  Result<std::shared_ptr<const grammar::CompiledGrammar>> compile(
      const std::string& key, const std::function<Result<grammar::Grammar>()>& build) override;

 private:
  void build_vocabulary();
  // The grammar `output` asks for (not kNone).
  Result<std::shared_ptr<const grammar::CompiledGrammar>> compile_output(const OutputConstraint& output);
  // A tool's arguments in the format's notation (tool_argument_vocab_).
  Result<std::shared_ptr<const grammar::CompiledGrammar>> compile_arguments(const nlohmann::json& schema, bool any_object);
  Result<std::shared_ptr<const grammar::CompiledGrammar>> compile_over(const std::shared_ptr<const grammar::TokenVocabulary>& vocab,
                                                                      const std::string& key,
                                                                      const std::function<Result<grammar::Grammar>()>& build);

  std::shared_ptr<const ChatFormat> format_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  std::once_flag vocabulary_built_;
  std::shared_ptr<const grammar::TokenVocabulary> vocab_;
  // vocab_ plus the format's special tokens inside arguments (as the bytes its notation spells them), less
  // the text tokens holding those bytes; vocab_ itself when the format has none.
  std::shared_ptr<const grammar::TokenVocabulary> tool_argument_vocab_;
  std::shared_ptr<const std::vector<uint32_t>> text_tokens_;
  std::mutex mu_;
  // Compiled grammars by hash of their source, least recently used first out.
  std::list<std::string> lru_;
  std::unordered_map<std::string, std::pair<std::shared_ptr<const grammar::CompiledGrammar>, std::list<std::string>::iterator>> cache_;
  grammar::MaskPrecompute precompute_;  // last: its threads stop before anything else goes
};

}  // namespace mx::server
