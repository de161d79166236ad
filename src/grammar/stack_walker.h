// Running the pushdown automaton over bytes. A stack is an entry (node, parent) in a StackPool, interned
// (hash-consed) so equal stacks share one id and a set of stacks is a set of ints: alternatives of an
// ambiguous grammar share their common part (a tree-shaped, persistent stack) and old states stay valid
// for rollback. A state is the set of stacks whose top can consume a byte (`tops`) and whether the whole
// match may end here.
//
// Parents below zero are not stacks: kBottom sits under the root rule (finishing it ends the match), and
// context_sentinel(rule) stands for "whatever called `rule`", used when token masks are precomputed per
// node without knowing the stack (token_masker.h): finishing the rule continues at its unique return node
// when the grammar has one, else the walk reports that it left the known context.
#pragma once

#include <cstdint>
#include <vector>

#include "grammar/automaton.h"

namespace mx::grammar {

inline constexpr int32_t kBottom = -1;
inline int32_t context_sentinel(int32_t rule) { return -2 - rule; }

class StackPool {
 public:
  StackPool();
  int32_t intern(int32_t node, int32_t parent);
  int32_t node(int32_t s) const { return entries_[s].node; }
  int32_t parent(int32_t s) const { return entries_[s].parent; }
  int64_t size() const { return static_cast<int64_t>(entries_.size()); }
  // Removes the entries added after size() was `mark` (stacks made by a trial walk).
  void truncate(int64_t mark);

 private:
  struct Entry {
    int32_t node;
    int32_t parent;
  };
  size_t slot_of(int32_t node, int32_t parent) const;
  void grow();

  std::vector<Entry> entries_;
  std::vector<int32_t> table_;  // open addressing, linear probing; -1 empty. LIFO removal keeps it valid.
};

struct StepResult {
  std::vector<int32_t> tops;  // stacks whose top node has byte edges
  bool can_end = false;       // the root finished: the match may end here
  bool left_context = false;  // a precomputation walk finished a rule whose caller is not known
  void clear() {
    tops.clear();
    can_end = false;
    left_context = false;
  }
};

class StackWalker {
 public:
  StackWalker(const Automaton& automaton, StackPool* pool) : a_(automaton), pool_(pool) {}

  // The state reached by expanding stack `s` (calls pushed, finished rules popped).
  void start(int32_t s, StepResult* out);
  // The state after consuming `byte` from any of `tops`.
  void advance(const std::vector<int32_t>& tops, uint8_t byte, StepResult* out);

 private:
  void begin_round();
  void expand(int32_t s, StepResult* out);
  void finish_rule(int32_t parent, StepResult* out);

  const Automaton& a_;
  StackPool* pool_;
  std::vector<uint32_t> seen_;  // per stack id: the round that expanded it
  uint32_t round_ = 0;
};

}  // namespace mx::grammar
