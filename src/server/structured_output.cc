#include "server/structured_output.h"

#include <algorithm>

#include "core/sha256.h"
#include "grammar/ebnf.h"
#include "grammar/json_schema.h"
#include "grammar/regex.h"

namespace mx::server {

namespace {

constexpr size_t kMaxCachedGrammars = 256;
// Node masks built ahead per grammar (the rest on demand): 64 MiB holds a few thousand nodes' caches.
constexpr int64_t kMaxPrecomputedBytes = int64_t{64} << 20;

using grammar::CompiledGrammar;
using grammar::GrammarMatcher;

// One choice of a raw completion: the grammar from the first token, then an end id (TextPlan).
class TextConstraint final : public TokenConstraint {
 public:
  explicit TextConstraint(std::shared_ptr<const TextPlan> plan) : plan_(std::move(plan)), matcher_(plan_->grammar) {}

  bool fill_mask(uint32_t* words, int64_t vocab) override {
    if (done_) return false;
    write_matcher_mask(matcher_, &scratch_, words, vocab);
    if (matcher_.can_end()) {
      for (int32_t id : plan_->end_ids) set_token_if_in(words, vocab, id);
    }
    return true;
  }

  void accept(int32_t token) override {
    if (done_) return;
    const bool end = std::find(plan_->end_ids.begin(), plan_->end_ids.end(), token) != plan_->end_ids.end();
    // An end id closes the match; a token the grammar refuses (a test's forced transcript) stops constraining.
    if ((end && matcher_.can_end()) || !matcher_.accept_token(token)) done_ = true;
  }

 private:
  std::shared_ptr<const TextPlan> plan_;
  GrammarMatcher matcher_;
  std::vector<uint32_t> scratch_;
  bool done_ = false;
};

}  // namespace

StructuredOutputs::StructuredOutputs(std::shared_ptr<const ChatFormat> format, int precompute_threads)
    : format_(std::move(format)), tokenizer_(format_, &format_->tokenizer()),
      precompute_(precompute_threads, kMaxPrecomputedBytes) {}

// The sorted vocabulary costs ~0.1 s: built by the first request that needs it, not at start-up.
void StructuredOutputs::build_vocabulary() {
  std::vector<std::string> bytes(tokenizer_->vocab_size());
  auto text = std::make_shared<std::vector<uint32_t>>((tokenizer_->vocab_size() + 31) / 32, 0u);
  for (int32_t id = 0; id < tokenizer_->vocab_size(); ++id) {
    if (tokenizer_->is_special(id) || !tokenizer_->append_token_bytes(id, &bytes[id])) continue;
    if (!bytes[id].empty()) set_token(text->data(), id);
  }
  const auto specials = format_->tool_argument_special_tokens();
  if (!specials.empty()) {
    // Text tokens holding a byte the notation gives a special token would be read as that token: left out.
    grammar::ByteSet reserved;
    for (const auto& [id, spelled] : specials)
      for (char c : spelled) reserved.add(static_cast<uint8_t>(c));
    std::vector<std::string> args = bytes;
    for (std::string& b : args)
      if (std::any_of(b.begin(), b.end(), [&](char c) { return reserved.has(static_cast<uint8_t>(c)); })) b.clear();
    for (const auto& [id, spelled] : specials)
      if (id >= 0 && id < static_cast<int32_t>(args.size())) args[id] = spelled;
    tool_argument_vocab_ = std::make_shared<const grammar::TokenVocabulary>(std::move(args));
  }
  vocab_ = std::make_shared<const grammar::TokenVocabulary>(std::move(bytes));
  if (!tool_argument_vocab_) tool_argument_vocab_ = vocab_;
  text_tokens_ = std::move(text);
}

Result<std::shared_ptr<const CompiledGrammar>> StructuredOutputs::compile(
    const std::string& key, const std::function<Result<grammar::Grammar>()>& build) {
  return compile_over(vocab_, key, build);
}

Result<std::shared_ptr<const CompiledGrammar>> StructuredOutputs::compile_over(
    const std::shared_ptr<const grammar::TokenVocabulary>& vocab, const std::string& key,
    const std::function<Result<grammar::Grammar>()>& build) {
  const std::string hash = sha256_hex((vocab == vocab_ ? "text:" : "arguments:") + key);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = cache_.find(hash);
    if (it != cache_.end()) {
      lru_.splice(lru_.end(), lru_, it->second.second);
      return it->second.first;
    }
  }
  MX_ASSIGN_OR_RETURN(grammar::Grammar g, build());
  MX_ASSIGN_OR_RETURN(std::shared_ptr<const CompiledGrammar> compiled, CompiledGrammar::create(g, vocab));
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = cache_.find(hash);
    if (it != cache_.end()) return it->second.first;  // compiled meanwhile by another request: share that one
    if (cache_.size() >= kMaxCachedGrammars) {
      cache_.erase(lru_.front());
      lru_.pop_front();
    }
    lru_.push_back(hash);
    cache_.emplace(hash, std::make_pair(compiled, std::prev(lru_.end())));
  }
  precompute_.add(compiled);
  return compiled;
}

