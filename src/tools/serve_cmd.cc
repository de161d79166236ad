// `mxserve serve`: the OpenAI-compatible HTTP server on the continuous-batching engine. SIGTERM/SIGINT
// drains (503 to new requests, in-flight ones finish for up to --shutdown-timeout, the rest are aborted);
// a second signal exits at once.
//
// Start-up: bind first (health answers 503 "loading"), then load the model, its tokenizer and the engine,
// then open generation. Without --model, the demo model (random weights, the real o200k tokenizer) is
// written to the user's cache directory on first use and served.
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <future>
#include <thread>

#include <boost/asio/signal_set.hpp>

#include "core/log.h"
#include "model/demo_model.h"
#include "model/gpt_oss.h"
#include "runtime/engine.h"
#include "runtime/tokenizer_detokenize.h"
#include "server/api_server.h"
#include "server/engine_completion_service.h"
#include "tools/cli_args.h"
#include "tools/commands.h"

namespace mx {
namespace {

const std::vector<CliOption> kOptions = {
    {"model", true, "model directory (config.json, safetensors, tokenizer); without it, the demo model: random "
                    "weights (it speaks gibberish), made once in $XDG_CACHE_HOME/mxserve or ~/.cache/mxserve"},
    {"host", true, "address to listen on (default 127.0.0.1)"},
    {"port", true, "TCP port (default 8000; 0 picks a free one)"},
    {"backend", true, "cpu (default) or cuda"},
    {"threads", true, "CPU backend threads (default: all cores)"},
    {"api-key", true, "require `Authorization: Bearer KEY` on every route but /health and /metrics"},
    {"metrics-require-key", false, "require the API key on /metrics too (open by default, as Prometheus scrapes it)"},
    {"served-model-name", true, "the model id clients use (default: the model directory's name, or mxserve-demo)"},
    {"context-length", true, "maximum prompt + output tokens per request (default: the model's, capped by the KV pool)"},
    {"max-running-requests", true, "requests the engine runs at once (default 64)"},
    {"max-queued-requests", true, "requests waiting beyond those; more get 503 (default 1024)"},
    {"num-kv-pages", true, "KV pool size in pages of 16 tokens (default: a 256 MiB budget on the CPU, --mem-fraction on cuda)"},
    {"mem-fraction", true, "cuda: share of GPU memory for weights, activations and the KV pool (default 0.9)"},
    {"disable-cuda-graph", false, "cuda: run decode steps eagerly instead of replaying CUDA graphs"},
    {"max-num-batched-tokens", true, "tokens computed per engine step (default 2048)"},
    {"no-prefix-cache", false, "do not reuse KV pages of shared prompt prefixes"},
    {"shutdown-timeout", true, "seconds in-flight requests may finish after SIGTERM (default 30)"},
    {"io-threads", true, "HTTP io threads (default 2)"},
    {"log-level", true, "debug, info (default), warning or error"},
    {"test-forced-tokens", true, "TEST ONLY: JSON file of transcripts the engine emits instead of sampling "
                                 "(see src/server/forced_transcripts.h)"},
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
  if (args.has("test-forced-tokens") && !std::filesystem::is_regular_file(args.get("test-forced-tokens")))
    return invalid_argument("--test-forced-tokens " + args.get("test-forced-tokens") + ": no such file");
  o.api_key = args.get("api-key");
  if (args.has("api-key") && o.api_key.empty()) return invalid_argument("--api-key must not be empty");
  o.metrics_require_key = args.has("metrics-require-key");
  if (o.metrics_require_key && o.api_key.empty()) return invalid_argument("--metrics-require-key needs --api-key");
  std::string model_dir = args.get("model");
  if (!model_dir.empty()) {
    if (!std::filesystem::is_regular_file(std::filesystem::path(model_dir) / "config.json"))
      return invalid_argument("--model " + model_dir + ": no config.json there");
    while (model_dir.size() > 1 && model_dir.back() == '/') model_dir.pop_back();
  }
  o.served_model_name = args.get("served-model-name", model_dir.empty() ? std::string("mxserve-demo")
                                                                        : std::filesystem::path(model_dir).filename().string());
  // Until the model is loaded, the most any model allows; the engine's limit replaces it (set_ready).
  MX_ASSIGN_OR_RETURN(o.context_length, args.get_int("context-length", 131072));
  if (o.context_length < 16) return invalid_argument("--context-length must be at least 16");
  MX_ASSIGN_OR_RETURN(o.max_running_requests, args.get_int("max-running-requests", 64));
  if (o.max_running_requests < 1) return invalid_argument("--max-running-requests must be at least 1");
  MX_ASSIGN_OR_RETURN(o.max_queued_requests, args.get_int("max-queued-requests", 1024));
  if (o.max_queued_requests < 0) return invalid_argument("--max-queued-requests must be >= 0");
  MX_ASSIGN_OR_RETURN(double timeout, args.get_double("shutdown-timeout", 30.0));
  if (!(timeout >= 0.0 && timeout <= 86400.0)) return invalid_argument("--shutdown-timeout must be between 0 and 86400 seconds");
  o.shutdown_timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout * 1000.0));
  return o;
}

