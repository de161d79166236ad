// Beast sessions: read a request (header first, so `Expect: 100-continue` is answered), hand it to the
// handler, write what the ResponseChannel produces, then read the next one on a kept-alive connection.
// All session state is touched only on the connection's strand.
#include "server/http_server.h"

#include <sys/resource.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdio>
#include <algorithm>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>

#include "core/log.h"

namespace mx::server {

using tcp = net::ip::tcp;

HttpResponse make_json_response(http::status status, std::string body, unsigned version) {
  HttpResponse res{status, version};
  res.set(http::field::server, "mxserve");
  res.set(http::field::content_type, "application/json");
  res.body() = std::move(body);
  return res;
}

HttpResponse make_error_response(const ApiError& error, unsigned version, const std::string& allow) {
  HttpResponse res = make_json_response(static_cast<http::status>(error.status), error_body(error), version);
  if (error.status == 503) res.set(http::field::retry_after, "1");
  if (error.status == 405 && !allow.empty()) res.set(http::field::allow, allow);
  if (error.status == 401) res.set(http::field::www_authenticate, "Bearer realm=\"mxserve\"");
  return res;
}

namespace {

std::string lower_trimmed(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

}  // namespace

std::optional<ApiError> request_framing_error(const http::request_header<>& header) {
  // RFC 9112 section 6: the body of a request is framed by Content-Length or by the chunked coding, and
  // chunked must be the last coding. Any other Transfer-Encoding leaves the body length to guesswork: a proxy
  // in front of us may frame it one way and we another, so its bytes could run as a second request
  // (request smuggling). Such requests are refused and the connection closed.
  std::vector<std::string> codings;
  size_t te_fields = 0;
  for (auto it = header.find(http::field::transfer_encoding); it != header.end() && it->name() == http::field::transfer_encoding; ++it) {
    ++te_fields;
    const std::string_view value = to_std(it->value());
    size_t start = 0;
    while (start <= value.size()) {
      const size_t comma = value.find(',', start);
      const size_t end = comma == std::string_view::npos ? value.size() : comma;
      codings.push_back(lower_trimmed(value.substr(start, end - start)));
      if (comma == std::string_view::npos) break;
      start = comma + 1;
    }
  }
  if (te_fields > 0) {
    if (header.version() < 11) {
      return ApiError::invalid_request("Transfer-Encoding is not allowed in an HTTP/1.0 request.");
    }
    if (codings.back() != "chunked") {
      return ApiError::invalid_request("Transfer-Encoding must end with `chunked`; the request's body framing is ambiguous.");
    }
    if (codings.size() > 1) {
      return ApiError::not_implemented("Only the `chunked` transfer coding is supported (got \"" +
                                       std::string(to_std(header[http::field::transfer_encoding])) + "\").");
    }
    if (header.count(http::field::content_length) > 0) {
      return ApiError::invalid_request("A request must not carry both Transfer-Encoding and Content-Length.");
    }
  }
  // RFC 9112 section 3.2: an HTTP/1.1 request carries exactly one Host field.
  const size_t hosts = header.count(http::field::host);
  if (header.version() >= 11 && hosts != 1) {
    return ApiError::invalid_request(hosts == 0 ? "Missing Host header." : "More than one Host header.");
  }
  if (hosts > 1) return ApiError::invalid_request("More than one Host header.");
  if (hosts == 1) {
    for (const char c : to_std(header[http::field::host])) {
      if (static_cast<unsigned char>(c) <= ' ' || c == '/' || c == '@' || c == '\\' || c == 0x7f) {
        return ApiError::invalid_request("Malformed Host header.");
      }
    }
  }
  return std::nullopt;
}

std::string origin_form_target(std::string_view target) {
  // RFC 9112 section 3.2.2: a server accepts the absolute form (what a request to a proxy looks like);
  // only its path and query are routed.
  const size_t scheme_end = target.find("://");
  if (scheme_end == std::string_view::npos || target.empty() || target.front() == '/') return std::string(target);
  const std::string scheme = lower_trimmed(target.substr(0, scheme_end));
  if (scheme != "http" && scheme != "https") return std::string(target);
  const size_t path = target.find_first_of("/?", scheme_end + 3);
  if (path == std::string_view::npos) return "/";
  std::string out(target.substr(path));
  if (out.front() == '?') out.insert(out.begin(), '/');
  return out;
}

bool raise_open_file_limit(int64_t* soft_after) {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return false;
  // One descriptor per client connection: the usual soft limit of 1024 would cap the server at about a
  // thousand clients. Like vLLM and SGLang, raise it towards 65535 (never above the hard limit).
  const rlim_t wanted = limit.rlim_max == RLIM_INFINITY ? 65535 : std::min<rlim_t>(limit.rlim_max, 65535);
  bool raised = false;
  if (limit.rlim_cur != RLIM_INFINITY && limit.rlim_cur < wanted) {
    rlimit next = limit;
    next.rlim_cur = wanted;
    raised = setrlimit(RLIMIT_NOFILE, &next) == 0;
    if (raised) limit = next;
  }
  if (soft_after) *soft_after = limit.rlim_cur == RLIM_INFINITY ? -1 : static_cast<int64_t>(limit.rlim_cur);
  return raised;
}

// Connections waiting for a request with nothing received yet (new ones and idle keep-alive ones), oldest
// first. When accept() runs out of file descriptors, the oldest of these are closed to make room: an idle
// connection may be closed at any time (RFC 9112 section 9.5), a refused one locks every client out.
class IdleConnections {
 public:
  uint64_t add(std::weak_ptr<HttpSession> session) {
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t key = ++next_;
    idle_.emplace(key, std::move(session));
    return key;
  }
  void remove(uint64_t key) {
    if (key == 0) return;
    std::lock_guard<std::mutex> lock(mu_);
    idle_.erase(key);
  }
  // Takes the oldest `count` entries out of the registry.
  std::vector<std::pair<uint64_t, std::weak_ptr<HttpSession>>> take_oldest(size_t count) {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::pair<uint64_t, std::weak_ptr<HttpSession>>> out;
    while (out.size() < count && !idle_.empty()) {
      out.emplace_back(idle_.begin()->first, std::move(idle_.begin()->second));
      idle_.erase(idle_.begin());
    }
    return out;
  }
  size_t size() const {
    std::lock_guard<std::mutex> lock(mu_);
    return idle_.size();
  }

