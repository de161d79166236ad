// A small Prometheus registry (text format 0.0.4): counters, gauges and histograms, lock-free updates
// (atomics), rendered on GET /metrics. Every series carries model_name, and names keep the suffixes vLLM
// and SGLang use (time_to_first_token_seconds, e2e_request_latency_seconds, ...) under the `mxserve:`
// prefix, so their Grafana boards port by changing the prefix.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
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

// Metrics are registered once at start-up (not thread-safe), then updated from any thread.
class MetricsRegistry {
 public:
  explicit MetricsRegistry(std::string model_name) : model_name_(std::move(model_name)) {}
  // `labels` are extra `key="value"` pairs, already escaped, e.g. `finished_reason="stop"`.
  Counter* counter(const std::string& name, const std::string& help, const std::string& labels = "");
  Gauge* gauge(const std::string& name, const std::string& help);
  Histogram* histogram(const std::string& name, const std::string& help, std::vector<double> bounds);
  std::string render() const;

 private:
  struct Entry {
    std::string name, help, type, labels;
    std::unique_ptr<Counter> counter;
    std::unique_ptr<Gauge> gauge;
    std::unique_ptr<Histogram> histogram;
  };
  std::string model_name_;
  std::vector<Entry> entries_;
};

// The series the server itself updates, plus the engine's gauges (copied from ServiceStats per scrape).
struct ServerMetrics {
  explicit ServerMetrics(MetricsRegistry* registry);

  Histogram* time_to_first_token;
  Histogram* time_per_output_token;
  Histogram* e2e_request_latency;
  Counter* prompt_tokens;
  Counter* generation_tokens;
  Counter* success_stop;
  Counter* success_length;
  Counter* success_tool_calls;
  Counter* success_abort;
  Counter* request_errors;      // ended with an error (before or after the stream started)
  Counter* rejected_requests;   // 503: queue full or draining
  Gauge* requests_running;
  Gauge* requests_waiting;
  Gauge* kv_cache_usage;        // 0..1
  Counter* preemptions;
  Gauge* http_inflight;         // generation requests the server holds, all states
};

}  // namespace mx::server
