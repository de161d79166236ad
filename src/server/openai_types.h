// Native C++ forms of the OpenAI requests we serve, and of the output a CompletionService reports.
// The HTTP layer turns JSON into these once, at the door; nothing behind it sees JSON. Defaults are
// gpt-oss's recommended sampling (temperature 1, top_p 1), not llama.cpp's (llama.cpp#27720).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "chat/chat_format.h"

namespace mx::server {

// The conversation's parts are the chat formats' own types (chat/chat_format.h): a request's messages go to
// ChatFormat::render without a copy into another vocabulary.
using ::mx::ChatMessage;
using ::mx::ChatRole;
using ::mx::FunctionTool;
using ::mx::ReasoningEffort;  // three levels; "minimal" reads as low, "none" as low with thinking off
using ::mx::ToolCall;

const char* chat_role_name(ChatRole role);

struct ToolChoice {
  enum class Mode { kAuto, kNone, kRequired, kNamed };
  Mode mode = Mode::kAuto;
  std::string name;  // kNamed
};

struct SamplingOptions {
  double temperature = 1.0;
  double top_p = 1.0;
  int64_t top_k = 0;  // 0 = off (-1 is accepted as off too, vLLM's spelling)
  double min_p = 0.0;
  double presence_penalty = 0.0;
  double frequency_penalty = 0.0;
  std::optional<int64_t> max_tokens;  // unset: what the context leaves
  std::vector<std::string> stop;
  std::optional<uint64_t> seed;
  int64_t n = 1;
  bool logprobs = false;
  int64_t top_logprobs = 0;
  bool ignore_eos = false;  // extension benchmarks rely on (vllm/sglang bench --ignore-eos)
};

struct StreamOptions {
  bool stream = false;
  bool include_usage = false;  // one extra chunk with `choices: []` and usage before [DONE]
};

// POST /v1/chat/completions, and /v1/responses after translation (see ResponsesRequest).
// Structured outputs: what the answer must match (chat response_format, Responses text.format, vLLM's
// structured_outputs and guided_* fields). Enforced by token masks (server/structured_output.h).
struct OutputConstraint {
  enum class Kind { kNone, kJsonObject, kJsonSchema, kRegex, kChoice, kGrammar };
  Kind kind = Kind::kNone;
  nlohmann::json schema;             // kJsonSchema
  std::string text;                  // kRegex, kGrammar (EBNF)
  std::vector<std::string> choices;  // kChoice
  std::string param;                 // the request field it came from (errors name it)
};

struct ChatRequest {
  std::string model;
  std::vector<ChatMessage> messages;
  std::vector<FunctionTool> tools;
  ToolChoice tool_choice;
  bool parallel_tool_calls = true;  // formats that end a turn at its first call (gpt-oss) make one either way
  OutputConstraint output;
  ReasoningEffort reasoning_effort = ReasoningEffort::kMedium;
  std::optional<bool> thinking;  // reasoning_effort ("none": false, a level: true), chat_template_kwargs.enable_thinking
  // vLLM's thinking_token_budget: reasoning tokens before the chat format closes the reasoning (enforced by
  // a token constraint: server/structured_output.h, which also bounds constrained requests without it).
  std::optional<int64_t> thinking_token_budget;
  SamplingOptions sampling;
  StreamOptions stream;
};

// One prompt of /v1/completions: text, or token ids given by the client.
struct CompletionPrompt {
  std::string text;
  std::vector<int64_t> token_ids;
  bool is_tokens = false;
};

struct CompletionRequest {
  std::string model;
  std::vector<CompletionPrompt> prompts;  // choice index = prompt index * n + sample index
  SamplingOptions sampling;
  StreamOptions stream;
  bool echo = false;
  OutputConstraint output;  // the whole completion (not only an answer: there is no message structure)
};

// POST /v1/responses: the conversation becomes a ChatRequest (instructions as the developer message,
// input items as messages), so the service serves one kind of chat.
struct ResponsesRequest {
  ChatRequest chat;
  std::string instructions;
};

// ---- What a CompletionService reports (see generation_stream.h) ----

enum class FinishReason { kStop, kLength, kToolCalls, kAbort, kError };
const char* finish_reason_name(FinishReason reason);

struct ToolCallDelta {
  int64_t index = 0;      // which call of this choice
  std::string id;         // first fragment of a call only
  std::string name;       // first fragment of a call only
  std::string arguments;  // a piece of the JSON text
};

// One generated token's logprob as OpenAI reports it.
struct TokenLogprobInfo {
  std::string token;  // the token's text (U+FFFD for a partial UTF-8 sequence)
  std::string bytes;  // the token's raw bytes (what the `bytes` list carries)
  double logprob = 0.0;
  std::vector<TokenLogprobInfo> top;  // the most likely alternatives, first first
};

struct GenerationDelta {
  int64_t choice = 0;
  std::string reasoning;
  std::string content;
  std::vector<ToolCallDelta> tool_calls;
  std::vector<TokenLogprobInfo> logprobs;  // the tokens of `content`, when the request asked for logprobs
  int64_t num_tokens = 0;  // generated tokens this delta covers (latency metrics)
};

struct GenerationUsage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;
  int64_t reasoning_tokens = 0;
};

}  // namespace mx::server
