// `mxserve generate`: prompts given as token ids in, generated ids out (one JSON line per prompt, in prompt
// order). Every prompt goes through the continuous-batching Engine at once, with the engine flags `serve`
// takes. The contract other checks rely on: see README. User errors print one line and exit 1.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "model/model_registry.h"
#include "model/tensor_parallel_model.h"
#include "runtime/engine.h"
#include "tools/cli_args.h"
#include "tools/commands.h"
#include "tools/engine_flags.h"

namespace mx {
namespace {

const std::vector<CliOption> kCommandOptions = {
    {"model", true, "model directory (config.json + safetensors)"},
    {"backend", true, "cpu (default) or cuda"},
    {"prompt-ids", true, "one prompt as comma-separated token ids"},
    {"prompt-ids-file", true, "JSONL file: one JSON array of token ids per line"},
    {"max-new-tokens", true, "tokens to generate per prompt (default 16)"},
    {"temperature", true, "0 (default) is greedy"},
    {"top-k", true, "sample among the k most likely tokens (0 = all)"},
    {"top-p", true, "nucleus sampling mass (default 1)"},
    {"min-p", true, "drop tokens below min-p times the most likely (default 0)"},
    {"seed", true, "sampling seed (default 0)"},
    {"logits-out", true, "write prompt_{i}_logits (f32 [T_i, vocab]) to this safetensors file"},
    {"threads", true, "CPU backend threads (default: all cores)"},
    {"tensor-parallel-size", true, "ranks the model is split over, one thread each (cpu: threads; cuda: devices 0..N-1; default 1)",
     {"tp", "tp-size"}},
    {"stats", false, "print engine counters (steps, preemptions, prefix hits, speculation) to stderr at the end"},
    {"log-level", true, "debug, info, warning (default) or error"},
    {"help", false, "show this help"},
};

std::vector<CliOption> options() {
  std::vector<CliOption> all = kCommandOptions;
  const auto engine = engine_cli_options();
  all.insert(all.end() - 1, engine.begin(), engine.end());  // before --help
  return all;
}

Result<std::vector<int32_t>> ids_from_json(const nlohmann::json& value, const std::string& where) {
  if (!value.is_array()) return invalid_argument(where + ": expected a JSON array of token ids");
  std::vector<int32_t> ids;
  for (const auto& v : value) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
      return invalid_argument(where + ": token ids must be integers in [0, 2^31)");
    ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
  }
  return ids;
}

Result<std::vector<std::vector<int32_t>>> read_prompts(const CliArgs& args) {
  std::vector<std::vector<int32_t>> prompts;
  if (args.has("prompt-ids") == args.has("prompt-ids-file"))
    return invalid_argument("give exactly one of --prompt-ids or --prompt-ids-file");
  if (args.has("prompt-ids")) {
    MX_ASSIGN_OR_RETURN(auto list, parse_int_list(args.get("prompt-ids")));
    std::vector<int32_t> ids;
    for (int64_t v : list) {
      if (v < 0 || v > INT32_MAX) return invalid_argument("--prompt-ids: token id " + std::to_string(v) + " is out of range");
      ids.push_back(static_cast<int32_t>(v));
    }
    prompts.push_back(std::move(ids));
    return prompts;
  }
  const std::string path = args.get("prompt-ids-file");
  std::ifstream in(path);
  if (!in) return io_error("cannot open " + path);
  std::string line;
  for (int64_t line_no = 1; std::getline(in, line); ++line_no) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(line_no);
    auto value = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (value.is_discarded()) return invalid_argument(where + ": not valid JSON");
    MX_ASSIGN_OR_RETURN(auto ids, ids_from_json(value, where));
    prompts.push_back(std::move(ids));
  }
  if (prompts.empty()) return invalid_argument(path + " holds no prompts");
  return prompts;
}

Result<BackendOptions> backend_options_from_args(const CliArgs& args) {
  BackendOptions options;
  options.name = args.get("backend", "cpu");
  MX_ASSIGN_OR_RETURN(int64_t threads, args.get_int("threads", 0));
  if (threads < 0 || threads > 1024) return invalid_argument("--threads must be in [0, 1024]");
  options.num_threads = static_cast<int>(threads);
  return options;
}

