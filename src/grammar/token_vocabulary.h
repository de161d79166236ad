// The model's vocabulary as the grammar sees it: every id's bytes, and the ids sorted by their bytes so that
// tokens sharing a prefix are neighbours (a walk over the sorted list checks a shared prefix once: an
// implicit trie). Ids with no bytes (special tokens, unused ids) are never allowed by a grammar; the
// caller adds end tokens itself when the grammar may end.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mx::grammar {

class TokenVocabulary {
 public:
  explicit TokenVocabulary(std::vector<std::string> token_bytes);

  int32_t size() const { return static_cast<int32_t>(bytes_.size()); }
  int32_t mask_words() const { return (size() + 31) / 32; }  // uint32 words of a token bitmask
  const std::string& bytes(int32_t id) const { return bytes_[id]; }
  int32_t num_sorted() const { return static_cast<int32_t>(sorted_ids_.size()); }
  int32_t sorted_id(int32_t i) const { return sorted_ids_[i]; }
  const std::string& sorted_bytes(int32_t i) const { return bytes_[sorted_ids_[i]]; }
  int32_t max_token_bytes() const { return max_token_bytes_; }

 private:
  std::vector<std::string> bytes_;
  std::vector<int32_t> sorted_ids_;  // ids with bytes, by bytes ascending
  int32_t max_token_bytes_ = 0;
};

}  // namespace mx::grammar
