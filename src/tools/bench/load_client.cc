#include "tools/bench/load_client.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <memory>
#include <optional>
#include <random>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "tools/bench/openai_stream.h"
#include "tools/bench/sse_parser.h"

namespace mx::bench {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

constexpr size_t kReadChunk = 16 * 1024;
constexpr size_t kErrorBodyLimit = 64 * 1024;  // of a non-200 body, kept for the error message
constexpr double kDrainTimeoutS = 10;          // for the rest of a body after [DONE] or an error event

// CPU time of the calling thread, the one that runs the io_context: the client's own cost, even when a test
// runs a server in the same process.
double thread_cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_THREAD, &usage);
  auto seconds = [](const timeval& t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

std::vector<double> arrival_offsets(size_t n, double rate, uint64_t seed) {
  std::vector<double> offsets(n, 0.0);
  if (!(rate < std::numeric_limits<double>::infinity())) return offsets;
  std::mt19937_64 rng(seed);
  std::exponential_distribution<double> gap(rate);
  for (size_t i = 1; i < n; ++i) offsets[i] = offsets[i - 1] + gap(rng);
  return offsets;
}

class Connection;

// Owns the schedule: arrivals, the FIFO of arrived requests, the concurrency slots and the idle connections.
// Everything runs on the one thread that runs the io_context, so nothing here locks.
class LoadGenerator {
 public:
  LoadGenerator(net::io_context& ioc, const LoadOptions& options, const std::vector<LoadRequest>& requests,
                tcp::resolver::results_type endpoints)
      : ioc_(ioc),
        options_(options),
        requests_(requests),
        endpoints_(std::move(endpoints)),
        timer_(ioc),
        offsets_(arrival_offsets(requests.size(), options.request_rate, options.seed)),
        results_(requests.size()),
        target_(options.url.target(options.path)) {}

  void start();
  // A connection ended request `index` (successfully or not). Called at most once per request.
  void finish(size_t index, RequestResult result);
  // A kept-alive connection whose response ended cleanly is free for the next request.
  void release(std::shared_ptr<Connection> connection);
  // A reused connection turned out to be closed by the server before it answered: send again on a new one
  // (which is never a reused one, so this happens at most once per request).
  void resend(size_t index);

  double now_s() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  const LoadOptions& options() const { return options_; }
  const LoadRequest& request(size_t index) const { return requests_[index]; }
  const std::string& target() const { return target_; }
  const tcp::resolver::results_type& endpoints() const { return endpoints_; }
  net::io_context& ioc() { return ioc_; }

  LoadRun take_run() {
    LoadRun run;
    run.results = std::move(results_);
    run.duration_s = end_s_;
    run.connections_opened = connections_opened_;
    return run;
  }

 private:
  void arrive();
  void dispatch();
  void send(size_t index, bool allow_reuse);

  net::io_context& ioc_;
  const LoadOptions& options_;
  const std::vector<LoadRequest>& requests_;
  tcp::resolver::results_type endpoints_;
  net::steady_timer timer_;
  std::vector<double> offsets_;
  std::vector<RequestResult> results_;
  std::string target_;
  Clock::time_point start_;
  std::deque<size_t> waiting_;
  std::vector<std::shared_ptr<Connection>> idle_;
  size_t next_arrival_ = 0;
  size_t completed_ = 0;
  size_t failed_ = 0;
  int64_t in_flight_ = 0;
  int64_t connections_opened_ = 0;
  double end_s_ = 0;
};

// One TCP connection and the request it is serving. Handlers hold a shared_ptr, so a connection lives as
// long as an operation on it is pending.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(LoadGenerator* gen) : gen_(gen), stream_(gen->ioc()) {}

  // Sends request `index`, connecting first when this connection is new.
  void start(size_t index) {
    index_ = index;
    decided_ = false;
    reported_ = false;
    bytes_received_ = 0;
    status_ = 0;
    error_body_.clear();
    sse_ = SseParser();
    reader_ = OpenAiStreamReader();
    result_ = RequestResult();
    result_.prompt_tokens = gen_->request(index).prompt_tokens;
    result_.start_s = gen_->now_s();
    build_request();
    arm_timeout();
    if (connected_) return write();
    stream_.async_connect(gen_->endpoints(), [self = shared_from_this()](beast::error_code ec, const tcp::endpoint&) {
      if (ec) return self->abandon("cannot connect to " + self->gen_->options().url.host_header + ": " + ec.message());
      self->connected_ = true;
      beast::error_code ignored;
      self->stream_.socket().set_option(tcp::no_delay(true), ignored);
      self->write();
    });
  }


 private:
  // After the outcome is known only the end of the body is awaited, and a server that holds it open (or one
  // that never answers at all) cannot hold a concurrency slot for longer than this.
  void arm_timeout() {
    const double seconds = decided_ ? std::min(kDrainTimeoutS, gen_->options().idle_timeout_s) : gen_->options().idle_timeout_s;
    stream_.expires_after(std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0)));
  }

  void build_request() {
    const LoadOptions& o = gen_->options();
    request_.emplace(http::verb::post, gen_->target(), 11);
    request_->set(http::field::host, o.url.host_header);
    request_->set(http::field::user_agent, "mxserve-bench");
    request_->set(http::field::content_type, "application/json");
    request_->set(http::field::accept, "text/event-stream");
    if (!o.api_key.empty()) request_->set(http::field::authorization, "Bearer " + o.api_key);
    request_->keep_alive(true);
    request_->body() = gen_->request(index_).body;
    request_->prepare_payload();
  }

  void write() {
    result_.start_s = gen_->now_s();  // timing starts when the request goes out, not at connect
    http::async_write(stream_, *request_, [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) return self->on_transport_error(ec);
      self->parser_.emplace();
      self->parser_->body_limit(std::numeric_limits<uint64_t>::max());
      self->read_more();
    });
  }

  void read_more() {
    parser_->get().body().data = read_chunk_;
    parser_->get().body().size = sizeof(read_chunk_);
    arm_timeout();
    http::async_read_some(stream_, buffer_, *parser_, [self = shared_from_this()](beast::error_code ec, size_t n) {
      self->on_read(ec, n);
    });
  }

  void on_read(beast::error_code ec, size_t bytes) {
    const double now = gen_->now_s();
    if (ec == http::error::need_buffer) ec = {};
    bytes_received_ += bytes;
    if (ec) return on_transport_error(ec);
    const size_t produced = sizeof(read_chunk_) - parser_->get().body().size;
    if (status_ == 0 && parser_->is_header_done() && !check_head()) return;
    if (produced > 0) take_body(std::string_view(read_chunk_, produced), now);
    if (reported_) return;  // abandoned while taking the body
    if (!parser_->is_done()) return read_more();
    end_of_body(now);
  }

  // False when the response cannot be a stream (the body is then kept for the error message).
  bool check_head() {
    const auto& head = parser_->get();
    status_ = head.result_int();
    if (status_ != 200) return true;
    const std::string type(head[http::field::content_type]);
    if (type.find("text/event-stream") == std::string::npos) {
      status_ = -1;  // read the body as an error message
      error_body_ = "HTTP 200 with Content-Type '" + type + "' instead of a text/event-stream (is streaming supported?)";
    }
    return true;
  }

  void take_body(std::string_view bytes, double now) {
    if (status_ != 200) {
      if (status_ > 0 && error_body_.size() < kErrorBodyLimit)
        error_body_.append(bytes.substr(0, kErrorBodyLimit - error_body_.size()));
      return;
    }
    if (decided_) return;  // draining what follows [DONE] or an error event
    events_.clear();
    const bool ok = sse_.feed(bytes, &events_);
    take_events(now);
    if (!ok && !decided_) abandon(sse_.error());
  }

  void take_events(double now) {
    for (const SseEvent& event : events_) {
      if (decided_) return;
      switch (reader_.read(event)) {
        case OpenAiStreamReader::Kind::kTokens:
          if (reader_.token_chunks() == 1) result_.ttft_s = now - result_.start_s;
          else result_.itl_s.push_back(now - last_token_s_);
          last_token_s_ = now;
          break;
        case OpenAiStreamReader::Kind::kDone:
          succeed(now);
          break;
        case OpenAiStreamReader::Kind::kError:
          fail(reader_.error());
          break;
        case OpenAiStreamReader::Kind::kNothing:
          break;
      }
    }
  }

  // The response is complete: the request's outcome is reported now (not at [DONE]), after the connection is
  // back in the pool, so the next request reuses it instead of opening another.
  void end_of_body(double now) {
    if (reported_) return;  // abandoned already
    if (status_ == 200 && !decided_) {
      events_.clear();
      sse_.finish(&events_);
      take_events(now);
    }
    if (!decided_) {
      if (status_ == 200 && reader_.finish_reason_seen()) succeed(now);
      else if (status_ == 200) fail("the stream ended before data: [DONE] after " + std::to_string(reader_.token_chunks()) + " chunks with text");
      else if (status_ == -1) fail(error_body_);
      else fail("HTTP " + std::to_string(status_) + ": " + error_message_from_body(error_body_));
    }
    if (parser_->keep_alive()) {
      reused_ = true;
      gen_->release(shared_from_this());
    } else {
      close();
    }
    report();
  }

  void on_transport_error(beast::error_code ec) {
    if (reported_) return;
    if (decided_) {  // the outcome came before the connection failed: keep it
      close();
      return report();
    }
    const bool stale = reused_ && bytes_received_ == 0 &&
                       (ec == http::error::end_of_stream || ec == net::error::eof ||
                        ec == net::error::connection_reset || ec == net::error::broken_pipe);
    if (stale) {
      close();
      reported_ = true;  // reported by the connection it is resent on
      gen_->resend(index_);
      return;
    }
    if (ec == beast::error::timeout) {
      char seconds[32];
      std::snprintf(seconds, sizeof(seconds), "%g", gen_->options().idle_timeout_s);
      return abandon(std::string("no data from the server for ") + seconds + " s");
    }
    if (ec == http::error::end_of_stream || ec == http::error::partial_message || ec == net::error::eof ||
        ec == net::error::connection_reset) {
      if (status_ == 0) return abandon("the server closed the connection before answering");
      return abandon("the server closed the connection mid-stream after " + std::to_string(reader_.token_chunks()) +
                     " chunks with text");
    }
    abandon(ec.message());
  }

  // Fails the request at once and drops the connection.
  void abandon(std::string error) {
    fail(std::move(error));
    close();
    report();
  }

  void close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.close();
    connected_ = false;
  }

  void succeed(double now) {
    result_.success = true;
    conclude(now);
  }

  void fail(std::string error) {
    result_.success = false;
    result_.error = std::move(error);
    conclude(gen_->now_s());
  }

  // Fixes the outcome and the end time; report() hands it over once the connection is settled.
  void conclude(double now) {
    if (decided_) return;
    decided_ = true;
    result_.e2e_s = now - result_.start_s;
    result_.token_chunks = reader_.token_chunks();
    result_.server_prompt_tokens = reader_.usage_prompt_tokens();
    result_.output_tokens_from_usage = reader_.usage_completion_tokens() >= 0;
    result_.output_tokens = result_.output_tokens_from_usage ? reader_.usage_completion_tokens() : reader_.token_chunks();
  }

  void report() {
    if (reported_) return;
    reported_ = true;
    gen_->finish(index_, std::move(result_));
  }

  LoadGenerator* gen_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request<http::string_body>> request_;
  std::optional<http::response_parser<http::buffer_body>> parser_;
  char read_chunk_[kReadChunk];
  size_t index_ = 0;
  bool connected_ = false;
  bool reused_ = false;
  bool decided_ = true;   // the request's outcome and end time are fixed
  bool reported_ = true;  // ... and handed to the generator
  size_t bytes_received_ = 0;
  int status_ = 0;  // 0 before the head, -1 for a 200 that is not a stream
  std::string error_body_;
  SseParser sse_;
  OpenAiStreamReader reader_;
  std::vector<SseEvent> events_;
  RequestResult result_;
  double last_token_s_ = 0;
};

