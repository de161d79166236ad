// A BPE tokenizer in one of two kinds:
// - byte-level with tiktoken semantics (o200k, gpt-oss): text is split into pre-tokens by the o200k regex
//   (Pretokenizer) and each pre-token is merged by rank (BpeRanks);
// - SentencePiece-style as a Hugging Face tokenizer.json describes it (Gemma): added tokens are cut out of
//   the text first (AddedTokenMatcher), the rest is normalized, split and merged by SentencePieceBpe.
// Special tokens come from the file, plus those the caller's chat format implies; the tokenizer knows no
// chat format. They are recognised only when the caller allows them: text that arrives from users is encoded
// with SpecialTokens::kAsText so "<|start|>" typed by a user stays plain text (added tokens that are not
// special, such as Gemma's whitespace runs, are always recognised, as Hugging Face does). A Tokenizer
// is immutable after loading except for its bounded pre-token cache (sharded, each shard behind a mutex),
// so one instance serves every thread.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "tokenizer/bpe_ranks.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/sentencepiece_bpe.h"

namespace mx {

enum class SpecialTokens {
  kAsText,  // special-token strings in the text are ordinary text (tiktoken's encode_ordinary)
  kAllow,   // every special-token string in the text becomes its id
};

struct SpecialToken {
  std::string text;
  int32_t id;
};

class Tokenizer {
 public:
  // Loads a tokenizer.json (optionally .json.gz), a .tiktoken rank file, or a model directory (tokenizer.json,
  // tokenizer.json.gz, else its single *.tiktoken). Special tokens come from the file (tokenizer.json's
  // added_tokens; a .tiktoken file has none) plus `implied_specials`, the ones a chat format relies on
  // (chat/chat_formats.h: chat_format_special_tokens), added where a byte-level file lacks them; a file that
  // gives one of them another id is an error. A SentencePiece-style file lists its own (they are not added;
  // a chat format checks the ones it needs when it is made).
  static Result<std::shared_ptr<const Tokenizer>> load(const std::string& path,
                                                       std::span<const SpecialToken> implied_specials = {});
  static Result<std::shared_ptr<const Tokenizer>> load_tiktoken(const std::string& path,
                                                                std::span<const SpecialToken> implied_specials = {});
  static Result<std::shared_ptr<const Tokenizer>> load_hf_json(const std::string& path,
                                                               std::span<const SpecialToken> implied_specials = {});
  // From the text of a .tiktoken rank file already in memory, e.g. embedded_o200k_tiktoken().
  static Result<std::shared_ptr<const Tokenizer>> from_tiktoken_text(std::string_view text,
                                                                     std::span<const SpecialToken> implied_specials = {});
  // From parts already in memory: ranks (tokens[r] = bytes of rank r), specials and the split pattern.
  static Result<std::shared_ptr<const Tokenizer>> create(std::vector<std::string> tokens,
                                                         std::vector<SpecialToken> specials,
                                                         const std::string& pattern);

  // A SentencePiece-style tokenizer from its parts (see sentencepiece_bpe.h); `added` are the file's
  // added_tokens, `bos_id` the token the model's tokenizer_config.json puts first (not added by encode).
  static Result<std::shared_ptr<const Tokenizer>> create_sentencepiece(SentencePieceBpeSpec spec,
                                                                      std::vector<AddedToken> added,
                                                                      std::optional<int32_t> bos_id);

  // Appends the ids of `text`. Ill-formed UTF-8 is first replaced by U+FFFD (maximal subparts).
  void encode_into(std::string_view text, SpecialTokens specials, std::vector<int32_t>* out) const;
  std::vector<int32_t> encode(std::string_view text, SpecialTokens specials = SpecialTokens::kAsText) const;

  // Appends the bytes of one id (a special token's text for a special id). False for an unknown id.
  bool append_token_bytes(int32_t id, std::string* out) const;
  // The bytes of `ids` (not necessarily valid UTF-8). Fails on an unknown id.
  Result<std::string> decode_bytes(std::span<const int32_t> ids) const;
  // decode_bytes with ill-formed UTF-8 replaced by U+FFFD (tiktoken's errors="replace").
  Result<std::string> decode(std::span<const int32_t> ids) const;

  // Largest id + 1 (201088 for gpt-oss: reserved ids included).
  int32_t vocab_size() const { return vocab_size_; }
  // Ids below this are ordinary tokens or added ones (SentencePiece-style: every id; see is_special).
  int32_t num_ranks() const { return sentencepiece_ ? vocab_size_ : ranks_.size(); }
  bool is_special(int32_t id) const;
  // The id of a special token's text; for a SentencePiece-style tokenizer, of any added token's text.
  std::optional<int32_t> special_id(std::string_view text) const;
  // The token that represents `bytes` exactly (a rank; SentencePiece-style: a vocabulary string), or nullopt.
  std::optional<int32_t> rank_of(std::string_view bytes) const;
  // The pre-tokenizer regex of a byte-level tokenizer; empty for a SentencePiece-style one.
  const std::string& pattern() const;
  // The beginning-of-sequence token the model expects first (tokenizer_config.json's bos_token when
  // add_bos_token is set); nullopt where none is (gpt-oss).
  std::optional<int32_t> bos_id() const { return bos_id_; }
  bool is_sentencepiece() const { return sentencepiece_ != nullptr; }

  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;
  Tokenizer() = default;  // use the factories

 private:
  void encode_ordinary(std::string_view text, std::vector<int32_t>* out) const;
  void encode_piece(std::string_view piece, std::vector<int32_t>* out) const;

  // A bounded memo of pre-token -> ids for pieces that needed merging. Each shard is cleared when full,
  // which keeps memory bounded without per-entry bookkeeping; hot pieces come back on the next hit.
  struct CacheShard {
    std::mutex mutex;
    std::unordered_map<std::string, std::vector<int32_t>> entries;
  };
  static constexpr size_t kCacheShards = 32;
  static constexpr size_t kCacheEntriesPerShard = 8192;
  static constexpr size_t kCacheMaxPieceBytes = 64;
  mutable std::array<CacheShard, kCacheShards> cache_;

  BpeRanks ranks_;
  std::shared_ptr<const Pretokenizer> pretokenizer_;
  std::unordered_map<std::string, int32_t> special_ids_;
  std::unordered_map<int32_t, std::string> special_text_;  // first text registered for each special id
  size_t max_special_len_ = 0;
  int32_t vocab_size_ = 0;

  // SentencePiece-style only (null / empty for byte-level).
  std::unique_ptr<const SentencePieceBpe> sentencepiece_;
  AddedTokenMatcher added_;  // added tokens matched in the raw text
  std::optional<int32_t> bos_id_;
};

// Adds the `implied` specials that `specials` (a file's) lacks; fails when `specials` gives one of their
// names a different id.
Status add_implied_specials(std::vector<SpecialToken>* specials, std::span<const SpecialToken> implied);

}  // namespace mx
