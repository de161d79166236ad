// A grammar compiled against one vocabulary (CompiledGrammar, shared by every request that uses it) and the
// per-request matcher that follows the generated tokens and writes the token bitmask of each step.
//
// Masks: a state is a set of stacks; each stack's top node has a precomputed NodeMasks (built the first
// time any request reaches that node, then shared): the tokens accepted whatever lies below the top
// (context-independent), and the few that finish a rule whose caller the grammar cannot tell (dependent).
// A step's mask is the union over the stacks of the accepted set plus the dependent tokens that the real
// stack accepts, checked by a sorted walk. Node masks are computed with the context the grammar implies
// (a rule with one call site returns to it), so for schemas compiled to call-free expressions almost
// every token is decided by the cache.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "grammar/automaton.h"
#include "grammar/stack_walker.h"
#include "grammar/token_vocabulary.h"
#include "grammar/token_walk.h"

namespace mx::grammar {

// The tokens a node's byte edges decide. Accepted ids as a bitmask (uint32 words over the vocabulary) when
// many, else as a list; dependent tokens as sorted-vocabulary indices, ascending.
struct NodeMasks {
  std::vector<uint32_t> accepted_words;
  std::vector<int32_t> accepted_ids;
  std::vector<int32_t> dependent;
  int64_t bytes() const { return 4 * static_cast<int64_t>(accepted_words.size() + accepted_ids.size() + dependent.size()); }
};

class CompiledGrammar {
 public:
  static Result<std::shared_ptr<const CompiledGrammar>> create(const Grammar& grammar,
                                                               std::shared_ptr<const TokenVocabulary> vocab,
                                                               const CompileLimits& limits = {});

  const Automaton& automaton() const { return automaton_; }
  const TokenVocabulary& vocab() const { return *vocab_; }
  // The masks of `node` (a node with byte edges), computed on first use; thread-safe.
  std::shared_ptr<const NodeMasks> node_masks(int32_t node) const;
  // Bytes held by the node-mask cache so far.
  int64_t cache_bytes() const;

  CompiledGrammar(Automaton automaton, std::shared_ptr<const TokenVocabulary> vocab)
      : automaton_(std::move(automaton)), vocab_(std::move(vocab)) {}

 private:
  std::shared_ptr<const NodeMasks> compute_node_masks(int32_t node) const;

  Automaton automaton_;
  std::shared_ptr<const TokenVocabulary> vocab_;
  mutable std::mutex mu_;
  mutable std::unordered_map<int32_t, std::shared_ptr<const NodeMasks>> cache_;
  mutable int64_t cache_bytes_ = 0;
};

class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar);

  // Advances by the token's bytes; false (and no change) when the grammar does not allow it.
  bool accept_token(int32_t id);
  bool accept_bytes(std::string_view bytes);
  // Undoes the last `n` accepted tokens (or byte strings); n <= num_accepted().
  void rollback(int32_t n);
  int32_t num_accepted() const { return static_cast<int32_t>(history_.size()) - 1; }

  // The match may end here (the caller allows its end tokens).
  bool can_end() const { return history_.back().can_end; }
  // Nothing but the end may follow.
  bool must_end() const { return history_.back().tops.empty(); }
  // Writes the allowed tokens of this step: bit (id % 32) of words[id / 32], vocab().mask_words() words.
  // End tokens are the caller's to add (can_end()).
  void fill_mask(uint32_t* words);

  const CompiledGrammar& grammar() const { return *grammar_; }

 private:
  struct State {
    std::vector<int32_t> tops;
    bool can_end = false;
  };
  bool advance(std::string_view bytes, State* out);

  std::shared_ptr<const CompiledGrammar> grammar_;
  StackPool pool_;
  StackWalker walker_;
  TokenWalk token_walk_;
  std::vector<State> history_;  // history_[0]: the start; one entry per accepted token
  StepResult scratch_[2];
  std::vector<int32_t> single_top_;
};

}  // namespace mx::grammar