 private:
  mutable std::mutex mu_;
  uint64_t next_ = 0;
  std::map<uint64_t, std::weak_ptr<HttpSession>> idle_;
};

class HttpSession : public std::enable_shared_from_this<HttpSession> {
 public:
  HttpSession(tcp::socket&& socket, const HttpServerOptions& options, HttpHandler handler,
              std::shared_ptr<IdleConnections> idle)
      : stream_(std::move(socket)), options_(options), handler_(std::move(handler)), idle_(std::move(idle)) {}
  ~HttpSession() { idle_->remove(idle_key_); }

  void start() { post([self = shared_from_this()] { self->read_request(); }); }
  void post(std::function<void()> fn) { net::post(stream_.get_executor(), std::move(fn)); }

  // Closes the connection if it is still waiting, with nothing received, in the idle period `key` names.
  void shed_if_idle(uint64_t key) {
    post([self = shared_from_this(), key] {
      if (self->idle_key_ != key || self->buffer_.size() > 0) return;
      self->idle_key_ = 0;
      self->close_now();
    });
  }

  // ---- called on the strand by ResponseChannel ----
  bool is_active(const ResponseChannel* ch) const { return ch == active_.get() && !ch->complete_; }

  void respond(ResponseChannel* ch, HttpResponse res) {
    if (!is_active(ch) || ch->streaming_) return;
    ch->complete_ = true;
    res.version(version_);
    res.keep_alive(keep_alive_);
    add_cors_headers(res);
    res.prepare_payload();
    if (head_request_) res.body().clear();  // HEAD: the GET response's headers, Content-Length included
    log_access(res.result_int(), ch->log_note_);  // before the bytes go out: a client that got them sees the line
    std::ostringstream os;
    os << res;
    enqueue(os.str());
  }

