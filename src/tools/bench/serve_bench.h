// `mxserve bench serve` without the command line: the model id from GET /v1/models, OpenAI request bodies
// for the prompts, warm-up requests, then the timed run.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "tools/bench/http_url.h"
#include "tools/bench/load_client.h"
#include "tools/bench/random_prompts.h"

namespace mx::bench {

struct ServeBenchOptions {
  HttpUrl url;
  std::string endpoint = "completions";  // or "chat"
  std::string model;                     // sent as "model"
  std::string api_key;
  double request_rate = std::numeric_limits<double>::infinity();
  int64_t max_concurrency = 0;
  uint64_t seed = 1;
  bool ignore_eos = true;
  int64_t warmup_requests = 1;
  nlohmann::json extra_body;  // an object merged into every request body, or null
  double idle_timeout_s = 600;
  bool progress = false;  // progress lines and warm-up failures on stderr
};

// "/v1/completions" or "/v1/chat/completions".
std::string endpoint_path(const std::string& endpoint);

// The first model id the server lists.
Result<std::string> fetch_model_id(const HttpUrl& url, const std::string& api_key, double timeout_s = 30);

// A streaming request asking for exactly `max_tokens` tokens (ignore_eos, temperature 0, usage in the stream).
std::string make_request_body(const ServeBenchOptions& options, const std::string& prompt, int64_t max_tokens);

struct ServeBenchRun {
  LoadRun run;
  int64_t warmup_failed = 0;
  std::string warmup_error;  // the first warm-up failure
};

// Sends the warm-up requests (the first prompt, at most 32 output tokens, all at once; their results are
// dropped, failures are counted and, with `progress`, printed to stderr), then every prompt once under the
// options' arrival rate and concurrency.
// Sends `options.warmup_requests` untimed requests cycling over `warmup_prompts` (which must not repeat the
// measured prompts: see make_warmup_prompts), then the measured `prompts`.
Result<ServeBenchRun> run_serve_bench(const ServeBenchOptions& options, const std::vector<BenchPrompt>& prompts,
                                      const std::vector<BenchPrompt>& warmup_prompts = {});

}  // namespace mx::bench
