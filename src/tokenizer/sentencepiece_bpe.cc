#include "tokenizer/sentencepiece_bpe.h"

#include <algorithm>
#include <limits>

#include "tokenizer/bpe_ranks.h"
#include "tokenizer/utf8.h"

namespace mx {
namespace {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;

inline uint64_t mix_pair(uint64_t k) {
  k ^= k >> 31;
  k *= 0x7fb5d329728ea185ULL;
  k ^= k >> 27;
  k *= 0x81dadef4bc2dd44dULL;
  k ^= k >> 33;
  return k;
}

size_t table_size_for(size_t count) {
  size_t cap = 16;
  while (cap < 2 * count) cap <<= 1;
  return cap;
}

// Decodes the code point at text[pos] of valid UTF-8; *len receives its byte length.
uint32_t decode_code_point(std::string_view text, size_t pos, int* len) {
  const auto b0 = static_cast<uint8_t>(text[pos]);
  if (b0 < 0x80) {
    *len = 1;
    return b0;
  }
  const int n = b0 >= 0xF0 ? 4 : b0 >= 0xE0 ? 3 : 2;
  uint32_t cp = n == 2 ? (b0 & 0x1F) : n == 3 ? (b0 & 0x0F) : (b0 & 0x07);
  for (int k = 1; k < n && pos + k < text.size(); ++k) cp = (cp << 6) | (static_cast<uint8_t>(text[pos + k]) & 0x3F);
  *len = n;
  return cp;
}

void replace_all(std::string_view text, std::string_view from, std::string_view to, std::string* out) {
  out->clear();
  size_t pos = 0;
  while (true) {
    const size_t hit = text.find(from, pos);
    if (hit == std::string_view::npos) break;
    out->append(text.substr(pos, hit - pos));
    out->append(to);
    pos = hit + from.size();
  }
  out->append(text.substr(pos));
}

// The byte of a "<0xHH>" token (either hex case), or -1.
int byte_fallback_value(std::string_view token) {
  if (token.size() != 6 || token.substr(0, 3) != "<0x" || token[5] != '>') return -1;
  int v = 0;
  for (int k = 3; k < 5; ++k) {
    const char c = token[k];
    const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

// Strips up to `start` leading and `stop` trailing copies of `content` (one character) from `token`.
std::string strip_token(const std::string& token, const std::string& content, int32_t start, int32_t stop) {
  size_t begin = 0, end = token.size();
  for (int32_t i = 0; i < start && token.compare(begin, content.size(), content) == 0 && begin < end; ++i)
    begin += content.size();
  for (int32_t i = 0; i < stop && end >= begin + content.size() &&
                      token.compare(end - content.size(), content.size(), content) == 0;
       ++i)
    end -= content.size();
  return token.substr(begin, end - begin);
}

struct Symbol {
  int32_t id;
  int32_t prev;
  int32_t next;
  int32_t len;  // bytes covered; 0 once merged into its left neighbour
};

struct Candidate {
  int32_t rank;
  int32_t pos;
  int32_t merged;
};

// Heap order: the lowest rank on top, then the leftmost position.
struct CandidateAfter {
  bool operator()(const Candidate& a, const Candidate& b) const {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  }
};

}  // namespace

Result<std::unique_ptr<const SentencePieceBpe>> SentencePieceBpe::build(SentencePieceBpeSpec spec,
                                                                         const std::vector<AddedToken>& added) {
  auto bpe = std::make_unique<SentencePieceBpe>();
  if (!spec.byte_fallback && spec.unk_id < 0)
    return unimplemented("BPE without byte_fallback needs an unk_token (some text would have no tokens)");
  for (const auto& step : spec.normalizer)
    if (step.kind == NormalizerStep::Kind::kReplace && step.from.empty())
      return invalid_argument("a Replace normalizer has an empty pattern");
  if (spec.split && spec.split->pattern.empty()) return invalid_argument("a Split pre-tokenizer has an empty pattern");
  bpe->normalizer_ = std::move(spec.normalizer);
  bpe->split_ = std::move(spec.split);
  bpe->byte_fallback_ = spec.byte_fallback;
  bpe->fuse_unk_ = spec.fuse_unk;
  bpe->ignore_merges_ = spec.ignore_merges;
  bpe->unk_id_ = spec.unk_id;
  bpe->vocab_ = std::move(spec.vocab);
  const auto& vocab = bpe->vocab_;
  if (spec.unk_id >= static_cast<int64_t>(vocab.size()) || (spec.unk_id >= 0 && vocab[spec.unk_id].empty()))
    return invalid_argument("the unk_token is not in the vocabulary");

  // Vocabulary lookup by string, one-character tokens by code point, byte tokens by byte.
  const size_t vcap = table_size_for(vocab.size());
  bpe->vocab_slots_.assign(vcap, -1);
  bpe->vocab_mask_ = vcap - 1;
  bpe->char_id_.assign(kMaxCodePoint + 1, -1);
  std::fill(std::begin(bpe->byte_id_), std::end(bpe->byte_id_), -1);
  for (size_t id = 0; id < vocab.size(); ++id) {
    const std::string& piece = vocab[id];
    if (piece.empty()) continue;
    if (!utf8_is_valid(piece)) return invalid_argument("vocab id " + std::to_string(id) + " is not valid UTF-8");
    uint64_t slot = hash_bytes(piece) & bpe->vocab_mask_;
    while (bpe->vocab_slots_[slot] >= 0) {
      if (vocab[bpe->vocab_slots_[slot]] == piece) return invalid_argument("vocab entry \"" + piece + "\" appears twice");
      slot = (slot + 1) & bpe->vocab_mask_;
    }
    bpe->vocab_slots_[slot] = static_cast<int32_t>(id);
    int len = 0;
    const uint32_t cp = decode_code_point(piece, 0, &len);
    if (static_cast<size_t>(len) == piece.size()) bpe->char_id_[cp] = static_cast<int32_t>(id);
    const int byte = byte_fallback_value(piece);
    if (byte >= 0) bpe->byte_id_[byte] = static_cast<int32_t>(id);
  }

  // Merges by (left id, right id); a later duplicate replaces an earlier one, as in a Hugging Face map.
  if (spec.merges.size() >= static_cast<size_t>(std::numeric_limits<int32_t>::max()))
    return invalid_argument("too many merges");
  const size_t mcap = table_size_for(spec.merges.size());
  bpe->merges_.assign(mcap, MergeSlot{});
  bpe->merge_mask_ = mcap - 1;
  std::string joined;
  for (size_t rank = 0; rank < spec.merges.size(); ++rank) {
    const auto& [a, b] = spec.merges[rank];
    const int32_t left = bpe->find(a), right = bpe->find(b);
    joined = a + b;
    const int32_t merged = bpe->find(joined);
    if (left < 0 || right < 0 || merged < 0)
      return invalid_argument("merge \"" + a + " " + b + "\" uses or makes a token not in the vocabulary");
    const uint64_t pair = (static_cast<uint64_t>(left) << 32) | static_cast<uint32_t>(right);
    uint64_t slot = mix_pair(pair) & bpe->merge_mask_;
    while (bpe->merges_[slot].merged >= 0 && bpe->merges_[slot].pair != pair) slot = (slot + 1) & bpe->merge_mask_;
    bpe->merges_[slot] = {pair, static_cast<int32_t>(rank), merged};
  }

  // Added tokens matched after normalization, with their text normalized the same way.
  std::vector<AddedToken> normalized;
  for (const auto& t : added) {
    if (!t.normalized) continue;
    AddedToken n = t;
    std::string tmp;
    for (const auto& step : bpe->normalizer_) {
      if (step.kind == NormalizerStep::Kind::kReplace) {
        replace_all(n.text, step.from, step.to, &tmp);
        n.text.swap(tmp);
      } else if (!n.text.empty()) {
        n.text = step.to + n.text;
      }
    }
    normalized.push_back(std::move(n));
  }
  bpe->normalized_added_.build(normalized);

  // Decoded bytes of every id: the decoder steps run per token (Fuse only joins, which concatenation does).
  int32_t size = static_cast<int32_t>(vocab.size());
  for (const auto& t : added) size = std::max(size, t.id + 1);
  std::vector<const std::string*> text_of(size, nullptr);
  for (int32_t id = 0; id < static_cast<int32_t>(vocab.size()); ++id)
    if (!vocab[id].empty()) text_of[id] = &vocab[id];
  for (const auto& t : added) text_of[t.id] = &t.text;  // the added vocabulary wins, as in Hugging Face
  bpe->decoded_offsets_.assign(1, 0);
  bpe->has_token_.assign(size, false);
  bool fused = false;
  for (const auto& step : spec.decoder) {
    if (step.kind == DecoderStep::Kind::kFuse) fused = true;
    // After Fuse a Strip acts on the whole output, which a per-token table cannot express.
    if (step.kind == DecoderStep::Kind::kStrip && fused)
      return unimplemented("a Strip decoder after Fuse (it strips the whole output, not each token)");
  }
  std::string token, tmp;
  for (int32_t id = 0; id < size; ++id) {
    if (text_of[id] != nullptr) {
      bpe->has_token_[id] = true;
      token = *text_of[id];
      bool after_fuse = false;
      for (const auto& step : spec.decoder) {
        switch (step.kind) {
          case DecoderStep::Kind::kReplace:
            replace_all(token, step.from, step.to, &tmp);
            token.swap(tmp);
            break;
          case DecoderStep::Kind::kByteFallback: {
            const int byte = byte_fallback_value(token);
            if (byte >= 0) token.assign(1, static_cast<char>(byte));
            break;
          }
          case DecoderStep::Kind::kFuse:
            after_fuse = true;
            break;
          case DecoderStep::Kind::kStrip:
            if (!after_fuse) token = strip_token(token, step.strip_content, step.strip_start, step.strip_stop);
            break;
        }
      }
      bpe->decoded_.append(token);
    }
    if (bpe->decoded_.size() > std::numeric_limits<uint32_t>::max()) return invalid_argument("vocabulary too large");
    bpe->decoded_offsets_.push_back(static_cast<uint32_t>(bpe->decoded_.size()));
  }
  return std::unique_ptr<const SentencePieceBpe>(std::move(bpe));
}

int32_t SentencePieceBpe::find(std::string_view piece) const {
  if (piece.empty()) return -1;
  for (uint64_t slot = hash_bytes(piece) & vocab_mask_;; slot = (slot + 1) & vocab_mask_) {
    const int32_t id = vocab_slots_[slot];
    if (id < 0) return -1;
    if (vocab_[id] == piece) return id;
  }
}

const SentencePieceBpe::MergeSlot* SentencePieceBpe::find_merge(int32_t left, int32_t right) const {
  const uint64_t pair = (static_cast<uint64_t>(left) << 32) | static_cast<uint32_t>(right);
  for (uint64_t slot = mix_pair(pair) & merge_mask_;; slot = (slot + 1) & merge_mask_) {
    const MergeSlot& m = merges_[slot];
    if (m.pair == pair) return &m;
    if (m.merged < 0) return nullptr;
  }
}

bool SentencePieceBpe::append_token_bytes(int32_t id, std::string* out) const {
  if (id < 0 || id >= size() || !has_token_[id]) return false;
  out->append(decoded_, decoded_offsets_[id], decoded_offsets_[id + 1] - decoded_offsets_[id]);
  return true;
}

void SentencePieceBpe::encode(std::string_view segment, bool specials_as_text, std::vector<int32_t>* out) const {
  thread_local std::string normalized, scratch;
  normalized.assign(segment);
  for (const auto& step : normalizer_) {
    if (step.kind == NormalizerStep::Kind::kReplace) {
      replace_all(normalized, step.from, step.to, &scratch);
      normalized.swap(scratch);
    } else if (!normalized.empty()) {
      normalized.insert(0, step.to);
    }
  }
  // encode_normalized may run on this thread again before `normalized` is done with: keep a private copy.
  const std::string text = normalized;
  if (normalized_added_.empty()) {
    encode_normalized(text, out);
    return;
  }
  normalized_added_.split(
      text, specials_as_text, [&](std::string_view part) { encode_normalized(part, out); },
      [&](int32_t id) { out->push_back(id); });
}

void SentencePieceBpe::encode_normalized(std::string_view text, std::vector<int32_t>* out) const {
  if (!split_) {
    encode_word(text, out);
    return;
  }
  // Pieces of the text: the gaps between matches and the matches, in order (Hugging Face's find_matches),
  // then merged by the behaviour exactly as its Split pre-tokenizer folds them.
  struct Piece {
    size_t begin, end;
    bool is_match;
  };
  std::vector<Piece> pieces;
  const std::string& pat = split_->pattern;
  size_t pos = 0;
  while (true) {
    const size_t hit = text.find(pat, pos);
    if (hit == std::string_view::npos) break;
    if (hit > pos) pieces.push_back({pos, hit, false});
    pieces.push_back({hit, hit + pat.size(), true});
    pos = hit + pat.size();
  }
  if (pos < text.size() || pieces.empty()) pieces.push_back({pos, text.size(), false});

  std::vector<Piece> words;
  bool previous_match = false;
  switch (split_->behavior) {
    case LiteralSplit::Behavior::kRemoved:
      for (const auto& p : pieces)
        if (!p.is_match) words.push_back(p);
      break;
    case LiteralSplit::Behavior::kIsolated:
      words = pieces;
      break;
    case LiteralSplit::Behavior::kMergedWithPrevious:
      for (const auto& p : pieces) {
        if (p.is_match && !previous_match && !words.empty()) words.back().end = p.end;
        else words.push_back(p);
        previous_match = p.is_match;
      }
      break;
    case LiteralSplit::Behavior::kMergedWithNext:
      for (auto it = pieces.rbegin(); it != pieces.rend(); ++it) {
        if (it->is_match && !previous_match && !words.empty()) words.back().begin = it->begin;
        else words.push_back(*it);
        previous_match = it->is_match;
      }
      std::reverse(words.begin(), words.end());
      break;
    case LiteralSplit::Behavior::kContiguous:
      for (size_t i = 0; i < pieces.size(); ++i) {
        if (i > 0 && pieces[i].is_match == previous_match) words.back().end = pieces[i].end;
        else words.push_back(pieces[i]);
        previous_match = pieces[i].is_match;
      }
      break;
  }
  for (const auto& w : words)
    if (w.end > w.begin) encode_word(text.substr(w.begin, w.end - w.begin), out);
}

void SentencePieceBpe::encode_word(std::string_view word, std::vector<int32_t>* out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    const int32_t whole = find(word);
    if (whole >= 0) {
      out->push_back(whole);
      return;
    }
  }
  thread_local std::vector<Symbol> symbols;
  thread_local std::vector<Candidate> heap;
  symbols.clear();
  heap.clear();
  const auto add = [&](int32_t id, int32_t len) {
    const int32_t index = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, index - 1, index + 1, len});
  };
  int32_t pending_unk = 0;  // bytes of unknown text waiting to become one (fused) unk symbol
  const auto flush_unk = [&] {
    if (pending_unk > 0) add(unk_id_, pending_unk);
    pending_unk = 0;
  };
  for (size_t pos = 0; pos < word.size();) {
    int len = 0;
    const uint32_t cp = decode_code_point(word, pos, &len);
    const int32_t id = cp <= kMaxCodePoint ? char_id_[cp] : -1;
    if (id >= 0) {
      flush_unk();
      add(id, len);
    } else {
      bool all_bytes = byte_fallback_;
      for (int k = 0; all_bytes && k < len; ++k) all_bytes = byte_id_[static_cast<uint8_t>(word[pos + k])] >= 0;
      if (all_bytes) {
        flush_unk();
        for (int k = 0; k < len; ++k) add(byte_id_[static_cast<uint8_t>(word[pos + k])], 1);
      } else {
        if (!fuse_unk_) flush_unk();
        pending_unk += len;
      }
    }
    pos += len;
  }
  flush_unk();
  const int32_t n = static_cast<int32_t>(symbols.size());
  symbols.back().next = -1;