  void begin_stream(ResponseChannel* ch, HttpResponse head) {
    if (!is_active(ch) || ch->streaming_) return;
    ch->streaming_ = true;
    stream_status_ = head.result_int();
    chunked_ = version_ >= 11;  // HTTP/1.0 has no chunks: the body ends when the connection closes
    if (!chunked_) keep_alive_ = false;
    head.version(version_);
    head.keep_alive(keep_alive_);
    add_cors_headers(head);
    head.body().clear();
    head.erase(http::field::content_length);
    if (chunked_) head.chunked(true);
    std::string out = "HTTP/" + std::to_string(version_ / 10) + "." + std::to_string(version_ % 10) + " " +
                      std::to_string(head.result_int()) + " " + std::string(head.reason()) + "\r\n";
    for (const auto& field : head) out += std::string(field.name_string()) + ": " + std::string(field.value()) + "\r\n";
    enqueue(out + "\r\n");
  }

  void write_chunk(ResponseChannel* ch, std::string data) {
    if (!is_active(ch) || !ch->streaming_ || data.empty()) return;
    if (!chunked_) return enqueue(std::move(data));
    char size[20];
    std::snprintf(size, sizeof(size), "%zx\r\n", data.size());
    enqueue(size + data + "\r\n");
  }

  void end_stream(ResponseChannel* ch) {
    if (!is_active(ch) || !ch->streaming_) return;
    ch->complete_ = true;
    log_access(stream_status_, ch->log_note_);
    if (chunked_) enqueue("0\r\n\r\n");
    else if (!writing_) after_response();
  }

