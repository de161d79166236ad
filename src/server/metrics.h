// A small Prometheus registry (text format 0.0.4): counters, gauges and histograms, lock-free updates
// (atomics), rendered on GET /metrics. Every series carries model_name. The series gateways and dashboards
// read are exported under vLLM's exact names, types and labels (`vllm:num_requests_waiting`,
// `vllm:kv_cache_usage_perc`, `vllm:cache_config_info`, the latency histograms, ...: an endpoint picker
// with no engine label reads vLLM's names), and the same series under the `mxserve:` prefix as well.
// Bucket bounds print in their shortest form (`le="0.1"`): alert rules match them as text.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace mx::server {

class Counter {
 public:
  void add(double v = 1.0) { value_.fetch_add(v, std::memory_order_relaxed); }
  // For totals owned elsewhere (the engine's preemption count), copied in at scrape time.
  void set(double v) { value_.store(v, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

class Gauge {
 public:
  void set(double v) { value_.store(v, std::memory_order_relaxed); }
  void add(double v) { value_.fetch_add(v, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);  // upper bounds, ascending; +Inf is implicit
  void observe(double v);
  const std::vector<double>& bounds() const { return bounds_; }
  uint64_t bucket(size_t i) const { return buckets_[i].load(std::memory_order_relaxed); }  // not cumulative
  uint64_t count() const { return count_.load(std::memory_order_relaxed); }
  double sum() const { return sum_.load(std::memory_order_relaxed); }

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // bounds_.size() + 1 (the last is +Inf)
  std::atomic<uint64_t> count_{0};
  std::atomic<double> sum_{0.0};
};

// A metric's names: one series rendered under each (e.g. {"vllm:x", "mxserve:x"}), updated once.
using MetricNames = std::vector<std::string>;

// Metrics are registered once at start-up (not thread-safe), then updated from any thread. Families render
// in the order their first series was registered, each with one HELP/TYPE.
class MetricsRegistry {
 public:
  explicit MetricsRegistry(std::string model_name) : model_name_(std::move(model_name)) {}
  // `labels` are extra `key="value"` pairs, already escaped (label_pair), e.g. `finished_reason="stop"`.
  Counter* counter(const MetricNames& names, const std::string& help, const std::string& labels = "");
  Gauge* gauge(const MetricNames& names, const std::string& help, const std::string& labels = "");
  Histogram* histogram(const MetricNames& names, const std::string& help, std::vector<double> bounds);
  // Replaces the labels of a gauge's series (info gauges whose labels describe the configuration).
  void set_labels(const Gauge* gauge, const std::string& labels);
  std::string render() const;

 private:
  struct Entry {
    MetricNames names;
    std::string help, type, labels;
    std::unique_ptr<Counter> counter;
    std::unique_ptr<Gauge> gauge;
    std::unique_ptr<Histogram> histogram;
  };
  std::string model_name_;
  std::vector<Entry> entries_;
  mutable std::mutex labels_mu_;  // set_labels may run while another thread renders
};

// `key="value"` with the value escaped for the text format.
std::string label_pair(const std::string& key, const std::string& value);
// A sample value or bucket bound in its shortest round-trip form ("0.1", "2560", "+Inf").
std::string metric_number(double v);

// The series the server itself updates, plus the engine's (copied from ServiceStats per scrape).
struct ServerMetrics {
  // `speculative_positions`: draft tokens per verify step (0: no speculation, no spec_decode series).
  explicit ServerMetrics(MetricsRegistry* registry, int64_t speculative_positions = 0);

  Histogram* time_to_first_token;
  Histogram* inter_token_latency;    // every gap between output tokens (a delta of n tokens: n gaps)
  Histogram* time_per_output_token;  // per request: (end - first token) / (tokens - 1)
  Histogram* e2e_request_latency;
  Histogram* request_queue_time;     // arrival -> first scheduled by the engine
  Histogram* request_prefill_time;   // first scheduled -> first token
  Histogram* request_decode_time;    // first token -> end
  Histogram* request_prompt_tokens;
  Histogram* request_generation_tokens;
  Counter* prompt_tokens;
  Counter* generation_tokens;
  // mxserve:request_success_total by our finish reasons.
  Counter* success_stop;
  Counter* success_length;
  Counter* success_tool_calls;
  Counter* success_abort;
  // vllm:request_success_total by vLLM's finished_reason values (a tool call finishes with "stop" there).
  Counter* vllm_success_stop;
  Counter* vllm_success_length;
  Counter* vllm_success_abort;
  Counter* vllm_success_error;
  Counter* request_errors;      // ended with an error (before or after the stream started)
  Counter* rejected_requests;   // 503: queue full or draining
  Gauge* requests_running;
  Gauge* requests_waiting;
  Gauge* kv_cache_usage;        // 0..1
  Counter* preemptions;
  Counter* prefix_cache_queries;  // prompt tokens looked up in the prefix cache
  Counter* prefix_cache_hits;     // of those, tokens found
  Gauge* cache_config_info;       // 1; labels block_size, num_gpu_blocks, ... (set_cache_config)
  Gauge* lora_requests_info;      // scrape time; labels max_lora, running/waiting_lora_adapters (no LoRA)
  Gauge* http_inflight;           // generation requests the server holds, all states
  // Speculative decoding, vLLM's series (null without speculation): verify steps per request ("drafts"),
  // tokens drafted, tokens accepted, accepted tokens by position in the draft (label position="0"...).
  Counter* spec_drafts = nullptr;
  Counter* spec_draft_tokens = nullptr;
  Counter* spec_accepted_tokens = nullptr;
  std::vector<Counter*> spec_accepted_per_pos;
};

// What vllm:cache_config_info's labels say.
struct CacheConfigInfo {
  int64_t block_size = 0;      // tokens per KV page
  int64_t num_gpu_blocks = 0;  // KV pages
  std::string cache_dtype;     // "auto" = the model's activation dtype
  bool enable_prefix_caching = true;
  double gpu_memory_utilization = 0;
};
void set_cache_config(MetricsRegistry* registry, const ServerMetrics& metrics, const CacheConfigInfo& info);

}  // namespace mx::server
