#include "tools/engine_flags.h"

namespace mx {

std::vector<CliOption> engine_cli_options() {
  return {
      {"page-size", true, "KV cache page size in tokens (default 16)"},
      {"mem-fraction", true, "CUDA: share of device memory for weights, activations and the KV pool (default 0.9)",
       {"gpu-memory-utilization", "mem-fraction-static"}},
      {"num-kv-pages", true, "KV pool size in pages; overrides --mem-fraction (CPU default: a 256 MiB pool)"},
      {"max-num-batched-tokens", true, "tokens computed per engine step (serve on a GPU: 8192 when the weights leave 16 GiB for KV; otherwise 2048)"},
      {"max-running-requests", true,
       "requests decoded together (serve on a GPU: as many as the KV pool holds at 2048 tokens each, at most 256; "
       "otherwise 64)",
       {"max-num-seqs"}},
      {"max-model-len", true, "longest prompt + output per request (default: the model's context, capped by the KV pool)",
       {"context-length"}},
      {"no-prefix-cache", false, "do not reuse KV pages of shared prompt prefixes", {"no-enable-prefix-caching"}},
      {"enable-prefix-caching", false, "reuse KV pages of shared prompt prefixes (the default)"},
      {"disable-cuda-graph", false, "run decode steps eagerly instead of replaying captured CUDA graphs"},
      {"disable-overlap-schedule", false,
       "schedule and stage each decode step only after the previous one's tokens are applied, instead of while "
       "it runs (the device then idles through the host's work between steps)"},
      {"cuda-graph-batch-sizes", true, "decode batch sizes to capture, e.g. 1,2,4,8 (default 1,2,4,8..512)"},
      {"speculative-algorithm", true,
       "speculative decoding drafter: ngram (prompt lookup), mtp (Gemma-4's MTP assistant) or eagle3 (an EAGLE-3 "
       "draft for gpt-oss); mtp and eagle3 read --speculative-draft-model"},
      {"speculative-draft-model", true,
       "mtp, eagle3: the draft model's checkpoint folder (a Gemma4AssistantForCausalLM or a LlamaForCausalLMEagle3)"},
      {"speculative-num-draft-tokens", true, "tokens drafted per request and step, verified in one pass (default 3)",
       {"num-speculative-tokens"}},
      {"no-speculative-draft-graphs", false,
       "eagle3: run the draft's chain passes eagerly instead of replaying CUDA graphs of them (one per decode graph "
       "bucket and draft count)"},
      {"speculative-ngram-min", true, "ngram: shortest suffix looked up in the sequence (default 1)", {"prompt-lookup-min"}},
      {"speculative-ngram-max", true, "ngram: longest suffix looked up in the sequence (default 4)", {"prompt-lookup-max"}},
      {"dense-dtype", true,
       "bf16 (default) or fp8: qkv, o_proj and lm_head weights converted at load to FP8 e4m3 with one scale per "
       "output channel (fewer bytes per decode step, less accurate logits: docs/API.md, docs/PERF.md)"},
      {"enable-expert-parallel", false,
       "tensor parallel: split the MoE by expert (each rank 1/N of the experts whole) instead of by the experts' "
       "intermediate dimension (each rank a slice of every expert: the default, faster in docs/PERF.md)"},
      {"no-enable-expert-parallel", false, "tensor parallel: split the MoE by the experts' intermediate dimension"},
      {"expert-parallel-size", true,
       "SGLang's spelling: 1 splits the MoE by intermediate dimension, the tensor-parallel size by expert",
       {"ep-size"}},
  };
}

namespace {

// --enable-expert-parallel / --no-enable-expert-parallel (vLLM) or --expert-parallel-size (SGLang, where only
// 1 and the tensor-parallel size mean something here: experts are never split over a subset of the ranks).
Result<MoeSplit> moe_split_flags(const CliArgs& args) {
  const bool on = args.has("enable-expert-parallel"), off = args.has("no-enable-expert-parallel");
  if (on && off) return invalid_argument("--enable-expert-parallel and --no-enable-expert-parallel contradict each other");
  MX_ASSIGN_OR_RETURN(const int tp, tensor_parallel_size(args));
  if (on && tp == 1) return invalid_argument("--enable-expert-parallel needs --tensor-parallel-size 2 or more");
  MoeSplit split = on ? MoeSplit::kByExpert : off ? MoeSplit::kByIntermediate : MoeSplit::kAuto;
  if (!args.has("expert-parallel-size")) return split;
  MX_ASSIGN_OR_RETURN(const int64_t ep, args.get_int("expert-parallel-size", 1));
  if (ep != 1 && ep != tp)
    return invalid_argument("--expert-parallel-size must be 1 (the MoE split by intermediate dimension) or the "
                            "tensor-parallel size " + std::to_string(tp) + " (split by expert), got " + std::to_string(ep));
  const MoeSplit sized = ep == 1 ? MoeSplit::kByIntermediate : MoeSplit::kByExpert;
  if (split != MoeSplit::kAuto && split != sized)
    return invalid_argument("--expert-parallel-size " + std::to_string(ep) + " contradicts --" +
                            (on ? "enable-expert-parallel" : "no-enable-expert-parallel"));
  return sized;
}

}  // namespace

Result<int> tensor_parallel_size(const CliArgs& args) {
  MX_ASSIGN_OR_RETURN(const int64_t tp, args.get_int("tensor-parallel-size", 1));
  if (tp < 1 || tp > 64) return invalid_argument("--tensor-parallel-size must be in [1, 64]");
  return static_cast<int>(tp);
}

Result<ModelLoadOptions> model_load_options(const CliArgs& args) {
  ModelLoadOptions options;
  if (args.has("dense-dtype")) {
    MX_ASSIGN_OR_RETURN(options.dense_dtype, parse_dense_dtype(args.get("dense-dtype")));
  }
  MX_ASSIGN_OR_RETURN(options.moe_split, moe_split_flags(args));
  return options;
}

Status read_engine_flags(const CliArgs& args, EngineConfig* c) {
  MX_ASSIGN_OR_RETURN(c->page_size, args.get_int("page-size", c->page_size));
  MX_ASSIGN_OR_RETURN(c->mem_fraction, args.get_double("mem-fraction", c->mem_fraction));
  MX_ASSIGN_OR_RETURN(c->num_kv_pages, args.get_int("num-kv-pages", c->num_kv_pages));
  MX_ASSIGN_OR_RETURN(c->max_num_batched_tokens, args.get_int("max-num-batched-tokens", c->max_num_batched_tokens));
  MX_ASSIGN_OR_RETURN(c->max_running_requests, args.get_int("max-running-requests", c->max_running_requests));
  // 0 in the config means "pick for me"; a number the user gives must be at least one.
  if (args.has("max-num-batched-tokens") && c->max_num_batched_tokens < 1)
    return invalid_argument("--max-num-batched-tokens must be at least 1");
  if (args.has("max-running-requests") && c->max_running_requests < 1)
    return invalid_argument("--max-running-requests must be at least 1");
  MX_ASSIGN_OR_RETURN(c->max_model_len, args.get_int("max-model-len", c->max_model_len));
  if (args.has("no-prefix-cache") && args.has("enable-prefix-caching"))
    return invalid_argument("--enable-prefix-caching and --no-prefix-cache (--no-enable-prefix-caching) contradict each other");
  if (args.has("no-prefix-cache")) c->enable_prefix_cache = false;
  if (args.has("disable-cuda-graph")) c->enable_cuda_graphs = false;
  if (args.has("disable-overlap-schedule")) c->overlap_steps = false;
  if (args.has("cuda-graph-batch-sizes")) {
    auto sizes = parse_int_list(args.get("cuda-graph-batch-sizes"));
    if (!sizes.is_ok()) return sizes.status().with_context("--cuda-graph-batch-sizes");
    c->cuda_graph_batch_sizes = *sizes;
  }
  return read_speculative_flags(args, &c->speculative);
}

Status read_speculative_flags(const CliArgs& args, SpeculativeConfig* s) {
  const bool any = args.has("speculative-num-draft-tokens") || args.has("speculative-ngram-min") ||
                   args.has("speculative-ngram-max") || args.has("speculative-draft-model") ||
                   args.has("no-speculative-draft-graphs");
  if (!args.has("speculative-algorithm")) {
    if (any)
      return invalid_argument(
          "--speculative-num-draft-tokens, --speculative-ngram-*, --speculative-draft-model and "
          "--no-speculative-draft-graphs need --speculative-algorithm");
    return Status::ok();
  }
  MX_ASSIGN_OR_RETURN(s->algorithm, parse_speculative_algorithm(args.get("speculative-algorithm")));
  MX_ASSIGN_OR_RETURN(s->num_draft_tokens, args.get_int("speculative-num-draft-tokens", 3));
  MX_ASSIGN_OR_RETURN(s->ngram_min, args.get_int("speculative-ngram-min", s->ngram_min));
  MX_ASSIGN_OR_RETURN(s->ngram_max, args.get_int("speculative-ngram-max", s->ngram_max));
  if (args.has("speculative-draft-model")) s->draft_model = args.get("speculative-draft-model");
  if (args.has("no-speculative-draft-graphs")) {
    if (s->algorithm != SpeculativeAlgorithm::kEagle3)
      return invalid_argument("--no-speculative-draft-graphs: only eagle3 drafts replay graphs of their own");
    s->draft_graphs = false;
  }
  return validate_speculative_config(*s);
}

}  // namespace mx
