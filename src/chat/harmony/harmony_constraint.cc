#include "chat/harmony/harmony_constraint.h"

#include <algorithm>
#include <optional>

#include "chat/harmony/harmony_tokens.h"

namespace mx::harmony {
namespace {

constexpr char kToolPrefix[] = "commentary to=functions.";

using grammar::GrammarMatcher;

class Constraint final : public TokenConstraint {
 public:
  Constraint(std::shared_ptr<const ConstraintPlan> plan, int64_t reasoning_budget)
      : plan_(std::move(plan)), reasoning_(reasoning_budget), analysis_seen_(reasoning_budget == 0) {}

  bool fill_mask(uint32_t* words, int64_t vocab) override {
    switch (phase_) {
      case Phase::kChannel:
      case Phase::kStart:
        std::fill(words, words + (vocab + 31) / 32, 0u);
        set_token_if_in(words, vocab, phase_ == Phase::kChannel ? kChannel : kStart);
        return true;
      case Phase::kAnalysis:  // free text and <|end|>; only <|end|> once the budget is spent
        reasoning_.fill_mask(plan_->text_vocab(), *plan_->text_tokens, kEnd, words, vocab);
        return true;
      case Phase::kHeader:
      case Phase::kContentType:
      case Phase::kRole:
      case Phase::kBody:
        if (!matcher_) {  // a free final answer
          write_text_mask(*plan_->text_tokens, words, vocab);
          set_token_if_in(words, vocab, body_end_);
          return true;
        }
        write_matcher_mask(*matcher_, &scratch_, words, vocab);
        if (matcher_->can_end()) set_token_if_in(words, vocab, end_token());
        if (phase_ == Phase::kHeader && matcher_->can_end() && is_tool_header()) set_token_if_in(words, vocab, kConstrain);
        return true;
      case Phase::kDone: return false;
    }
    return false;
  }

  void accept(int32_t token) override {
    switch (phase_) {
      case Phase::kChannel:
        if (token != kChannel) return give_up();
        start_header();
        return;
      case Phase::kStart:
        if (token != kStart) return give_up();
        phase_ = Phase::kRole;
        matcher_.emplace(plan_->role);
        return;
      case Phase::kRole:
        if (token == kChannel && matcher_->can_end()) return start_header();
        if (!matcher_->accept_token(token)) give_up();
        return;
      case Phase::kAnalysis:
        if (token == kEnd) {
          phase_ = Phase::kStart;
        } else {
          reasoning_.accept(plan_->text_vocab(), token);
        }
        return;
      case Phase::kHeader:
        if (token == kMessage && matcher_->can_end()) return open_body();
        if (token == kConstrain && matcher_->can_end() && is_tool_header()) {
          phase_ = Phase::kContentType;
          matcher_.emplace(plan_->content_type);
          return;
        }
        if (!matcher_->accept_token(token)) return give_up();
        header_ += matcher_->grammar().vocab().bytes(token);
        return;
      case Phase::kContentType:
        if (token == kMessage && matcher_->can_end()) return open_body();
        if (!matcher_->accept_token(token)) give_up();
        return;
      case Phase::kBody:
        if (token == body_end_ && (!matcher_ || matcher_->can_end())) {
          phase_ = Phase::kDone;
          return;
        }
        if (matcher_ ? !matcher_->accept_token(token) : !allowed_text(token)) give_up();
        return;
      case Phase::kDone: return;
    }
  }

 private:
  enum class Phase { kChannel, kHeader, kContentType, kAnalysis, kBody, kStart, kRole, kDone };

  int32_t end_token() const {
    if (phase_ == Phase::kHeader || phase_ == Phase::kContentType) return kMessage;
    return phase_ == Phase::kRole ? kChannel : body_end_;
  }
  bool allowed_text(int32_t token) const {
    const std::vector<uint32_t>& text = *plan_->text_tokens;
    return token >= 0 && static_cast<size_t>(token >> 5) < text.size() && ((text[token >> 5] >> (token & 31)) & 1u);
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
      body_end_ = kReturn;
      if (plan_->answer) {
        matcher_.emplace(plan_->answer);
      } else {
        matcher_.reset();
      }
      return;
    }
    if (!is_tool_header()) return give_up();
    std::string name = header_.substr(sizeof(kToolPrefix) - 1);
    while (!name.empty() && name.back() == ' ') name.pop_back();
    auto it = plan_->tools.find(name);
    if (it == plan_->tools.end()) return give_up();
    phase_ = Phase::kBody;
    body_end_ = kCall;
    matcher_.emplace(it->second);
  }

  std::shared_ptr<const ConstraintPlan> plan_;
  ReasoningBudget reasoning_;
  Phase phase_ = Phase::kChannel;
  std::optional<GrammarMatcher> matcher_;
  std::string header_;
  std::vector<uint32_t> scratch_;
  int32_t body_end_ = -1;
  bool analysis_seen_;
};

}  // namespace

std::shared_ptr<TokenConstraint> ConstraintPlan::make(int64_t reasoning_budget) const {
  auto self = std::static_pointer_cast<const ConstraintPlan>(shared_from_this());
  return std::make_shared<Constraint>(std::move(self), reasoning_budget);
}

Result<std::shared_ptr<const TurnConstraintPlan>> plan_constraint(const TurnConstraintSpec& spec, GrammarCompiler& compiler) {
  auto plan = std::make_shared<ConstraintPlan>();
  plan->answer = spec.answer;
  plan->answer_allowed = spec.answer_allowed;
  plan->text_tokens = spec.text_tokens;
  std::vector<std::string> headers;
  for (const ConstrainedTool& tool : spec.tools) {
    plan->tools[tool.name] = tool.arguments;
    headers.push_back(kToolPrefix + tool.name);
    headers.push_back(kToolPrefix + tool.name + " ");  // before <|constrain|>json
  }
  if (spec.answer_allowed) headers.push_back("final");
  if (headers.empty()) return invalid_argument("the turn allows neither an answer nor a tool call");
  std::sort(headers.begin(), headers.end());
  std::string key = "harmony header";
  for (const std::string& h : headers) key += "\n" + h;
  MX_ASSIGN_OR_RETURN(plan->header_after_analysis,
                      compiler.compile(key, [&] { return Result<grammar::Grammar>(literal_choice(headers)); }));
  headers.push_back("analysis");
  MX_ASSIGN_OR_RETURN(plan->header, compiler.compile(key + "\nanalysis", [&] {
                        return Result<grammar::Grammar>(literal_choice(headers));
                      }));
  MX_ASSIGN_OR_RETURN(plan->role, compiler.compile("harmony role", [] {
                        return Result<grammar::Grammar>(literal_choice({"assistant"}));
                      }));
  MX_ASSIGN_OR_RETURN(plan->content_type, compiler.compile("harmony content type", [] {
                        return Result<grammar::Grammar>(literal_choice({"json"}));
                      }));
  return std::shared_ptr<const TurnConstraintPlan>(std::move(plan));
}

}  // namespace mx::harmony
