// EngineConfig: the engine's knobs, validated once and resolved against the model (auto values filled
// in and logged at start-up), then immutable. Also the KV memory plan: how many pages fit.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "spec/drafter.h"

namespace mx {

class Model;
class PrefixCacheObserver;
struct KvLayout;

struct EngineConfig {
  int64_t page_size = 16;               // tokens per KV page
  int64_t num_kv_pages = 0;             // pages of each full-attention layer group's pool (the context);
                                        // 0 = from the memory plan
  int64_t cpu_kv_cache_bytes = 256ll << 20;  // CPU backend: KV budget when num_kv_pages is 0
  double mem_fraction = 0.9;            // CUDA: share of device memory for weights + activations + KV
                                        // (graphs come out of the rest, as in SGLang)
  // 0 = auto (serve's defaults; resolve_engine_config and the memory plan pick them, see auto_* below).
  int64_t max_num_batched_tokens = 2048;  // tokens computed per step, over all requests
  int64_t max_running_requests = 64;
  int64_t max_queued_requests = 0;      // requests waiting beyond the running ones; 0 = unbounded
  int64_t max_model_len = 0;            // 0 = the model's context length (always capped by the KV pool)
  bool enable_prefix_cache = true;
  int64_t max_prompt_logit_rows = 0;    // > 0 allows want_prompt_logits; rows of prompt logits per step
  int64_t max_top_logprobs = 20;
  std::optional<std::vector<int32_t>> eos_token_ids;  // unset: the model's generation_config eos ids
  // Decode-only steps replay a graph captured at start-up for the smallest batch-size bucket that holds
  // them (padded with rows on a scratch page), where the backend can capture. Empty list = the default
  // buckets (default_cuda_graph_batch_sizes); sizes above max-running-requests (or the step budget) give way
  // to one of exactly that size.
  bool enable_cuda_graphs = true;
  std::vector<int64_t> cuda_graph_batch_sizes;
  // Overlapped steps (EngineCore): while a decode step runs, the next one is scheduled and packed, and it
  // starts as soon as the running step's samples are read, its tokens copied on the device; the host applies
  // the samples and delivers outputs while the device computes. Off: each step waits for the previous one's
  // update (--disable-overlap-schedule).
  bool overlap_steps = true;
  // Benchmarks only (bench latency --whole-page-table-uploads): every step uploads its page tables at full
  // width instead of the columns its rows use (BatchLimits::whole_tables), the cost that change removed.
  bool whole_page_table_uploads = false;
  // Speculative decoding (off by default): a drafter proposes up to k tokens per decoding request and step,
  // verified as k + 1 query rows (see scheduler.h).
  SpeculativeConfig speculative;
  // Keys below each sliding window that the window groups keep as well, for a draft model that reads them
  // (DraftModel::window_slack; EngineCore sets it from the draft model it loads).
  int64_t kv_window_slack = 0;
  // Told of prefix-cache changes (KV-cache events); null: nobody listens.
  std::shared_ptr<PrefixCacheObserver> prefix_cache_observer;

