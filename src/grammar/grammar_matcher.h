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
//
// A node's masks cost one walk of the sorted vocabulary (a few ms at 201k tokens). They are built once per
// node, by precompute_masks (run on background threads right after compilation, nodes nearest the start
// first: grammar/mask_precompute.h) or by the first matcher that needs a node not built yet; a matcher that
// needs a node another thread is building waits for it instead of building it twice.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string_view>
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
  // The masks of `node` (a node with byte edges), built here if nobody has yet; thread-safe.
  std::shared_ptr<const NodeMasks> node_masks(int32_t node) const;
  // Bytes held by the node-mask cache so far.
  int64_t cache_bytes() const;

  // Builds the masks of nodes not built yet, in order of distance from the start (bytes and calls), until
  // all are built, `stop` is set, or the cache holds `max_cache_bytes`. Several threads may run it on one
  // grammar at once (each takes the next node). Returns how many nodes this call built.
  int64_t precompute_masks(const std::atomic<bool>& stop, int64_t max_cache_bytes) const;
  // Nodes with byte edges (those that have masks), and how many of them node_masks built on demand
  // (a matcher found them missing) rather than precompute_masks.
  int64_t num_mask_nodes() const { return static_cast<int64_t>(precompute_order_.size()); }
  int64_t masks_built_on_demand() const;

  CompiledGrammar(Automaton automaton, std::shared_ptr<const TokenVocabulary> vocab);

 private:
  enum class SlotState : uint8_t { kMissing, kBuilding, kBuilt };
  std::shared_ptr<const NodeMasks> compute_node_masks(int32_t node) const;
  // Builds `node` unless it is built or being built (then returns false at once, or waits when `wait`).
  std::shared_ptr<const NodeMasks> build_or_wait(int32_t node, bool wait, bool on_demand) const;

  Automaton automaton_;
  std::shared_ptr<const TokenVocabulary> vocab_;
  std::vector<int32_t> precompute_order_;  // nodes with byte edges, breadth first from the start
  mutable std::atomic<size_t> next_precompute_{0};
  mutable std::mutex mu_;
  mutable std::condition_variable built_;
  mutable std::vector<SlotState> state_;                         // per node
  mutable std::vector<std::shared_ptr<const NodeMasks>> masks_;  // per node, once built
  mutable int64_t cache_bytes_ = 0;
  mutable int64_t built_on_demand_ = 0;
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
