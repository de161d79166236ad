// Prometheus text rendering. Histogram buckets are stored per bucket and summed when rendered, so an
// observation touches two atomics and the scrape does the cumulative pass.
#include "server/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

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

Counter* MetricsRegistry::counter(const std::string& name, const std::string& help, const std::string& labels) {
  Entry e{name, help, "counter", labels, std::make_unique<Counter>(), nullptr, nullptr};
  entries_.push_back(std::move(e));
  return entries_.back().counter.get();
}

Gauge* MetricsRegistry::gauge(const std::string& name, const std::string& help) {
  Entry e{name, help, "gauge", "", nullptr, std::make_unique<Gauge>(), nullptr};
  entries_.push_back(std::move(e));
  return entries_.back().gauge.get();
}

Histogram* MetricsRegistry::histogram(const std::string& name, const std::string& help, std::vector<double> bounds) {
  Entry e{name, help, "histogram", "", nullptr, nullptr, std::make_unique<Histogram>(std::move(bounds))};
  entries_.push_back(std::move(e));
  return entries_.back().histogram.get();
}

namespace {

std::string number(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

std::string escape_label(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

}  // namespace

std::string MetricsRegistry::render() const {
  const std::string model = "model_name=\"" + escape_label(model_name_) + "\"";
  std::string out;
  std::string last_name;
  for (const auto& e : entries_) {
    if (e.name != last_name) {  // one HELP/TYPE per family (labelled counters share a name)
      out += "# HELP " + e.name + " " + e.help + "\n# TYPE " + e.name + " " + e.type + "\n";
      last_name = e.name;
    }
    const std::string labels = e.labels.empty() ? model : model + "," + e.labels;
    if (e.counter) out += e.name + "{" + labels + "} " + number(e.counter->value()) + "\n";
    if (e.gauge) out += e.name + "{" + labels + "} " + number(e.gauge->value()) + "\n";
    if (e.histogram) {
      const Histogram& h = *e.histogram;
      uint64_t cumulative = 0;
      for (size_t i = 0; i <= h.bounds().size(); ++i) {
        cumulative += h.bucket(i);
        const double le = i < h.bounds().size() ? h.bounds()[i] : INFINITY;
        out += e.name + "_bucket{" + labels + ",le=\"" + number(le) + "\"} " + std::to_string(cumulative) + "\n";
      }
      out += e.name + "_sum{" + labels + "} " + number(h.sum()) + "\n";
      out += e.name + "_count{" + labels + "} " + std::to_string(h.count()) + "\n";
    }
  }
  return out;
}

ServerMetrics::ServerMetrics(MetricsRegistry* r) {
  const std::vector<double> ttft = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                                    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
  const std::vector<double> tpot = {0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05,
                                    0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
  const std::vector<double> e2e = {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                                   60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
  time_to_first_token = r->histogram("mxserve:time_to_first_token_seconds", "Time to first token in seconds.", ttft);
  time_per_output_token = r->histogram("mxserve:time_per_output_token_seconds",
                                       "Time per output token after the first, in seconds.", tpot);
  e2e_request_latency = r->histogram("mxserve:e2e_request_latency_seconds", "End-to-end request latency in seconds.", e2e);
  prompt_tokens = r->counter("mxserve:prompt_tokens_total", "Prefill tokens processed.");
  generation_tokens = r->counter("mxserve:generation_tokens_total", "Generation tokens processed.");
  const char* success_help = "Finished requests by finish reason.";
  success_stop = r->counter("mxserve:request_success_total", success_help, "finished_reason=\"stop\"");
  success_length = r->counter("mxserve:request_success_total", success_help, "finished_reason=\"length\"");
  success_tool_calls = r->counter("mxserve:request_success_total", success_help, "finished_reason=\"tool_calls\"");
  success_abort = r->counter("mxserve:request_success_total", success_help, "finished_reason=\"abort\"");
  request_errors = r->counter("mxserve:request_errors_total", "Requests that ended with an error.");
  rejected_requests = r->counter("mxserve:rejected_requests_total",
                                 "Requests refused with 503 because the queue was full or the server was draining.");
  requests_running = r->gauge("mxserve:num_requests_running", "Requests running in the engine.");
  requests_waiting = r->gauge("mxserve:num_requests_waiting", "Requests waiting for the engine.");
  kv_cache_usage = r->gauge("mxserve:kv_cache_usage_perc", "Fraction of KV cache pages in use (0 to 1).");
  preemptions = r->counter("mxserve:num_preemptions_total", "Requests preempted (recomputed later) by the engine.");
  http_inflight = r->gauge("mxserve:http_requests_in_flight", "Generation requests admitted by the HTTP server.");
}

}  // namespace mx::server
