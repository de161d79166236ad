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
constexpr char kToolPrefix[] = "commentary to=functions.";

using grammar::CompiledGrammar;
using grammar::GrammarMatcher;

void set_bit(uint32_t* words, int32_t id) { words[id >> 5] |= uint32_t{1} << (id & 31); }

// Alternatives of fixed strings as a grammar.
grammar::Grammar literal_choice(const std::vector<std::string>& options) {
  grammar::Grammar g;
  g.root = g.add_rule("root");
  std::vector<grammar::Expr> alts;
  for (const std::string& o : options) alts.push_back(grammar::literal(o));
  g.rules[g.root].body = grammar::alt(std::move(alts));
  return g;
}

// One choice's walk through the Harmony message structure (structured_output.h).
class HarmonyConstraint final : public TokenConstraint {
 public:
  HarmonyConstraint(std::shared_ptr<const HarmonyPlan> plan, std::shared_ptr<const std::vector<uint32_t>> text_tokens)
      : plan_(std::move(plan)), text_tokens_(std::move(text_tokens)) {}

  bool fill_mask(uint32_t* words, int64_t vocab) override {
    const int64_t n = (vocab + 31) / 32;
    std::fill(words, words + n, 0u);
    const HarmonyIds& ids = plan_->ids;
    switch (phase_) {
      case Phase::kChannel:
      case Phase::kStart: {
        const int32_t id = phase_ == Phase::kChannel ? ids.channel : ids.start;
        if (id >= vocab) return false;
        set_bit(words, id);
        return true;
      }
      case Phase::kAnalysis:  // free text; of the special tokens only <|end|>
        std::copy(text_tokens_->begin(), text_tokens_->begin() + std::min<int64_t>(n, text_tokens_->size()), words);
        if (ids.end < vocab) set_bit(words, ids.end);
        return true;
      case Phase::kHeader:
      case Phase::kContentType:
      case Phase::kRole:
      case Phase::kBody: {
        // Through a buffer of the tokenizer's size: the model's vocabulary may be smaller or larger.
        scratch_.resize(static_cast<size_t>(matcher_->grammar().vocab().mask_words()));
        matcher_->fill_mask(scratch_.data());
        std::copy(scratch_.begin(), scratch_.begin() + std::min<int64_t>(n, scratch_.size()), words);
        const int32_t end = end_token();
        if (matcher_->can_end() && end < vocab) set_bit(words, end);
        if (phase_ == Phase::kHeader && matcher_->can_end() && ids.constrain >= 0 && ids.constrain < vocab &&
            is_tool_header()) {
          set_bit(words, ids.constrain);
        }
        return true;
      }
      case Phase::kDone: return false;
    }
    return false;
  }

  void accept(int32_t token) override {
    const HarmonyIds& ids = plan_->ids;
    switch (phase_) {
      case Phase::kChannel:
        if (token != ids.channel) return give_up();
        start_header();
        return;
      case Phase::kStart:
        if (token != ids.start) return give_up();
        phase_ = Phase::kRole;
        matcher_.emplace(plan_->role);
        return;
      case Phase::kRole:
        if (token == ids.channel && matcher_->can_end()) return start_header();
        if (!matcher_->accept_token(token)) give_up();
        return;
      case Phase::kAnalysis:
        if (token == ids.end) phase_ = Phase::kStart;
        return;
      case Phase::kHeader:
        if (token == ids.message && matcher_->can_end()) return open_body();
        if (token == ids.constrain && matcher_->can_end() && is_tool_header()) {
          phase_ = Phase::kContentType;
          matcher_.emplace(plan_->content_type);
          return;
        }
        if (!matcher_->accept_token(token)) return give_up();
        header_ += matcher_->grammar().vocab().bytes(token);
        return;
      case Phase::kContentType:
        if (token == ids.message && matcher_->can_end()) return open_body();
        if (!matcher_->accept_token(token)) give_up();
        return;
      case Phase::kBody:
        if (token == body_end_ && matcher_->can_end()) {
          phase_ = Phase::kDone;
          return;
        }
        if (!matcher_->accept_token(token)) give_up();
        return;
      case Phase::kDone: return;
    }
  }

 private:
  enum class Phase { kChannel, kHeader, kContentType, kAnalysis, kBody, kStart, kRole, kDone };

