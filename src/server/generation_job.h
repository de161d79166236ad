// GenerationJob: one HTTP generation request in flight in the engine (one engine request per choice).
// Every method but schedule_drain and the constructor runs on the connection's strand, so its state needs
// no lock. See engine_completion_service.h for the whole path.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "server/content_stop.h"
#include "server/generation_stream.h"
#include "chat/chat_format.h"

namespace mx::server {

class EngineCompletionService;

struct JobChoice {
  RequestInput input;
  int64_t index = 0;          // choice index in the response
  bool counts_prompt = true;  // usage counts each prompt once, not once per sample
  std::string echo;           // completions with echo: the prompt text, sent before the first text
  std::vector<std::string> content_stops;  // chat: stop strings (the engine gets none; see content_stop.h)
};

class GenerationJob : public std::enable_shared_from_this<GenerationJob> {
 public:
  enum class Kind { kChat, kCompletion };

  GenerationJob(EngineCompletionService* service, Kind kind, std::shared_ptr<GenerationStream> stream);

  // Submits every choice; on a refusal aborts the ones already queued and returns the error to answer.
  std::optional<ApiError> start(std::vector<JobChoice> choices);

 private:
  struct Choice {
    JobChoice spec;
    RequestId id = -1;
    std::shared_ptr<RequestStream> stream;
    std::unique_ptr<ChatStreamParser> parser;  // chat: the model's format
    bool logprobs = false;
    bool finished = false;
    Usage usage;
    int64_t reasoning_tokens = 0;
    std::vector<SampledToken> held_logprobs;  // chat: tokens whose text has not come out yet
    ContentStopMatcher stop{{}};     // chat: stop strings, matched on content only
    bool stopped_by_string = false;  // chat: a stop string ended it (its engine request was aborted)
  };

  // Any thread (the engine's notify): posts one drain unless one is already pending.
  void schedule_drain();
  void drain();
  void process(Choice& c, RequestOutput& out);
  void chat_tokens(Choice& c, const RequestOutput& out);
  void apply_stop_strings(Choice& c, bool finished, std::vector<GenerationDelta>* deltas);
  TokenLogprobInfo logprob_info(const SampledToken& s) const;
  void fail(const std::string& message);
  void abort_all();
  void end();

  EngineCompletionService* service_;
  const Kind kind_;
  std::shared_ptr<GenerationStream> stream_;
  std::vector<Choice> choices_;
  std::atomic<bool> drain_pending_{false};
  bool ended_ = false;
  std::vector<ChatEvent> events_;  // scratch
};

}  // namespace mx::server
