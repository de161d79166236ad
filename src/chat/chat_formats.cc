#include "chat/chat_formats.h"

#include <functional>

#include "chat/gemma4/gemma4_format.h"
#include "chat/harmony/harmony_format.h"
#include "chat/harmony/harmony_tokens.h"

namespace mx {
namespace {

struct FormatRow {
  const char* name;
  std::function<std::vector<SpecialToken>()> special_tokens;
  std::function<Result<std::shared_ptr<const ChatFormat>>(std::shared_ptr<const Tokenizer>)> make;
};

Result<std::shared_ptr<const ChatFormat>> make_harmony(std::shared_ptr<const Tokenizer> tokenizer) {
  MX_ASSIGN_OR_RETURN(auto format, HarmonyFormat::create(std::move(tokenizer)));
  return std::shared_ptr<const ChatFormat>(std::move(format));
}

Result<std::shared_ptr<const ChatFormat>> make_gemma4(std::shared_ptr<const Tokenizer> tokenizer) {
  MX_ASSIGN_OR_RETURN(auto format, Gemma4Format::create(std::move(tokenizer)));
  return std::shared_ptr<const ChatFormat>(std::move(format));
}

// Gemma-4's tokenizer.json lists every control token its format uses; none are implied.
std::vector<SpecialToken> no_implied_tokens() { return {}; }

const std::vector<FormatRow>& formats() {
  static const std::vector<FormatRow> table = {
      {"harmony", harmony::special_tokens, make_harmony},
      {"gemma4", no_implied_tokens, make_gemma4},
  };
  return table;
}

Result<const FormatRow*> find_format(const std::string& name) {
  std::string known;
  for (const FormatRow& row : formats()) {
    if (name == row.name) return &row;
    known += (known.empty() ? "" : ", ") + std::string(row.name);
  }
  return invalid_argument("unknown chat format '" + name + "' (known: " + known + ")");
}

}  // namespace

Result<std::vector<SpecialToken>> chat_format_special_tokens(const std::string& name) {
  MX_ASSIGN_OR_RETURN(const FormatRow* row, find_format(name));
  return row->special_tokens();
}

Result<std::shared_ptr<const ChatFormat>> make_chat_format(const std::string& name,
                                                           std::shared_ptr<const Tokenizer> tokenizer) {
  MX_ASSIGN_OR_RETURN(const FormatRow* row, find_format(name));
  return row->make(std::move(tokenizer));
}

Result<ChatTokenizer> load_chat_tokenizer(const std::string& path, const std::string& format_name) {
  MX_ASSIGN_OR_RETURN(const FormatRow* row, find_format(format_name));
  ChatTokenizer out;
  MX_ASSIGN_OR_RETURN(out.tokenizer, Tokenizer::load(path, row->special_tokens()));
  MX_ASSIGN_OR_RETURN(out.format, row->make(out.tokenizer));
  return out;
}

}  // namespace mx
