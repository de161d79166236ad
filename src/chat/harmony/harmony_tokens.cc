#include "chat/harmony/harmony_tokens.h"

#include <string>

namespace mx::harmony {

std::vector<SpecialToken> special_tokens() {
  std::vector<SpecialToken> tokens = {
      {"<|startoftext|>", kStartOfText}, {"<|endoftext|>", kEndOfText}, {"<|return|>", kReturn},
      {"<|constrain|>", kConstrain},     {"<|channel|>", kChannel},     {"<|start|>", kStart},
      {"<|end|>", kEnd},                 {"<|message|>", kMessage},     {"<|call|>", kCall},
      {"<|endofprompt|>", kEndOfPrompt},
  };
  for (int32_t id = 200000; id < kVocabSize; ++id) {
    const bool named = id == kReturn || id == kConstrain || (id >= kChannel && id <= kMessage) || id == kCall;
    if (!named) tokens.push_back({"<|reserved_" + std::to_string(id) + "|>", id});
  }
  return tokens;
}

}  // namespace mx::harmony
