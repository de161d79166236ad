// Prometheus text rendering. Histogram buckets are stored per bucket and summed when rendered, so an
// observation touches two atomics and the scrape does the cumulative pass.
#include "server/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <map>

namespace mx::server {

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), buckets_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  std::sort(bounds_.begin(), bounds_.end());
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i].store(0);
}

void Histogram::observe(double v) {
  if (!std::isfinite(v)) return;
  const size_t i = static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
}

Counter* MetricsRegistry::counter(const MetricNames& names, const std::string& help, const std::string& labels) {
  entries_.push_back(Entry{names, help, "counter", labels, std::make_unique<Counter>(), nullptr, nullptr});
  return entries_.back().counter.get();
}

Gauge* MetricsRegistry::gauge(const MetricNames& names, const std::string& help, const std::string& labels) {
  entries_.push_back(Entry{names, help, "gauge", labels, nullptr, std::make_unique<Gauge>(), nullptr});
  return entries_.back().gauge.get();
}

Histogram* MetricsRegistry::histogram(const MetricNames& names, const std::string& help, std::vector<double> bounds) {
  entries_.push_back(Entry{names, help, "histogram", "", nullptr, nullptr, std::make_unique<Histogram>(std::move(bounds))});
  return entries_.back().histogram.get();
}

void MetricsRegistry::set_labels(const Gauge* gauge, const std::string& labels) {
  std::lock_guard<std::mutex> lock(labels_mu_);
  for (auto& e : entries_) {
    if (e.gauge.get() == gauge) e.labels = labels;
  }
}

std::string metric_number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  const auto result = std::to_chars(buf, buf + sizeof(buf), v);  // shortest form that reads back as v
  return std::string(buf, result.ptr);
}

std::string label_pair(const std::string& key, const std::string& value) {
  std::string out = key + "=\"";
  for (char c : value) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out + "\"";
}

std::string MetricsRegistry::render() const {
  const std::string model = label_pair("model_name", model_name_);
  // Families in the order of their first series; a family's series may come from several entries
  // (labelled counters) and one entry may feed several families (its names).
  std::vector<std::string> order;
  std::map<std::string, std::vector<const Entry*>> families;
  for (const auto& e : entries_) {
    for (const auto& name : e.names) {
      auto& members = families[name];
      if (members.empty()) order.push_back(name);
      members.push_back(&e);
    }
  }
  std::string out;
  std::lock_guard<std::mutex> lock(labels_mu_);
  for (const auto& name : order) {
    const auto& members = families.at(name);
    out += "# HELP " + name + " " + members.front()->help + "\n# TYPE " + name + " " + members.front()->type + "\n";
    for (const Entry* e : members) {
      const std::string labels = e->labels.empty() ? model : model + "," + e->labels;
      if (e->counter) out += name + "{" + labels + "} " + metric_number(e->counter->value()) + "\n";
      if (e->gauge) out += name + "{" + labels + "} " + metric_number(e->gauge->value()) + "\n";
      if (e->histogram) {
        const Histogram& h = *e->histogram;
        uint64_t cumulative = 0;
        for (size_t i = 0; i <= h.bounds().size(); ++i) {
          cumulative += h.bucket(i);
          const double le = i < h.bounds().size() ? h.bounds()[i] : INFINITY;
          out += name + "_bucket{" + labels + ",le=\"" + metric_number(le) + "\"} " + std::to_string(cumulative) + "\n";
        }
        out += name + "_sum{" + labels + "} " + metric_number(h.sum()) + "\n";
        out += name + "_count{" + labels + "} " + std::to_string(h.count()) + "\n";
      }
    }
  }
  return out;
}

namespace {

// vLLM's names first (what gateways read), then ours.
MetricNames both(const std::string& suffix) { return {"vllm:" + suffix, "mxserve:" + suffix}; }

// 1, 2, 5, 10, 20, 50, ... up to `max` (vLLM's bounds for token-count histograms).
std::vector<double> one_two_five(double max) {
  std::vector<double> out;
  for (double decade = 1; decade <= max; decade *= 10) {
    for (double m : {1.0, 2.0, 5.0}) {
      if (m * decade <= max) out.push_back(m * decade);
    }
  }
  return out;
}

}  // namespace