  int32_t end_token() const {
    if (phase_ == Phase::kHeader || phase_ == Phase::kContentType) return plan_->ids.message;
    return phase_ == Phase::kRole ? plan_->ids.channel : body_end_;
  }
  // The header so far names a tool (complete: the caller checks can_end), maybe with a trailing space.
  bool is_tool_header() const { return header_.rfind(kToolPrefix, 0) == 0; }
  // A token the structure does not expect (a test's forced transcript): stop constraining rather than guess.
  void give_up() {
    phase_ = Phase::kDone;
    matcher_.reset();
  }
  void start_header() {
    phase_ = Phase::kHeader;
    header_.clear();
    matcher_.emplace(analysis_seen_ ? plan_->header_after_analysis : plan_->header);
  }
  void open_body() {
    if (header_ == "analysis") {
      analysis_seen_ = true;
      phase_ = Phase::kAnalysis;
      matcher_.reset();
      return;
    }
    if (header_ == "final") {
      phase_ = Phase::kBody;
      body_end_ = plan_->ids.return_;
      matcher_.emplace(plan_->answer);
      return;
    }
    if (!is_tool_header()) return give_up();
    std::string name = header_.substr(sizeof(kToolPrefix) - 1);
    while (!name.empty() && name.back() == ' ') name.pop_back();
    auto it = plan_->tools.find(name);
    if (it == plan_->tools.end()) return give_up();
    phase_ = Phase::kBody;
    body_end_ = plan_->ids.call;
    matcher_.emplace(it->second);
  }

  std::shared_ptr<const HarmonyPlan> plan_;
  std::shared_ptr<const std::vector<uint32_t>> text_tokens_;
  Phase phase_ = Phase::kChannel;
  std::optional<GrammarMatcher> matcher_;
  std::string header_;
  std::vector<uint32_t> scratch_;
  int32_t body_end_ = -1;
  bool analysis_seen_ = false;
};

// One choice of a raw completion: the grammar from the first token, then an end id (TextPlan).
class TextConstraint final : public TokenConstraint {
 public:
  explicit TextConstraint(std::shared_ptr<const TextPlan> plan) : plan_(std::move(plan)), matcher_(plan_->grammar) {}

