#include "chat/gemma4/gemma4_constraint.h"

#include <algorithm>
#include <optional>
#include <string>

namespace mx::gemma4 {
namespace {

constexpr char kCallPrefix[] = "call:";

using grammar::GrammarMatcher;

class Constraint final : public TokenConstraint {
 public:
  Constraint(std::shared_ptr<const ConstraintPlan> plan, int64_t reasoning_budget)
      : plan_(std::move(plan)), ids_(plan_->ids), reasoning_(reasoning_budget),
        can_think_(plan_->thinking && reasoning_budget != 0) {
    open();
  }

  bool fill_mask(uint32_t* words, int64_t vocab) override {
    const int64_t n = (vocab + 31) / 32;
    switch (phase_) {
      case Phase::kOpen:
        if (!plan_->answer_allowed) {
          std::fill(words, words + n, 0u);
        } else {
          answer_mask(words, vocab);
        }
        if (can_think_) set_token_if_in(words, vocab, ids_.channel_open);
        if (!plan_->tools.empty()) set_token_if_in(words, vocab, ids_.tool_call_open);
        return true;
      case Phase::kLabel:
        write_matcher_mask(*matcher_, &scratch_, words, vocab);
        return true;
      case Phase::kThought:  // free text and <channel|>; only <channel|> once the budget is spent
        reasoning_.fill_mask(plan_->text_vocab(), *plan_->text_tokens, ids_.channel_close, words, vocab);
        return true;
      case Phase::kAnswer:
        answer_mask(words, vocab);
        if (!matcher_ && !plan_->tools.empty()) set_token_if_in(words, vocab, ids_.tool_call_open);
        return true;
      case Phase::kName: {
        write_matcher_mask(*matcher_, &scratch_, words, vocab);
        const auto* args = complete_name_arguments();
        if (args) {  // the name may end here: the arguments' first tokens too
          GrammarMatcher first(*args);
          std::vector<uint32_t> more(static_cast<size_t>(n));
          write_matcher_mask(first, &scratch_, more.data(), vocab);
          for (int64_t i = 0; i < n; ++i) words[i] |= more[i];
        }
        return true;
      }
      case Phase::kArgs:
        write_matcher_mask(*matcher_, &scratch_, words, vocab);
        if (matcher_->can_end()) set_token_if_in(words, vocab, ids_.tool_call_close);
        return true;
      case Phase::kAfterCall:
        std::fill(words, words + n, 0u);
        set_token_if_in(words, vocab, ids_.tool_response);
        if (plan_->parallel_tool_calls) set_token_if_in(words, vocab, ids_.tool_call_open);
        return true;
      case Phase::kDone: return false;
    }
    return false;
  }

  void accept(int32_t token) override {
    switch (phase_) {
      case Phase::kOpen:
        if (token == ids_.channel_open && can_think_) {
          phase_ = Phase::kLabel;
          matcher_.emplace(plan_->label);
          return;
        }
        if (token == ids_.tool_call_open && !plan_->tools.empty()) return start_call();
        if (!plan_->answer_allowed) return give_up();
        phase_ = Phase::kAnswer;
        return accept_answer(token);
      case Phase::kLabel:
        if (!matcher_->accept_token(token)) return give_up();
        if (matcher_->must_end()) {
          phase_ = Phase::kThought;
          matcher_.reset();
        }
        return;
      case Phase::kThought:
        if (token == ids_.channel_close) {
          can_think_ = false;
          open();
        } else {
          reasoning_.accept(plan_->text_vocab(), token);
        }
        return;
      case Phase::kAnswer:
        if (token == ids_.tool_call_open && !matcher_ && !plan_->tools.empty()) return start_call();
        return accept_answer(token);
      case Phase::kName: {
        if (matcher_->accept_token(token)) {
          name_ += matcher_->grammar().vocab().bytes(token);
          return;
        }
        const auto* args = complete_name_arguments();
        if (!args) return give_up();
        matcher_.emplace(*args);
        phase_ = Phase::kArgs;
        if (!matcher_->accept_token(token)) give_up();
        return;
      }
      case Phase::kArgs:
        if (token == ids_.tool_call_close && matcher_->can_end()) {
          phase_ = Phase::kAfterCall;
          matcher_.reset();
          return;
        }
        if (!matcher_->accept_token(token)) give_up();
        return;
      case Phase::kAfterCall:
        if (token == ids_.tool_call_open && plan_->parallel_tool_calls) return start_call();
        if (token == ids_.tool_response) phase_ = Phase::kDone;
        else give_up();
        return;
      case Phase::kDone: return;
    }
  }

