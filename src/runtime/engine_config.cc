// Validation and auto values of EngineConfig, and the KV memory plan.
#include "runtime/engine_config.h"

#include <algorithm>
#include <cstdio>

#include "model/model.h"

namespace mx {
namespace {

constexpr int32_t kHarmonyEndOfMessage = 200007;

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

}  // namespace

std::vector<int32_t> default_eos_token_ids(const Model& model) {
  std::vector<int32_t> ids;
  for (int64_t id : model.generation_config().eos_token_ids)
    if (id >= 0 && id <= INT32_MAX && id != kHarmonyEndOfMessage) ids.push_back(static_cast<int32_t>(id));
  return ids;
}

Result<EngineConfig> resolve_engine_config(const EngineConfig& in, const Model& model) {
  EngineConfig c = in;
  MX_RETURN_IF_ERROR(check_range("page size", c.page_size, 1, 4096));
  MX_RETURN_IF_ERROR(check_range("max-num-batched-tokens", c.max_num_batched_tokens, 1, 1 << 20));
  MX_RETURN_IF_ERROR(check_range("max-running-requests", c.max_running_requests, 1, 1 << 16));
  MX_RETURN_IF_ERROR(check_range("max-queued-requests", c.max_queued_requests, 0, 1 << 24));
  MX_RETURN_IF_ERROR(check_range("max-prompt-logit-rows", c.max_prompt_logit_rows, 0, 1 << 20));
  MX_RETURN_IF_ERROR(check_range("max-top-logprobs", c.max_top_logprobs, 0, 1024));
  MX_RETURN_IF_ERROR(check_range("max-model-len", c.max_model_len, 0, INT32_MAX));
  MX_RETURN_IF_ERROR(check_range("num-kv-pages", c.num_kv_pages, 0, INT32_MAX - 1));
  if (!(c.mem_fraction > 0.0 && c.mem_fraction <= 1.0)) return invalid_argument("mem-fraction must be in (0, 1]");

  c.vocab_size = model.dims().vocab_size;
  c.model_context_len = model.dims().context_len;
  for (int64_t b : c.cuda_graph_batch_sizes) MX_RETURN_IF_ERROR(check_range("cuda graph batch size", b, 1, 1 << 16));
  const int64_t wanted = c.max_model_len > 0 ? c.max_model_len : c.model_context_len;
  c.max_model_len = std::min(wanted, c.model_context_len);
  // On a device the pool is sized by the model runner from measured memory (plan_kv_memory), which then
  // calls set_kv_pool_pages; on the CPU from a fixed budget.
  if (c.num_kv_pages == 0 && model.backend().device() == Device::kCpu) {
    const int64_t per_page = model.kv_layout().bytes_per_token(model.backend().kv_dtype()) * c.page_size;
    c.num_kv_pages = std::max<int64_t>(1, c.cpu_kv_cache_bytes / per_page);
  }
  if (c.num_kv_pages > 0) set_kv_pool_pages(&c, c.num_kv_pages);
  // Resolved to what will happen: a backend that cannot capture (the CPU) runs every step eagerly.
  if (!model.backend().can_capture()) c.enable_cuda_graphs = false;
  if (!c.eos_token_ids) c.eos_token_ids = default_eos_token_ids(model);
  return c;
}

void set_kv_pool_pages(EngineConfig* c, int64_t num_pages) {
  c->num_kv_pages = num_pages;
  // A request must fit in the pool on its own, or preempting everything else could not save it.
  c->max_model_len = std::min(c->max_model_len, num_pages * c->page_size);
}

std::vector<int64_t> cuda_graph_batch_sizes(const EngineConfig& c) {
  std::vector<int64_t> sizes = c.cuda_graph_batch_sizes;
  if (sizes.empty()) {
    sizes = {1, 2, 4};
    for (int64_t b = 8; b <= 512; b += b < 64 ? 8 : (b < 128 ? 16 : 32)) sizes.push_back(b);
  }
  const int64_t cap = std::min(c.max_running_requests, c.max_num_batched_tokens);
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  std::erase_if(sizes, [&](int64_t b) { return b < 1 || b > cap; });
  return sizes;
}

std::string describe_engine_config(const EngineConfig& c) {
  std::string eos;
  for (int32_t id : c.eos_token_ids.value_or(std::vector<int32_t>{})) {
    if (!eos.empty()) eos += ',';
    eos += std::to_string(id);
  }
  return "engine: " + std::to_string(c.num_kv_pages) + " KV pages of " + std::to_string(c.page_size) + " tokens, " +
         "max-model-len " + std::to_string(c.max_model_len) + ", max-num-batched-tokens " +
         std::to_string(c.max_num_batched_tokens) + ", max-running-requests " + std::to_string(c.max_running_requests) +
         ", prefix cache " + (c.enable_prefix_cache ? "on" : "off") + ", cuda graphs " +
         (c.enable_cuda_graphs ? "on" : "off") + ", eos [" + eos + "]";
}

Result<KvMemoryPlan> plan_kv_memory(const KvMemoryInputs& in) {
  if (in.bytes_per_token <= 0 || in.page_size <= 0 || in.max_model_len <= 0)
    return invalid_argument("memory plan needs positive bytes per token, page size and context length");
  const auto budget = static_cast<int64_t>(static_cast<double>(in.device_bytes) * in.mem_fraction);
  KvMemoryPlan plan;
  plan.kv_bytes = budget - in.weights_bytes - in.activation_bytes - in.other_bytes;
  const int64_t page_bytes = in.bytes_per_token * in.page_size;
  plan.num_pages = plan.kv_bytes > 0 ? plan.kv_bytes / page_bytes : 0;
  if (plan.num_pages < 1)
    return resource_exhausted("no memory left for the KV cache: " + gib(budget) + " allowed (mem-fraction " +
                              std::to_string(in.mem_fraction) + "), weights " + gib(in.weights_bytes) + ", activations " +
                              gib(in.activation_bytes) + ", other " + gib(in.other_bytes));
  plan.kv_bytes = plan.num_pages * page_bytes;
  plan.kv_tokens = plan.num_pages * in.page_size;
  const int64_t pages_per_request = (in.max_model_len + in.page_size - 1) / in.page_size;
  plan.full_context_requests = plan.num_pages / pages_per_request;
  return plan;
}

std::string describe_kv_memory_plan(const KvMemoryInputs& in, const KvMemoryPlan& plan) {
  char head[96];
  std::snprintf(head, sizeof(head), "memory plan: %s x %.2f: weights ", gib(in.device_bytes).c_str(), in.mem_fraction);
  return head + gib(in.weights_bytes) + ", activations " + gib(in.activation_bytes) + ", other " +
         gib(in.other_bytes) + ", KV " + gib(plan.kv_bytes) + " = " + std::to_string(plan.kv_tokens) + " tokens (" + std::to_string(plan.num_pages) +
         " pages of " + std::to_string(in.page_size) + "), " + std::to_string(plan.full_context_requests) +
         " requests at full context (" + std::to_string(in.max_model_len) + " tokens)";
}

}  // namespace mx