ServerMetrics::ServerMetrics(MetricsRegistry* r, int64_t speculative_positions) {
  const std::vector<double> ttft = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                                    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
  const std::vector<double> itl = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
                                   2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
  const std::vector<double> tpot = {0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05,
                                    0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
  const std::vector<double> e2e = {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                                   60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
  requests_running = r->gauge(both("num_requests_running"), "Number of requests running in the engine.");
  requests_waiting = r->gauge(both("num_requests_waiting"), "Number of requests waiting for the engine.");
  kv_cache_usage = r->gauge(both("kv_cache_usage_perc"), "KV-cache usage. 1 means 100 percent usage.");
  cache_config_info = r->gauge({"vllm:cache_config_info", "mxserve:cache_config_info"}, "Information of the KV cache configuration.");
  lora_requests_info = r->gauge({"vllm:lora_requests_info"}, "Running stats on LoRA requests (mxserve serves no adapters).",
                                label_pair("max_lora", "0") + "," + label_pair("running_lora_adapters", "") + "," +
                                    label_pair("waiting_lora_adapters", ""));
  preemptions = r->counter(both("num_preemptions_total"), "Cumulative number of preemptions from the engine.");
  prefix_cache_queries = r->counter(both("prefix_cache_queries_total"), "Prefix-cache queries, in prompt tokens looked up.");
  prefix_cache_hits = r->counter(both("prefix_cache_hits_total"), "Prefix-cache hits, in prompt tokens found.");
  prompt_tokens = r->counter(both("prompt_tokens_total"), "Number of prefill tokens processed.");
  generation_tokens = r->counter(both("generation_tokens_total"), "Number of generation tokens processed.");
  const char* vllm_success = "Count of successfully processed requests.";
  vllm_success_stop = r->counter({"vllm:request_success_total"}, vllm_success, label_pair("finished_reason", "stop"));
  vllm_success_length = r->counter({"vllm:request_success_total"}, vllm_success, label_pair("finished_reason", "length"));
  vllm_success_abort = r->counter({"vllm:request_success_total"}, vllm_success, label_pair("finished_reason", "abort"));
  vllm_success_error = r->counter({"vllm:request_success_total"}, vllm_success, label_pair("finished_reason", "error"));
  const char* success_help = "Finished requests by finish reason.";
  success_stop = r->counter({"mxserve:request_success_total"}, success_help, label_pair("finished_reason", "stop"));
  success_length = r->counter({"mxserve:request_success_total"}, success_help, label_pair("finished_reason", "length"));
  success_tool_calls = r->counter({"mxserve:request_success_total"}, success_help, label_pair("finished_reason", "tool_calls"));
  success_abort = r->counter({"mxserve:request_success_total"}, success_help, label_pair("finished_reason", "abort"));
  time_to_first_token = r->histogram(both("time_to_first_token_seconds"), "Histogram of time to first token in seconds.", ttft);
  inter_token_latency = r->histogram(both("inter_token_latency_seconds"), "Histogram of inter-token latency in seconds.", itl);
  time_per_output_token = r->histogram(both("time_per_output_token_seconds"),
                                       "Histogram of time per output token in seconds (per request, after the first).", tpot);
  e2e_request_latency = r->histogram(both("e2e_request_latency_seconds"), "Histogram of end-to-end request latency in seconds.", e2e);
  request_queue_time = r->histogram(both("request_queue_time_seconds"), "Histogram of time spent waiting for the engine in seconds.", e2e);
  request_prefill_time = r->histogram(both("request_prefill_time_seconds"), "Histogram of time spent in prefill in seconds.", e2e);
  request_decode_time = r->histogram(both("request_decode_time_seconds"), "Histogram of time spent in decode in seconds.", e2e);
  request_prompt_tokens = r->histogram(both("request_prompt_tokens"), "Number of prefill tokens processed.", one_two_five(1e6));
  request_generation_tokens = r->histogram(both("request_generation_tokens"), "Number of generation tokens processed.", one_two_five(1e6));
  request_errors = r->counter({"mxserve:request_errors_total"}, "Requests that ended with an error.");
  rejected_requests = r->counter({"mxserve:rejected_requests_total"},
                                 "Requests refused with 503 because the queue was full or the server was draining.");
  http_inflight = r->gauge({"mxserve:http_requests_in_flight"}, "Generation requests admitted by the HTTP server.");
  cache_config_info->set(1);
  if (speculative_positions > 0) {
    spec_drafts = r->counter(both("spec_decode_num_drafts_total"), "Number of spec decoding drafts (verify steps of a request).");
    spec_draft_tokens = r->counter(both("spec_decode_num_draft_tokens_total"), "Number of draft tokens.");
    spec_accepted_tokens = r->counter(both("spec_decode_num_accepted_tokens_total"), "Number of accepted tokens.");
    for (int64_t i = 0; i < speculative_positions; ++i)
      spec_accepted_per_pos.push_back(r->counter(both("spec_decode_num_accepted_tokens_per_pos_total"),
                                                 "Accepted tokens per draft position.", label_pair("position", std::to_string(i))));
  }
}

void set_cache_config(MetricsRegistry* registry, const ServerMetrics& metrics, const CacheConfigInfo& info) {
  registry->set_labels(metrics.cache_config_info,
                       label_pair("block_size", std::to_string(info.block_size)) + "," +
                           label_pair("cache_dtype", info.cache_dtype) + "," +
                           label_pair("enable_prefix_caching", info.enable_prefix_caching ? "True" : "False") + "," +
                           label_pair("gpu_memory_utilization", metric_number(info.gpu_memory_utilization)) + "," +
                           label_pair("num_gpu_blocks", std::to_string(info.num_gpu_blocks)));
}

}  // namespace mx::server
