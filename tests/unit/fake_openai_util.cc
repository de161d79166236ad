#include "fake_openai_util.h"

#include <algorithm>
#include <utility>  // Boost 1.74's asio/awaitable.hpp uses std::exchange without including it

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <cstdio>
#include <nlohmann/json.hpp>

namespace mx::test {

namespace net = boost::asio;
using net::awaitable;
using net::use_awaitable;
using tcp = net::ip::tcp;

struct FakeOpenAiServer::State {
  net::io_context ioc{1};
  tcp::acceptor acceptor{ioc};
  FakeOpenAiOptions options;
  FakeOpenAiServer* owner = nullptr;
  mutable std::mutex mu;
  std::vector<std::string> bodies;
  int64_t open_streams = 0;  // touched on the server thread only
};

namespace {

using State = FakeOpenAiServer::State;

// Token texts with multi-byte UTF-8, so that split writes land inside sequences.
const char* const kTokens[] = {"h\xC3\xA9llo", " w\xC3\xB6rld", " \xE2\x86\x92", " \xF0\x9F\x98\x80", " plain"};

awaitable<void> pause_ms(int ms) {
  net::steady_timer timer(co_await net::this_coro::executor);
  timer.expires_after(std::chrono::milliseconds(ms));
  co_await timer.async_wait(use_awaitable);
}

awaitable<void> write_raw(tcp::socket& socket, std::string bytes) {
  co_await net::async_write(socket, net::buffer(bytes), use_awaitable);
}

std::string http_chunk(std::string_view data) {
  char size[16];
  std::snprintf(size, sizeof(size), "%zx\r\n", data.size());
  return size + std::string(data) + "\r\n";
}

// How one response body goes out: chunked or raw (ended by closing), with writes split to taste.
class BodyWriter {
 public:
  BodyWriter(tcp::socket& socket, bool chunked) : socket_(socket), chunked_(chunked) {}

  // Writes `bytes` in two writes split at `split` (when inside), pausing in between when asked.
  awaitable<void> send(std::string bytes, size_t split, bool pause_between) {
    if (split == 0 || split >= bytes.size()) {
      co_await write_raw(socket_, frame(bytes));
      co_return;
    }
    co_await write_raw(socket_, frame(bytes.substr(0, split)));
    if (pause_between) co_await pause_ms(1);
    co_await write_raw(socket_, frame(bytes.substr(split)));
  }
  awaitable<void> end() {
    if (chunked_) co_await write_raw(socket_, "0\r\n\r\n");
  }

