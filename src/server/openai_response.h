// Response JSON for the generation endpoints, built from the GenerationDeltas a CompletionService reports.
// One formatter per request accumulates every delta (for the non-streaming body) and, when streaming,
// also renders the SSE events for it, exactly as OpenAI streams them:
//  - chat: a first chunk with the role, deltas (reasoning and reasoning_content both; tool calls with id,
//    type and name on their first fragment), a finish chunk with an empty delta, the usage chunk with
//    `choices: []` when asked, then `data: [DONE]`;
//  - completions: text chunks, a finish chunk, the usage chunk when asked, `data: [DONE]`;
//  - responses: typed events (response.created ... response.completed), no [DONE].
// Formatters are not thread-safe; GenerationStream calls them on the connection's strand.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "server/api_error.h"
#include "server/json_text.h"
#include "server/openai_types.h"

namespace mx::server {

struct ResponseIdentity {
  std::string id;  // chatcmpl-..., cmpl-..., resp_...
  std::string model;
  int64_t created = 0;  // unix seconds
};

class ResponseFormatter {
 public:
  virtual ~ResponseFormatter() = default;
  // Each appends the SSE text to send now (nothing when the event adds no output yet).
  virtual void delta(const GenerationDelta& delta, std::string* sse) = 0;
  virtual void finish(int64_t choice, FinishReason reason, std::string* sse) = 0;
  virtual void done(const GenerationUsage& usage, std::string* sse) = 0;
  // The complete non-streaming body, after done().
  virtual std::string body(const GenerationUsage& usage) const = 0;
  // An error after the stream started: in-band, since the status line (200) is already sent.
  virtual std::string stream_error(const ApiError& error);
};

// `logprobs`: the request asked for them (the body then carries a logprobs object even when empty).
std::unique_ptr<ResponseFormatter> make_chat_formatter(ResponseIdentity identity, StreamOptions stream, int64_t choices,
                                                       bool logprobs = false);
std::unique_ptr<ResponseFormatter> make_completion_formatter(ResponseIdentity identity, StreamOptions stream,
                                                             int64_t choices, bool logprobs = false);
// What a Responses request adds to its response object, and where a finished response goes to be stored.
struct ResponsesOptions {
  bool store = true;                 // echoed as "store"; the caller stores only when set
  std::string previous_response_id;  // echoed; empty = null
  // Called once with the final response object (completed or incomplete), before its last bytes are queued.
  std::function<void(const Json& response)> on_complete;
};
std::unique_ptr<ResponseFormatter> make_responses_formatter(ResponseIdentity identity, const ChatRequest& request,
                                                            ResponsesOptions options = {});

// `data: <json>\n\n`
std::string sse_data(const Json& data);
// A random id with `prefix` ("chatcmpl-", "call_", ...): 24 hex digits.
std::string random_id(const std::string& prefix);

struct ModelCard {
  std::string id;
  int64_t created = 0;
  int64_t context_length = 0;
};
Json model_json(const ModelCard& card);
// GET /v1/models.
std::string models_body(const std::vector<ModelCard>& models);

}  // namespace mx::server