  // Filled by resolve_engine_config.
  bool auto_max_running_requests = false;  // max_running_requests was 0: the memory plan lowers it
  bool auto_max_num_batched_tokens = false;  // max_num_batched_tokens was 0: chosen from the memory share
  int64_t vocab_size = 0;
  int64_t model_context_len = 0;        // the model's own limit (max_position_embeddings)
  // Each KV layer group's window as the pools keep it (the model's window + kv_window_slack; 0 = full
  // attention); empty = one full group.
  std::vector<int64_t> kv_group_windows;
  // Filled by set_kv_pool_pages: each group's pool size (full groups num_kv_pages, sliding-window groups
  // what their window can need at once: window_group_pages, at most num_kv_pages).
  std::vector<int64_t> kv_group_pages;
};

// Pages a sliding-window group needs at most at once: each running request holds the pages its window
// spans (ceil((window - 1) / P) + 1) plus the page being written, and one step's tokens add at most
// ceil(tokens / P) more before the window moves past the old ones.
int64_t window_group_pages(int64_t window, const EngineConfig& config);

// Auto sizes. A step's token budget: 16384 where the weights leave at least kAutoLargestStepMinKvBytes of the
// memory share for the KV pool (a 16K step's activations cost gpt-oss ~2 GiB: 120b's prefill phase of 256 x 1K
// prompts ran 5.87 s at 16K steps against 6.69 at 8K, 20b 3.55 against 4.05, Gemma-4's 100 x 1K 3.07 against
// 3.72: H200, docs/PERF.md), 8192 where they leave kAutoLargeStepMinKvBytes (whole prompts of several requests
// in one step, as vLLM's server default on big GPUs), 2048 where they leave less (an 8192-token step's
// activations and window pages cost gpt-oss ~1 GiB, 12% of 120b's KV on an 80 GB GPU) and on the CPU.
constexpr int64_t kAutoBatchedTokensLargest = 16384;
constexpr int64_t kAutoBatchedTokensLarge = 8192;
constexpr int64_t kAutoBatchedTokensSmall = 2048;
constexpr int64_t kAutoLargestStepMinKvBytes = 32ll << 30;
constexpr int64_t kAutoLargeStepMinKvBytes = 16ll << 30;
// Running requests: on a device as many as the KV pool holds at kAutoTokensPerRequest tokens each (a
// 1K-in/1K-out request at its end, so that a full batch of them never preempts), at most the largest
// decode graph bucket of the default list that is kept (kAutoMaxRunningRequests); on the CPU a fixed 64.
constexpr int64_t kAutoTokensPerRequest = 2048;
constexpr int64_t kAutoMaxRunningRequests = 256;
constexpr int64_t kAutoRunningRequestsCpu = 64;

// The auto step budget for a device with `kv_room_bytes` of its memory share left after the weights (< 0:
// no device, the CPU).
int64_t auto_max_num_batched_tokens(int64_t kv_room_bytes);

// Checks ranges (one clear message per bad field) and fills the auto values from the model.
Result<EngineConfig> resolve_engine_config(const EngineConfig& config, const Model& model);

// One line for the start-up log: every resolved knob.
std::string describe_engine_config(const EngineConfig& config);

// Full-attention groups get `num_pages` pages (from --num-kv-pages, the CPU budget or the memory plan),
// window groups what they need; caps max_model_len so that one request always fits the pools alone.
void set_kv_pool_pages(EngineConfig* config, int64_t num_pages);
// Pages of each group's pool when full groups get `full_pages` (kv_group_pages without changing config).
std::vector<int64_t> kv_group_pages(const EngineConfig& config, int64_t full_pages);

// 1, 2, 4, 8, then steps of 8 to 64, of 16 to 128, of 32 to 512, kept <= max-running-requests and
// max-num-batched-tokens. Explicit sizes are sorted, deduplicated and capped the same way.
std::vector<int64_t> cuda_graph_batch_sizes(const EngineConfig& config);

// Stop ids from a model's generation_config (gpt-oss: 200002, 199999, 200012). The family's loader keeps ids
// that only close a message inside a turn out of that list; chat requests stop on their ChatFormat's
// stop_ids instead (the server sets them per request).
std::vector<int32_t> default_eos_token_ids(const Model& model);

// How device memory is split (CUDA; sized after weights are loaded and a worst-case warm-up batch ran).
struct KvMemoryInputs {
  int64_t device_bytes = 0;      // total device memory
  int64_t weights_bytes = 0;
  int64_t activation_bytes = 0;  // peak of the warm-up pass: workspace, staging, logits, backend scratch
  int64_t other_bytes = 0;       // the rest already in use: CUDA context, library workspaces, other processes
  double mem_fraction = 0.9;
  int64_t bytes_per_token = 0;   // KV bytes of one token over all layers (K and V)
  int64_t page_size = 16;
  int64_t max_model_len = 0;
  // Per KV layer group (empty: one full-attention group of bytes_per_token): the bytes one token takes in
  // the group's layers, its window (0 = full) and, for window groups, window_group_pages.
  std::vector<int64_t> group_bytes_per_token;
  std::vector<int64_t> group_windows;
  std::vector<int64_t> group_window_pages;
  int64_t scratch_pages = 0;     // pages every group's pool holds beyond its plan (the graphs' scratch page)
};

struct KvMemoryPlan {
  int64_t kv_bytes = 0;
  int64_t num_pages = 0;              // of each full-attention group: the context
  int64_t kv_tokens = 0;              // num_pages x page size
  int64_t full_context_requests = 0;  // requests that fit at max_model_len tokens each
  std::vector<int64_t> group_pages;   // every group's pool (scratch pages not counted)
};

// Full-group pages are as many as fit (the most tokens of context): window groups need only their
// window_group_pages, whatever the context.
Result<KvMemoryPlan> plan_kv_memory(const KvMemoryInputs& inputs);
// The plan's inputs that come from the config and the model's KV layout (the rest is measured).
// `devices` > 1: the layers are spread evenly over that many devices and the plan is one device's.
KvMemoryInputs kv_memory_inputs(const EngineConfig& config, const KvLayout& layout, DType kv_dtype, int64_t devices = 1);
// "memory plan: 139.8 GiB x 0.90: weights 12.8 GiB, activations 1.1 GiB, other 0.6 GiB, KV 52.0 GiB =
//  1136000 tokens (71000 pages of 16), 8 requests at full context (131072 tokens)"
std::string describe_kv_memory_plan(const KvMemoryInputs& inputs, const KvMemoryPlan& plan);

// The auto max-running-requests for a pool of `full_pages` pages per full-attention group: the largest
// default graph bucket up to kAutoMaxRunningRequests whose requests fit at kAutoTokensPerRequest each, 1 at
// least.
int64_t auto_max_running_requests(int64_t full_pages, int64_t page_size);
// The same when the pool is planned from memory: window groups' pages grow with the running requests, so
// each candidate is planned afresh from the measured `inputs` (`config` gives the rest of the knobs).
int64_t auto_max_running_requests(const KvMemoryInputs& inputs, const EngineConfig& config);

}  // namespace mx
