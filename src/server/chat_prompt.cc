#include "server/chat_prompt.h"

namespace mx::server {

Conversation chat_conversation(const ChatRequest& request) {
  Conversation conv;
  conv.messages = request.messages;
  conv.reasoning_effort = request.reasoning_effort;
  conv.thinking = request.thinking;
  if (request.tool_choice.mode != ToolChoice::Mode::kNone) {
    for (const FunctionTool& tool : request.tools) {
      if (request.tool_choice.mode == ToolChoice::Mode::kNamed && tool.name != request.tool_choice.name) continue;
      conv.tools.push_back(tool);
    }
  }
  return conv;
}

std::optional<ApiError> render_chat_prompt(const ChatFormat& format, const ChatRequest& request,
                                           std::vector<int32_t>* ids) {
  auto rendered = format.render(chat_conversation(request));
  if (!rendered.is_ok()) return ApiError::invalid_request("Cannot render the conversation: " + rendered.status().message(), "messages");
  *ids = std::move(rendered).value();
  return std::nullopt;
}

}  // namespace mx::server