Status run(const CliArgs& args) {
  set_log_level(LogLevel::kWarning);
  if (!args.has("model")) return invalid_argument("--model is required");
  if (args.has("log-level")) {
    LogLevel level;
    if (!parse_log_level(args.get("log-level"), &level)) return invalid_argument("unknown --log-level");
    set_log_level(level);
  }
  MX_ASSIGN_OR_RETURN(auto prompts, read_prompts(args));
  MX_ASSIGN_OR_RETURN(int64_t max_new, args.get_int("max-new-tokens", 16));
  MX_ASSIGN_OR_RETURN(double temperature, args.get_double("temperature", 0.0));
  MX_ASSIGN_OR_RETURN(int64_t top_k, args.get_int("top-k", 0));
  MX_ASSIGN_OR_RETURN(double top_p, args.get_double("top-p", 1.0));
  MX_ASSIGN_OR_RETURN(double min_p, args.get_double("min-p", 0.0));
  MX_ASSIGN_OR_RETURN(int64_t seed, args.get_int("seed", 0));
  if (max_new < 0) return invalid_argument("--max-new-tokens must be >= 0");
  if (temperature < 0) return invalid_argument("--temperature must be >= 0");
  if (top_k < 0) return invalid_argument("--top-k must be >= 0");
  if (!(top_p > 0 && top_p <= 1)) return invalid_argument("--top-p must be in (0, 1]");
  if (!(min_p >= 0 && min_p <= 1)) return invalid_argument("--min-p must be in [0, 1]");

  EngineConfig config;
  MX_RETURN_IF_ERROR(read_engine_flags(args, &config));
  const bool want_logits = args.has("logits-out");
  if (want_logits) config.max_prompt_logit_rows = config.max_num_batched_tokens;

  MX_ASSIGN_OR_RETURN(const BackendOptions backend_options, backend_options_from_args(args));
  MX_ASSIGN_OR_RETURN(const int tp, tensor_parallel_size(args));
  MX_RETURN_IF_ERROR(check_tensor_parallel_backend(backend_options, tp));
  MX_ASSIGN_OR_RETURN(auto backend, make_backend(backend_options));
  MX_ASSIGN_OR_RETURN(const ModelLoadOptions load_options, model_load_options(args));
  MX_ASSIGN_OR_RETURN(auto model,
                      load_tensor_parallel_model(args.get("model"), *backend, backend_options, tp, load_options));
  MX_ASSIGN_OR_RETURN(auto engine, Engine::start(*model, config));
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (size_t i = 0; i < prompts.size(); ++i) {
    RequestInput r;
    r.prompt = std::move(prompts[i]);
    r.max_tokens = max_new;
    r.sampling.temperature = static_cast<float>(temperature);
    r.sampling.top_k = top_k;
    r.sampling.top_p = static_cast<float>(top_p);
    r.sampling.min_p = static_cast<float>(min_p);
    r.sampling.seed = static_cast<uint64_t>(seed);
    r.want_prompt_logits = want_logits;
    auto stream = engine->add_request(std::move(r));
    if (!stream.is_ok()) return stream.status().with_context("prompt " + std::to_string(i));
    streams.push_back(std::move(*stream));
  }
  std::vector<RequestOutput> results(streams.size());
  RequestOutput delta;
  for (size_t i = 0; i < streams.size(); ++i) {
    while (!results[i].finished()) {
      if (streams[i]->wait(&delta, std::chrono::milliseconds(100))) results[i].merge(std::move(delta));
    }
    if (results[i].finish == FinishReason::kError)
      return internal_error("prompt " + std::to_string(i) + ": " + results[i].error);
  }
  if (args.has("stats")) {
    const EngineStats st = engine->stats();
    std::fprintf(stderr, "engine: %lld steps, %lld tokens computed, %lld prefix-cache hit tokens, %lld preemptions\n",
                 static_cast<long long>(st.scheduler.steps), static_cast<long long>(st.scheduler.computed_tokens),
                 static_cast<long long>(st.scheduler.prefix_hit_tokens), static_cast<long long>(st.scheduler.preemptions));
    if (engine->config().speculative.enabled()) std::fprintf(stderr, "%s\n", describe_speculation(st.scheduler).c_str());
  }
  engine.reset();

  for (size_t i = 0; i < results.size(); ++i) {
    nlohmann::ordered_json line = {{"prompt_index", i}, {"output_ids", results[i].token_ids}};
    std::cout << line.dump() << "\n";
  }
  std::cout.flush();
  if (want_logits) {
    const int64_t vocab = model->dims().vocab_size;
    std::vector<NamedTensor> tensors;
    for (size_t i = 0; i < results.size(); ++i) {
      auto& logits = results[i].prompt_logits;
      tensors.push_back({"prompt_" + std::to_string(i) + "_logits",
                         TensorView(logits.data(), DType::kF32, {static_cast<int64_t>(logits.size()) / vocab, vocab})});
    }
    MX_RETURN_IF_ERROR(write_safetensors(args.get("logits-out"), tensors));
  }
  return Status::ok();
}

}  // namespace

int run_generate_command(int argc, char** argv) {
  return run_cli_command(argc, argv, "generate", options(), run);
}

}  // namespace mx
