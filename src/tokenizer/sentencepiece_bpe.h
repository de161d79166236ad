// SentencePiece-style BPE as a Hugging Face tokenizer.json describes it (Gemma, Llama): the text between
// added tokens is normalized (Replace " " -> "▁", Prepend), split by a literal Split pre-tokenizer (or not at
// all), and each word is merged by merge rank over Unicode characters; a character missing from the vocabulary
// becomes its UTF-8 bytes as <0xHH> tokens (byte_fallback), else the unknown token (consecutive ones fused
// with fuse_unk). The decoder rules (Replace, ByteFallback, Fuse, Strip) are applied per token at load time,
// so decoding is a table lookup and streams like byte-level BPE does (a Strip after Fuse, which acts on the
// whole output, is refused at load time).
//
// Merging follows Hugging Face's Word::merge_all: a min-heap of (rank, position) over adjacent pairs, the
// lowest rank first and the leftmost on ties, stale entries skipped; O(n log n) in the word length, which
// matters because Gemma's pre-tokenizer leaves a whole line as one word.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"
#include "tokenizer/added_tokens.h"

namespace mx {

// One normalizer step: replace every occurrence of `from` by `to`, or prepend `to` to non-empty text.
struct NormalizerStep {
  enum class Kind { kReplace, kPrepend };
  Kind kind = Kind::kReplace;
  std::string from;
  std::string to;
};

// Hugging Face's Split pre-tokenizer with a literal pattern.
struct LiteralSplit {
  enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };
  std::string pattern;
  Behavior behavior = Behavior::kIsolated;
};

// One decoder step, applied to each token's text.
struct DecoderStep {
  enum class Kind { kReplace, kByteFallback, kFuse, kStrip };
  Kind kind = Kind::kReplace;
  std::string from, to;           // kReplace
  std::string strip_content;      // kStrip: the character stripped
  int32_t strip_start = 0, strip_stop = 0;
};

struct SentencePieceBpeSpec {
  std::vector<std::string> vocab;                            // by id; an empty string marks an unused id
  std::vector<std::pair<std::string, std::string>> merges;   // in rank order
  std::vector<NormalizerStep> normalizer;
  std::optional<LiteralSplit> split;
  std::vector<DecoderStep> decoder;  // a Strip after Fuse is refused
  bool byte_fallback = false;
  bool fuse_unk = false;
  bool ignore_merges = false;
  int32_t unk_id = -1;
};

class SentencePieceBpe {
 public:
  // `added` are all added tokens: those marked normalized are matched in the normalized text here, and
  // every added token gets its decoded bytes.
  static Result<std::unique_ptr<const SentencePieceBpe>> build(SentencePieceBpeSpec spec,
                                                                const std::vector<AddedToken>& added);

  // Appends the ids of one text segment (valid UTF-8, already cut at raw added tokens).
  void encode(std::string_view segment, bool specials_as_text, std::vector<int32_t>* out) const;
  // Appends the decoded bytes of `id`; false for an id with neither a vocabulary entry nor an added token.
  bool append_token_bytes(int32_t id, std::string* out) const;
  // One past the largest vocabulary or added-token id.
  int32_t size() const { return static_cast<int32_t>(decoded_offsets_.size() - 1); }
  // The id of exactly this vocabulary string, or -1.
  int32_t find(std::string_view piece) const;

  SentencePieceBpe(const SentencePieceBpe&) = delete;
  SentencePieceBpe& operator=(const SentencePieceBpe&) = delete;
  SentencePieceBpe() = default;

 private:
  struct MergeSlot {
    uint64_t pair = ~uint64_t{0};  // left id << 32 | right id
    int32_t rank = -1;
    int32_t merged = -1;
  };
  const MergeSlot* find_merge(int32_t left, int32_t right) const;
  void encode_normalized(std::string_view text, std::vector<int32_t>* out) const;
  void encode_word(std::string_view word, std::vector<int32_t>* out) const;

  std::vector<NormalizerStep> normalizer_;
  std::optional<LiteralSplit> split_;
  AddedTokenMatcher normalized_added_;
  bool byte_fallback_ = false, fuse_unk_ = false, ignore_merges_ = false;
  int32_t unk_id_ = -1;

  std::vector<std::string> vocab_;       // by id
  std::vector<int32_t> vocab_slots_;     // open addressing over vocab_ (ids; -1 empty)
  uint64_t vocab_mask_ = 0;
  std::vector<int32_t> char_id_;         // code point -> id of the one-character token, or -1
  int32_t byte_id_[256];                 // byte -> id of <0xHH>, or -1
  std::vector<MergeSlot> merges_;        // open addressing, size a power of two
  uint64_t merge_mask_ = 0;

  std::string decoded_;                  // decoded bytes of every id, back to back
  std::vector<uint32_t> decoded_offsets_;
  std::vector<bool> has_token_;
};

}  // namespace mx
