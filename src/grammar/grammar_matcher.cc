#include "grammar/grammar_matcher.h"

#include <algorithm>

namespace mx::grammar {

Result<std::shared_ptr<const CompiledGrammar>> CompiledGrammar::create(const Grammar& grammar,
                                                                       std::shared_ptr<const TokenVocabulary> vocab,
                                                                       const CompileLimits& limits) {
  MX_ASSIGN_OR_RETURN(Automaton automaton, Automaton::compile(grammar, limits));
  return std::make_shared<const CompiledGrammar>(std::move(automaton), std::move(vocab));
}

std::shared_ptr<const NodeMasks> CompiledGrammar::node_masks(int32_t node) const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = cache_.find(node);
    if (it != cache_.end()) return it->second;
  }
  // Computed outside the lock: two requests may race to build the same entry; both results are equal.
  auto masks = compute_node_masks(node);
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, inserted] = cache_.emplace(node, std::move(masks));
  if (inserted) cache_bytes_ += it->second->bytes();
  return it->second;
}

int64_t CompiledGrammar::cache_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cache_bytes_;
}

std::shared_ptr<const NodeMasks> CompiledGrammar::compute_node_masks(int32_t node) const {
  StackPool pool;
  TokenWalk walk(automaton_, &pool, *vocab_);
  const std::vector<int32_t> tops{pool.intern(node, context_sentinel(automaton_.node(node).rule))};
  std::vector<int32_t> accepted;
  auto masks = std::make_shared<NodeMasks>();
  walk.run(tops, nullptr, [&](int32_t index, TokenClass c) {
    if (c == TokenClass::kAccepted) {
      accepted.push_back(vocab_->sorted_id(index));
    } else if (c == TokenClass::kDependent) {
      masks->dependent.push_back(index);
    }
  });
  if (static_cast<int64_t>(accepted.size()) * 32 > vocab_->size()) {  // a list would outweigh a bitmask
    masks->accepted_words.assign(vocab_->mask_words(), 0);
    for (int32_t id : accepted) masks->accepted_words[id >> 5] |= uint32_t{1} << (id & 31);
  } else {
    std::sort(accepted.begin(), accepted.end());
    masks->accepted_ids = std::move(accepted);
  }
  return masks;
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar)
    : grammar_(std::move(grammar)),
      walker_(grammar_->automaton(), &pool_),
      token_walk_(grammar_->automaton(), &pool_, grammar_->vocab()) {
  const Automaton& a = grammar_->automaton();
  StepResult start;
  walker_.start(pool_.intern(a.rule_start(a.root()), kBottom), &start);
  history_.push_back(State{start.tops, start.can_end});
}

bool GrammarMatcher::advance(std::string_view bytes, State* out) {
  const State& cur = history_.back();
  scratch_[0].tops = cur.tops;
  int from = 0;
  for (char c : bytes) {
    walker_.advance(scratch_[from].tops, static_cast<uint8_t>(c), &scratch_[1 - from]);
    from = 1 - from;
    if (scratch_[from].tops.empty() && !scratch_[from].can_end) return false;
  }
  if (bytes.empty()) return false;
  // A byte after the end is refused above only when no stack is left; end-only states have no tops.
  out->tops = scratch_[from].tops;
  std::sort(out->tops.begin(), out->tops.end());
  out->can_end = scratch_[from].can_end;
  return true;
}

bool GrammarMatcher::accept_bytes(std::string_view bytes) {
  State next;
  if (!advance(bytes, &next)) return false;
  history_.push_back(std::move(next));
  return true;
}

bool GrammarMatcher::accept_token(int32_t id) {
  if (id < 0 || id >= grammar_->vocab().size()) return false;
  return accept_bytes(grammar_->vocab().bytes(id));
}

void GrammarMatcher::rollback(int32_t n) {
  n = std::min(n, num_accepted());
  history_.resize(history_.size() - n);
}

void GrammarMatcher::fill_mask(uint32_t* words) {
  const TokenVocabulary& vocab = grammar_->vocab();
  std::fill(words, words + vocab.mask_words(), 0u);
  const int64_t mark = pool_.size();
  for (int32_t s : history_.back().tops) {
    const auto masks = grammar_->node_masks(pool_.node(s));
    if (!masks->accepted_words.empty()) {
      for (size_t w = 0; w < masks->accepted_words.size(); ++w) words[w] |= masks->accepted_words[w];
    } else {
      for (int32_t id : masks->accepted_ids) words[id >> 5] |= uint32_t{1} << (id & 31);
    }
    if (masks->dependent.empty()) continue;
    single_top_.assign(1, s);
    token_walk_.run(single_top_, &masks->dependent, [&](int32_t index, TokenClass c) {
      if (c != TokenClass::kAccepted) return;
      const int32_t id = vocab.sorted_id(index);
      words[id >> 5] |= uint32_t{1} << (id & 31);
    });
  }
  pool_.truncate(mark);  // the trial walks' stacks are not part of any state
}

}  // namespace mx::grammar
