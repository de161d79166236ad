// EngineCompletionService: the CompletionService backed by the continuous-batching Engine.
//
// On the io thread that received the request (no waiting): chat and responses requests are rendered to
// prompt ids by the model's ChatFormat (completions: the text tokenized, or the client's ids), checked
// against the context length (400 with the numbers), and submitted as one engine request per choice (n > 1:
// n requests; the seed, when given, is seed + choice; chat stops on the format's stop ids). The engine's
// RequestStream notify callback, which runs on the engine thread, only posts a drain to the connection's
// strand; there a GenerationJob turns new token ids into reasoning, content and tool-call deltas (one
// ChatStreamParser of the format per choice) and ends the response with usage. A client that disconnects aborts its engine requests (freed within one step).
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <mutex>
#include <unordered_map>

#include "chat/chat_format.h"
#include "runtime/engine.h"
#include "server/completion_service.h"
#include "server/forced_transcripts.h"
#include "server/generation_job.h"
#include "server/structured_output.h"
#include "tokenizer/tokenizer.h"

namespace mx::server {

struct EngineServiceOptions {
  int64_t context_length = 0;  // prompt + output tokens per request; 0 = the engine's max_model_len
  const ForcedTranscripts* forced = nullptr;  // test only; must outlive the service
  // `serve --seed`: requests without a seed get seeds drawn from this (reproducible across restarts for
  // the same request order, as vLLM's --seed); unset: from the OS's random device.
  std::optional<uint64_t> seed;
};

class EngineCompletionService final : public CompletionService {
 public:
  // `engine` must outlive the service; the service must outlive the server using it. `format` renders chat
  // and parses its output; completions use its tokenizer directly.
  EngineCompletionService(Engine& engine, std::shared_ptr<const ChatFormat> format, EngineServiceOptions options);
  ~EngineCompletionService() override;

  std::optional<ApiError> start_chat(const ChatRequest& request, std::shared_ptr<GenerationStream> stream) override;
  std::optional<ApiError> start_completion(const CompletionRequest& request,
                                           std::shared_ptr<GenerationStream> stream) override;
  ServiceStats stats() const override;
  std::optional<ApiError> tokenize(const std::optional<ChatRequest>& chat, const std::string& prompt,
                                   std::vector<int32_t>* ids) const override;
  std::optional<ApiError> detokenize(const std::vector<int64_t>& ids, std::string* text) const override;

  int64_t context_length() const { return context_length_; }
  // Jobs started and not yet ended (tests).
  int64_t live_jobs() const;

 private:
  friend class GenerationJob;
  std::optional<ApiError> launch(GenerationJob::Kind kind, std::vector<JobChoice> choices,
                                 std::shared_ptr<GenerationStream> stream);
  void adopt(const std::shared_ptr<GenerationJob>& job);
  void release(const GenerationJob* job);
  uint64_t next_seed();  // for a choice without a request seed

  Engine& engine_;
  std::atomic<uint64_t> seed_counter_{0};
  std::shared_ptr<const ChatFormat> format_;
  std::shared_ptr<const Tokenizer> tokenizer_;  // format_'s (shares its ownership)
  StructuredOutputs structured_;  // response_format / tool_choice -> token constraints, compiled grammars cached
  EngineServiceOptions options_;
  int64_t context_length_;
  // Jobs own their engine streams; the engine's notify callbacks hold them only weakly, so the service
  // keeps each job alive until it ends.
  mutable std::mutex mu_;
  std::unordered_map<const GenerationJob*, std::shared_ptr<GenerationJob>> jobs_;
};

}  // namespace mx::server
