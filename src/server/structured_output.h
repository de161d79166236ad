// Structured outputs and enforced tool choice for Harmony (gpt-oss) chat: a request's response_format /
// structured_outputs / guided_* and tool_choice become a TokenConstraint per choice that
//   - keeps the message structure: <|channel|>HEADER<|message|>BODY then <|end|> (analysis, then
//     <|start|>assistant and the next header), <|return|> (final) or <|call|> (a tool call);
//   - lets the analysis body run free (only the structural special tokens are withheld, <|end|> is allowed);
//   - limits the header to what the request allows: "analysis" once, "final" unless a tool call is
//     required, "commentary to=functions.NAME" for the callable tools (all with required, one when named),
//     which may go on with " <|constrain|>json" as gpt-oss writes its calls;
//   - constrains the final body by the answer's grammar and a call's arguments by the tool's parameters,
//     forcing the end token once the value is complete.
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

#include "grammar/grammar_matcher.h"
#include "grammar/mask_precompute.h"
#include "runtime/token_constraint.h"
#include "server/api_error.h"
#include "server/openai_types.h"
#include "tokenizer/tokenizer.h"

namespace mx::server {

// The Harmony special tokens the constraint steers by.
struct HarmonyIds {
  int32_t start = -1, channel = -1, message = -1, end = -1, return_ = -1, call = -1;
  int32_t constrain = -1;  // optional: a tokenizer without it gets tool headers without a content type
};

// What one request's constraints compile to; shared by its choices (each gets its own matchers).
struct HarmonyPlan {
  std::shared_ptr<const grammar::CompiledGrammar> header;  // the allowed headers (text between channel and message)
  std::shared_ptr<const grammar::CompiledGrammar> header_after_analysis;  // the same without "analysis"
  std::shared_ptr<const grammar::CompiledGrammar> role;    // "assistant" after <|start|>
  std::shared_ptr<const grammar::CompiledGrammar> content_type;  // "json" after a tool header's <|constrain|>
  std::shared_ptr<const grammar::CompiledGrammar> answer;  // the final body; null when final is not allowed
  std::unordered_map<std::string, std::shared_ptr<const grammar::CompiledGrammar>> tools;  // arguments by name
  HarmonyIds ids;
  std::shared_ptr<const std::vector<uint32_t>> text_tokens;  // mask of every non-special token
};

// /v1/completions: the whole output follows the grammar, then one of the end ids (the engine's eos) once
// the grammar may end; only an end id once nothing else may follow.
struct TextPlan {
  std::shared_ptr<const grammar::CompiledGrammar> grammar;
  std::vector<int32_t> end_ids;
};

class StructuredOutputs {
 public:
  // `precompute_threads`: background threads building new grammars' node masks (0: masks are built by the
  // engine thread on first use).
  explicit StructuredOutputs(std::shared_ptr<const Tokenizer> tokenizer,
                             int precompute_threads = grammar::MaskPrecompute::default_threads());

  // What `request` constrains, compiled (null when nothing), or the 400 naming the field that cannot be enforced.
  std::optional<ApiError> plan_for(const ChatRequest& request, std::shared_ptr<const HarmonyPlan>* plan);
  // One choice's constraint (each choice of n > 1 gets its own).
  static std::shared_ptr<TokenConstraint> make_constraint(std::shared_ptr<const HarmonyPlan> plan);

  // The same for raw completions: null when `output` asks for nothing.
  std::optional<ApiError> plan_for_text(const OutputConstraint& output, std::vector<int32_t> end_ids,
                                        std::shared_ptr<const TextPlan>* plan);
  static std::shared_ptr<TokenConstraint> make_constraint(std::shared_ptr<const TextPlan> plan);

 private:
  void build_vocabulary();
  // The grammar `output` asks for (not kNone).
  Result<std::shared_ptr<const grammar::CompiledGrammar>> compile_output(const OutputConstraint& output);
  Result<std::shared_ptr<const grammar::CompiledGrammar>> compile(const std::string& key,
                                                                 const std::function<Result<grammar::Grammar>()>& build);

  std::shared_ptr<const Tokenizer> tokenizer_;
  std::once_flag vocabulary_built_;
  std::shared_ptr<const grammar::TokenVocabulary> vocab_;
  HarmonyIds ids_;
  std::shared_ptr<const std::vector<uint32_t>> text_tokens_;
  std::mutex mu_;
  // Compiled grammars by hash of their source, least recently used first out.
  std::list<std::string> lru_;
  std::unordered_map<std::string, std::pair<std::shared_ptr<const grammar::CompiledGrammar>, std::list<std::string>::iterator>> cache_;
  grammar::MaskPrecompute precompute_;  // last: its threads stop before anything else goes
};

}  // namespace mx::server
