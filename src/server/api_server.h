// ApiServer: the OpenAI-compatible routes on top of HttpServer: auth, admission, draining, metrics, and
// the generation endpoints, which parse and validate requests here and hand them to a CompletionService.
//
// Routes: GET /health (open, 503 while loading or draining), GET /metrics, GET /v1/models[/{id}],
// POST /v1/chat/completions, /v1/completions, /v1/responses. Everything but /health needs the API key
// when one is set. Unknown path -> 404, known path with another method -> 405 (with Allow).
// Admission: at most max_running + max_queued generation requests held at once; more get 503 +
// Retry-After (SGLang's --max-queued-requests semantics; the engine enforces max_running itself).
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "server/completion_service.h"
#include "server/http_server_config.h"
#include "server/metrics.h"

namespace mx::server {

class HttpServer;
class ResponseChannel;
// The request being answered: http_server.h's HttpRequest (a Boost.Beast message), defined in api_server.cc so
// that this header does not parse Beast.
struct ApiRequest;

struct ApiServerOptions {
  HttpServerOptions http;
  std::string api_key;            // empty: no auth
  bool metrics_require_key = false;
  bool log_requests = true;          // one access-log line per request (--disable-log-requests turns it off)  // /metrics is open (as vLLM serves it: scrapers hold no key) unless set
  std::string served_model_name;  // the id in /v1/models; requests naming another model get 404
  int64_t context_length = 131072;
  int64_t max_running_requests = 256;  // 0: not known until set_ready (the engine sizes it)
  int64_t max_queued_requests = 1024;
  int64_t speculative_draft_tokens = 0;  // k of the engine's speculative decoding (0: off): /metrics' spec_decode series
  std::chrono::milliseconds shutdown_timeout{30000};
};

enum class ServerState { kLoading, kReady, kDraining };

class ApiServer {
 public:
  // Starts listening at once, in kLoading (health 503) until set_ready(). Services must outlive the server.
  static Result<std::unique_ptr<ApiServer>> start(const ApiServerOptions& options, CompletionService* service);
  ~ApiServer();  // drain_and_stop()
  ApiServer(const ApiServer&) = delete;
  ApiServer& operator=(const ApiServer&) = delete;

  int port() const;
  // Health turns 200 and generation opens. A server started before the model was loaded gets its real
  // service, context length and running-request limit here (all optional).
  void set_ready(CompletionService* service = nullptr, int64_t context_length = 0, int64_t max_running_requests = 0);
  ServerState state() const { return state_.load(); }
  // Generation requests admitted and not yet ended.
  int64_t in_flight() const;
  MetricsRegistry& registry();

  // Graceful shutdown (SIGTERM): refuse new connections and requests (503), let in-flight requests finish
  // for up to shutdown_timeout, cancel the rest (their producers end them with finish_reason "abort"),
  // then stop the io threads. Idempotent.
  void drain_and_stop();

 private:
  struct Shared;
  enum class Endpoint { kChat, kCompletions, kResponses };

  ApiServer(const ApiServerOptions& options, CompletionService* service);
  void handle(ApiRequest&& request, std::shared_ptr<ResponseChannel> channel);
  void generate(Endpoint endpoint, const ApiRequest& request, const std::shared_ptr<ResponseChannel>& channel);
  // POST /tokenize and /detokenize, vLLM's request and response shapes.
  void tokenize(bool detokenize, const ApiRequest& request, const std::shared_ptr<ResponseChannel>& channel);
  bool authorized(const ApiRequest& request) const;
  std::string metrics_text();
  void cancel_all();

  ApiServerOptions options_;
  std::atomic<CompletionService*> service_;
  std::atomic<int64_t> context_length_;
  std::atomic<int64_t> max_running_requests_;  // with max_queued_requests: the admission limit
  std::shared_ptr<Shared> shared_;  // outlives the server while requests still hold it
  std::unique_ptr<HttpServer> http_;
  std::atomic<ServerState> state_{ServerState::kLoading};
  std::atomic<bool> stopped_{false};
  int64_t created_ = 0;
};

// Equal strings compare in time that depends only on `secret`'s length, never on where they differ.
bool constant_time_equal(std::string_view given, std::string_view secret);

}  // namespace mx::server
