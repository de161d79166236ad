// Forced-acceptance drafter: continuations looked up by prompt (see reference_drafter.h).
#include "spec/reference_drafter.h"

#include <algorithm>

namespace mx {
namespace {

uint64_t hash_tokens(std::span<const int32_t> tokens) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the ids
  for (int32_t t : tokens) {
    h ^= static_cast<uint32_t>(t);
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

ReferenceDrafter::ReferenceDrafter(std::vector<Reference> references) : references_(std::move(references)) {
  for (size_t i = 0; i < references_.size(); ++i) {
    by_prompt_.emplace(hash_tokens(references_[i].prompt), i);
    prompt_lengths_.push_back(references_[i].prompt.size());
  }
  std::sort(prompt_lengths_.begin(), prompt_lengths_.end());
  prompt_lengths_.erase(std::unique(prompt_lengths_.begin(), prompt_lengths_.end()), prompt_lengths_.end());
}

void ReferenceDrafter::propose(std::span<const int32_t> tokens, int64_t max_tokens, std::vector<int32_t>* out) const {
  out->clear();
  if (max_tokens <= 0) return;
  for (auto l = prompt_lengths_.rbegin(); l != prompt_lengths_.rend(); ++l) {  // the longest prompt that matches
    const size_t len = *l;
    if (len >= tokens.size()) continue;  // the sequence has generated nothing past a prompt this long
    const std::span<const int32_t> prompt = tokens.first(len);
    const auto [first, last] = by_prompt_.equal_range(hash_tokens(prompt));
    for (auto it = first; it != last; ++it) {
      const Reference& ref = references_[it->second];
      if (!std::equal(prompt.begin(), prompt.end(), ref.prompt.begin(), ref.prompt.end())) continue;
      const size_t at = tokens.size() - len;  // generated so far
      if (at >= ref.continuation.size()) return;
      const size_t n = std::min(static_cast<size_t>(max_tokens), ref.continuation.size() - at);
      out->insert(out->end(), ref.continuation.begin() + static_cast<std::ptrdiff_t>(at),
                  ref.continuation.begin() + static_cast<std::ptrdiff_t>(at + n));
      return;
    }
  }
}

}  // namespace mx
