// Added tokens (Hugging Face's added_tokens: special tokens such as <bos> or <|start|>, and ordinary ones
// such as Gemma's "\n" or "<unused0>") and the matcher that finds them in text before the BPE model runs.
//
// Matching follows Hugging Face's AddedVocabulary: scan left to right, at the leftmost position where any
// added token starts take the longest one (leftmost-longest, non-overlapping), then apply its flags:
// single_word drops a match inside a word, lstrip/rstrip pull the neighbouring whitespace into the token.
// When special tokens are encoded as text (user input), special matches are dropped after matching, so a
// special token hides any shorter ordinary token inside it, exactly as there.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace mx {

struct AddedToken {
  std::string text;
  int32_t id = -1;
  bool special = true;       // skipped by skip_special_tokens; plain text when specials are not allowed
  bool lstrip = false;       // swallows the whitespace before it
  bool rstrip = false;       // swallows the whitespace after it
  bool single_word = false;  // matches only between non-word characters
  bool normalized = false;   // matched in normalized text (after the normalizer) instead of the raw text
};

// True for Unicode White_Space code points (Rust's char::is_whitespace).
bool is_unicode_white_space(uint32_t cp);

class AddedTokenMatcher {
 public:
  // `tokens` must outlive nothing: the matcher copies what it needs.
  void build(const std::vector<AddedToken>& tokens);
  bool empty() const { return tokens_.empty(); }
  bool has_ordinary_tokens() const { return has_ordinary_; }

  // Cuts `text` into plain segments and added tokens, in order: on_text(std::string_view) for text between
  // tokens (never empty), on_token(int32_t id) for each token. With specials_as_text, special tokens are
  // left in the text.
  template <typename OnText, typename OnToken>
  void split(std::string_view text, bool specials_as_text, OnText&& on_text, OnToken&& on_token) const {
    size_t offset = 0;  // end of what was already handed out
    size_t pos = 0;
    while (pos < text.size()) {
      int32_t index = -1;
      size_t end = 0;
      if (!longest_match(text, pos, &index, &end)) {
        ++pos;
        continue;
      }
      const AddedToken& t = tokens_[index];
      size_t start = pos;
      pos = end;
      if (specials_as_text && t.special) continue;
      if (t.single_word && !is_single_word(text, start, end)) continue;
      if (t.lstrip) start = std::max(offset, strip_whitespace_before(text, start));
      if (t.rstrip) end = strip_whitespace_after(text, end);
      if (offset < start) on_text(text.substr(offset, start - offset));
      on_token(t.id);
      offset = std::max(offset, end);
    }
    if (offset < text.size()) on_text(text.substr(offset));
  }

 private:
  // The longest token starting at text[pos]: its index in tokens_ and its end. False when none starts there.
  bool longest_match(std::string_view text, size_t pos, int32_t* index, size_t* end) const;
  static bool is_single_word(std::string_view text, size_t start, size_t end);
  static size_t strip_whitespace_before(std::string_view text, size_t start);
  static size_t strip_whitespace_after(std::string_view text, size_t end);

  // A byte trie: node 0 is the root; edges_ maps (node << 8 | byte) to the child node.
  struct Edge {
    uint64_t key = ~uint64_t{0};
    int32_t child = -1;
  };
  int32_t child(int32_t node, uint8_t byte) const;
  void add_edge(uint64_t key, int32_t child);

  std::vector<AddedToken> tokens_;
  std::vector<int32_t> terminal_;  // per node: index into tokens_ of the token ending there, or -1
  std::vector<Edge> edges_;        // open addressing, size a power of two
  uint64_t edge_mask_ = 0;
  size_t edge_count_ = 0;
  bool first_byte_[256] = {};      // bytes that can start a token (skips most positions cheaply)
  bool has_ordinary_ = false;
};

}  // namespace mx
