#include "chat/gemma4/gemma4_format.h"

namespace mx {
namespace {

// Every control token the template writes or the parser reads.
constexpr const char* kControlTokens[] = {
    "<bos>",         "<eos>",         "<|turn>",           "<turn|>",          "<|think|>",
    "<|channel>",    "<channel|>",    "<|tool>",           "<tool|>",          "<|tool_call>",
    "<tool_call|>",  "<|tool_response>", "<tool_response|>", "<|\"|>",
};

}  // namespace

Gemma4Format::Gemma4Format(std::shared_ptr<const Tokenizer> tokenizer, gemma4::ControlIds ids)
    : tokenizer_(std::move(tokenizer)), ids_(std::move(ids)), stop_ids_(ids_.ends) {
  auto id = [&](const char* token) { return tokenizer_->special_id(token).value_or(-1); };
  constraint_ids_ = {ids_.channel_open, ids_.channel_close, ids_.tool_call_open, ids_.tool_call_close,
                     id("<turn|>"),     id("<eos>"),        id("<|tool_response>")};
}

Result<std::shared_ptr<const Gemma4Format>> Gemma4Format::create(std::shared_ptr<const Tokenizer> tokenizer) {
  std::string missing;
  for (const char* token : kControlTokens)
    if (!tokenizer->special_id(token)) missing += (missing.empty() ? "" : " ") + std::string(token);
  if (!missing.empty())
    return invalid_argument("the tokenizer lacks Gemma-4's control tokens " + missing + " (not a Gemma-4 tokenizer.json?)");
  auto id = [&](const char* token) { return *tokenizer->special_id(token); };
  gemma4::ControlIds ids;
  ids.channel_open = id("<|channel>");
  ids.channel_close = id("<channel|>");
  ids.tool_call_open = id("<|tool_call>");
  ids.tool_call_close = id("<tool_call|>");
  ids.quote = id("<|\"|>");
  // A turn ends at <turn|>; after tool calls the model writes <|tool_response> and waits for the results.
  ids.ends = {id("<turn|>"), id("<|tool_response>"), id("<eos>")};
  return std::make_shared<const Gemma4Format>(std::move(tokenizer), std::move(ids));
}

Result<std::vector<int32_t>> Gemma4Format::encode(const gemma4::RenderedPrompt& prompt) const {
  std::vector<int32_t> ids;
  for (const gemma4::PromptPiece& piece : prompt.pieces()) {
    if (!piece.control) {
      tokenizer_->encode_into(piece.text, SpecialTokens::kAsText, &ids);
      continue;
    }
    const auto id = tokenizer_->special_id(piece.text);
    if (!id) return internal_error("Gemma-4 control token " + piece.text + " missing from the tokenizer");
    ids.push_back(*id);
  }
  return ids;
}

Result<std::vector<int32_t>> Gemma4Format::render(const Conversation& conversation) const {
  gemma4::RenderOptions options;
  options.enable_thinking = conversation.thinking.value_or(false);
  MX_ASSIGN_OR_RETURN(gemma4::RenderedPrompt prompt, gemma4::render_prompt(conversation, options));
  return encode(prompt);
}

std::unique_ptr<ChatStreamParser> Gemma4Format::make_parser() const {
  return std::make_unique<gemma4::StreamParser>(*tokenizer_, ids_);
}

grammar::JsonSchemaOptions Gemma4Format::tool_argument_notation() const {
  grammar::JsonSchemaOptions notation;
  notation.string_quote = gemma4::kQuoteByte;
  return notation;
}

std::vector<std::pair<int32_t, std::string>> Gemma4Format::tool_argument_special_tokens() const {
  return {{ids_.quote, gemma4::kQuoteByte}};
}

Result<std::shared_ptr<const TurnConstraintPlan>> Gemma4Format::plan_constraint(const TurnConstraintSpec& spec,
                                                                                GrammarCompiler& compiler) const {
  return gemma4::plan_constraint(spec, constraint_ids_, compiler);
}

}  // namespace mx