 private:
  enum class Phase { kOpen, kLabel, kThought, kAnswer, kName, kArgs, kAfterCall, kDone };

  // Before the answer's first token: a fresh matcher of the answer's grammar (none for a free answer).
  void open() {
    phase_ = Phase::kOpen;
    if (plan_->answer) {
      matcher_.emplace(plan_->answer);
    } else {
      matcher_.reset();
    }
  }
  void start_call() {
    phase_ = Phase::kName;
    name_.clear();
    matcher_.emplace(plan_->names);
  }
  bool is_end(int32_t token) const { return token == ids_.turn_end || token == ids_.eos; }
  bool is_text(int32_t token) const {
    const std::vector<uint32_t>& text = *plan_->text_tokens;
    return token >= 0 && static_cast<size_t>(token >> 5) < text.size() && ((text[token >> 5] >> (token & 31)) & 1u);
  }
  // The answer's allowed tokens and, once it may end, its end tokens.
  void answer_mask(uint32_t* words, int64_t vocab) {
    if (matcher_) {
      write_matcher_mask(*matcher_, &scratch_, words, vocab);
      if (!matcher_->can_end()) return;
    } else {
      write_text_mask(*plan_->text_tokens, words, vocab);
    }
    set_token_if_in(words, vocab, ids_.turn_end);
    set_token_if_in(words, vocab, ids_.eos);
  }
  void accept_answer(int32_t token) {
    if (is_end(token) && (!matcher_ || matcher_->can_end())) {
      phase_ = Phase::kDone;
      return;
    }
    if (matcher_ ? !matcher_->accept_token(token) : !is_text(token)) give_up();
  }
  // The arguments' grammar when the name written so far is a whole tool name; null otherwise.
  const std::shared_ptr<const grammar::CompiledGrammar>* complete_name_arguments() const {
    if (!matcher_->can_end() || name_.size() < sizeof(kCallPrefix) - 1) return nullptr;
    auto it = plan_->tools.find(name_.substr(sizeof(kCallPrefix) - 1));
    return it == plan_->tools.end() ? nullptr : &it->second;
  }
  // A token the structure does not expect (a test's forced transcript): stop constraining rather than guess.
  void give_up() {
    phase_ = Phase::kDone;
    matcher_.reset();
  }

  std::shared_ptr<const ConstraintPlan> plan_;
  const ConstraintIds ids_;
  ReasoningBudget reasoning_;
  bool can_think_;
  Phase phase_ = Phase::kOpen;
  std::optional<GrammarMatcher> matcher_;
  std::string name_;
  std::vector<uint32_t> scratch_;
};

}  // namespace

std::shared_ptr<TokenConstraint> ConstraintPlan::make(int64_t reasoning_budget) const {
  auto self = std::static_pointer_cast<const ConstraintPlan>(shared_from_this());
  return std::make_shared<Constraint>(std::move(self), reasoning_budget);
}

Result<std::shared_ptr<const TurnConstraintPlan>> plan_constraint(const TurnConstraintSpec& spec, const ConstraintIds& ids,
                                                                  GrammarCompiler& compiler) {
  auto plan = std::make_shared<ConstraintPlan>();
  plan->ids = ids;
  plan->thinking = spec.thinking.value_or(false);
  plan->answer = spec.answer;
  plan->answer_allowed = spec.answer_allowed;
  plan->parallel_tool_calls = spec.parallel_tool_calls;
  plan->text_tokens = spec.text_tokens;
  if (!spec.answer_allowed && spec.tools.empty()) return invalid_argument("the turn allows neither an answer nor a tool call");
  MX_ASSIGN_OR_RETURN(plan->label, compiler.compile("gemma4 thought label", [] {
                        return Result<grammar::Grammar>(literal_choice({"thought\n"}));
                      }));
  if (!spec.tools.empty()) {
    std::vector<std::string> names;
    for (const ConstrainedTool& tool : spec.tools) {
      plan->tools[tool.name] = tool.arguments;
      names.push_back(kCallPrefix + tool.name);
    }
    std::sort(names.begin(), names.end());
    std::string key = "gemma4 call names";
    for (const std::string& name : names) key += "\n" + name;
    MX_ASSIGN_OR_RETURN(plan->names, compiler.compile(key, [&] { return Result<grammar::Grammar>(literal_choice(names)); }));
  }
  return std::shared_ptr<const TurnConstraintPlan>(std::move(plan));
}

}  // namespace mx::gemma4