 private:
  std::string frame(std::string_view data) const { return chunked_ ? http_chunk(data) : std::string(data); }
  tcp::socket& socket_;
  bool chunked_;
};

std::string chunk_json(bool chat, const std::string& choice_body) {
  const std::string head = chat ? R"({"id":"chatcmpl-1","object":"chat.completion.chunk","created":0,"model":"fake-model","choices":[)"
                                : R"({"id":"cmpl-1","object":"text_completion","created":0,"model":"fake-model","choices":[)";
  return head + choice_body + "]}";
}

std::string text_choice(bool chat, const std::string& text, const char* field = "content") {
  return chat ? R"({"index":0,"delta":{")" + std::string(field) + R"(":")" + text + R"("},"finish_reason":null})"
              : R"({"index":0,"text":")" + text + R"(","logprobs":null,"finish_reason":null})";
}

std::string event(const std::string& json, bool crlf) {
  const char* eol = crlf ? "\r\n" : "\n";
  return "data: " + json + eol + eol;
}

awaitable<void> write_json_response(tcp::socket& socket, int status, const std::string& reason, const std::string& body) {
  co_await write_raw(socket, "HTTP/1.1 " + std::to_string(status) + " " + reason +
                                 "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
                                 "\r\n\r\n" + body);
}

// Streams one generation. Returns false when the connection must close afterwards.
awaitable<bool> stream_generation(tcp::socket& socket, State* st, bool chat, const std::string& prompt, int64_t max_tokens,
                                  bool include_usage) {
  const bool eof_body = prompt.find("eof-body") != std::string::npos;
  const bool close_early = prompt.find("close-early") != std::string::npos;
  const bool mid_error = prompt.find("mid-error") != std::string::npos;
  const bool usage = include_usage && prompt.find("no-usage") == std::string::npos;
  co_await write_raw(socket, std::string("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n") +
                                 (eof_body ? "Connection: close\r\n" : "Transfer-Encoding: chunked\r\n") + "\r\n");
  st->owner->max_open_streams.store(std::max<int64_t>(st->owner->max_open_streams.load(), ++st->open_streams));
  BodyWriter body(socket, !eof_body);
  const int gap = st->options.token_gap_ms;
  for (int waited_ms = 0; st->owner->max_open_streams.load() < st->options.hold_until_open_streams && waited_ms < 20000;
       waited_ms += 5) {
    co_await pause_ms(5);
  }
  // A comment first, then (chat) the role-only chunk with empty content, split inside "data:".
  co_await body.send(": ping\r\n\r\n", 0, false);
  if (chat) co_await body.send(event(chunk_json(true, R"({"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null})"), false), 3, true);
  if (prompt.find("stall") != std::string::npos) {
    co_await body.send(event(chunk_json(chat, text_choice(chat, "x")), false), 0, false);
    co_await pause_ms(3000);
    st->open_streams--;
    co_return false;
  }
  const int64_t tokens = (close_early || mid_error) ? std::min<int64_t>(2, max_tokens) : max_tokens;
  for (int64_t i = 0; i < tokens; ++i) {
    if (gap > 0) co_await pause_ms(gap);
    const std::string text = kTokens[i % 5];
    // The first chat token is reasoning text: it counts for TTFT like content does.
    const std::string json = chunk_json(chat, text_choice(chat, text, chat && i == 0 ? "reasoning_content" : "content"));
    std::string bytes;
    if (i % 4 == 1) {  // one JSON chunk over two data: lines (joined with "\n", which JSON reads as space)
      const size_t comma = json.find(',');
      bytes = "data: " + json.substr(0, comma + 1) + "\ndata: " + json.substr(comma + 1) + "\n\n";
    } else {
      bytes = event(json, i % 2 == 0);
    }
    if (i % 3 == 2) bytes = ": ping\n\n" + bytes;
    if (i == 1) bytes += event(chunk_json(chat, chat ? R"({"index":0,"delta":{},"finish_reason":null})"
                                                      : R"({"index":0,"text":"","finish_reason":null})"), true);
    // Split points walk through the event: inside "data:", inside the JSON, inside multi-byte text.
    co_await body.send(bytes, (i * 7 + 2) % bytes.size(), i < 3);
  }
  if (close_early) {
    st->open_streams--;
    co_return false;
  }
  if (mid_error) {
    co_await body.send("event: error\ndata: {\"error\":{\"message\":\"scripted mid-stream error\",\"type\":\"server_error\"}}\n\n", 9, false);
  } else {
    co_await body.send(event(chunk_json(chat, chat ? R"({"index":0,"delta":{},"finish_reason":"length"})"
                                                   : R"({"index":0,"text":"","finish_reason":"length"})"), false), 0, false);
    if (usage) {
      const std::string u = R"({"id":"x","object":"chunk","created":0,"model":"fake-model","choices":[],"usage":{"prompt_tokens":)" +
                            std::to_string(prompt.size()) + R"(,"completion_tokens":)" + std::to_string(tokens) +
                            R"(,"total_tokens":)" + std::to_string(static_cast<int64_t>(prompt.size()) + tokens) + "}}";
      co_await body.send(event(u, true), 0, false);
    }
  }
  co_await body.send("data: [DONE]\n\n", 8, false);
  co_await body.end();
  st->open_streams--;
  co_return !eof_body;
}

// Answers one request; false when the connection must close afterwards.
awaitable<bool> respond(tcp::socket& socket, State* st, const std::string& method, const std::string& target,
                        const std::string& body) {
  if (method == "GET" && target == "/v1/models") {
    co_await write_json_response(socket, 200, "OK", R"({"object":"list","data":[{"id":"fake-model","object":"model"}]})");
    co_return true;
  }
  const bool chat = target == "/v1/chat/completions";
  if (method != "POST" || (!chat && target != "/v1/completions")) {
    co_await write_json_response(socket, 404, "Not Found", R"({"error":{"message":"no such route"}})");
    co_return true;
  }
  st->owner->generation_requests++;
  {
    std::lock_guard lock(st->mu);
    st->bodies.push_back(body);
  }
  const auto request = nlohmann::json::parse(body, nullptr, false);
  std::string prompt;
  int64_t max_tokens = 4;
  bool include_usage = false;
  if (request.is_object()) {
    if (chat && request.contains("messages") && request["messages"].is_array() && !request["messages"].empty())
      prompt = request["messages"][0].value("content", "");
    if (!chat) prompt = request.value("prompt", "");
    max_tokens = request.value("max_tokens", int64_t{4});
    if (request.contains("stream_options") && request["stream_options"].is_object())
      include_usage = request["stream_options"].value("include_usage", false);
  }
  if (prompt.find("fail") != std::string::npos) {
    co_await write_json_response(socket, 500, "Internal Server Error",
                                 R"({"error":{"message":"scripted failure","type":"server_error","code":500}})");
    co_return true;
  }
  co_return co_await stream_generation(socket, st, chat, prompt, max_tokens, include_usage);
}

awaitable<void> serve_connection(tcp::socket socket, State* st) {
  try {
    std::string buffer;
    for (;;) {
      const size_t head_end = co_await net::async_read_until(socket, net::dynamic_buffer(buffer), "\r\n\r\n", use_awaitable);
      const std::string head = buffer.substr(0, head_end);
      buffer.erase(0, head_end);
      const size_t sp1 = head.find(' '), sp2 = head.find(' ', sp1 + 1);
      const std::string method = head.substr(0, sp1), target = head.substr(sp1 + 1, sp2 - sp1 - 1);
      std::string lower = head;
      std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
      size_t length = 0;
      if (const size_t at = lower.find("\r\ncontent-length:"); at != std::string::npos)
        length = std::stoul(head.substr(at + 17));
      if (buffer.size() < length)
        co_await net::async_read(socket, net::dynamic_buffer(buffer), net::transfer_at_least(length - buffer.size()), use_awaitable);
      const std::string body = buffer.substr(0, length);
      buffer.erase(0, length);
      const bool keep = co_await respond(socket, st, method, target, body);
      if (!keep || st->options.close_after_each_response) break;
    }
  } catch (const std::exception&) {
    // the client went away: nothing to do
  }
  boost::system::error_code ignored;
  socket.shutdown(tcp::socket::shutdown_both, ignored);
  socket.close(ignored);
}

awaitable<void> accept_loop(State* st) {
  for (;;) {
    tcp::socket socket = co_await st->acceptor.async_accept(use_awaitable);
    st->owner->connections++;
    socket.set_option(tcp::no_delay(true));  // split writes go out at once, as a streaming server's do
    net::co_spawn(st->ioc, serve_connection(std::move(socket), st), net::detached);
  }
}

}  // namespace

FakeOpenAiServer::FakeOpenAiServer(FakeOpenAiOptions options) : state_(std::make_unique<State>()) {
  state_->options = options;
  state_->owner = this;
  const tcp::endpoint endpoint(net::ip::make_address("127.0.0.1"), 0);
  state_->acceptor.open(endpoint.protocol());
  state_->acceptor.set_option(tcp::acceptor::reuse_address(true));
  state_->acceptor.bind(endpoint);
  state_->acceptor.listen(4096);
  port_ = state_->acceptor.local_endpoint().port();
  net::co_spawn(state_->ioc, accept_loop(state_.get()), net::detached);
  thread_ = std::thread([this] { state_->ioc.run(); });
}

FakeOpenAiServer::~FakeOpenAiServer() {
  state_->ioc.stop();
  thread_.join();
}

std::vector<std::string> FakeOpenAiServer::bodies() const {
  std::lock_guard lock(state_->mu);
  return state_->bodies;
}

}  // namespace mx::test
