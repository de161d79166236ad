#include "chat/harmony/harmony_format.h"

#include "chat/harmony/harmony_constraint.h"
#include "chat/harmony/harmony_parser.h"
#include "chat/harmony/harmony_tokens.h"

namespace mx {

HarmonyConversation conversation_to_harmony(const Conversation& conversation) {
  HarmonyConversation conv;
  conv.reasoning_effort = conversation.thinking == false ? ReasoningEffort::kLow : conversation.reasoning_effort;
  for (const ChatMessage& m : conversation.messages) {
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
  for (const FunctionTool& tool : conversation.tools) conv.tools.push_back({tool.name, tool.description, tool.parameters});
  return conv;
}

HarmonyFormat::HarmonyFormat(std::shared_ptr<const Tokenizer> tokenizer)
    : tokenizer_(std::move(tokenizer)), stop_ids_{harmony::kReturn, harmony::kCall} {}

Result<std::shared_ptr<const HarmonyFormat>> HarmonyFormat::create(std::shared_ptr<const Tokenizer> tokenizer) {
  // The renderer and parser use the ids as constants; a tokenizer that disagrees would garble every prompt.
  for (const SpecialToken& s : harmony::special_tokens()) {
    if (tokenizer->special_id(s.text) != s.id)
      return invalid_argument("the tokenizer lacks Harmony's special token " + s.text + " (id " + std::to_string(s.id) +
                              "); load it with the harmony chat format's special tokens");
  }
  return std::make_shared<const HarmonyFormat>(std::move(tokenizer));
}

Result<std::vector<int32_t>> HarmonyFormat::render(const Conversation& conversation) const {
  return render_harmony_prompt(*tokenizer_, conversation_to_harmony(conversation));
}

std::unique_ptr<ChatStreamParser> HarmonyFormat::make_parser() const {
  return std::make_unique<HarmonyStreamParser>(*tokenizer_);
}

Result<std::shared_ptr<const TurnConstraintPlan>> HarmonyFormat::plan_constraint(const TurnConstraintSpec& spec,
                                                                                 GrammarCompiler& compiler) const {
  return harmony::plan_constraint(spec, compiler);
}

}  // namespace mx
