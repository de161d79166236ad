#include "server/chat_prompt.h"

namespace mx::server {

HarmonyConversation chat_to_harmony(const ChatRequest& request) {
  HarmonyConversation conv;
  conv.reasoning_effort = request.reasoning_effort;
  for (const ChatMessage& m : request.messages) {
    switch (m.role) {
      case ChatRole::kSystem:
      case ChatRole::kDeveloper:
        if (m.content.empty()) break;
        if (!conv.instructions.empty()) conv.instructions += "\n\n";
        conv.instructions += m.content;
        break;
      case ChatRole::kUser: conv.messages.push_back(HarmonyMessage::user(m.content)); break;
      case ChatRole::kAssistant:
        if (!m.reasoning.empty()) conv.messages.push_back(HarmonyMessage::assistant("analysis", m.reasoning));
        for (const ToolCall& call : m.tool_calls) conv.messages.push_back(HarmonyMessage::tool_call(call.name, call.arguments));
        if (!m.content.empty() || (m.reasoning.empty() && m.tool_calls.empty()))
          conv.messages.push_back(HarmonyMessage::assistant("final", m.content));
        break;
      case ChatRole::kTool: conv.messages.push_back(HarmonyMessage::tool_result(m.name, m.content)); break;
    }
  }
  if (request.tool_choice.mode != ToolChoice::Mode::kNone) {
    for (const FunctionTool& tool : request.tools) {
      if (request.tool_choice.mode == ToolChoice::Mode::kNamed && tool.name != request.tool_choice.name) continue;
      conv.tools.push_back({tool.name, tool.description, tool.parameters});
    }
  }
  return conv;
}

std::optional<ApiError> render_chat_prompt(const Tokenizer& tokenizer, const ChatRequest& request,
                                           std::vector<int32_t>* ids) {
  auto rendered = render_harmony_prompt(tokenizer, chat_to_harmony(request));
  if (!rendered.is_ok()) return ApiError::invalid_request("Cannot render the conversation: " + rendered.status().message(), "messages");
  *ids = std::move(rendered).value();
  return std::nullopt;
}

}  // namespace mx::server
