// `mxserve serve`: the OpenAI-compatible HTTP server. SIGTERM/SIGINT drains (503 to new requests,
// in-flight ones finish for up to --shutdown-timeout, the rest are aborted); a second signal exits at once.
//
// Phase 1 (this file today): the server, its limits, auth, admission, metrics and request validation
// run for real, but generation answers 501: no CompletionService backed by the engine and tokenizer
// exists yet (issue 6, phase 2), and the demo model made on first use without --model is not built yet.
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <future>
#include <thread>

#include <boost/asio/signal_set.hpp>

#include "core/log.h"
#include "server/api_server.h"
#include "tools/cli_args.h"
#include "tools/commands.h"

namespace mx {
namespace {

const std::vector<CliOption> kOptions = {
    {"model", true, "model directory (config.json + safetensors); without it, the demo model (not wired yet)"},
    {"host", true, "address to listen on (default 127.0.0.1)"},
    {"port", true, "TCP port (default 8000; 0 picks a free one)"},
    {"backend", true, "cuda or cpu (default cuda when built with CUDA, else cpu)"},
    {"api-key", true, "require `Authorization: Bearer KEY` on every route but /health"},
    {"served-model-name", true, "the model id clients use (default: the model directory's name)"},
    {"context-length", true, "maximum prompt + output tokens per request (default 131072)"},
    {"max-running-requests", true, "requests the engine runs at once (default 256)"},
    {"max-queued-requests", true, "requests waiting beyond those; more get 503 (default 1024)"},
    {"shutdown-timeout", true, "seconds in-flight requests may finish after SIGTERM (default 30)"},
    {"io-threads", true, "HTTP io threads (default 2)"},
    {"log-level", true, "debug, info (default), warning or error"},
    {"help", false, "show this help"},
};

int fail(const std::string& message) {
  std::fprintf(stderr, "error: %s\n", message.c_str());
  return 1;
}

Result<server::ApiServerOptions> read_options(const CliArgs& args) {
  server::ApiServerOptions o;
  o.http.host = args.get("host", "127.0.0.1");
  MX_ASSIGN_OR_RETURN(int64_t port, args.get_int("port", 8000));
  if (port < 0 || port > 65535) return invalid_argument("--port must be between 0 and 65535");
  o.http.port = static_cast<int>(port);
  MX_ASSIGN_OR_RETURN(int64_t io_threads, args.get_int("io-threads", 2));
  if (io_threads < 1 || io_threads > 256) return invalid_argument("--io-threads must be between 1 and 256");
  o.http.io_threads = static_cast<int>(io_threads);
  const std::string backend = args.get("backend", "cpu");
  if (backend != "cpu" && backend != "cuda") return invalid_argument("unknown backend '" + backend + "' (cpu or cuda)");
  o.api_key = args.get("api-key");
  if (args.has("api-key") && o.api_key.empty()) return invalid_argument("--api-key must not be empty");
  std::string model_dir = args.get("model");
  if (!model_dir.empty()) {
    if (!std::filesystem::is_regular_file(std::filesystem::path(model_dir) / "config.json"))
      return invalid_argument("--model " + model_dir + ": no config.json there");
    while (model_dir.size() > 1 && model_dir.back() == '/') model_dir.pop_back();
  }
  o.served_model_name = args.get("served-model-name", model_dir.empty() ? std::string("mxserve-demo")
                                                                        : std::filesystem::path(model_dir).filename().string());
  MX_ASSIGN_OR_RETURN(o.context_length, args.get_int("context-length", 131072));
  if (o.context_length < 16) return invalid_argument("--context-length must be at least 16");
  MX_ASSIGN_OR_RETURN(o.max_running_requests, args.get_int("max-running-requests", 256));
  if (o.max_running_requests < 1) return invalid_argument("--max-running-requests must be at least 1");
  MX_ASSIGN_OR_RETURN(o.max_queued_requests, args.get_int("max-queued-requests", 1024));
  if (o.max_queued_requests < 0) return invalid_argument("--max-queued-requests must be >= 0");
  MX_ASSIGN_OR_RETURN(double timeout, args.get_double("shutdown-timeout", 30.0));
  if (!(timeout >= 0.0 && timeout <= 86400.0)) return invalid_argument("--shutdown-timeout must be between 0 and 86400 seconds");
  o.shutdown_timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout * 1000.0));
  return o;
}

}  // namespace

int run_serve_command(int argc, char** argv) {
  auto parsed = CliArgs::parse(argc, argv, 2, kOptions);
  if (!parsed.is_ok()) {
    std::fprintf(stderr, "error: %s\n%s", parsed.status().message().c_str(), cli_usage("serve", kOptions).c_str());
    return 2;
  }
  const CliArgs& args = *parsed;
  if (args.has("help")) {
    std::fprintf(stdout, "%s", cli_usage("serve", kOptions).c_str());
    return 0;
  }
  LogLevel level = LogLevel::kInfo;
  if (args.has("log-level") && !parse_log_level(args.get("log-level"), &level))
    return fail("unknown --log-level '" + args.get("log-level") + "'");
  set_log_level(level);
  auto options = read_options(args);
  if (!options.is_ok()) return fail(options.status().message());

  // Signals are handled on their own thread, so a second one is seen while the main thread drains.
  boost::asio::io_context signal_ioc;
  boost::asio::signal_set signals(signal_ioc, SIGINT, SIGTERM);
  std::promise<void> first_signal;
  signals.async_wait([&](const boost::system::error_code& ec, int) {
    if (ec) return;
    first_signal.set_value();
    signals.async_wait([](const boost::system::error_code& ec2, int) {
      if (ec2) return;
      std::fprintf(stderr, "mxserve: second signal, exiting now\n");
      std::_Exit(1);
    });
  });
  std::thread signal_thread([&] { signal_ioc.run(); });

  server::UnwiredCompletionService service;
  auto server = server::ApiServer::start(*options, &service);
  if (!server.is_ok()) {
    signal_ioc.stop();
    signal_thread.join();
    return fail(server.status().message());
  }
  MX_LOG(Warning) << "generation is not wired to the engine yet: /v1/chat/completions, /v1/completions and "
                     "/v1/responses validate requests and then answer 501";
  (*server)->set_ready();
  MX_LOG(Info) << "serving " << options->served_model_name << " on http://" << options->http.host << ":"
               << (*server)->port();
  std::fprintf(stdout, "listening on http://%s:%d\n", options->http.host.c_str(), (*server)->port());
  std::fflush(stdout);

  first_signal.get_future().wait();
  MX_LOG(Info) << "draining (up to " << options->shutdown_timeout.count() << " ms)";
  (*server)->drain_and_stop();
  signal_ioc.stop();
  signal_thread.join();
  return 0;
}

}  // namespace mx
