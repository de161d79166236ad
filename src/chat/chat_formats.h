// The chat formats by name. The model registry says which format a family speaks (model_chat_format in
// model/model_registry.h: gpt_oss -> "harmony", gemma4 -> "gemma4"); a new format adds one row to the table in chat_formats.cc.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "chat/chat_format.h"
#include "tokenizer/tokenizer.h"

namespace mx {

// The special tokens format `name` relies on, for Tokenizer::load: added where the tokenizer file lacks them
// (a .tiktoken rank file lists none), an error where the file gives them other ids. Unknown name: an error
// listing the known ones.
Result<std::vector<SpecialToken>> chat_format_special_tokens(const std::string& name);

// The format over a tokenizer loaded with its special tokens; fails when the tokenizer disagrees with them.
Result<std::shared_ptr<const ChatFormat>> make_chat_format(const std::string& name,
                                                           std::shared_ptr<const Tokenizer> tokenizer);

// Both at once: the tokenizer at `path` (a file or a model directory, as Tokenizer::load takes) with the
// format's special tokens, and the format over it.
struct ChatTokenizer {
  std::shared_ptr<const Tokenizer> tokenizer;
  std::shared_ptr<const ChatFormat> format;
};
Result<ChatTokenizer> load_chat_tokenizer(const std::string& path, const std::string& format_name);

}  // namespace mx
