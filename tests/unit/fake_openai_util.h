// A minimal in-process OpenAI-compatible server for the bench client tests: raw Asio, one thread, coroutines.
// It answers GET /v1/models and streams canned chunks for POST /v1/completions and /v1/chat/completions in
// the awkward ways real servers do: chunked transfer encoding, events split over several writes (inside
// `data:`, inside UTF-8 sequences), CRLF and LF line endings, `: ping` comments, a JSON chunk spread over two
// `data:` lines, a role-only first chunk, an empty delta, a usage chunk with `choices: []`, then [DONE].
//
// The prompt (or the first message's content) picks the behaviour:
//   contains "fail"         500 with an OpenAI error body
//   contains "mid-error"    two text chunks, then an error event and [DONE]
//   contains "close-early"  two text chunks, then the connection closes
//   contains "no-usage"     the normal stream without the usage chunk
//   contains "eof-body"     no chunked encoding: Connection: close and the body ends at EOF
//   contains "stall"        one text chunk, then nothing for 3 s
//   anything else           max_tokens text chunks `token_gap_ms` apart, finish_reason "length"
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace mx::test {

struct FakeOpenAiOptions {
  int token_gap_ms = 2;
  // Close each connection right after its response although it was kept alive (a server's idle timeout
  // firing between requests): clients must resend on a new connection.
  bool close_after_each_response = false;
  // > 0: every stream waits (up to 20 s) before its first token until this many streams have been open at
  // once, so a concurrency test measures the client's concurrency, not how fast a loaded machine opens sockets.
  int64_t hold_until_open_streams = 0;
};

class FakeOpenAiServer {
 public:
  explicit FakeOpenAiServer(FakeOpenAiOptions options = {});
  ~FakeOpenAiServer();
  FakeOpenAiServer(const FakeOpenAiServer&) = delete;
  FakeOpenAiServer& operator=(const FakeOpenAiServer&) = delete;

  int port() const { return port_; }
  std::string base_url() const { return "http://127.0.0.1:" + std::to_string(port_); }

  std::atomic<int64_t> connections{0};
  std::atomic<int64_t> generation_requests{0};
  std::atomic<int64_t> max_open_streams{0};
  // Request bodies of the generation requests, in arrival order.
  std::vector<std::string> bodies() const;

  struct State;

 private:
  std::unique_ptr<State> state_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace mx::test
