// CompletionService: the seam between the HTTP server and generation. The server parses and validates
// OpenAI requests into native structs and hands them here together with a GenerationStream to answer
// through; the service renders (the model's ChatFormat), tokenizes, submits to the engine and reports text back.
//
// Wired today: the interface, a service that refuses generation (UnwiredCompletionService, what
// `mxserve serve` runs until the engine and tokenizer are merged), and a scripted fake in the tests.
// Not wired yet: the engine-backed implementation (issue 6, phase 2).
#pragma once

#include <memory>
#include <optional>

#include "server/api_error.h"
#include "server/generation_stream.h"
#include "server/openai_types.h"

namespace mx::server {

// The engine's side of /metrics, read at each scrape.
struct ServiceStats {
  int64_t running = 0;
  int64_t waiting = 0;
  double kv_cache_usage = 0.0;  // 0..1
  int64_t preemptions_total = 0;
  int64_t prefix_query_tokens = 0;  // prompt tokens looked up in the prefix cache (cumulative)
  int64_t prefix_hit_tokens = 0;    // of those, tokens found (cumulative)
  // Speculative decoding (cumulative; SchedulerStats' spec_* counters).
  int64_t spec_drafts = 0;
  int64_t spec_draft_tokens = 0;
  int64_t spec_accepted_tokens = 0;
  std::vector<int64_t> spec_accepted_per_pos;
  // The KV cache's configuration (constant once serving).
  int64_t page_size = 0;
  int64_t num_pages = 0;
  bool prefix_caching = false;
  std::string kv_cache_dtype;
  double mem_fraction = 0;
};

class CompletionService {
 public:
  virtual ~CompletionService() = default;

  // Called on an io thread; must not block for long (tokenizing is fine, waiting for the engine is not).
  // An error is answered at once with its status. nullopt means the service took the request and will
  // end `stream` exactly once (see GenerationStream), including after a cancel.
  virtual std::optional<ApiError> start_chat(const ChatRequest& request, std::shared_ptr<GenerationStream> stream) = 0;
  virtual std::optional<ApiError> start_completion(const CompletionRequest& request,
                                                   std::shared_ptr<GenerationStream> stream) = 0;
  virtual ServiceStats stats() const = 0;

  // /tokenize and /detokenize (vLLM's shapes). A chat request (`messages` given) is rendered as for
  // generation; a prompt is encoded as completions encode it. Services without a tokenizer answer 501.
  virtual std::optional<ApiError> tokenize(const std::optional<ChatRequest>& chat, const std::string& prompt,
                                           std::vector<int32_t>* ids) const {
    (void)chat, (void)prompt, (void)ids;
    return ApiError::not_implemented("This server has no tokenizer loaded.");
  }
  virtual std::optional<ApiError> detokenize(const std::vector<int64_t>& ids, std::string* text) const {
    (void)ids, (void)text;
    return ApiError::not_implemented("This server has no tokenizer loaded.");
  }
};

// Answers every generation request with 501 and says why. /health, /metrics and /v1/models still work.
class UnwiredCompletionService final : public CompletionService {
 public:
  std::optional<ApiError> start_chat(const ChatRequest&, std::shared_ptr<GenerationStream>) override { return error(); }
  std::optional<ApiError> start_completion(const CompletionRequest&, std::shared_ptr<GenerationStream>) override {
    return error();
  }
  ServiceStats stats() const override { return {}; }

 private:
  static ApiError error() {
    return ApiError::not_implemented("Generation is not wired to the engine in this build yet (issue 6, phase 2).");
  }
};

}  // namespace mx::server
