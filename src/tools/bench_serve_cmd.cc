// `mxserve bench serve`: a streaming load test of any OpenAI-compatible server (mxserve, SGLang, vLLM) with
// random prompts of set lengths, reporting what SGLang's bench_serving reports. The client is one thread of
// Asio; see tools/bench/load_client.h. Exit 0 when at least one request succeeded, 1 when none did or on a
// setup error (unreachable server, bad flag values), 2 on unknown options.
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <limits>

#include "tokenizer/embedded_o200k.h"
#include "tokenizer/tokenizer.h"
#include "tools/bench/bench_report.h"
#include "tools/bench/serve_bench.h"
#include "tools/cli_args.h"
#include "tools/commands.h"

namespace mx {
namespace {

const std::vector<CliOption> kOptions = {
    {"base-url", true, "server as http://HOST:PORT[/PREFIX] (http only, no TLS; default http://127.0.0.1:8000)"},
    {"endpoint", true, "completions (/v1/completions, default) or chat (/v1/chat/completions)"},
    {"model", true, "model id to send (default: the first id from GET /v1/models)"},
    {"num-prompts", true, "requests to send (default 1000)"},
    {"random-input-len", true, "prompt tokens per request (default 1024)"},
    {"random-output-len", true, "output tokens per request, sent as max_tokens (default 1024)"},
    {"random-range-ratio", true, "lengths drawn from [len*ratio, len]; 1 (default) = exact lengths"},
    {"request-rate", true, "Poisson arrivals per second, or inf (default): all at once"},
    {"max-concurrency", true, "requests in flight at most (default: no limit)"},
    {"warmup-requests", true, "untimed requests sent first (default 1; at most 32 output tokens each)"},
    {"disable-ignore-eos", false, "do not send ignore_eos: true (outputs may then end early)"},
    {"extra-body", true, "JSON object merged into every request body, e.g. '{\"reasoning_effort\":\"low\"}'"},
    {"seed", true, "seed for prompts and arrival times (default 1)"},
    {"api-key", true, "sent as `Authorization: Bearer KEY` (default: $OPENAI_API_KEY when set)"},
    {"tokenizer", true, "tokenizer for the prompts: .tiktoken, tokenizer.json or model dir (default: built-in o200k)"},
    {"request-timeout", true, "seconds without a byte from the server before a request fails (default 600)"},
    {"json", true, "write every result (summary, settings, per-request arrays) to this JSON file"},
    {"help", false, "show this help"},
};

std::string command_line(int argc, char** argv) {
  std::string out = "mxserve";
  for (int i = 0; i < argc; ++i) {
    const std::string arg = argv[i];
    out += arg.find_first_of(" \t\"'") == std::string::npos ? " " + arg : " '" + arg + "'";
  }
  return out;
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buffer[32];
  std::strftime(buffer, sizeof(buffer), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buffer;
}

struct Plan {
  bench::ServeBenchOptions serve;
  bench::RandomPromptOptions prompts;
  std::string tokenizer_path;
};

Result<Plan> read_plan(const CliArgs& args) {
  Plan plan;
  bench::ServeBenchOptions& s = plan.serve;
  MX_ASSIGN_OR_RETURN(s.url, bench::parse_http_url(args.get("base-url", "http://127.0.0.1:8000")));
  s.endpoint = args.get("endpoint", "completions");
  if (s.endpoint != "completions" && s.endpoint != "chat")
    return invalid_argument("--endpoint must be completions or chat, not '" + s.endpoint + "'");
  s.model = args.get("model");
  if (args.has("model") && s.model.empty()) return invalid_argument("--model must not be empty");
  const char* env_key = std::getenv("OPENAI_API_KEY");
  s.api_key = args.get("api-key", env_key ? env_key : "");
  MX_ASSIGN_OR_RETURN(s.request_rate, args.get_double("request-rate", std::numeric_limits<double>::infinity()));
  if (!(s.request_rate > 0)) return invalid_argument("--request-rate must be > 0 (or inf)");
  MX_ASSIGN_OR_RETURN(s.max_concurrency, args.get_int("max-concurrency", 0));
  if (args.has("max-concurrency") && s.max_concurrency < 1) return invalid_argument("--max-concurrency must be at least 1");
  MX_ASSIGN_OR_RETURN(s.warmup_requests, args.get_int("warmup-requests", 1));
  if (s.warmup_requests < 0 || s.warmup_requests > 10000) return invalid_argument("--warmup-requests must be in [0, 10000]");
  s.ignore_eos = !args.has("disable-ignore-eos");
  if (args.has("extra-body")) {
    s.extra_body = nlohmann::json::parse(args.get("extra-body"), nullptr, /*allow_exceptions=*/false);
    if (!s.extra_body.is_object()) return invalid_argument("--extra-body must be a JSON object");
  }
  MX_ASSIGN_OR_RETURN(int64_t seed, args.get_int("seed", 1));
  s.seed = static_cast<uint64_t>(seed);
  MX_ASSIGN_OR_RETURN(s.idle_timeout_s, args.get_double("request-timeout", 600));
  if (!(s.idle_timeout_s > 0 && s.idle_timeout_s <= 86400)) return invalid_argument("--request-timeout must be in (0, 86400]");
  s.progress = true;

  bench::RandomPromptOptions& p = plan.prompts;
  MX_ASSIGN_OR_RETURN(p.num_prompts, args.get_int("num-prompts", 1000));
  MX_ASSIGN_OR_RETURN(p.input_len, args.get_int("random-input-len", 1024));
  MX_ASSIGN_OR_RETURN(p.output_len, args.get_int("random-output-len", 1024));
  MX_ASSIGN_OR_RETURN(p.range_ratio, args.get_double("random-range-ratio", 1.0));
  if (p.num_prompts < 1 || p.num_prompts > 10'000'000) return invalid_argument("--num-prompts must be in [1, 10000000]");
  if (p.input_len < 1 || p.input_len > 10'000'000) return invalid_argument("--random-input-len must be in [1, 10000000]");
  if (p.output_len < 1 || p.output_len > 10'000'000) return invalid_argument("--random-output-len must be in [1, 10000000]");
  if (!(p.range_ratio >= 0 && p.range_ratio <= 1)) return invalid_argument("--random-range-ratio must be in [0, 1]");
  p.seed = s.seed;

  plan.tokenizer_path = args.get("tokenizer");
  if (args.has("tokenizer") && plan.tokenizer_path.empty()) return invalid_argument("--tokenizer must not be empty");
  return plan;
}

// The o200k tokenizer built into the binary unless a file is named.
Result<std::shared_ptr<const Tokenizer>> load_tokenizer(const std::string& path) {
  if (!path.empty()) return Tokenizer::load(path);
  MX_ASSIGN_OR_RETURN(std::string_view ranks, embedded_o200k_tiktoken());
  return Tokenizer::from_tiktoken_text(ranks);
}

Status run(const CliArgs& args, const std::string& command) {
  MX_ASSIGN_OR_RETURN(Plan plan, read_plan(args));
  bench::raise_open_file_limit();
  MX_ASSIGN_OR_RETURN(auto tokenizer, load_tokenizer(plan.tokenizer_path));
  MX_ASSIGN_OR_RETURN(auto prompts, bench::make_random_prompts(*tokenizer, plan.prompts));
  if (plan.serve.model.empty()) {
    MX_ASSIGN_OR_RETURN(plan.serve.model, bench::fetch_model_id(plan.serve.url, plan.serve.api_key));
  }
  std::fprintf(stderr, "bench serve: %lld requests to %s%s (model %s)\n", static_cast<long long>(prompts.size()),
               plan.serve.url.to_string().c_str(), bench::endpoint_path(plan.serve.endpoint).c_str(),
               plan.serve.model.c_str());
  std::vector<bench::BenchPrompt> warmup;
  if (plan.serve.warmup_requests > 0) {
    MX_ASSIGN_OR_RETURN(warmup, bench::make_warmup_prompts(*tokenizer, plan.prompts, prompts, plan.serve.warmup_requests));
  }
  MX_ASSIGN_OR_RETURN(bench::ServeBenchRun result, bench::run_serve_bench(plan.serve, prompts, warmup));

  bench::BenchConfig config;
  config.command_line = command;
  config.date = utc_now();
  config.base_url = plan.serve.url.to_string();
  config.endpoint = plan.serve.endpoint;
  config.model = plan.serve.model;
  config.num_prompts = plan.prompts.num_prompts;
  config.input_len = plan.prompts.input_len;
  config.output_len = plan.prompts.output_len;
  config.range_ratio = plan.prompts.range_ratio;
  config.request_rate = plan.serve.request_rate;
  config.max_concurrency = plan.serve.max_concurrency;
  config.seed = plan.serve.seed;
  config.ignore_eos = plan.serve.ignore_eos;
  config.warmup_requests = plan.serve.warmup_requests;
  const bench::BenchSummary summary = bench::summarize_run(result.run);
  std::fputs(bench::format_report(config, summary).c_str(), stdout);
  std::fflush(stdout);
  if (args.has("json")) {
    std::ofstream out(args.get("json"));
    out << bench::report_json(config, summary, result.run).dump() << "\n";
    if (!out) return io_error("cannot write " + args.get("json"));
  }
  if (summary.completed == 0)
    return io_error("all " + std::to_string(summary.failed) + " requests failed (first error: " +
                       summary.errors.front().first + ")");
  return Status::ok();
}

}  // namespace

int run_bench_serve_command(int argc, char** argv) {
  const std::string command = command_line(argc, argv);
  return run_cli_command(argc, argv, "bench serve", kOptions, [&](const CliArgs& args) { return run(args, command); });
}

}  // namespace mx
