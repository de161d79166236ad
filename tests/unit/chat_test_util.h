// Shared by the chat format tests: a message with text only.
#pragma once

#include <string>
#include <utility>

#include "chat/chat_format.h"

namespace mx {

// A message with text only (no reasoning, tool calls or tool names).
inline ChatMessage text_message(ChatRole role, std::string content) {
  ChatMessage m;
  m.role = role;
  m.content = std::move(content);
  return m;
}

}  // namespace mx
