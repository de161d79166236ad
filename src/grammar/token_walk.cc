#include "grammar/token_walk.h"

namespace mx::grammar {

TokenWalk::TokenWalk(const Automaton& automaton, StackPool* pool, const TokenVocabulary& vocab)
    : walker_(automaton, pool), vocab_(vocab) {
  levels_.resize(static_cast<size_t>(vocab.max_token_bytes()) + 1);
  exited_.resize(levels_.size(), 0);
}

void TokenWalk::step(int32_t depth, uint8_t byte) {
  walker_.advance(levels_[depth].tops, byte, &levels_[depth + 1]);
  exited_[depth + 1] = exited_[depth] | static_cast<uint8_t>(levels_[depth + 1].left_context);
}

}  // namespace mx::grammar
