#include "tokenizer/tokenizer.h"

#include <algorithm>

#include "tokenizer/utf8.h"

namespace mx {

Status add_implied_specials(std::vector<SpecialToken>* specials, std::span<const SpecialToken> implied) {
  std::unordered_map<std::string, int32_t> have;
  for (const auto& s : *specials) have.emplace(s.text, s.id);
  for (const auto& w : implied) {
    auto it = have.find(w.text);
    if (it == have.end()) {
      specials->push_back(w);
    } else if (it->second != w.id) {
      return invalid_argument("special token " + w.text + " has id " + std::to_string(it->second) +
                              ", but the model's chat format needs " + std::to_string(w.id));
    }
  }
  return Status::ok();
}

Result<std::shared_ptr<const Tokenizer>> Tokenizer::create(std::vector<std::string> tokens,
                                                           std::vector<SpecialToken> specials,
                                                           const std::string& pattern) {
  auto tok = std::make_shared<Tokenizer>();
  MX_ASSIGN_OR_RETURN(tok->ranks_, BpeRanks::build(std::move(tokens)));
  MX_ASSIGN_OR_RETURN(tok->pretokenizer_, Pretokenizer::compile(pattern));
  tok->vocab_size_ = tok->ranks_.size();
  for (const auto& s : specials) {
    if (s.text.empty()) return invalid_argument("a special token has empty text");
    if (s.id < 0) return invalid_argument("special token " + s.text + " has a negative id");
    if (!tok->ranks_.bytes_of(s.id).empty())
      return invalid_argument("special token " + s.text + " reuses the id of an ordinary token (" +
                              std::to_string(s.id) + ")");
    auto [it, inserted] = tok->special_ids_.emplace(s.text, s.id);
    if (!inserted && it->second != s.id)
      return invalid_argument("special token " + s.text + " is given two ids");
    tok->special_text_.emplace(s.id, s.text);
    tok->max_special_len_ = std::max(tok->max_special_len_, s.text.size());
    tok->vocab_size_ = std::max(tok->vocab_size_, s.id + 1);
  }
  return std::shared_ptr<const Tokenizer>(std::move(tok));
}

Result<std::shared_ptr<const Tokenizer>> Tokenizer::create_sentencepiece(SentencePieceBpeSpec spec,
                                                                         std::vector<AddedToken> added,
                                                                         std::optional<int32_t> bos_id) {
  auto tok = std::make_shared<Tokenizer>();
  for (const auto& t : added) {
    if (t.text.empty()) return invalid_argument("an added token has empty text");
    if (t.id < 0) return invalid_argument("added token " + t.text + " has a negative id");
  }
  MX_ASSIGN_OR_RETURN(tok->sentencepiece_, SentencePieceBpe::build(std::move(spec), added));
  tok->vocab_size_ = tok->sentencepiece_->size();
  std::vector<AddedToken> raw;
  for (const auto& t : added) {
    tok->special_ids_.emplace(t.text, t.id);  // the first id of a text, as the matcher keeps
    if (t.special) tok->special_text_.emplace(t.id, t.text);
    if (!t.normalized) raw.push_back(t);
  }
  tok->added_.build(raw);
  if (bos_id && (*bos_id < 0 || *bos_id >= tok->vocab_size_)) return invalid_argument("the BOS id is out of range");
  tok->bos_id_ = bos_id;
  return std::shared_ptr<const Tokenizer>(std::move(tok));
}

void Tokenizer::encode_piece(std::string_view piece, std::vector<int32_t>* out) const {
  const int32_t whole = ranks_.find(piece);
  if (whole >= 0) {
    out->push_back(whole);
    return;
  }
  if (piece.size() > kCacheMaxPieceBytes) {
    ranks_.encode_piece(piece, out);
    return;
  }
  CacheShard& shard = cache_[hash_bytes(piece) % kCacheShards];
  {
    std::lock_guard<std::mutex> lock(shard.mutex);
    auto it = shard.entries.find(std::string(piece));
    if (it != shard.entries.end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = out->size();
  ranks_.encode_piece(piece, out);
  std::vector<int32_t> ids(out->begin() + first, out->end());
  std::lock_guard<std::mutex> lock(shard.mutex);
  if (shard.entries.size() >= kCacheEntriesPerShard) shard.entries.clear();
  shard.entries.emplace(std::string(piece), std::move(ids));
}

void Tokenizer::encode_ordinary(std::string_view text, std::vector<int32_t>* out) const {
  pretokenizer_->split(text, [&](std::string_view piece) { encode_piece(piece, out); });
}

void Tokenizer::encode_into(std::string_view text, SpecialTokens specials, std::vector<int32_t>* out) const {
  std::string repaired;
  if (!utf8_is_valid(text)) {
    repaired = utf8_make_valid(text);
    text = repaired;
  }
  if (sentencepiece_) {
    const bool as_text = specials == SpecialTokens::kAsText;
    added_.split(
        text, as_text, [&](std::string_view segment) { sentencepiece_->encode(segment, as_text, out); },
        [&](int32_t id) { out->push_back(id); });
    return;
  }
  if (specials == SpecialTokens::kAsText || special_ids_.empty()) {
    encode_ordinary(text, out);
    return;
  }
  // Every special token looks like "<|name|>"; find each "<|", then its "|>", and look the text up. The
  // ordinary text between specials is split on its own, as tiktoken does.
  size_t segment = 0;
  size_t pos = 0;
  while ((pos = text.find("<|", pos)) != std::string_view::npos) {
    const size_t close = text.find("|>", pos + 2);
    if (close == std::string_view::npos) break;
    const size_t len = close + 2 - pos;
    if (len <= max_special_len_) {
      auto it = special_ids_.find(std::string(text.substr(pos, len)));
      if (it != special_ids_.end()) {
        encode_ordinary(text.substr(segment, pos - segment), out);
        out->push_back(it->second);
        pos += len;
        segment = pos;
        continue;
      }
    }
    pos += 1;
  }
  encode_ordinary(text.substr(segment), out);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, SpecialTokens specials) const {
  std::vector<int32_t> ids;
  encode_into(text, specials, &ids);
  return ids;
}

bool Tokenizer::append_token_bytes(int32_t id, std::string* out) const {
  if (sentencepiece_) return sentencepiece_->append_token_bytes(id, out);
  const std::string_view bytes = ranks_.bytes_of(id);
  if (!bytes.empty()) {
    out->append(bytes);
    return true;
  }
  auto it = special_text_.find(id);
  if (it == special_text_.end()) return false;
  out->append(it->second);
  return true;
}

Result<std::string> Tokenizer::decode_bytes(std::span<const int32_t> ids) const {
  std::string out;
  for (const int32_t id : ids) {
    if (!append_token_bytes(id, &out)) return invalid_argument("unknown token id " + std::to_string(id));
  }
  return out;
}

Result<std::string> Tokenizer::decode(std::span<const int32_t> ids) const {
  MX_ASSIGN_OR_RETURN(std::string bytes, decode_bytes(ids));
  if (utf8_is_valid(bytes)) return bytes;
  return utf8_make_valid(bytes);
}

const std::string& Tokenizer::pattern() const {
  static const std::string kNone;
  return pretokenizer_ ? pretokenizer_->pattern() : kNone;
}

bool Tokenizer::is_special(int32_t id) const { return special_text_.count(id) != 0; }

std::optional<int32_t> Tokenizer::special_id(std::string_view text) const {
  auto it = special_ids_.find(std::string(text));
  if (it == special_ids_.end()) return std::nullopt;
  return it->second;
}

std::optional<int32_t> Tokenizer::rank_of(std::string_view bytes) const {
  if (sentencepiece_) {
    const int32_t id = sentencepiece_->find(bytes);
    return id < 0 ? std::nullopt : std::optional<int32_t>(id);
  }
  const int32_t r = ranks_.find(bytes);
  if (r < 0) return std::nullopt;
  return r;
}

}  // namespace mx
