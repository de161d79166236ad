// Reading the SentencePiece-style parts of a Hugging Face tokenizer.json (Gemma, Llama): the normalizer,
// the pre-tokenizer, the BPE model, the decoder and the added tokens, each checked, with the BOS token from
// the tokenizer_config.json beside it. Anything the encoder does not implement is an Unimplemented error
// naming the part, never a silent approximation.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "core/status.h"
#include "tokenizer/tokenizer.h"

namespace mx {

// True when the document describes byte-level BPE (a ByteLevel pre-tokenizer or decoder anywhere).
bool hf_json_is_byte_level(const nlohmann::json& doc);

// `config` is the parsed tokenizer_config.json, or null when the file has none beside it.
Result<std::shared_ptr<const Tokenizer>> parse_hf_sentencepiece(const nlohmann::json& doc,
                                                                 const nlohmann::json& config);

}  // namespace mx
