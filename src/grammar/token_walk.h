// Classifying tokens against a state by walking them in sorted-byte order: the states after each prefix
// byte are kept per depth, so a token only advances the bytes it does not share with the one before (the
// sorted list is walked as a trie), and once a prefix is dead every following token with that prefix is
// decided by one comparison.
//
// A token is accepted when all its bytes are consumed (it may end exactly where the grammar may end, or,
// in a precomputation walk, where the known context ends); dependent when, before its last byte, a walk
// finished a rule whose caller is unknown (only the real stack can decide); rejected otherwise.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "grammar/stack_walker.h"
#include "grammar/token_vocabulary.h"

namespace mx::grammar {

enum class TokenClass : uint8_t { kRejected, kAccepted, kDependent };

class TokenWalk {
 public:
  TokenWalk(const Automaton& automaton, StackPool* pool, const TokenVocabulary& vocab);

  // Calls on_token(sorted index, class) for each of `sorted_indices` (ascending) from the state `tops`;
  // all of the sorted vocabulary when sorted_indices is null.
  template <typename OnToken>
  void run(const std::vector<int32_t>& tops, const std::vector<int32_t>* sorted_indices, OnToken&& on_token);

 private:
  // Advances level `depth` by `byte` into level depth + 1.
  void step(int32_t depth, uint8_t byte);

  StackWalker walker_;
  const TokenVocabulary& vocab_;
  std::vector<StepResult> levels_;  // levels_[d]: the state after d bytes of the current token
  std::vector<uint8_t> exited_;     // exited_[d]: the known context was left within the first d bytes
};

template <typename OnToken>
void TokenWalk::run(const std::vector<int32_t>& tops, const std::vector<int32_t>* sorted_indices, OnToken&& on_token) {
  levels_[0].clear();
  levels_[0].tops = tops;
  exited_[0] = 0;
  const int64_t count = sorted_indices ? static_cast<int64_t>(sorted_indices->size()) : vocab_.num_sorted();
  const std::string* prev = nullptr;
  int32_t computed = 0;   // levels_[0..computed] hold the previous token's prefix states
  int32_t dead_at = -1;   // the depth at which the previous token's walk died, if it did
  for (int64_t i = 0; i < count; ++i) {
    const int32_t index = sorted_indices ? (*sorted_indices)[i] : static_cast<int32_t>(i);
    const std::string& t = vocab_.sorted_bytes(index);
    const int32_t len = static_cast<int32_t>(t.size());
    int32_t shared = 0;
    if (prev) {
      const int32_t limit = std::min<int32_t>(static_cast<int32_t>(prev->size()), len);
      while (shared < limit && (*prev)[shared] == t[shared]) ++shared;
    }
    prev = &t;
    int32_t depth = std::min(shared, computed);
    if (dead_at >= 0 && dead_at <= depth) {
      on_token(index, exited_[dead_at] ? TokenClass::kDependent : TokenClass::kRejected);
      continue;
    }
    dead_at = -1;
    while (depth < len) {
      step(depth, static_cast<uint8_t>(t[depth]));
      ++depth;
      computed = depth;
      if (levels_[depth].tops.empty() && depth < len) {
        dead_at = depth;
        break;
      }
    }
    if (dead_at >= 0) {
      on_token(index, exited_[dead_at] ? TokenClass::kDependent : TokenClass::kRejected);
      continue;
    }
    const StepResult& last = levels_[len];
    if (!last.tops.empty() || last.can_end || last.left_context) {
      on_token(index, TokenClass::kAccepted);
    } else {
      dead_at = len;
      on_token(index, exited_[len] ? TokenClass::kDependent : TokenClass::kRejected);
    }
  }
}

}  // namespace mx::grammar