void LoadGenerator::start() {
  start_ = Clock::now();
  arrive();
}

void LoadGenerator::arrive() {
  const double now = now_s();
  while (next_arrival_ < offsets_.size() && offsets_[next_arrival_] <= now) waiting_.push_back(next_arrival_++);
  dispatch();
  if (next_arrival_ == offsets_.size()) return;
  timer_.expires_at(start_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(offsets_[next_arrival_])));
  timer_.async_wait([this](beast::error_code ec) {
    if (!ec) arrive();
  });
}

void LoadGenerator::dispatch() {
  while (!waiting_.empty() && (options_.max_concurrency <= 0 || in_flight_ < options_.max_concurrency)) {
    const size_t index = waiting_.front();
    waiting_.pop_front();
    ++in_flight_;
    send(index, /*allow_reuse=*/true);
  }
}

void LoadGenerator::send(size_t index, bool allow_reuse) {
  std::shared_ptr<Connection> connection;
  if (allow_reuse && !idle_.empty()) {
    connection = std::move(idle_.back());
    idle_.pop_back();
  } else {
    connection = std::make_shared<Connection>(this);
    ++connections_opened_;
  }
  connection->start(index);
}

void LoadGenerator::resend(size_t index) { send(index, /*allow_reuse=*/false); }

