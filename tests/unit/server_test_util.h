// Helpers for the HTTP server tests: a scripted CompletionService (no engine) and an ApiServer on a free
// loopback port (Boost.Beast comes with it); the raw HTTP client and `mxserve serve` as a child process are in
// serve_process_util.h, which needs no server header.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "serve_process_util.h"
#include "server/api_server.h"

namespace mx::test {

// Behaviour is picked by the last message's text (or the prompt, for completions):
//   "forever"   one content delta every 5 ms until cancelled, then finish "abort"
//   "tool"      a reasoning delta, then a get_weather call whose arguments arrive in two pieces
//   "fail-late" one content delta, then fail() with a 500 (error after the stream started)
//   "reject"    refuse at once with context_length_exceeded
//   "slow"      answer "ok" after 300 ms
//   anything else: reasoning "Thinking.", content "Hello world!" in three deltas, finish "stop"
class ScriptedService : public server::CompletionService {
 public:
  ~ScriptedService() override;
  std::optional<server::ApiError> start_chat(const server::ChatRequest& request,
                                             std::shared_ptr<server::GenerationStream> stream) override;
  std::optional<server::ApiError> start_completion(const server::CompletionRequest& request,
                                                   std::shared_ptr<server::GenerationStream> stream) override;
  server::ServiceStats stats() const override;

  std::atomic<int64_t> cancellations{0};
  std::atomic<int64_t> running{0};
  // The last parsed chat request, for tests that check parsing end to end.
  server::ChatRequest last_chat() const;

 private:
  void spawn(std::function<void()> fn);
  mutable std::mutex mu_;
  std::vector<std::thread> threads_;
  server::ChatRequest last_chat_;
};

class TestServer {
 public:
  explicit TestServer(server::ApiServerOptions options = default_options());
  static server::ApiServerOptions default_options();
  int port() const { return server_->port(); }
  server::ApiServer& api() { return *server_; }
  ScriptedService& service() { return service_; }

 private:
  ScriptedService service_;  // outlives the server
  std::unique_ptr<server::ApiServer> server_;
};

}  // namespace mx::test
