#include "grammar/token_vocabulary.h"

#include <algorithm>

namespace mx::grammar {

TokenVocabulary::TokenVocabulary(std::vector<std::string> token_bytes) : bytes_(std::move(token_bytes)) {
  for (int32_t id = 0; id < size(); ++id) {
    if (bytes_[id].empty()) continue;
    sorted_ids_.push_back(id);
    max_token_bytes_ = std::max<int32_t>(max_token_bytes_, static_cast<int32_t>(bytes_[id].size()));
  }
  std::sort(sorted_ids_.begin(), sorted_ids_.end(), [&](int32_t a, int32_t b) {
    return bytes_[a] != bytes_[b] ? bytes_[a] < bytes_[b] : a < b;
  });
}

}  // namespace mx::grammar
