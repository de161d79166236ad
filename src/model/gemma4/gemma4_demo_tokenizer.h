// The tokenizer written beside synthetic Gemma-4 checkpoints, so that `serve --model DIR` takes the directory
// as it is: a SentencePiece-style tokenizer.json in the Gemma layout (normalizer " " -> "▁", Split on " ",
// BPE with byte_fallback, decoder Replace/ByteFallback/Fuse) with Gemma-4's control tokens as special added
// tokens (<|turn> <turn|> <|channel> <channel|> <|think|> <|tool> <|tool_call> <|tool_response> <|"|> ...),
// byte tokens <0x00>..<0xFF>, and every other id a made-up syllable piece so that any id a random model picks
// decodes to text. It is not Google's vocabulary: a real checkpoint brings its own tokenizer.json.
#pragma once

#include <cstdint>
#include <string>

namespace mx {

// tokenizer.json for a model of `vocab_size` ids (at least 1024; 262,144 for Gemma-4).
std::string gemma4_demo_tokenizer_json(int64_t vocab_size);
// tokenizer_config.json: BOS added first, the special tokens by name.
std::string gemma4_demo_tokenizer_config_json();

}  // namespace mx
