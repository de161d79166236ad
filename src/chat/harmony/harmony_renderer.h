// Harmony renderer: a conversation becomes the prompt token ids gpt-oss expects, ending in
// `<|start|>assistant` so that the model writes the next assistant message.
//
// The output is token-exact with openai/harmony's render_conversation_for_completion: the system message
// (identity, knowledge cutoff, optional date, reasoning effort, valid channels, and the function-tools line
// when function tools exist), a developer message (# Instructions, # Tools as a TypeScript-like namespace),
// then the messages. Each header piece is encoded on its own as harmony does, and text is always encoded as
// ordinary text, so a user who types "<|end|>" cannot forge a special token.
//
// The input is a plain struct at the Harmony level (roles, channels, recipients); the HTTP layer maps
// OpenAI chat messages onto it: reasoning -> an analysis message, tool_calls -> commentary messages with
// recipient "functions.NAME", role "tool" -> a tool message authored by "functions.NAME".
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "chat/chat_format.h"
#include "core/status.h"
#include "tokenizer/tokenizer.h"

namespace mx {

enum class HarmonyRole { kSystem, kDeveloper, kUser, kAssistant, kTool };

const char* harmony_role_name(HarmonyRole role);

inline constexpr char kDefaultModelIdentity[] = "You are ChatGPT, a large language model trained by OpenAI.";

struct HarmonyFunctionTool {
  std::string name;
  std::string description;
  // A JSON Schema (key order kept: it is the order the model sees). Null, or an object schema without
  // properties, renders as `() => any`.
  nlohmann::ordered_json parameters;
};

struct HarmonyMessage {
  HarmonyRole role = HarmonyRole::kUser;
  std::string content;
  // Tool messages: the tool that answered, e.g. "functions.get_weather" (rendered in place of the role).
  // Other roles: an optional author name, rendered as "role:name".
  std::string author_name;
  std::string recipient;     // assistant tool call: "functions.get_weather"; tool result: "assistant"
  std::string channel;       // "analysis", "commentary" or "final"; empty renders no channel
  std::string content_type;  // e.g. "<|constrain|>json" (the marker becomes the special token) or "json"

  static HarmonyMessage user(std::string text);
  static HarmonyMessage assistant(std::string channel, std::string text);
  // An assistant tool call: commentary channel, recipient "functions.NAME", content type <|constrain|>json.
  static HarmonyMessage tool_call(const std::string& function_name, std::string arguments_json);
  // A tool result: author "functions.NAME", recipient assistant, commentary channel.
  static HarmonyMessage tool_result(const std::string& function_name, std::string content);
};

struct HarmonyConversation {
  // System message.
  std::string model_identity = kDefaultModelIdentity;
  std::string knowledge_cutoff = "2024-06";
  std::string current_date;  // "YYYY-MM-DD"; empty omits the line
  ReasoningEffort reasoning_effort = ReasoningEffort::kMedium;
  std::vector<std::string> valid_channels = {"analysis", "commentary", "final"};
  bool include_system_message = true;

  // Developer message, rendered when either is non-empty.
  std::string instructions;
  std::vector<HarmonyFunctionTool> tools;

  std::vector<HarmonyMessage> messages;

  // When the last assistant message is on the final channel, drop the analysis messages before the first
  // final message (harmony's auto_drop_analysis): earlier turns' reasoning leaves the prompt, while the
  // reasoning around pending tool calls stays.
  bool drop_analysis = true;
};

// The prompt ids, ending in <|start|>assistant. Fails (never aborts) on a malformed conversation: a tool
// message without a name, a function without a name, or names that would break the header.
Result<std::vector<int32_t>> render_harmony_prompt(const Tokenizer& tokenizer, const HarmonyConversation& conv);

// The "type NAME = (_: ...) => any;" body for one JSON Schema, as harmony renders it (exposed for tests).
std::string json_schema_to_typescript(const nlohmann::ordered_json& schema, const std::string& indent);

}  // namespace mx