 private:
  void read_request() {
    if (closed_) return;
    parser_.emplace();
    parser_->body_limit(options_.max_body_bytes);
    parser_->header_limit(options_.max_header_bytes);
    stream_.expires_after(options_.request_timeout);
    if (buffer_.size() == 0) idle_key_ = idle_->add(weak_from_this());
    http::async_read_header(stream_, buffer_, *parser_,
                            [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
  }

  void on_header(beast::error_code ec) {
    idle_->remove(idle_key_);
    idle_key_ = 0;
    if (ec) return on_read_error(ec);
    if (auto error = request_framing_error(parser_->get())) {
      version_ = parser_->get().version();
      return fail_and_close(*error);
    }
    if (parser_->is_done()) return on_request();
    if (beast::iequals(parser_->get()[http::field::expect], "100-continue")) {
      // curl sends this for bodies over 1 KiB and waits a second for the answer if it gets none.
      continue_ = "HTTP/1.1 100 Continue\r\n\r\n";
      net::async_write(stream_, net::buffer(continue_), [self = shared_from_this()](beast::error_code ec, size_t) {
        if (ec) return self->peer_gone();
        self->read_body();
      });
      return;
    }
    read_body();
  }

  void read_body() {
    http::async_read(stream_, buffer_, *parser_, [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) return self->on_read_error(ec);
      self->on_request();
    });
  }

  void on_read_error(beast::error_code ec) {
    if (ec == http::error::end_of_stream || ec == beast::error::timeout || ec == net::error::operation_aborted ||
        ec == net::error::eof || ec == net::error::connection_reset) {
      return close_now();
    }
    if (ec == http::error::body_limit) {
      return fail_and_close(ApiError::payload_too_large(static_cast<long long>(options_.max_body_bytes)));
    }
    if (ec == http::error::header_limit) return fail_and_close(ApiError::headers_too_large());
    if (ec.category() == http::make_error_code(http::error::bad_method).category()) {
      return fail_and_close(ApiError::invalid_request("Malformed HTTP request: " + ec.message() + "."));
    }
    close_now();  // a socket error: nobody to answer
  }

  void on_request() {
    HttpRequest request = parser_->release();
    parser_.reset();
    keep_alive_ = request.keep_alive();
    version_ = request.version();
    head_request_ = request.method() == http::verb::head;
    cors_origin_.clear();
    if (!options_.allowed_origins.empty()) {
      const std::string origin(to_std(request[http::field::origin]));
      for (const auto& allowed : options_.allowed_origins) {
        if (!origin.empty() && (allowed == "*" || allowed == origin)) cors_origin_ = allowed == "*" ? "*" : origin;
      }
    }
    if (const std::string_view target = to_std(request.target()); !target.empty() && target.front() != '/') {
      request.target(origin_form_target(target));
    }
    chunked_ = true;
    stream_.expires_never();
    auto channel = std::make_shared<ResponseChannel>(shared_from_this());
    active_ = channel;
    const bool preflight = !cors_origin_.empty() && request.method() == http::verb::options &&
                           request.count(http::field::access_control_request_method) > 0;
    if (options_.access_log) {
      started_ = std::chrono::steady_clock::now();
      pending_log_ = AccessRecord{};
      pending_log_.method = std::string(request.method_string());
      pending_log_.target = std::string(to_std(request.target()));
      pending_log_.version = version_;
      beast::error_code ec;
      const auto peer = stream_.socket().remote_endpoint(ec);
      if (!ec) pending_log_.client = peer.address().to_string();
      log_pending_ = true;
    }
    if (preflight) {  // answered here: a preflight carries no credentials and reaches no route
      HttpResponse res{http::status::no_content, version_};
      res.set(http::field::access_control_allow_methods, "GET, POST, HEAD, OPTIONS");
      const auto asked = request[http::field::access_control_request_headers];
      res.set(http::field::access_control_allow_headers, asked.empty() ? "Authorization, Content-Type" : asked);
      res.set(http::field::access_control_max_age, "600");
      respond(channel.get(), std::move(res));
      return;
    }
    handler_(std::move(request), channel);
    if (active_ == channel && !channel->complete_) watch_disconnect();
  }

  void add_cors_headers(HttpResponse& res) const {
    if (cors_origin_.empty()) return;
    res.set(http::field::access_control_allow_origin, cors_origin_);
    if (cors_origin_ != "*") res.set(http::field::vary, "Origin");
  }

  void log_access(int status, const std::string& note) {
    if (!log_pending_) return;
    log_pending_ = false;
    pending_log_.status = status;
    pending_log_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
    pending_log_.note = note;
    options_.access_log(pending_log_);
  }

  // ---- writing ----
  void enqueue(std::string bytes) {
    if (closed_) return;
    pending_ += bytes;
    if (!writing_) do_write();
  }

  void do_write() {
    writing_ = true;
    out_.clear();
    out_.swap(pending_);
    stream_.expires_after(options_.write_timeout);
    net::async_write(stream_, net::buffer(out_), [self = shared_from_this()](beast::error_code ec, size_t) {
      self->on_write(ec);
    });
  }

  void on_write(beast::error_code ec) {
    writing_ = false;
    if (ec) return peer_gone();
    if (!pending_.empty()) return do_write();
    stream_.expires_never();
    if (closing_) return lingering_close();
    if (active_ && active_->complete_) after_response();
  }

  void after_response() {
    active_.reset();
    stop_watch();
    if (!keep_alive_) return lingering_close();
    read_request();
  }

  void fail_and_close(const ApiError& error) {
    if (options_.access_log && !log_pending_) {  // refused before a request reached the handler
      started_ = std::chrono::steady_clock::now();
      pending_log_ = AccessRecord{};
      if (parser_) {
        pending_log_.method = std::string(parser_->get().method_string());
        pending_log_.target = std::string(to_std(parser_->get().target()));
      }
      beast::error_code ec;
      const auto peer = stream_.socket().remote_endpoint(ec);
      if (!ec) pending_log_.client = peer.address().to_string();
      log_pending_ = true;
    }
    log_access(error.status, "");
    active_.reset();
    closing_ = true;
    HttpResponse res = make_error_response(error, version_, "");
    res.keep_alive(false);
    res.prepare_payload();
    std::ostringstream os;
    os << res;
    enqueue(os.str());
  }

  // ---- noticing a client that left ----
  void watch_disconnect() {
    if (watching_ || closed_ || buffer_.size() > 0) return;  // bytes already buffered: a pipelined request
    watching_ = true;
    const uint64_t id = ++watch_id_;
    stream_.socket().async_wait(tcp::socket::wait_read,
                                net::bind_executor(stream_.get_executor(), [self = shared_from_this(), id](
                                                                               beast::error_code ec) { self->on_readable(ec, id); }));
  }

  void on_readable(beast::error_code ec, uint64_t id) {
    if (id != watch_id_) return;  // a watch cancelled since
    watching_ = false;
    if (ec == net::error::operation_aborted) return;
    if (ec) return peer_gone();
    char byte;
    const ssize_t n = ::recv(stream_.socket().native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0) return peer_gone();  // orderly shutdown by the client
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return watch_disconnect();
      return peer_gone();
    }
    // n > 0: the client sent more (a pipelined request); it is still there. Stop watching: a disconnect
    // will now show up as a failed write.
  }

