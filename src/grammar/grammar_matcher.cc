#include "grammar/grammar_matcher.h"

#include <algorithm>

namespace mx::grammar {

Result<std::shared_ptr<const CompiledGrammar>> CompiledGrammar::create(const Grammar& grammar,
                                                                       std::shared_ptr<const TokenVocabulary> vocab,
                                                                       const CompileLimits& limits) {
  MX_ASSIGN_OR_RETURN(Automaton automaton, Automaton::compile(grammar, limits));
  return std::make_shared<const CompiledGrammar>(std::move(automaton), std::move(vocab));
}

namespace {

// Nodes with byte edges in breadth-first order from the root's start over byte edges and calls (a callee's
// start and the node it returns to): the order in which a match is likely to reach them.
std::vector<int32_t> breadth_first_byte_nodes(const Automaton& a) {
  std::vector<uint8_t> seen(static_cast<size_t>(a.num_nodes()), 0);
  std::vector<int32_t> queue, order;
  auto visit = [&](int32_t n) {
    if (!seen[n]) {
      seen[n] = 1;
      queue.push_back(n);
    }
  };
  visit(a.rule_start(a.root()));
  for (size_t i = 0; i < queue.size(); ++i) {
    const int32_t n = queue[i];
    if (a.has_byte_edges(n)) order.push_back(n);
    for (const ByteEdge* e = a.byte_edges_begin(n); e != a.byte_edges_end(n); ++e) visit(e->target);
    for (const CallEdge* c = a.call_edges_begin(n); c != a.call_edges_end(n); ++c) {
      visit(a.rule_start(c->rule));
      visit(c->ret);
    }
  }
  return order;
}

}  // namespace

CompiledGrammar::CompiledGrammar(Automaton automaton, std::shared_ptr<const TokenVocabulary> vocab)
    : automaton_(std::move(automaton)),
      vocab_(std::move(vocab)),
      precompute_order_(breadth_first_byte_nodes(automaton_)),
      state_(static_cast<size_t>(automaton_.num_nodes()), SlotState::kMissing),
      masks_(static_cast<size_t>(automaton_.num_nodes())) {}

std::shared_ptr<const NodeMasks> CompiledGrammar::node_masks(int32_t node) const {
  return build_or_wait(node, /*wait=*/true, /*on_demand=*/true);
}

std::shared_ptr<const NodeMasks> CompiledGrammar::build_or_wait(int32_t node, bool wait, bool on_demand) const {
  {
    std::unique_lock<std::mutex> lock(mu_);
    while (state_[node] == SlotState::kBuilding) {
      if (!wait) return nullptr;
      built_.wait(lock);
    }
    if (state_[node] == SlotState::kBuilt) return on_demand ? masks_[node] : nullptr;
    state_[node] = SlotState::kBuilding;
  }
  std::shared_ptr<const NodeMasks> masks = compute_node_masks(node);
  {
    std::lock_guard<std::mutex> lock(mu_);
    masks_[node] = masks;
    state_[node] = SlotState::kBuilt;
    cache_bytes_ += masks->bytes();
    built_on_demand_ += on_demand ? 1 : 0;
  }
  built_.notify_all();
  return masks;
}

int64_t CompiledGrammar::precompute_masks(const std::atomic<bool>& stop, int64_t max_cache_bytes) const {
  int64_t built = 0;
  while (!stop.load(std::memory_order_relaxed) && cache_bytes() < max_cache_bytes) {
    const size_t i = next_precompute_.fetch_add(1);
    if (i >= precompute_order_.size()) break;
    built += build_or_wait(precompute_order_[i], /*wait=*/false, /*on_demand=*/false) ? 1 : 0;
  }
  return built;
}

int64_t CompiledGrammar::cache_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cache_bytes_;
}

int64_t CompiledGrammar::masks_built_on_demand() const {
  std::lock_guard<std::mutex> lock(mu_);
  return built_on_demand_;
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