  for (int32_t i = 0; i + 1 < n; ++i) {
    if (const MergeSlot* m = find_merge(symbols[i].id, symbols[i + 1].id)) heap.push_back({m->rank, i, m->merged});
  }
  std::make_heap(heap.begin(), heap.end(), CandidateAfter{});
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), CandidateAfter{});
    const Candidate top = heap.back();
    heap.pop_back();
    Symbol& left = symbols[top.pos];
    if (left.len == 0 || left.next < 0) continue;
    const int32_t right_pos = left.next;
    const Symbol right = symbols[right_pos];
    const MergeSlot* now = find_merge(left.id, right.id);
    if (now == nullptr || now->merged != top.merged) continue;  // a stale entry
    left.id = top.merged;
    left.len += right.len;
    left.next = right.next;
    symbols[right_pos].len = 0;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    if (left.prev >= 0) {
      if (const MergeSlot* m = find_merge(symbols[left.prev].id, left.id)) {
        heap.push_back({m->rank, left.prev, m->merged});
        std::push_heap(heap.begin(), heap.end(), CandidateAfter{});
      }
    }
    if (left.next >= 0) {
      if (const MergeSlot* m = find_merge(left.id, symbols[left.next].id)) {
        heap.push_back({m->rank, top.pos, m->merged});
        std::push_heap(heap.begin(), heap.end(), CandidateAfter{});
      }
    }
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next) out->push_back(symbols[i].id);
}

}  // namespace mx