Result<std::shared_ptr<const CompiledGrammar>> StructuredOutputs::compile_arguments(const nlohmann::json& schema, bool any_object) {
  const grammar::JsonSchemaOptions notation = format_->tool_argument_notation();
  const std::string key = "quote " + notation.string_quote + (any_object ? "\njson_object" : "\nschema:" + schema.dump());
  return compile_over(tool_argument_vocab_, key, [&]() -> Result<grammar::Grammar> {
    if (any_object) return grammar::any_json_grammar(true, notation);
    return grammar::json_schema_grammar(schema, notation);
  });
}

Result<std::shared_ptr<const CompiledGrammar>> StructuredOutputs::compile_output(const OutputConstraint& output) {
  using Kind = OutputConstraint::Kind;
  switch (output.kind) {
    case Kind::kJsonObject:
      return compile("json_object", [] { return Result<grammar::Grammar>(grammar::any_json_grammar(true)); });
    case Kind::kJsonSchema:
      return compile("schema:" + output.schema.dump(), [&] { return grammar::json_schema_grammar(output.schema); });
    case Kind::kRegex: return compile("regex:" + output.text, [&] { return grammar::regex_grammar(output.text); });
    case Kind::kGrammar: return compile("ebnf:" + output.text, [&] { return grammar::parse_ebnf(output.text); });
    case Kind::kChoice: {
      std::string key = "choice";
      for (const std::string& c : output.choices) key += ":" + std::to_string(c.size()) + ":" + c;
      return compile(key, [&] { return Result<grammar::Grammar>(literal_choice(output.choices)); });
    }
    case Kind::kNone: break;
  }
  return internal_error("no output constraint to compile");
}

std::optional<ApiError> StructuredOutputs::plan_for(const ChatRequest& request,
                                                    std::shared_ptr<const TurnConstraintPlan>* out) {
  using Kind = OutputConstraint::Kind;
  const OutputConstraint& output = request.output;
  const ToolChoice::Mode mode = request.tool_choice.mode;
  const bool must_call = mode == ToolChoice::Mode::kRequired || mode == ToolChoice::Mode::kNamed;
  out->reset();
  if (output.kind == Kind::kNone && !must_call && !request.thinking_token_budget) return std::nullopt;
  std::call_once(vocabulary_built_, [this] { build_vocabulary(); });
  const std::string request_param = must_call              ? "tool_choice"
                                    : !output.param.empty() ? output.param
                                                            : "thinking_token_budget";
  auto fail = [](const Status& st, const std::string& param) {
    return ApiError::invalid_request("Cannot enforce '" + param + "': " + st.message(), param);
  };
  TurnConstraintSpec spec;
  spec.answer_allowed = !must_call;
  spec.parallel_tool_calls = request.parallel_tool_calls;
  spec.thinking = request.thinking;
  spec.text_tokens = text_tokens_;
  if (!must_call && output.kind != Kind::kNone) {
    auto answer = compile_output(output);
    if (!answer.is_ok()) return fail(answer.status(), output.param);
    spec.answer = *answer;
  }
  // Tools the model may call: none with tool_choice none; all with auto/required; one when named. With
  // auto a tool whose parameters cannot be enforced takes any JSON object (the answer is what was asked
  // for); with required/named it is an error.
  if (mode != ToolChoice::Mode::kNone) {
    for (size_t i = 0; i < request.tools.size(); ++i) {
      const FunctionTool& tool = request.tools[i];
      if (mode == ToolChoice::Mode::kNamed && tool.name != request.tool_choice.name) continue;
      const nlohmann::json params = nlohmann::json::parse(tool.parameters.dump());
      auto args = compile_arguments(params, false);
      if (!args.is_ok()) {
        const std::string param = "tools[" + std::to_string(i) + "].function.parameters";
        if (must_call) return fail(args.status(), param);
        args = compile_arguments(params, true);
        if (!args.is_ok()) return fail(args.status(), param);
      }
      spec.tools.push_back({tool.name, *args});
    }
  }
  auto plan = format_->plan_constraint(spec, *this);
  if (!plan.is_ok()) return fail(plan.status(), request_param);
  *out = std::move(plan).value();
  return std::nullopt;
}

int64_t StructuredOutputs::reasoning_budget(const ChatRequest& request, int64_t max_tokens) {
  return request.thinking_token_budget.value_or(max_tokens / 2);
}

std::optional<ApiError> StructuredOutputs::plan_for_text(const OutputConstraint& output, std::vector<int32_t> end_ids,
                                                         std::shared_ptr<const TextPlan>* out) {
  out->reset();
  if (output.kind == OutputConstraint::Kind::kNone) return std::nullopt;
  std::call_once(vocabulary_built_, [this] { build_vocabulary(); });
  auto compiled = compile_output(output);
  if (!compiled.is_ok()) {
    return ApiError::invalid_request("Cannot enforce '" + output.param + "': " + compiled.status().message(), output.param);
  }
  if (end_ids.empty()) {
    return ApiError::invalid_request("Cannot enforce '" + output.param + "': the model has no end-of-sequence token to end "
                                     "a constrained completion with.", output.param);
  }
  auto plan = std::make_shared<TextPlan>();
  plan->grammar = *compiled;
  plan->end_ids = std::move(end_ids);
  *out = std::move(plan);
  return std::nullopt;
}

std::shared_ptr<TokenConstraint> StructuredOutputs::make_constraint(std::shared_ptr<const TextPlan> plan) {
  return std::make_shared<TextConstraint>(std::move(plan));
}

}  // namespace mx::server
