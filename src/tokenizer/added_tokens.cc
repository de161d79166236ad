#include "tokenizer/added_tokens.h"

#include <algorithm>

#include "tokenizer/utf8.h"

namespace mx {
namespace {

inline uint64_t mix_key(uint64_t k) {
  k ^= k >> 29;
  k *= 0xbf58476d1ce4e5b9ULL;
  k ^= k >> 32;
  return k;
}

// Decodes the code point starting at text[pos] (valid UTF-8 assumed); *len receives its byte length.
uint32_t code_point_at(std::string_view text, size_t pos, int* len) {
  const auto b0 = static_cast<uint8_t>(text[pos]);
  int n = utf8_sequence_length(text, pos);
  if (n <= 0) n = 1;
  uint32_t cp = n == 1 ? b0 : n == 2 ? (b0 & 0x1F) : n == 3 ? (b0 & 0x0F) : (b0 & 0x07);
  for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<uint8_t>(text[pos + k]) & 0x3F);
  *len = n;
  return cp;
}

// Start of the code point that ends at text[end - 1].
size_t previous_code_point_start(std::string_view text, size_t end) {
  size_t p = end - 1;
  while (p > 0 && (static_cast<uint8_t>(text[p]) & 0xC0) == 0x80) --p;
  return p;
}

// A word character for single_word tokens: ASCII letters, digits and '_', and every non-ASCII code point
// that is not white space (Hugging Face asks Unicode's alphanumeric property; no token we load uses
// single_word, so the approximation outside ASCII is documented rather than tabled).
bool is_word_char(uint32_t cp) {
  if (cp < 0x80) return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || cp == '_';
  return !is_unicode_white_space(cp);
}

}  // namespace

bool is_unicode_white_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

int32_t AddedTokenMatcher::child(int32_t node, uint8_t byte) const {
  const uint64_t key = (static_cast<uint64_t>(node) << 8) | byte;
  for (uint64_t slot = mix_key(key) & edge_mask_;; slot = (slot + 1) & edge_mask_) {
    const Edge& e = edges_[slot];
    if (e.key == key) return e.child;
    if (e.child < 0) return -1;
  }
}

void AddedTokenMatcher::add_edge(uint64_t key, int32_t child) {
  uint64_t slot = mix_key(key) & edge_mask_;
  while (edges_[slot].child >= 0) slot = (slot + 1) & edge_mask_;
  edges_[slot] = {key, child};
  ++edge_count_;
}

void AddedTokenMatcher::build(const std::vector<AddedToken>& tokens) {
  tokens_.clear();
  for (const auto& t : tokens)
    if (!t.text.empty()) tokens_.push_back(t);
  size_t total_bytes = 1;
  for (const auto& t : tokens_) total_bytes += t.text.size();
  size_t cap = 16;
  while (cap < 2 * total_bytes) cap <<= 1;
  edges_.assign(cap, Edge{});
  edge_mask_ = cap - 1;
  edge_count_ = 0;
  terminal_.assign(1, -1);
  std::fill(std::begin(first_byte_), std::end(first_byte_), false);
  has_ordinary_ = false;
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const std::string& text = tokens_[i].text;
    has_ordinary_ = has_ordinary_ || !tokens_[i].special;
    first_byte_[static_cast<uint8_t>(text[0])] = true;
    int32_t node = 0;
    for (const char c : text) {
      int32_t next = child(node, static_cast<uint8_t>(c));
      if (next < 0) {
        next = static_cast<int32_t>(terminal_.size());
        terminal_.push_back(-1);
        add_edge((static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(c), next);
      }
      node = next;
    }
    // A text given twice keeps its first entry (Hugging Face keeps the first id for a content).
    if (terminal_[node] < 0) terminal_[node] = static_cast<int32_t>(i);
  }
}

bool AddedTokenMatcher::longest_match(std::string_view text, size_t pos, int32_t* index, size_t* end) const {
  if (tokens_.empty() || !first_byte_[static_cast<uint8_t>(text[pos])]) return false;
  int32_t node = 0;
  bool found = false;
  for (size_t p = pos; p < text.size(); ++p) {
    node = child(node, static_cast<uint8_t>(text[p]));
    if (node < 0) break;
    if (terminal_[node] >= 0) {
      *index = terminal_[node];
      *end = p + 1;
      found = true;
    }
  }
  return found;
}

bool AddedTokenMatcher::is_single_word(std::string_view text, size_t start, size_t end) {
  int len = 0;
  if (start > 0 && is_word_char(code_point_at(text, previous_code_point_start(text, start), &len))) return false;
  if (end < text.size() && is_word_char(code_point_at(text, end, &len))) return false;
  return true;
}

size_t AddedTokenMatcher::strip_whitespace_before(std::string_view text, size_t start) {
  while (start > 0) {
    const size_t p = previous_code_point_start(text, start);
    int len = 0;
    if (!is_unicode_white_space(code_point_at(text, p, &len))) break;
    start = p;
  }
  return start;
}

size_t AddedTokenMatcher::strip_whitespace_after(std::string_view text, size_t end) {
  while (end < text.size()) {
    int len = 0;
    if (!is_unicode_white_space(code_point_at(text, end, &len))) break;
    end += len;
  }
  return end;
}

}  // namespace mx
