// Validation and auto values of EngineConfig, and the KV memory plan.
#include "runtime/engine_config.h"

#include <algorithm>
#include <cstdio>

#include "model/model.h"

namespace mx {
namespace {

Status check_range(const char* name, int64_t value, int64_t lo, int64_t hi) {
  if (value < lo || value > hi)
    return invalid_argument(std::string(name) + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                            "], got " + std::to_string(value));
  return Status::ok();
}

std::string gib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f GiB", static_cast<double>(bytes) / (1ll << 30));
  return buf;
}

// A group's pool when full groups get `full_pages`: window groups their need, never more than the context.
std::vector<int64_t> pool_pages(const std::vector<int64_t>& windows, const std::vector<int64_t>& window_pages,
                                int64_t full_pages) {
  std::vector<int64_t> pages;
  for (size_t g = 0; g < windows.size(); ++g)
    pages.push_back(windows[g] > 0 ? std::min(full_pages, window_pages[g]) : full_pages);
  return pages;
}

// The groups of a plan's inputs (one full group of bytes_per_token when none are given).
struct PlanGroups {
  std::vector<int64_t> bytes, windows, window_pages;
};
PlanGroups plan_groups(const KvMemoryInputs& in) {
  if (in.group_bytes_per_token.empty()) return PlanGroups{{in.bytes_per_token}, {0}, {0}};
  return PlanGroups{in.group_bytes_per_token, in.group_windows, in.group_window_pages};
}

int64_t plan_bytes(const PlanGroups& g, int64_t page_size, int64_t scratch, int64_t full_pages) {
  const std::vector<int64_t> pages = pool_pages(g.windows, g.window_pages, full_pages);
  int64_t bytes = 0;
  for (size_t i = 0; i < pages.size(); ++i) bytes += g.bytes[i] * page_size * (pages[i] + scratch);
  return bytes;
}

// The most full-group pages whose pools (plus scratch) fit `budget` bytes; 0 when none.
int64_t max_full_pages(const PlanGroups& g, int64_t page_size, int64_t scratch, int64_t budget) {
  int64_t lo = 0, hi = INT32_MAX - 1;  // plan_bytes(lo) <= budget holds or lo stays 0
  if (plan_bytes(g, page_size, scratch, 1) > budget) return 0;
  lo = 1;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (plan_bytes(g, page_size, scratch, mid) <= budget) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

}  // namespace

std::vector<int32_t> default_eos_token_ids(const Model& model) {
  std::vector<int32_t> ids;
  for (int64_t id : model.generation_config().eos_token_ids)
    if (id >= 0 && id <= INT32_MAX) ids.push_back(static_cast<int32_t>(id));
  return ids;
}

int64_t auto_max_num_batched_tokens(int64_t kv_room_bytes) {
  if (kv_room_bytes >= kAutoLargestStepMinKvBytes) return kAutoBatchedTokensLargest;
  return kv_room_bytes >= kAutoLargeStepMinKvBytes ? kAutoBatchedTokensLarge : kAutoBatchedTokensSmall;
}

Result<EngineConfig> resolve_engine_config(const EngineConfig& in, const Model& model) {
  EngineConfig c = in;
  const bool on_cpu = model.backend().device() == Device::kCpu;
  const Result<DeviceMemory> memory = on_cpu ? Result<DeviceMemory>(unimplemented("cpu")) : model.backend().memory_info();
  if (c.max_num_batched_tokens == 0) {
    int64_t room = -1;
    if (memory.is_ok())
      room = static_cast<int64_t>(static_cast<double>(memory->total_bytes) * c.mem_fraction) - model.device_weight_bytes();
    c.max_num_batched_tokens = auto_max_num_batched_tokens(room);
    c.auto_max_num_batched_tokens = true;
  }
  // A device sizes the batch from the KV pool, once it is known: until then, buffers for the most it can get.
  if (c.max_running_requests == 0) {
    c.max_running_requests = on_cpu ? kAutoRunningRequestsCpu : kAutoMaxRunningRequests;
    c.auto_max_running_requests = !on_cpu;
  }
  MX_RETURN_IF_ERROR(check_range("page size", c.page_size, 1, 4096));
  MX_RETURN_IF_ERROR(check_range("max-num-batched-tokens", c.max_num_batched_tokens, 1, 1 << 20));
  MX_RETURN_IF_ERROR(check_range("max-running-requests", c.max_running_requests, 1, 1 << 16));
  MX_RETURN_IF_ERROR(check_range("max-queued-requests", c.max_queued_requests, 0, 1 << 24));
  MX_RETURN_IF_ERROR(check_range("max-prompt-logit-rows", c.max_prompt_logit_rows, 0, 1 << 20));
  MX_RETURN_IF_ERROR(check_range("max-top-logprobs", c.max_top_logprobs, 0, 1024));
  MX_RETURN_IF_ERROR(check_range("max-model-len", c.max_model_len, 0, INT32_MAX));
  MX_RETURN_IF_ERROR(check_range("num-kv-pages", c.num_kv_pages, 0, INT32_MAX - 1));
  if (!(c.mem_fraction > 0.0 && c.mem_fraction <= 1.0)) return invalid_argument("mem-fraction must be in (0, 1]");
  MX_RETURN_IF_ERROR(validate_speculative_config(c.speculative));

  c.vocab_size = model.dims().vocab_size;
  c.model_context_len = model.dims().context_len;
  for (int64_t b : c.cuda_graph_batch_sizes) MX_RETURN_IF_ERROR(check_range("cuda graph batch size", b, 1, 1 << 16));
  const int64_t wanted = c.max_model_len > 0 ? c.max_model_len : c.model_context_len;
  c.max_model_len = std::min(wanted, c.model_context_len);
  // On a device the pool is sized by the model runner from measured memory (plan_kv_memory), which then
  // calls set_kv_pool_pages; on the CPU from a fixed budget.
  const KvLayout& layout = model.kv_layout();
  MX_RETURN_IF_ERROR(check_range("kv window slack", c.kv_window_slack, 0, 1 << 20));
  c.kv_group_windows.clear();
  for (const KvLayerSpec& g : layout.groups) c.kv_group_windows.push_back(g.window > 0 ? g.window + c.kv_window_slack : 0);
  if (c.num_kv_pages == 0 && on_cpu) {
    KvMemoryInputs in = kv_memory_inputs(c, layout, model.backend().kv_dtype());
    c.num_kv_pages = std::max<int64_t>(1, max_full_pages(plan_groups(in), c.page_size, 0, c.cpu_kv_cache_bytes));
  } else if (c.num_kv_pages > 0 && c.auto_max_running_requests) {
    c.max_running_requests = auto_max_running_requests(c.num_kv_pages, c.page_size);
  } else if (c.auto_max_running_requests && memory.is_ok()) {
    // The memory plan will lower it once the warm-up measured the activations; until then the most the
    // memory left beside the weights (and whatever else is in use) could hold, so that the warm-up's
    // buffers (logits rows, staging) are not sized for a batch the pool can never run.
    KvMemoryInputs estimate = kv_memory_inputs(c, layout, model.backend().kv_dtype(), model.kv_devices());
    estimate.device_bytes = memory->total_bytes;
    estimate.weights_bytes = model.device_weight_bytes();
    estimate.other_bytes = std::max<int64_t>(0, memory->total_bytes - memory->free_bytes - estimate.weights_bytes);
    estimate.scratch_pages = 1;
    c.max_running_requests = auto_max_running_requests(estimate, c);
  }
  if (c.num_kv_pages > 0) set_kv_pool_pages(&c, c.num_kv_pages);
  // Resolved to what will happen: a backend that cannot capture (the CPU) runs every step eagerly.
  if (!model.backend().can_capture()) c.enable_cuda_graphs = false;
  if (!c.eos_token_ids) c.eos_token_ids = default_eos_token_ids(model);
  return c;
}

int64_t window_group_pages(int64_t window, const EngineConfig& c) {
  const int64_t P = c.page_size;
  return c.max_running_requests * ((window - 1 + P - 1) / P + 2) + (c.max_num_batched_tokens + P - 1) / P;
}

std::vector<int64_t> kv_group_pages(const EngineConfig& c, int64_t full_pages) {
  const std::vector<int64_t> windows = c.kv_group_windows.empty() ? std::vector<int64_t>{0} : c.kv_group_windows;
  std::vector<int64_t> window_pages;
  for (int64_t w : windows) window_pages.push_back(w > 0 ? window_group_pages(w, c) : 0);
  return pool_pages(windows, window_pages, full_pages);
}

KvMemoryInputs kv_memory_inputs(const EngineConfig& c, const KvLayout& layout, DType kv_dtype, int64_t devices) {
  KvMemoryInputs in;
  in.bytes_per_token = layout.bytes_per_token(kv_dtype) / devices;
  in.page_size = c.page_size;
  in.max_model_len = c.max_model_len;
  in.mem_fraction = c.mem_fraction;
  for (int64_t g = 0; g < layout.num_groups(); ++g) {
    const int64_t w = static_cast<size_t>(g) < c.kv_group_windows.size() ? c.kv_group_windows[static_cast<size_t>(g)]
                                                                         : layout.groups[static_cast<size_t>(g)].window;
    in.group_bytes_per_token.push_back(layout.group_bytes_per_token(g, kv_dtype) / devices);
    in.group_windows.push_back(w);
    in.group_window_pages.push_back(w > 0 ? window_group_pages(w, c) : 0);
  }
  return in;
}

void set_kv_pool_pages(EngineConfig* c, int64_t num_pages) {
  c->num_kv_pages = num_pages;
  c->kv_group_pages = kv_group_pages(*c, num_pages);
  // A request must fit in the pools on its own, or preempting everything else could not save it (window
  // groups always hold one request's window).
  c->max_model_len = std::min(c->max_model_len, num_pages * c->page_size);
}

namespace {

std::vector<int64_t> default_graph_batch_sizes() {
  std::vector<int64_t> sizes = {1, 2, 4};
  for (int64_t b = 8; b <= 512; b += b < 64 ? 8 : (b < 128 ? 16 : 32)) sizes.push_back(b);
  return sizes;
}

// Default graph buckets up to kAutoMaxRunningRequests, largest first, ending at 1.
std::vector<int64_t> auto_running_candidates() {
  std::vector<int64_t> sizes = default_graph_batch_sizes();
  std::erase_if(sizes, [](int64_t b) { return b > kAutoMaxRunningRequests; });
  std::reverse(sizes.begin(), sizes.end());
  return sizes;
}

}  // namespace

int64_t auto_max_running_requests(int64_t full_pages, int64_t page_size) {
  for (int64_t n : auto_running_candidates())
    if (full_pages * page_size >= n * kAutoTokensPerRequest) return n;
  return 1;
}

int64_t auto_max_running_requests(const KvMemoryInputs& inputs, const EngineConfig& config) {
  EngineConfig c = config;
  KvMemoryInputs in = inputs;
  for (int64_t n : auto_running_candidates()) {
    c.max_running_requests = n;
    for (size_t g = 0; g < in.group_windows.size() && g < in.group_window_pages.size(); ++g)
      in.group_window_pages[g] = in.group_windows[g] > 0 ? window_group_pages(in.group_windows[g], c) : 0;
    auto plan = plan_kv_memory(in);
    if (plan.is_ok() && plan->kv_tokens >= n * kAutoTokensPerRequest) return n;
  }
  return 1;
}

std::vector<int64_t> cuda_graph_batch_sizes(const EngineConfig& c) {
  std::vector<int64_t> sizes = c.cuda_graph_batch_sizes;
  if (sizes.empty()) sizes = default_graph_batch_sizes();
  const int64_t cap = std::min(c.max_running_requests, c.max_num_batched_tokens);
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  const bool above_cap = !sizes.empty() && sizes.back() > cap;
  std::erase_if(sizes, [&](int64_t b) { return b < 1 || b > cap; });
  // No step holds more than `cap` sequences: the buckets above it become one of exactly `cap`, so that the
  // steps between the last bucket below and the cap replay too (at --max-running-requests 100, as bench
  // latency sets for --batch-size 100, a step of 100 ran eagerly: 5 ms of launch gaps per Gemma-4 step).
  if (above_cap && (sizes.empty() || sizes.back() < cap)) sizes.push_back(cap);
  return sizes;
}

std::string describe_engine_config(const EngineConfig& c) {
  std::string eos;
  for (int32_t id : c.eos_token_ids.value_or(std::vector<int32_t>{})) {
    if (!eos.empty()) eos += ',';
    eos += std::to_string(id);
  }
  // Window groups' pools, when the model has any: "(window 128: 768 pages)".
  std::string windows;
  for (size_t g = 0; g < c.kv_group_windows.size() && g < c.kv_group_pages.size(); ++g)
    if (c.kv_group_windows[g] > 0)
      windows += (windows.empty() ? " (" : ", ") + std::string("window ") + std::to_string(c.kv_group_windows[g]) + ": " +
                 std::to_string(c.kv_group_pages[g]) + " pages";
  if (!windows.empty()) windows += ")";
  return "engine: " + std::to_string(c.num_kv_pages) + " KV pages of " + std::to_string(c.page_size) + " tokens" + windows + ", " +
         "max-model-len " + std::to_string(c.max_model_len) + ", max-num-batched-tokens " +
         std::to_string(c.max_num_batched_tokens) +
         (c.auto_max_num_batched_tokens
              ? " (auto: " + std::to_string(kAutoBatchedTokensLargest) + " where the memory share leaves " +
                    std::to_string(kAutoLargestStepMinKvBytes >> 30) + " GiB beside the weights, " +
                    std::to_string(kAutoBatchedTokensLarge) + " where " + std::to_string(kAutoLargeStepMinKvBytes >> 30) +
                    " GiB, else " + std::to_string(kAutoBatchedTokensSmall) + ")"
              : std::string()) +
         ", max-running-requests " + std::to_string(c.max_running_requests) +
         (c.auto_max_running_requests ? " (auto: the KV pool holds that many at " + std::to_string(kAutoTokensPerRequest) +
                                            " tokens, at most " + std::to_string(kAutoMaxRunningRequests) + ")"
                                      : std::string()) +
         ", prefix cache " + (c.enable_prefix_cache ? "on" : "off") + ", cuda graphs " +
         (c.enable_cuda_graphs ? "on" : "off") + ", overlapped steps " + (c.overlap_steps ? "on" : "off") + ", eos [" + eos + "]" +
         (c.speculative.enabled() ? std::string(", speculative ") + speculative_algorithm_name(c.speculative.algorithm) +
                                        " k=" + std::to_string(c.speculative.num_draft_tokens)
                                  : std::string());
}

Result<KvMemoryPlan> plan_kv_memory(const KvMemoryInputs& in) {
  if (in.bytes_per_token <= 0 || in.page_size <= 0 || in.max_model_len <= 0)
    return invalid_argument("memory plan needs positive bytes per token, page size and context length");
  const PlanGroups groups = plan_groups(in);
  if (groups.windows.size() != groups.bytes.size() || groups.window_pages.size() != groups.bytes.size())
    return invalid_argument("memory plan needs a window and a window page count per layer group");
  const auto budget = static_cast<int64_t>(static_cast<double>(in.device_bytes) * in.mem_fraction);
  KvMemoryPlan plan;
  plan.kv_bytes = budget - in.weights_bytes - in.activation_bytes - in.other_bytes;
  plan.num_pages = plan.kv_bytes > 0 ? max_full_pages(groups, in.page_size, in.scratch_pages, plan.kv_bytes) : 0;
  if (plan.num_pages < 1)
    return resource_exhausted("no memory left for the KV cache: " + gib(budget) + " allowed (mem-fraction " +
                              std::to_string(in.mem_fraction) + "), weights " + gib(in.weights_bytes) + ", activations " +
                              gib(in.activation_bytes) + ", other " + gib(in.other_bytes));
  plan.group_pages = pool_pages(groups.windows, groups.window_pages, plan.num_pages);
  plan.kv_bytes = plan_bytes(groups, in.page_size, 0, plan.num_pages);
  plan.kv_tokens = plan.num_pages * in.page_size;
  const int64_t pages_per_request = (in.max_model_len + in.page_size - 1) / in.page_size;
  plan.full_context_requests = plan.num_pages / pages_per_request;
  return plan;
}

std::string describe_kv_memory_plan(const KvMemoryInputs& in, const KvMemoryPlan& plan) {
  char head[96];
  std::snprintf(head, sizeof(head), "memory plan: %s x %.2f: weights ", gib(in.device_bytes).c_str(), in.mem_fraction);
  // Tokens per layer group: the full groups hold the context, window groups only their windows.
  const PlanGroups groups = plan_groups(in);
  std::string per_group;
  for (size_t g = 0; g < plan.group_pages.size() && g < groups.bytes.size(); ++g) {
    per_group += (g == 0 ? " [" : "; ") + std::string(groups.windows[g] > 0 ? "window " + std::to_string(groups.windows[g]) : "full") +
                 " layers " + std::to_string(plan.group_pages[g] * in.page_size) + " tokens " +
                 gib(groups.bytes[g] * in.page_size * plan.group_pages[g]);
  }
  if (!per_group.empty()) per_group += "]";
  return head + gib(in.weights_bytes) + ", activations " + gib(in.activation_bytes) + ", other " +
         gib(in.other_bytes) + ", KV " + gib(plan.kv_bytes) + " = " + std::to_string(plan.kv_tokens) + " tokens (" + std::to_string(plan.num_pages) +
         " pages of " + std::to_string(in.page_size) + ")" + per_group + ", " + std::to_string(plan.full_context_requests) +
         " requests at full context (" + std::to_string(in.max_model_len) + " tokens)";
}

}  // namespace mx