  void stop_watch() {
    if (!watching_) return;
    watching_ = false;
    ++watch_id_;
    beast::error_code ec;
    stream_.socket().cancel(ec);
  }

  void peer_gone() {
    if (closed_) return;
    if (active_ && !active_->complete_) log_access(0, active_->log_note_.empty() ? "client gone" : active_->log_note_ + " client gone");
    if (active_) {
      auto channel = std::move(active_);
      channel->disconnected_.store(true, std::memory_order_release);
      if (!channel->complete_ && channel->disconnect_fn_) {
        auto fn = std::move(channel->disconnect_fn_);
        fn();
      }
    }
    close_now();
  }

  void close_now() {
    if (closed_) return;
    closed_ = true;
    idle_->remove(idle_key_);
    idle_key_ = 0;
    active_.reset();
    pending_.clear();
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.close();
  }

  // Half-close, then drain what the client still sends for a moment: closing with unread data would send
  // a reset that can destroy our response (a 413 while the client is still uploading) before it is read.
  void lingering_close() {
    if (closed_) return;
    stop_watch();
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    stream_.expires_after(std::chrono::seconds(2));
    drain();
  }

  void drain() {
    stream_.async_read_some(net::buffer(discard_), [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) return self->close_now();
      self->drain();
    });
  }

