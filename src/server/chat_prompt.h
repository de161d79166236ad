// An OpenAI chat request as a conversation for the model's ChatFormat (chat/chat_format.h), rendered to
// prompt ids. The format decides how roles, reasoning and tool calls look to the model; this only applies
// tool_choice: tools are rendered unless it is "none", a named choice renders only that tool. Nothing
// constrains decoding: "required" and a named choice are hints the model usually follows, not guarantees.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "chat/chat_format.h"
#include "server/api_error.h"
#include "server/openai_types.h"

namespace mx::server {

// A view of the request's messages (the request must outlive it).
Conversation chat_conversation(const ChatRequest& request);

// The prompt ids, ending where the model writes its turn; a conversation the format cannot express is a 400.
std::optional<ApiError> render_chat_prompt(const ChatFormat& format, const ChatRequest& request,
                                           std::vector<int32_t>* ids);

}  // namespace mx::server
