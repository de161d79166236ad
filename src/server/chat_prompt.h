// An OpenAI chat request as gpt-oss's Harmony conversation, rendered to prompt ids.
//
// Mapping (as openai/harmony documents it for chat completions): system and developer messages become the
// developer message's instructions (the Harmony system message is the model's own: identity, reasoning
// effort, channels); an assistant turn becomes its reasoning on the analysis channel, its tool calls as
// commentary messages to functions.NAME, and its text on the final channel; a tool message becomes a
// message from functions.NAME. Tools are rendered unless tool_choice is "none"; a named tool_choice
// renders only that tool. Nothing constrains decoding: "required" and a named choice are hints the
// model usually follows, not guarantees.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "server/api_error.h"
#include "server/openai_types.h"
#include "tokenizer/tokenizer.h"

namespace mx::server {

HarmonyConversation chat_to_harmony(const ChatRequest& request);

// The prompt ids, ending in <|start|>assistant; a malformed conversation is a 400.
std::optional<ApiError> render_chat_prompt(const Tokenizer& tokenizer, const ChatRequest& request,
                                           std::vector<int32_t>* ids);

}  // namespace mx::server
