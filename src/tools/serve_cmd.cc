// `mxserve serve`: the OpenAI-compatible HTTP server on the continuous-batching engine. SIGTERM/SIGINT
// drains (503 to new requests, in-flight ones finish for up to --shutdown-timeout, the rest are aborted);
// a second signal exits at once.
//
// Start-up: bind first (health answers 503 "loading"), then load the model, its tokenizer and the engine,
// then open generation. Without --model, the demo model (random weights, the real o200k tokenizer) is
// written to the user's cache directory on first use and served. --preset serves a synthetic model made in
// memory (benchmarks: no checkpoint to write and read back; make-model of gpt-oss-20b takes ~50 s on a GPU
// machine, the in-memory weights ~16 s).
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <future>
#include <sstream>
#include <thread>

#include <boost/asio/signal_set.hpp>

#include "core/log.h"
#include "core/version.h"
#include "chat/chat_formats.h"
#include "model/demo_model.h"
#include "model/model_registry.h"
#include "model/synthetic_model.h"
#include "model/tensor_parallel_model.h"
#include "runtime/engine.h"
#include "runtime/tokenizer_detokenize.h"
#include "server/api_server.h"
#include "server/engine_completion_service.h"
#include "server/kv_event_publisher.h"
#include "tools/cli_args.h"
#include "tools/commands.h"
#include "tools/engine_flags.h"
#include "tools/model_location.h"

