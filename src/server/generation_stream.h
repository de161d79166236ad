// GenerationStream: how whatever generates text (a CompletionService; the engine side) answers one HTTP
// request. Thread-safe: call it from any thread. Each call hops to the connection's strand, where a
// ResponseFormatter turns the events into OpenAI JSON: SSE chunks as they come when the client asked to
// stream, one body at the end otherwise. Latency metrics are taken here, so every service gets them.
//
// Protocol for the producer: delta()* and finish_choice()* in order, then exactly one of done() or fail().
// When the client disconnects (or the server aborts at shutdown) the cancel callback fires once; the
// producer should stop and still end the stream (done() with FinishReason::kAbort choices, or fail()).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>

#include "server/api_error.h"
#include "server/metrics.h"
#include "server/openai_response.h"
#include "server/openai_types.h"

namespace mx::server {

class ResponseChannel;  // server/http_server.h: Boost.Beast, which only the HTTP side needs to parse

class GenerationStream : public std::enable_shared_from_this<GenerationStream> {
 public:
  // `on_end` runs once on the strand when the request ends however it ends (admission release).
  GenerationStream(std::shared_ptr<ResponseChannel> channel, std::unique_ptr<ResponseFormatter> formatter, bool streaming,
                   ServerMetrics* metrics, std::function<void()> on_end);
  ~GenerationStream();
  GenerationStream(const GenerationStream&) = delete;
  GenerationStream& operator=(const GenerationStream&) = delete;

  void delta(GenerationDelta delta);
  void finish_choice(int64_t choice, FinishReason reason);
  void done(GenerationUsage usage);
  // When the engine first scheduled one of this request's choices (queue/prefill/decode-time metrics).
  void scheduled(std::chrono::steady_clock::time_point when);
  void fail(ApiError error);

  // True once the client has gone away or the request was aborted; producers may poll it.
  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }
  // `fn` runs once (on an io thread) when the request is cancelled; at once if it already was.
  void on_cancel(std::function<void()> fn);
  // Server shutdown: cancel as if the client had left.
  void cancel();

  bool streaming() const { return streaming_; }
  // Runs `fn` on the connection's strand, in order with the events above (producers that keep per-request
  // state without locks, e.g. the engine service draining its request streams).
  void post(std::function<void()> fn);

 private:
  void start();  // registers the disconnect callback; called by the factory
  void begin_if_needed();
  void end();
  void fire_cancel();
  friend std::shared_ptr<GenerationStream> make_generation_stream(std::shared_ptr<ResponseChannel>,
                                                                  std::unique_ptr<ResponseFormatter>, bool,
                                                                  ServerMetrics*, std::function<void()>);

  std::shared_ptr<ResponseChannel> channel_;
  std::unique_ptr<ResponseFormatter> formatter_;
  const bool streaming_;
  ServerMetrics* metrics_;
  std::function<void()> on_end_;
  std::atomic<bool> cancelled_{false};
  // Strand-only state.
  std::function<void()> cancel_fn_;
  bool headers_sent_ = false;
  bool ended_ = false;
  std::chrono::steady_clock::time_point arrival_, first_token_, last_token_, scheduled_;
  int64_t tokens_ = 0;
  FinishReason last_reason_ = FinishReason::kStop;
};

std::shared_ptr<GenerationStream> make_generation_stream(std::shared_ptr<ResponseChannel> channel,
                                                         std::unique_ptr<ResponseFormatter> formatter, bool streaming,
                                                         ServerMetrics* metrics, std::function<void()> on_end);

}  // namespace mx::server