  bool fill_mask(uint32_t* words, int64_t vocab) override {
    if (done_) return false;
    const int64_t n = (vocab + 31) / 32;
    scratch_.resize(static_cast<size_t>(matcher_.grammar().vocab().mask_words()));
    matcher_.fill_mask(scratch_.data());
    std::fill(words, words + n, 0u);
    std::copy(scratch_.begin(), scratch_.begin() + std::min<int64_t>(n, scratch_.size()), words);
    if (matcher_.can_end()) {
      for (int32_t id : plan_->end_ids)
        if (id >= 0 && id < vocab) set_bit(words, id);
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

StructuredOutputs::StructuredOutputs(std::shared_ptr<const Tokenizer> tokenizer, int precompute_threads)
    : tokenizer_(std::move(tokenizer)), precompute_(precompute_threads, kMaxPrecomputedBytes) {}

// The sorted vocabulary costs ~0.1 s: built by the first request that needs it, not at start-up.
void StructuredOutputs::build_vocabulary() {
  std::vector<std::string> bytes(tokenizer_->vocab_size());
  auto text = std::make_shared<std::vector<uint32_t>>((tokenizer_->vocab_size() + 31) / 32, 0u);
  for (int32_t id = 0; id < tokenizer_->vocab_size(); ++id) {
    if (tokenizer_->is_special(id) || !tokenizer_->append_token_bytes(id, &bytes[id])) continue;
    if (!bytes[id].empty()) set_bit(text->data(), id);
  }
  vocab_ = std::make_shared<const grammar::TokenVocabulary>(std::move(bytes));
  text_tokens_ = std::move(text);
  auto id = [&](const char* s) { return tokenizer_->special_id(s).value_or(-1); };
  ids_ = {id("<|start|>"), id("<|channel|>"), id("<|message|>"), id("<|end|>"), id("<|return|>"), id("<|call|>"),
          id("<|constrain|>")};
}

Result<std::shared_ptr<const CompiledGrammar>> StructuredOutputs::compile(
    const std::string& key, const std::function<Result<grammar::Grammar>()>& build) {
  const std::string hash = sha256_hex(key);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = cache_.find(hash);
    if (it != cache_.end()) {
      lru_.splice(lru_.end(), lru_, it->second.second);
      return it->second.first;
    }
  }
  MX_ASSIGN_OR_RETURN(grammar::Grammar g, build());
  MX_ASSIGN_OR_RETURN(std::shared_ptr<const CompiledGrammar> compiled, CompiledGrammar::create(g, vocab_));
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

std::optional<ApiError> StructuredOutputs::plan_for(const ChatRequest& request, std::shared_ptr<const HarmonyPlan>* out) {
  using Kind = OutputConstraint::Kind;
  const OutputConstraint& output = request.output;
  const ToolChoice::Mode mode = request.tool_choice.mode;
  const bool must_call = mode == ToolChoice::Mode::kRequired || mode == ToolChoice::Mode::kNamed;
  out->reset();
  if (output.kind == Kind::kNone && !must_call) return std::nullopt;
  std::call_once(vocabulary_built_, [this] { build_vocabulary(); });
  if (ids_.channel < 0 || ids_.message < 0 || ids_.return_ < 0 || ids_.call < 0 || ids_.end < 0 || ids_.start < 0) {
    return ApiError::invalid_request("Structured outputs need the Harmony special tokens, which this tokenizer lacks.",
                                     output.param.empty() ? "tool_choice" : output.param);
  }
  auto plan = std::make_shared<HarmonyPlan>();
  plan->ids = ids_;
  auto fail = [](const Status& st, const std::string& param) {
    return ApiError::invalid_request("Cannot enforce '" + param + "': " + st.message(), param);
  };
  if (!must_call) {
    auto answer = compile_output(output);
    if (!answer.is_ok()) return fail(answer.status(), output.param);
    plan->answer = *answer;
  }
  // Tools the model may call: none with tool_choice none; all with auto/required; one when named. With
  // auto a tool whose parameters cannot be enforced takes any JSON object (the answer is what was asked
  // for); with required/named it is an error.
  std::vector<std::string> headers;
  if (mode != ToolChoice::Mode::kNone) {
    for (size_t i = 0; i < request.tools.size(); ++i) {
      const FunctionTool& tool = request.tools[i];
      if (mode == ToolChoice::Mode::kNamed && tool.name != request.tool_choice.name) continue;
      const nlohmann::json params = nlohmann::json::parse(tool.parameters.dump());
      auto args = compile("schema:" + params.dump(), [&] { return grammar::json_schema_grammar(params); });
      if (!args.is_ok()) {
        const std::string param = "tools[" + std::to_string(i) + "].function.parameters";
        if (must_call) return fail(args.status(), param);
        args = compile("json_object", [] { return Result<grammar::Grammar>(grammar::any_json_grammar(true)); });
        if (!args.is_ok()) return fail(args.status(), param);
      }
      plan->tools[tool.name] = *args;
      headers.push_back(kToolPrefix + tool.name);
      headers.push_back(kToolPrefix + tool.name + " ");  // before <|constrain|>json
    }
  }
  if (plan->answer) headers.push_back("final");
  std::sort(headers.begin(), headers.end());
  std::string key = "header";
  for (const std::string& h : headers) key += "\n" + h;
  auto after = compile(key, [&] { return Result<grammar::Grammar>(literal_choice(headers)); });
  headers.push_back("analysis");
  auto first = compile(key + "\nanalysis", [&] { return Result<grammar::Grammar>(literal_choice(headers)); });
  auto role = compile("role", [] { return Result<grammar::Grammar>(literal_choice({"assistant"})); });
  auto content_type = compile("content_type", [] { return Result<grammar::Grammar>(literal_choice({"json"})); });
  for (const auto* r : {&after, &first, &role, &content_type}) {
    if (!r->is_ok()) return fail(r->status(), "tools");
  }
  plan->header = *first;
  plan->header_after_analysis = *after;
  plan->role = *role;
  plan->content_type = *content_type;
  plan->text_tokens = text_tokens_;
  *out = std::move(plan);
  return std::nullopt;
}

std::shared_ptr<TokenConstraint> StructuredOutputs::make_constraint(std::shared_ptr<const HarmonyPlan> plan) {
  auto text = plan->text_tokens;
  return std::make_shared<HarmonyConstraint>(std::move(plan), std::move(text));
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