namespace mx {
namespace {

// serve's own flags, then the engine's (tools/engine_flags.h). Aliases are the spellings of vLLM and SGLang
// command lines; flags of theirs that mxserve cannot honour are accepted only with values it can, and
// refused with the reason otherwise (never parsed and ignored).
std::vector<CliOption> serve_options() {
  std::vector<CliOption> options = {
      {"model", true,
       "model directory (config.json, safetensors, tokenizer) or a Hugging Face id found in the local Hugging Face "
       "cache; also the bare first argument. Without it, the demo model: random weights (it speaks gibberish), made "
       "once in $XDG_CACHE_HOME/mxserve or ~/.cache/mxserve",
       {"model-path"}},
      {"preset", true,
       "instead of --model: synthetic weights (seed 0) of a preset, made in memory, for benchmarks: " +
           synthetic_preset_list() + "; needs --tokenizer"},
      {"tokenizer", true, "with --preset: its tokenizer (a tokenizer.json or .tiktoken file, or a folder holding one)"},
      {"host", true, "address to listen on (default 127.0.0.1)"},
      {"port", true, "TCP port (default 8000; 0 picks a free one)"},
      {"backend", true, "cpu (default) or cuda"},
      {"threads", true, "CPU backend threads (default: all cores)"},
      {"api-key", true, "require `Authorization: Bearer KEY` on every route but /health and /metrics"},
      {"allowed-origins", true, "CORS: comma-separated origins browsers may call from, or * (default: none)"},
      {"metrics-require-key", false, "require the API key on /metrics too (open by default, as Prometheus scrapes it)"},
      {"served-model-name", true, "the model id clients use (default: the model directory's name, or mxserve-demo)"},
      {"max-queued-requests", true, "requests waiting beyond those; more get 503 (default 1024)"},
      {"seed", true, "seed for requests that bring none (default: random per request)"},
      {"dtype", true, "auto or bfloat16 (the only dtype mxserve computes in on the GPU; the CPU reference is fp32)"},
      {"kv-cache-dtype", true, "auto or bfloat16 (fp8 KV is not available)"},
      {"tensor-parallel-size", true,
       "ranks the model is split over, one thread each (cpu: threads; cuda: devices 0..N-1; default 1)",
       {"tp", "tp-size"}},
      {"reasoning-parser", true, "gpt_oss (also gpt-oss, openai_gptoss): the model's own format; on by default"},
      {"tool-call-parser", true, "openai (also gpt_oss, harmony): the model's own format; on by default"},
      {"enable-auto-tool-choice", false, "accepted: tool calls are always parsed"},
      {"trust-remote-code", false, "accepted: mxserve runs no code from checkpoints"},
      {"disable-log-requests", false, "no access-log line per request"},
      {"kv-events-endpoint", true, "publish KV-cache events (vLLM's format) on this ZeroMQ PUB address, e.g. tcp://*:5557"},
      {"kv-events-replay-endpoint", true, "answer replay requests on this ZeroMQ ROUTER address, e.g. tcp://*:5559"},
      {"kv-events-topic", true, "first frame of every KV event message (default empty; llm-d: kv@POD_IP:PORT@MODEL)"},
      {"kv-events-block-size", true, "tokens per event block; must equal --page-size (default: the page size)"},
      {"shutdown-timeout", true, "seconds in-flight requests may finish after SIGTERM (default 30)"},
      {"io-threads", true, "HTTP io threads (default 2)"},
      {"log-level", true, "debug, info (default), warning or error"},
      {"test-forced-tokens", true, "TEST ONLY: JSON file of transcripts the engine emits instead of sampling "
                                   "(see src/server/forced_transcripts.h)"},
      {"version", false, "print the version and exit"},
      {"help", false, "show this help"},
  };
  for (auto& o : engine_cli_options()) options.push_back(std::move(o));
  return options;
}

// The vLLM/SGLang flags whose only honourable values are the ones mxserve runs with.
Status check_compat_flags(const CliArgs& args) {
  auto one_of = [&](const std::string& flag, std::initializer_list<const char*> accepted, const std::string& why) -> Status {
    if (!args.has(flag)) return Status::ok();
    const std::string value = args.get(flag);
    for (const char* a : accepted) {
      if (value == a) return Status::ok();
    }
    return invalid_argument("--" + flag + " " + value + ": " + why);
  };
  MX_RETURN_IF_ERROR(one_of("dtype", {"auto", "bfloat16", "bf16"},
                            "mxserve computes in bfloat16 on the GPU (fp32 on the CPU reference); use auto or bfloat16"));
  MX_RETURN_IF_ERROR(one_of("kv-cache-dtype", {"auto", "bfloat16", "bf16"}, "only a bfloat16 KV cache is available"));
  MX_RETURN_IF_ERROR(one_of("reasoning-parser", {"gpt_oss", "gpt-oss", "openai_gptoss", "harmony"},
                            "mxserve parses the model's own format (gpt-oss: Harmony); give gpt_oss or leave it out"));
  MX_RETURN_IF_ERROR(one_of("tool-call-parser", {"openai", "gpt_oss", "gpt-oss", "harmony"},
                            "mxserve parses the model's own format (gpt-oss: Harmony); give openai or leave it out"));
  return Status::ok();
}

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
  o.log_requests = !args.has("disable-log-requests");
  if (args.has("allowed-origins")) {
    std::stringstream list(args.get("allowed-origins"));
    for (std::string origin; std::getline(list, origin, ',');) {
      while (!origin.empty() && origin.front() == ' ') origin.erase(origin.begin());
      while (!origin.empty() && origin.back() == ' ') origin.pop_back();
      if (origin.empty()) continue;
      if (origin != "*" && origin.find("://") == std::string::npos)
        return invalid_argument("--allowed-origins: '" + origin + "' is not an origin (scheme://host[:port]) or *");
      o.http.allowed_origins.push_back(origin);
    }
    if (o.http.allowed_origins.empty()) return invalid_argument("--allowed-origins needs at least one origin");
  }
  if (o.metrics_require_key && o.api_key.empty()) return invalid_argument("--metrics-require-key needs --api-key");
  {
    SpeculativeConfig speculative;  // /metrics registers a spec_decode series per draft position up front
    MX_RETURN_IF_ERROR(read_speculative_flags(args, &speculative));
    o.speculative_draft_tokens = speculative.enabled() ? speculative.num_draft_tokens : 0;
  }
  MX_RETURN_IF_ERROR(check_compat_flags(args));
  {
    MX_ASSIGN_OR_RETURN(const int tp, tensor_parallel_size(args));
    BackendOptions backend;
    backend.name = args.get("backend", "cpu");
    MX_RETURN_IF_ERROR(check_tensor_parallel_backend(backend, tp));
  }
  std::string served = "mxserve-demo";
  if (args.has("preset")) {
    const std::string preset = args.get("preset");
    const std::vector<std::string> names = synthetic_preset_names();
    if (args.has("model")) return invalid_argument("give --model or --preset, not both");
    if (std::find(names.begin(), names.end(), preset) == names.end())
      return invalid_argument("--preset " + preset + ": unknown (" + synthetic_preset_list() + ")");
    if (!args.has("tokenizer"))
      return invalid_argument("--preset " + preset + " needs --tokenizer: synthetic presets come without one");
    MX_ASSIGN_OR_RETURN(const int tp, tensor_parallel_size(args));
    if (tp > 1) return invalid_argument("--preset makes the model in memory for one rank: not with --tensor-parallel-size");
    served = preset;
  } else if (args.has("tokenizer")) {
    return invalid_argument("--tokenizer goes with --preset: a model directory brings its own tokenizer");
  } else if (args.has("model")) {
    MX_ASSIGN_OR_RETURN(const ModelLocation where, resolve_model_location(args.get("model")));
    served = where.served_name;
  }
  o.served_model_name = args.get("served-model-name", served);
  // Until the model is loaded, the most any model allows; the engine's limit replaces it (set_ready).
  MX_ASSIGN_OR_RETURN(o.context_length, args.get_int("max-model-len", 131072));
  if (o.context_length < 16) return invalid_argument("--max-model-len (--context-length) must be at least 16");
  // 0: the engine sizes it from the KV pool and tells the server when ready (set_ready).
  MX_ASSIGN_OR_RETURN(o.max_running_requests, args.get_int("max-running-requests", 0));
  if (args.has("max-running-requests") && o.max_running_requests < 1)
    return invalid_argument("--max-running-requests must be at least 1");
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
  std::unique_ptr<Model> model;
  std::shared_ptr<const Tokenizer> tokenizer;
  std::shared_ptr<const ChatFormat> format;  // over `tokenizer`
  std::unique_ptr<server::ForcedTranscripts> forced;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<server::EngineCompletionService> service;