// Everything generation needs, built after the server is listening. Destroyed in reverse: the service
// (its jobs release their engine streams), then the engine (aborts what is left), then the model.
struct LoadedModel {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<GptOssModel> model;
  std::shared_ptr<const Tokenizer> tokenizer;
  std::unique_ptr<server::ForcedTranscripts> forced;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<server::EngineCompletionService> service;

  ~LoadedModel() {
    service.reset();
    engine.reset();
  }
};

Result<std::unique_ptr<LoadedModel>> load_model(const CliArgs& args, const server::ApiServerOptions& server_options) {
  auto loaded = std::make_unique<LoadedModel>();
  std::string model_dir = args.get("model");
  if (model_dir.empty()) {
    MX_ASSIGN_OR_RETURN(std::string dir, default_demo_model_dir());
    MX_ASSIGN_OR_RETURN(model_dir, ensure_demo_model(dir));
    MX_LOG(Warning) << "no --model given: serving the demo model from " << model_dir
                    << ". It has random weights and speaks gibberish; it is for trying the API, not for answers.";
  }
  BackendOptions backend_options;
  backend_options.name = args.get("backend", "cpu");
  MX_ASSIGN_OR_RETURN(int64_t threads, args.get_int("threads", 0));
  if (threads < 0 || threads > 1024) return invalid_argument("--threads must be in [0, 1024]");
  backend_options.num_threads = static_cast<int>(threads);
  MX_ASSIGN_OR_RETURN(loaded->backend, make_backend(backend_options));

  auto tokenizer = Tokenizer::load(model_dir);
  if (!tokenizer.is_ok()) return tokenizer.status().with_context("the model's tokenizer");
  loaded->tokenizer = std::move(tokenizer).value();
  MX_ASSIGN_OR_RETURN(loaded->model, GptOssModel::load(model_dir, *loaded->backend));
  const int64_t vocab = loaded->model->config().vocab_size;
  if (loaded->tokenizer->vocab_size() > vocab)
    return invalid_argument("the tokenizer's vocabulary (" + std::to_string(loaded->tokenizer->vocab_size()) +
                            " ids) is larger than the model's (" + std::to_string(vocab) + ")");
  if (args.has("test-forced-tokens")) {
    MX_ASSIGN_OR_RETURN(auto forced, server::ForcedTranscripts::load(args.get("test-forced-tokens"), *loaded->tokenizer));
    loaded->forced = std::make_unique<server::ForcedTranscripts>(std::move(forced));
    MX_LOG(Warning) << "TEST ONLY: --test-forced-tokens replaces sampling with scripted transcripts";
  }

  EngineConfig config;
  config.max_running_requests = server_options.max_running_requests;
  config.max_queued_requests = server_options.max_queued_requests;
  MX_ASSIGN_OR_RETURN(config.num_kv_pages, args.get_int("num-kv-pages", 0));
  MX_ASSIGN_OR_RETURN(config.mem_fraction, args.get_double("mem-fraction", config.mem_fraction));
  config.enable_cuda_graphs = !args.has("disable-cuda-graph");
  MX_ASSIGN_OR_RETURN(config.max_num_batched_tokens, args.get_int("max-num-batched-tokens", config.max_num_batched_tokens));
  if (args.has("context-length")) config.max_model_len = server_options.context_length;
  config.enable_prefix_cache = !args.has("no-prefix-cache");
  MX_ASSIGN_OR_RETURN(loaded->engine, Engine::start(*loaded->model, config, make_detokenize_fn(loaded->tokenizer)));
  server::EngineServiceOptions service_options;
  service_options.context_length = loaded->engine->config().max_model_len;
  service_options.forced = loaded->forced.get();
  loaded->service = std::make_unique<server::EngineCompletionService>(*loaded->engine, loaded->tokenizer, service_options);
  return loaded;
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
  auto stop_signals = [&] {
    signal_ioc.stop();
    signal_thread.join();
  };

  int64_t open_files = 0;
  if (server::raise_open_file_limit(&open_files)) {
    MX_LOG(Info) << "open-file limit raised to " << open_files;
  } else if (open_files >= 0 && open_files < 4096) {
    MX_LOG(Warning) << "open-file limit is " << open_files << " (hard limit): at most about that many clients at once";
  }

  // Generation answers 503 "loading" until the engine is up; /health says the same.
  server::UnwiredCompletionService loading_service;
  auto server = server::ApiServer::start(*options, &loading_service);
  if (!server.is_ok()) {
    stop_signals();
    return fail(server.status().message());
  }
  MX_LOG(Info) << "listening on http://" << options->http.host << ":" << (*server)->port() << " (loading the model)";
  auto loaded = load_model(args, *options);
  if (!loaded.is_ok()) {
    server->reset();
    stop_signals();
    return fail(loaded.status().message());
  }
  (*server)->set_ready((*loaded)->service.get(), (*loaded)->service->context_length());
  MX_LOG(Info) << "serving " << options->served_model_name << " on http://" << options->http.host << ":"
               << (*server)->port() << " (context " << (*loaded)->service->context_length() << " tokens)";
  std::fprintf(stdout, "listening on http://%s:%d\n", options->http.host.c_str(), (*server)->port());
  std::fflush(stdout);

  first_signal.get_future().wait();
  MX_LOG(Info) << "draining (up to " << options->shutdown_timeout.count() << " ms)";
  (*server)->drain_and_stop();
  server->reset();  // before the service it points to
  loaded->reset();
  stop_signals();
  return 0;
}

}  // namespace mx
