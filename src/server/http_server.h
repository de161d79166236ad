// Async HTTP/1.1 on Boost.Beast: a fixed pool of io threads runs every connection, so ten thousand open
// streams cost ten thousand small session objects, not threads. Each connection lives on its own strand;
// nothing here takes a lock.
//
// A request is handed to the Handler together with a ResponseChannel, the only way to answer it. The
// channel may be used from any thread (it posts to the connection's strand), now or much later, to send
// one complete response or a chunked stream (begin_stream, write_chunk..., end_stream). While a response
// is outstanding the connection watches its socket, so a client that goes away is noticed even when
// nothing is being written (a long prefill), and the channel's disconnect callback fires once.
//
// Limits are enforced before the handler runs: body size (413), header size (431), malformed requests
// (400), ambiguous body framing and Host errors (400 + close: see request_framing_error), and an idle
// timeout per request (slowloris). Keep-alive follows the request (HTTP/1.1 default on). HEAD is answered
// with the headers of the GET response. When accept() runs out of file descriptors the oldest idle
// connections are closed to make room, so a flood of idle clients cannot lock others out.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>  // before Asio: its awaitable.hpp uses std::exchange without including it
#include <vector>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "core/status.h"
#include "server/api_error.h"
#include "server/http_server_config.h"

namespace mx::server {

namespace beast = boost::beast;
namespace http = boost::beast::http;
namespace net = boost::asio;

using HttpRequest = http::request<http::string_body>;
using HttpResponse = http::response<http::string_body>;

// Beast 1.74 has its own string_view; the rest of the code uses std's.
inline std::string_view to_std(beast::string_view s) { return {s.data(), s.size()}; }

class HttpSession;
class IdleConnections;

// An error response in the OpenAI envelope; 503 carries Retry-After, 405 an Allow list when given, 401
// a WWW-Authenticate challenge.
HttpResponse make_error_response(const ApiError& error, unsigned version, const std::string& allow = "");
HttpResponse make_json_response(http::status status, std::string body, unsigned version);

// Why a request's head cannot be served safely, checked before its body is read: a Transfer-Encoding other
// than exactly `chunked` (400, or 501 for codings before chunked), both Transfer-Encoding and
// Content-Length, an HTTP/1.1 request without exactly one Host, a malformed Host. The connection closes.
std::optional<ApiError> request_framing_error(const http::request_header<>& header);
// The origin form (path and query) of a request target given in absolute form (`http://host/path?q`).
std::string origin_form_target(std::string_view target);

class ResponseChannel : public std::enable_shared_from_this<ResponseChannel> {
 public:
  explicit ResponseChannel(std::shared_ptr<HttpSession> session) : session_(std::move(session)) {}

  // All of these are thread-safe and return at once; the work happens on the connection's strand.
  // Calls after the response is complete, or after the client left, are ignored.
  void respond(HttpResponse response);
  // Sends the status line and headers of `head` with chunked transfer encoding (its body is ignored).
  void begin_stream(HttpResponse head);
  void write_chunk(std::string data);
  void end_stream();
  // Runs `fn` on the connection's strand (callers that keep state per request without locks).
  void run(std::function<void()> fn);
  // Text for this request's access-log line (token counts); call before the response completes.
  void set_log_note(std::string note);

  bool disconnected() const { return disconnected_.load(std::memory_order_acquire); }
  // `fn` runs once, on the strand, when the client goes away before the response is complete (at once if
  // it already has). Replaces an earlier callback.
  void on_disconnect(std::function<void()> fn);

 private:
  friend class HttpSession;
  std::shared_ptr<HttpSession> session_;
  // Strand-only state.
  bool complete_ = false;
  bool streaming_ = false;
  std::function<void()> disconnect_fn_;
  std::string log_note_;
  std::atomic<bool> disconnected_{false};
};

using HttpHandler = std::function<void(HttpRequest&& request, std::shared_ptr<ResponseChannel> channel)>;

class HttpServer {
 public:
  // Binds, listens and starts the io threads. The handler runs on io threads; it must not block.
  static Result<std::unique_ptr<HttpServer>> start(const HttpServerOptions& options, HttpHandler handler);
  ~HttpServer();  // stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const { return port_; }
  // Closes the listening socket: new connections are refused, open ones keep being served.
  void stop_accepting();
  // Stops the io threads and closes every connection. Idempotent.
  void stop();

 private:
  HttpServer(const HttpServerOptions& options, HttpHandler handler);
  void do_accept();

  HttpServerOptions options_;
  HttpHandler handler_;
  std::shared_ptr<IdleConnections> idle_;
  std::chrono::steady_clock::time_point last_accept_warning_{};
  net::io_context ioc_;
  net::executor_work_guard<net::io_context::executor_type> work_;
  net::ip::tcp::acceptor acceptor_;
  std::vector<std::thread> threads_;
  int port_ = 0;
  std::atomic<bool> stopped_{false};
};

}  // namespace mx::server