void LoadGenerator::release(std::shared_ptr<Connection> connection) { idle_.push_back(std::move(connection)); }

void LoadGenerator::finish(size_t index, RequestResult result) {
  if (!result.success) ++failed_;
  results_[index] = std::move(result);
  --in_flight_;
  ++completed_;
  if (options_.progress) {
    const size_t step = std::max<size_t>(1, requests_.size() / 10);
    if (completed_ % step == 0 || completed_ == requests_.size())
      std::fprintf(stderr, "  %zu/%zu requests done (%zu failed), %.1f s\n", completed_, requests_.size(), failed_, now_s());
  }
  if (completed_ == requests_.size()) {
    end_s_ = now_s();
    ioc_.stop();  // connections still draining a body are dropped with the io_context
    return;
  }
  net::post(ioc_, [this] { dispatch(); });  // after the finishing connection has been released
}

}  // namespace

void raise_open_file_limit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= limit.rlim_max) return;
  limit.rlim_cur = limit.rlim_max;
  setrlimit(RLIMIT_NOFILE, &limit);
}

Result<LoadRun> run_load(const LoadOptions& options, const std::vector<LoadRequest>& requests) {
  if (requests.empty()) return LoadRun{};
  net::io_context ioc(1);
  tcp::resolver resolver(ioc);
  beast::error_code ec;
  auto endpoints = resolver.resolve(options.url.host, std::to_string(options.url.port), ec);
  if (ec) return io_error("cannot resolve " + options.url.host + ": " + ec.message());
  const double cpu_before = thread_cpu_seconds();
  LoadGenerator generator(ioc, options, requests, std::move(endpoints));
  generator.start();
  ioc.run();
  LoadRun run = generator.take_run();
  run.client_cpu_s = thread_cpu_seconds() - cpu_before;
  return run;
}

}  // namespace mx::bench