  beast::tcp_stream stream_;
  HttpServerOptions options_;
  HttpHandler handler_;
  std::shared_ptr<IdleConnections> idle_;
  uint64_t idle_key_ = 0;  // this connection's entry in `idle_` while it waits for a request, else 0
  bool head_request_ = false;
  int stream_status_ = 0;
  std::string cors_origin_;  // Access-Control-Allow-Origin for the current request; empty: none
  bool log_pending_ = false;  // a request's access line is still to be written
  AccessRecord pending_log_;
  std::chrono::steady_clock::time_point started_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::shared_ptr<ResponseChannel> active_;  // the request being answered
  unsigned version_ = 11;
  bool keep_alive_ = true;
  bool chunked_ = true;
  std::string pending_, out_, continue_;
  char discard_[4096];
  bool writing_ = false, closing_ = false, closed_ = false, watching_ = false;
  uint64_t watch_id_ = 0;
};

// ---- ResponseChannel: hop to the strand, then act if still current ----

void ResponseChannel::respond(HttpResponse response) {
  session_->post([self = shared_from_this(), r = std::move(response)]() mutable { self->session_->respond(self.get(), std::move(r)); });
}

void ResponseChannel::begin_stream(HttpResponse head) {
  session_->post([self = shared_from_this(), h = std::move(head)]() mutable { self->session_->begin_stream(self.get(), std::move(h)); });
}

void ResponseChannel::write_chunk(std::string data) {
  session_->post([self = shared_from_this(), d = std::move(data)]() mutable { self->session_->write_chunk(self.get(), std::move(d)); });
}

void ResponseChannel::end_stream() {
  session_->post([self = shared_from_this()] { self->session_->end_stream(self.get()); });
}

void ResponseChannel::run(std::function<void()> fn) { session_->post(std::move(fn)); }

void ResponseChannel::set_log_note(std::string note) {
  session_->post([self = shared_from_this(), n = std::move(note)]() mutable { self->log_note_ = std::move(n); });
}

void ResponseChannel::on_disconnect(std::function<void()> fn) {
  session_->post([self = shared_from_this(), fn = std::move(fn)]() mutable {
    if (self->disconnected()) return fn();
    if (!self->complete_) self->disconnect_fn_ = std::move(fn);
  });
}

// ---- HttpServer ----

HttpServer::HttpServer(const HttpServerOptions& options, HttpHandler handler)
    : options_(options),
      handler_(std::move(handler)),
      idle_(std::make_shared<IdleConnections>()),
      work_(net::make_work_guard(ioc_)),
      acceptor_(net::make_strand(ioc_)) {}

Result<std::unique_ptr<HttpServer>> HttpServer::start(const HttpServerOptions& options, HttpHandler handler) {
  if (options.io_threads < 1) return invalid_argument("the HTTP server needs at least one io thread");
  std::unique_ptr<HttpServer> server(new HttpServer(options, std::move(handler)));
  const std::string where = options.host + ":" + std::to_string(options.port);
  beast::error_code ec;
  tcp::resolver resolver(server->ioc_);
  auto endpoints = resolver.resolve(options.host, std::to_string(options.port), tcp::resolver::passive, ec);
  if (ec || endpoints.empty()) return invalid_argument("cannot resolve host " + where + ": " + ec.message());
  const tcp::endpoint endpoint = endpoints.begin()->endpoint();
  auto& acceptor = server->acceptor_;
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) return io_error("cannot listen on " + where + ": " + ec.message());
  server->port_ = acceptor.local_endpoint().port();
  server->do_accept();
  for (int i = 0; i < options.io_threads; ++i) server->threads_.emplace_back([s = server.get()] { s->ioc_.run(); });
  return server;
}

void HttpServer::do_accept() {
  acceptor_.async_accept(net::make_strand(ioc_), [this](beast::error_code ec, tcp::socket socket) {
    if (!acceptor_.is_open()) return;
    if (ec) {
      // Out of file descriptors: close the oldest idle connections so that the clients queued behind
      // them (a health probe among them) get in; then back off briefly instead of spinning.
      const bool out_of_descriptors = ec == net::error::no_descriptors || ec.value() == ENFILE;
      size_t shed = 0;
      if (out_of_descriptors) {
        const size_t idle = idle_->size();
        for (auto& [key, weak] : idle_->take_oldest(std::max<size_t>(16, idle / 8))) {
          if (auto session = weak.lock()) session->shed_if_idle(key), ++shed;
        }
      }
      const auto now = std::chrono::steady_clock::now();
      if (now - last_accept_warning_ > std::chrono::seconds(5)) {  // one line per burst, not per attempt
        last_accept_warning_ = now;
        MX_LOG(Warning) << "accept failed: " << ec.message()
                        << (out_of_descriptors ? "; closing " + std::to_string(shed) + " idle connections" : "");
      }
      auto timer = std::make_shared<net::steady_timer>(acceptor_.get_executor(),
                                                       std::chrono::milliseconds(shed > 0 ? 5 : 50));
      timer->async_wait([this, timer](beast::error_code) {
        if (acceptor_.is_open()) do_accept();
      });
      return;
    }
    beast::error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);  // SSE events must not wait for Nagle
    std::make_shared<HttpSession>(std::move(socket), options_, handler_, idle_)->start();
    do_accept();
  });
}

void HttpServer::stop_accepting() {
  if (stopped_.load()) return;
  std::promise<void> closed;
  net::post(acceptor_.get_executor(), [this, &closed] {
    beast::error_code ec;
    acceptor_.close(ec);
    closed.set_value();
  });
  closed.get_future().wait();
}

void HttpServer::stop() {
  if (stopped_.exchange(true)) return;
  work_.reset();
  ioc_.stop();
  for (auto& t : threads_) t.join();
  threads_.clear();
}

HttpServer::~HttpServer() { stop(); }

}  // namespace mx::server
