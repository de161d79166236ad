// Helpers for the HTTP server tests: a scripted CompletionService (no engine), an ApiServer on a free
// loopback port, and a raw HTTP client that sends exact bytes and reads whole responses (chunked too).
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <sys/types.h>

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

// Starts the `mxserve` binary's `serve` on a free port with the demo model (cached under the build tree,
// shared with the engine tests) plus `extra` flags; returns its pid and port (0 if it printed none) once it
// serves. `max_open_files` > 0 caps the child's RLIMIT_NOFILE, soft and hard (as `ulimit -n` does).
std::pair<pid_t, int> start_serve(const std::vector<std::string>& extra, int max_open_files = 0);
// Waits for the process and returns its exit code (-1 when a signal ended it).
int wait_exit(pid_t pid);

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

struct HttpReply {
  int status = 0;  // 0: no response (connection closed or timed out)
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;
  std::string header(const std::string& name) const {
    auto it = headers.find(name);
    return it == headers.end() ? "" : it->second;
  }
};

// How much slower this build runs than a plain one (sanitizers): client timeouts and waits are scaled by it.
inline constexpr int kTestTimeScale = MX_TEST_TIME_SCALE;

class RawClient {
 public:
  // `timeout_ms` (per read and write) is scaled by kTestTimeScale.
  explicit RawClient(int port, int timeout_ms = 10000);
  ~RawClient();
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  bool send(const std::string& bytes);
  void shutdown_write();
  // Reads one whole response (status 0 if the connection ends or times out first).
  HttpReply read_reply();
  // Reads the status line and headers only; the body (SSE) follows through read_some.
  HttpReply read_head();
  // Raw bytes as they arrive (empty on close/timeout).
  std::string read_some();
  // True when the server has closed the connection (reads EOF within the timeout).
  bool closed_by_peer();
  void close();

 private:
  std::string recv_some();  // bytes from the socket only (empty on close/timeout)

  int fd_ = -1;
  std::string buffered_;
};

// One request on a fresh connection. `extra_headers` are full lines without CRLF.
HttpReply http_call(int port, const std::string& method, const std::string& target, const std::string& body = "",
                    const std::vector<std::string>& extra_headers = {});
std::string make_request(const std::string& method, const std::string& target, const std::string& body = "",
                         const std::vector<std::string>& extra_headers = {});
// The payloads of `data:` events in an SSE body, in order ("[DONE]" included).
std::vector<std::string> sse_payloads(const std::string& body);
// The `event:` names in an SSE body, in order.
std::vector<std::string> sse_event_names(const std::string& body);

}  // namespace mx::test
