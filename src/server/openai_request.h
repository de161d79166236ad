// OpenAI request JSON -> native structs, with validation. Each failure is a 400 whose `param` names the
// field ("messages[1].tool_calls[0].function.name"). Unknown fields are ignored (clients send `user`,
// `metadata`, `store`, ... and must not be refused); a JSON null means "not given".
#pragma once

#include <optional>

#include "server/api_error.h"
#include "server/json_text.h"
#include "server/openai_types.h"

namespace mx::server {

// Bounds on resource-amplifying fields (vLLM's docs list `n` as a DoS vector).
inline constexpr int64_t kMaxChoices = 128;
inline constexpr int64_t kMaxTopLogprobs = 20;
inline constexpr int64_t kMaxStopStrings = 16;
inline constexpr int64_t kMaxPrompts = 1024;

std::optional<ApiError> parse_chat_request(const Json& body, ChatRequest* out);
std::optional<ApiError> parse_completion_request(const Json& body, CompletionRequest* out);
std::optional<ApiError> parse_responses_request(const Json& body, ResponsesRequest* out);

// Json keeps object keys sorted, but the model should see a tool's parameters in the order the client
// wrote them (it is the order of the TypeScript signature in the prompt). Re-reads `body` keeping only
// its "tools" and gives each parsed tool its schema in the original order. Schemas with an object of more
// than kMaxOrderedKeys keys keep the sorted order (ordered objects insert in linear time per key).
inline constexpr size_t kMaxOrderedKeys = 256;
void restore_tool_schema_order(std::string_view body, const Json& parsed_body, std::vector<FunctionTool>* tools);

}  // namespace mx::server
