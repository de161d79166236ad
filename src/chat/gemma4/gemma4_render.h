// Gemma-4's prompt, as its chat template (google/gemma-4 chat_template.jinja, the OpenAI-messages variant;
// tests/fixtures/gemma4-chat holds it) renders it, written out in C++ so that no template engine runs per
// request. Byte-exact against transformers' apply_chat_template on the fixture corpus.
//
// The template's rules, which this follows to the byte:
// - <bos>, then a system turn when thinking is on, tools are given or the first message is system/developer:
//   `<|turn>system\n`, `<|think|>\n` when thinking, the first message's trimmed text, one
//   `<|tool>declaration:NAME{...}<tool|>` per tool, `<turn|>\n`.
// - user (and later system/developer) turns: `<|turn>ROLE\n` + trimmed text + `<turn|>\n`.
// - assistant turns are `model`; an assistant message right after another (tool results between them do not
//   count) continues the same turn. Its reasoning is kept only when it made tool calls after the last user
//   message; tool calls are `<|tool_call>call:NAME{args}<tool_call|>` with arguments in the template's own
//   notation (keys sorted, strings between <|"|>); the tool messages that follow are pulled into the turn as
//   `<|tool_response>response:NAME{value:<|"|>TEXT<|"|>}<tool_response|>`; then the content with any
//   `<|channel>...<channel|>` thoughts removed. A turn that ends in tool results stays open (the model goes
//   on after them), one that ends in a call without results ends in `<|tool_response>`.
// - the generation prompt `<|turn>model\n`, plus an empty thought channel when thinking is off, unless the
//   last turn is still open.
// Client text is always text: only the pieces the template writes become control tokens.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "chat/chat_format.h"
#include "core/status.h"

namespace mx::gemma4 {

// One piece of a rendered prompt: ordinary text (encoded as text, never as special tokens), or a control
// token by its text ("<|turn>").
struct PromptPiece {
  bool control = false;
  std::string text;
};

class RenderedPrompt {
 public:
  void text(std::string_view s);
  void control(std::string_view token);
  const std::vector<PromptPiece>& pieces() const { return pieces_; }
  // Everything as one string, control tokens written out: what the template renders.
  std::string str() const;

 private:
  std::vector<PromptPiece> pieces_;
};

struct RenderOptions {
  bool add_generation_prompt = true;
  bool enable_thinking = false;  // the template's default: thinking off
};

// The prompt for `conversation` (tools and messages; thinking from `options`). Fails, as the template does,
// on a tool result whose function cannot be named.
Result<RenderedPrompt> render_prompt(const Conversation& conversation, const RenderOptions& options);

// A tool's declaration as the template writes it between <|tool> and <|tool|>, and a call's arguments
// (a JSON object) between the braces of call:NAME{...}; exposed for tests.
void render_declaration(const FunctionTool& tool, RenderedPrompt* out);
void render_argument(const nlohmann::ordered_json& value, bool escape_keys, RenderedPrompt* out);

}  // namespace mx::gemma4
