// Ids of the o200k_harmony special tokens (gpt-oss). These are fixed by the model's vocabulary; the tokenizer
// is loaded with harmony::special_tokens() (a file that gives one of them another id fails to load) and
// HarmonyFormat checks the loaded tokenizer again before anything relies on them.
#pragma once

#include <cstdint>
#include <vector>

#include "tokenizer/tokenizer.h"

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

// Every o200k_harmony special: the named ones and <|reserved_N|> for each other id from 200000 up to
// kVocabSize - 1 (200018 has both names, <|endofprompt|> and <|reserved_200018|>), as tiktoken defines the
// encoding. gpt-oss's tokenizer.json lists only ids up to 200018 and a .tiktoken rank file none, so the
// loader adds what a file lacks and the vocabulary covers every id the model can sample.
std::vector<SpecialToken> special_tokens();

}  // namespace mx::harmony
