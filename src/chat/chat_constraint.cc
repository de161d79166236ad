#include "chat/chat_constraint.h"

#include <algorithm>

namespace mx {

void write_text_mask(const std::vector<uint32_t>& text, uint32_t* words, int64_t vocab) {
  const int64_t n = (vocab + 31) / 32;
  std::fill(words, words + n, 0u);
  std::copy(text.begin(), text.begin() + std::min<int64_t>(n, static_cast<int64_t>(text.size())), words);
}

void write_matcher_mask(grammar::GrammarMatcher& matcher, std::vector<uint32_t>* scratch, uint32_t* words, int64_t vocab) {
  scratch->resize(static_cast<size_t>(matcher.grammar().vocab().mask_words()));
  matcher.fill_mask(scratch->data());
  write_text_mask(*scratch, words, vocab);
}

grammar::Grammar literal_choice(const std::vector<std::string>& options) {
  grammar::Grammar g;
  g.root = g.add_rule("root");
  std::vector<grammar::Expr> alts;
  for (const std::string& o : options) alts.push_back(grammar::literal(o));
  g.rules[g.root].body = grammar::alt(std::move(alts));
  return g;
}

}  // namespace mx