  ~LoadedModel() {
    service.reset();
    engine.reset();
  }
};

// --preset: the synthetic checkpoint in memory, its chat format and --tokenizer with that format's tokens.
Status load_preset_model(const CliArgs& args, const BackendOptions& backend_options, LoadedModel* loaded) {
  const std::string preset = args.get("preset"), source = "preset " + preset;
  SyntheticOptions synthetic_options;
  synthetic_options.threads = backend_options.num_threads;
  MX_ASSIGN_OR_RETURN(SyntheticCheckpoint synthetic, synthetic_checkpoint_in_memory(preset, synthetic_options));
  MX_ASSIGN_OR_RETURN(const std::string format_name, model_chat_format_of_config(synthetic.config_json, source));
  auto chat = load_chat_tokenizer(args.get("tokenizer"), format_name);
  if (!chat.is_ok()) return chat.status().with_context("--tokenizer " + args.get("tokenizer"));
  loaded->tokenizer = chat->tokenizer;
  loaded->format = chat->format;
  MX_ASSIGN_OR_RETURN(const ModelLoadOptions load_options, model_load_options(args));
  MX_ASSIGN_OR_RETURN(loaded->model, model_from_checkpoint(synthetic.config_json, source, std::move(synthetic.generation_config),
                                                           std::move(synthetic.checkpoint), *loaded->backend, load_options));
  return Status::ok();
}

Result<std::unique_ptr<LoadedModel>> load_model(const CliArgs& args, const server::ApiServerOptions& server_options) {
  auto loaded = std::make_unique<LoadedModel>();
  std::string model_dir;
  if (args.has("preset")) {
    // the model comes from memory (below)
  } else if (args.has("model")) {
    MX_ASSIGN_OR_RETURN(const ModelLocation where, resolve_model_location(args.get("model")));
    model_dir = where.dir;
  } else {
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

  if (args.has("preset")) {
    MX_RETURN_IF_ERROR(load_preset_model(args, backend_options, loaded.get()));
  } else {
    // The family's chat format, known from config.json before anything loads: the tokenizer gets its special
    // tokens (a .tiktoken rank file lists none).
    MX_ASSIGN_OR_RETURN(const std::string format_name, model_chat_format(model_dir));
    auto chat = load_chat_tokenizer(model_dir, format_name);
    if (!chat.is_ok()) return chat.status().with_context("the model's tokenizer");
    loaded->tokenizer = chat->tokenizer;
    loaded->format = chat->format;
    MX_ASSIGN_OR_RETURN(const int tp, tensor_parallel_size(args));
    MX_ASSIGN_OR_RETURN(const ModelLoadOptions load_options, model_load_options(args));
    MX_ASSIGN_OR_RETURN(loaded->model,
                        load_tensor_parallel_model(model_dir, *loaded->backend, backend_options, tp, load_options));
  }
  const int64_t vocab = loaded->model->dims().vocab_size;
  if (loaded->tokenizer->vocab_size() > vocab)
    return invalid_argument("the tokenizer's vocabulary (" + std::to_string(loaded->tokenizer->vocab_size()) +
                            " ids) is larger than the model's (" + std::to_string(vocab) + ")");
  if (args.has("test-forced-tokens")) {
    MX_ASSIGN_OR_RETURN(auto forced, server::ForcedTranscripts::load(args.get("test-forced-tokens"), *loaded->tokenizer));
    loaded->forced = std::make_unique<server::ForcedTranscripts>(std::move(forced));
    MX_LOG(Warning) << "TEST ONLY: --test-forced-tokens replaces sampling with scripted transcripts";
  }

  EngineConfig config;
  config.max_num_batched_tokens = 0;  // auto unless given: resolve_engine_config and the memory plan pick them
  config.max_running_requests = 0;
  MX_RETURN_IF_ERROR(read_engine_flags(args, &config));
  if (args.has("kv-events-endpoint")) {
    server::KvEventOptions events;
    events.endpoint = args.get("kv-events-endpoint");
    events.replay_endpoint = args.get("kv-events-replay-endpoint");
    events.topic = args.get("kv-events-topic");
    MX_ASSIGN_OR_RETURN(events.block_size, args.get_int("kv-events-block-size", config.page_size));
    if (events.block_size != config.page_size)
      return invalid_argument("--kv-events-block-size " + std::to_string(events.block_size) + " must equal --page-size (" +
                              std::to_string(config.page_size) + "): one event block is one KV page; set --page-size " +
                              std::to_string(events.block_size) + " to publish blocks of that size");
    if (!config.enable_prefix_cache) return invalid_argument("--kv-events-endpoint needs the prefix cache (drop --no-prefix-cache)");
    events.medium = backend_options.name == "cuda" ? "GPU" : "CPU";
    MX_ASSIGN_OR_RETURN(auto publisher, server::KvEventPublisher::start(events));
    MX_LOG(Info) << "KV-cache events on " << publisher->endpoint()
                 << (events.replay_endpoint.empty() ? "" : ", replay on " + publisher->replay_endpoint()) << ", blocks of "
                 << events.block_size << " tokens";
    config.prefix_cache_observer = std::move(publisher);
  } else if (args.has("kv-events-replay-endpoint") || args.has("kv-events-topic") || args.has("kv-events-block-size")) {
    return invalid_argument("the --kv-events-* options need --kv-events-endpoint");
  }
  config.max_queued_requests = server_options.max_queued_requests;
  MX_ASSIGN_OR_RETURN(loaded->engine, Engine::start(*loaded->model, config, make_detokenize_fn(loaded->tokenizer)));
  server::EngineServiceOptions service_options;
  service_options.context_length = loaded->engine->config().max_model_len;
  service_options.forced = loaded->forced.get();
  if (args.has("seed")) {
    MX_ASSIGN_OR_RETURN(const int64_t seed, args.get_int("seed", 0));
    service_options.seed = static_cast<uint64_t>(seed);
  }
  loaded->service = std::make_unique<server::EngineCompletionService>(*loaded->engine, loaded->format, service_options);
  return loaded;
}

}  // namespace

int run_serve_command(int argc, char** argv) {
  const std::vector<CliOption> flags = serve_options();
  auto parsed = CliArgs::parse(argc, argv, 2, flags, "model");
  if (!parsed.is_ok()) {
    std::fprintf(stderr, "error: %s\n%s", parsed.status().message().c_str(), cli_usage("serve", flags).c_str());
    return 2;
  }
  const CliArgs& args = *parsed;
  if (args.has("help")) {
    std::fprintf(stdout, "%s", cli_usage("serve", flags).c_str());
    return 0;
  }
  if (args.has("version")) {
    std::fprintf(stdout, "mxserve %s\n", kMxserveVersion);
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
  (*server)->set_ready((*loaded)->service.get(), (*loaded)->service->context_length(),
                       (*loaded)->engine->config().max_running_requests);
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
