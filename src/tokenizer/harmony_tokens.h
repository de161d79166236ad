// Ids of the o200k_harmony special tokens (gpt-oss). These are fixed by the model's vocabulary; the loader
// checks that a tokenizer file agrees with them before anything relies on them.
#pragma once

#include <cstdint>

namespace mx::harmony {

inline constexpr int32_t kStartOfText = 199998;  // <|startoftext|>: never emitted by the renderer
inline constexpr int32_t kEndOfText = 199999;    // <|endoftext|>: a generation stop
inline constexpr int32_t kReturn = 200002;       // <|return|>: end of the final answer (a stop)
inline constexpr int32_t kConstrain = 200003;    // <|constrain|>: content-type constraint follows
inline constexpr int32_t kChannel = 200005;      // <|channel|>
inline constexpr int32_t kStart = 200006;        // <|start|>
inline constexpr int32_t kEnd = 200007;          // <|end|>: end of a message (not a generation stop)
inline constexpr int32_t kMessage = 200008;      // <|message|>: header -> content
inline constexpr int32_t kCall = 200012;         // <|call|>: end of a tool call (a stop)
inline constexpr int32_t kEndOfPrompt = 200018;  // <|endofprompt|> (also <|reserved_200018|>)
inline constexpr int32_t kFirstSpecial = 199998;
inline constexpr int32_t kVocabSize = 201088;    // the model's embedding rows; reserved ids fill the rest

}  // namespace mx::harmony
