#include "chat/chat_constraint.h"

#include <algorithm>

#include "tokenizer/utf8.h"

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

void ReasoningBudget::accept(const grammar::TokenVocabulary& vocab, int32_t token) {
  ++tokens_;
  if (token >= 0 && token < vocab.size()) unfinished_ += vocab.bytes(token);
  unfinished_.erase(0, unfinished_.size() - static_cast<size_t>(utf8_unfinished_tail(unfinished_)));
}

void ReasoningBudget::fill_mask(const grammar::TokenVocabulary& vocab, const std::vector<uint32_t>& text, int32_t close,
                                uint32_t* words, int64_t model_vocab) const {
  if (budget_ < 0 || tokens_ < budget_) {
    write_text_mask(text, words, model_vocab);
    set_token_if_in(words, model_vocab, close);
    return;
  }
  std::fill(words, words + (model_vocab + 31) / 32, 0u);
  if (!unfinished_.empty() && tokens_ - budget_ < kMaxUtf8Overrun) {
    // Tokens of continuation bytes only, which leave the character whole or still a valid prefix: scanned
    // here, in at most kMaxUtf8Overrun steps of a request, rather than indexed for every request.
    bool any = false;
    const int64_t text_ids = int64_t{32} * static_cast<int64_t>(text.size());
    const auto n = static_cast<int32_t>(std::min<int64_t>({vocab.size(), model_vocab, text_ids}));
    std::string candidate;
    for (int32_t id = 0; id < n; ++id) {
      const std::string& b = vocab.bytes(id);
      const bool continuation = !b.empty() && b.size() <= 3 && (static_cast<uint8_t>(b[0]) & 0xC0) == 0x80;
      if (!continuation || !((text[id >> 5] >> (id & 31)) & 1u)) continue;
      candidate = unfinished_ + b;
      int subpart = 0;
      const int whole = utf8_sequence_length(candidate, 0, &subpart);
      if (static_cast<size_t>(whole) != candidate.size() && static_cast<size_t>(subpart) != candidate.size()) continue;
      set_token(words, id);
      any = true;
    }
    if (any) return;
  }
  set_token_if_in(words, model_vocab, close);
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
