#include "tools/bench/bench_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>

namespace mx::bench {
namespace {

double percentile(const std::vector<double>& sorted, double p) {
  const double rank = p / 100.0 * static_cast<double>(sorted.size() - 1);
  const size_t low = static_cast<size_t>(std::floor(rank));
  const size_t high = std::min(low + 1, sorted.size() - 1);
  return sorted[low] + (sorted[high] - sorted[low]) * (rank - static_cast<double>(low));
}

std::string rate_text(double rate) {
  if (!(rate < std::numeric_limits<double>::infinity())) return "inf";
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%g", rate);
  return buffer;
}

class ReportWriter {
 public:
  // `text` centred in a 50-column rule, extra fill on the right (bench_serving's layout).
  void title(const std::string& text, char fill) {
    const size_t width = 50;
    const size_t pad = text.size() >= width ? 0 : width - text.size();
    out_ += std::string(pad / 2, fill) + text + std::string(pad - pad / 2, fill) + "\n";
  }
  void line(const std::string& label, const std::string& value) {
    char buffer[256];
    std::snprintf(buffer, sizeof(buffer), "%-40s %s\n", (label + ":").c_str(), value.c_str());
    out_ += buffer;
  }
  void number(const std::string& label, double value) {
    char buffer[64];
    std::snprintf(buffer, sizeof(buffer), "%.2f", value);
    line(label, buffer);
  }
  void integer(const std::string& label, int64_t value) { line(label, std::to_string(value)); }
  void ms(const std::string& label, double seconds) { number(label + " (ms)", seconds * 1e3); }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

void latency_json(nlohmann::json* out, const std::string& name, const Distribution& d, bool tail) {
  (*out)["mean_" + name + "_ms"] = d.mean * 1e3;
  (*out)["median_" + name + "_ms"] = d.median * 1e3;
  (*out)["std_" + name + "_ms"] = d.std * 1e3;
  (*out)["p90_" + name + "_ms"] = d.p90 * 1e3;
  (*out)["p99_" + name + "_ms"] = d.p99 * 1e3;
  if (tail) {
    (*out)["p95_" + name + "_ms"] = d.p95 * 1e3;
    (*out)["max_" + name + "_ms"] = d.max * 1e3;
  }
}

}  // namespace

Distribution summarize(std::vector<double> values) {
  Distribution d;
  if (values.empty()) return d;
  std::sort(values.begin(), values.end());
  d.count = static_cast<int64_t>(values.size());
  double sum = 0;
  for (double v : values) sum += v;
  d.mean = sum / static_cast<double>(values.size());
  double squares = 0;
  for (double v : values) squares += (v - d.mean) * (v - d.mean);
  d.std = std::sqrt(squares / static_cast<double>(values.size()));
  d.median = percentile(values, 50);
  d.p90 = percentile(values, 90);
  d.p95 = percentile(values, 95);
  d.p99 = percentile(values, 99);
  d.max = values.back();
  return d;
}

BenchSummary summarize_run(const LoadRun& run) {
  BenchSummary s;
  std::vector<double> ttfts, tpots, itls, e2es;
  std::map<std::string, size_t> error_slot;
  double e2e_sum = 0;
  int64_t server_input = 0;
  bool all_server_input = true;
  for (const RequestResult& r : run.results) {
    if (!r.success) {
      ++s.failed;
      auto [it, added] = error_slot.emplace(r.error, s.errors.size());
      if (added) s.errors.emplace_back(r.error, 0);
      ++s.errors[it->second].second;
      continue;
    }
    ++s.completed;
    s.total_input_tokens += r.prompt_tokens;
    all_server_input = all_server_input && r.server_prompt_tokens >= 0;
    server_input += std::max<int64_t>(0, r.server_prompt_tokens);
    s.total_output_tokens += r.output_tokens;
    if (r.output_tokens_from_usage) ++s.output_counts_from_usage;
    if (r.token_chunks > 0) ttfts.push_back(r.ttft_s);
    if (r.output_tokens > 1) tpots.push_back((r.e2e_s - r.ttft_s) / static_cast<double>(r.output_tokens - 1));
    itls.insert(itls.end(), r.itl_s.begin(), r.itl_s.end());
    e2es.push_back(r.e2e_s);
    e2e_sum += r.e2e_s;
  }
  if (s.completed > 0 && all_server_input) s.server_input_tokens = server_input;
  s.duration_s = run.duration_s;
  if (run.duration_s > 0) {
    s.request_throughput = static_cast<double>(s.completed) / run.duration_s;
    s.input_throughput = static_cast<double>(s.total_input_tokens) / run.duration_s;
    s.output_throughput = static_cast<double>(s.total_output_tokens) / run.duration_s;
    s.total_throughput = s.input_throughput + s.output_throughput;
    s.concurrency = e2e_sum / run.duration_s;
    s.client_cpu_percent = 100.0 * run.client_cpu_s / run.duration_s;
  }
  s.ttft = summarize(std::move(ttfts));
  s.tpot = summarize(std::move(tpots));
  s.itl = summarize(std::move(itls));
  s.e2e = summarize(std::move(e2es));
  s.connections_opened = run.connections_opened;
  return s;
}

std::string format_report(const BenchConfig& config, const BenchSummary& s, size_t max_errors) {
  ReportWriter w;
  w.title(" Serving Benchmark Result ", '=');
  w.line("Backend", "openai-" + config.endpoint + " (" + config.base_url + ")");
  w.line("Model", config.model);
  w.line("Traffic request rate", rate_text(config.request_rate));
  w.line("Max request concurrency", config.max_concurrency > 0 ? std::to_string(config.max_concurrency) : "not set");
  w.integer("Successful requests", s.completed);
  w.integer("Failed requests", s.failed);
  w.number("Benchmark duration (s)", s.duration_s);
  w.integer("Total input tokens", s.total_input_tokens);
  // The server's count differs from the client's by the chat template (and any tokenizer difference).
  if (s.server_input_tokens >= 0) w.integer("Total input tokens (server usage)", s.server_input_tokens);
  w.integer("Total generated tokens", s.total_output_tokens);
  w.line("Generated token counts from",
         s.completed == 0 ? std::string("-")
         : s.output_counts_from_usage == s.completed
             ? std::string("server usage")
             : (s.output_counts_from_usage == 0 ? std::string("counting chunks (no usage sent)")
                                                : "server usage for " + std::to_string(s.output_counts_from_usage) + " of " +
                                                      std::to_string(s.completed) + ", chunks for the rest"));
  w.number("Request throughput (req/s)", s.request_throughput);
  w.number("Input token throughput (tok/s)", s.input_throughput);
  w.number("Output token throughput (tok/s)", s.output_throughput);
  w.number("Total token throughput (tok/s)", s.total_throughput);
  w.number("Concurrency", s.concurrency);
  w.title("End-to-End Latency", '-');
  w.ms("Mean E2E Latency", s.e2e.mean);
  w.ms("Median E2E Latency", s.e2e.median);
  w.ms("P99 E2E Latency", s.e2e.p99);
  w.title("Time to First Token", '-');
  w.ms("Mean TTFT", s.ttft.mean);
  w.ms("Median TTFT", s.ttft.median);
  w.ms("P99 TTFT", s.ttft.p99);
  w.title("Time per Output Token (excl. 1st token)", '-');
  w.ms("Mean TPOT", s.tpot.mean);
  w.ms("Median TPOT", s.tpot.median);
  w.ms("P99 TPOT", s.tpot.p99);
  w.title("Inter-Token Latency", '-');
  w.ms("Mean ITL", s.itl.mean);
  w.ms("Median ITL", s.itl.median);
  w.ms("P95 ITL", s.itl.p95);
  w.ms("P99 ITL", s.itl.p99);
  w.ms("Max ITL", s.itl.max);
  w.title("Client", '-');
  w.integer("Connections opened", s.connections_opened);
  w.number("Client CPU (% of one core)", s.client_cpu_percent);
  w.title("", '=');
  std::string out = w.take();
  if (s.client_cpu_percent > 80 && s.duration_s > 1)  // short runs are mostly connection setup
    out += "Warning: the client thread was busy " + std::to_string(static_cast<int>(s.client_cpu_percent)) +
           "% of the run; latencies may include time spent waiting for it.\n";
  if (!s.errors.empty()) {
    out += "Errors (" + std::to_string(s.errors.size()) + " distinct";
    out += s.errors.size() > max_errors ? ", first " + std::to_string(max_errors) + " shown):\n" : "):\n";
    for (size_t i = 0; i < s.errors.size() && i < max_errors; ++i)
      out += "  " + std::to_string(s.errors[i].second) + "x " + s.errors[i].first + "\n";
  }
  return out;
}

nlohmann::json report_json(const BenchConfig& config, const BenchSummary& s, const LoadRun& run) {
  nlohmann::json j;
  j["command_line"] = config.command_line;
  j["date"] = config.date;
  j["backend"] = "openai-" + config.endpoint;
  j["base_url"] = config.base_url;
  j["endpoint"] = config.endpoint;
  j["model"] = config.model;
  j["dataset_name"] = "random";
  j["num_prompts"] = config.num_prompts;
  j["random_input_len"] = config.input_len;
  j["random_output_len"] = config.output_len;
  j["random_range_ratio"] = config.range_ratio;
  j["request_rate"] = config.request_rate < std::numeric_limits<double>::infinity() ? nlohmann::json(config.request_rate)
                                                                                    : nlohmann::json("inf");
  j["max_concurrency"] = config.max_concurrency > 0 ? nlohmann::json(config.max_concurrency) : nlohmann::json(nullptr);
  j["seed"] = config.seed;
  j["ignore_eos"] = config.ignore_eos;
  j["warmup_requests"] = config.warmup_requests;

  j["duration"] = s.duration_s;
  j["completed"] = s.completed;
  j["failed"] = s.failed;
  j["total_input_tokens"] = s.total_input_tokens;
  j["total_output_tokens"] = s.total_output_tokens;
  j["total_input_tokens_server"] = s.server_input_tokens >= 0 ? nlohmann::json(s.server_input_tokens) : nlohmann::json(nullptr);
  j["output_counts_from_usage"] = s.output_counts_from_usage;
  j["request_throughput"] = s.request_throughput;
  j["input_throughput"] = s.input_throughput;
  j["output_throughput"] = s.output_throughput;
  j["total_throughput"] = s.total_throughput;
  j["concurrency"] = s.concurrency;
  latency_json(&j, "e2e_latency", s.e2e, false);
  latency_json(&j, "ttft", s.ttft, false);
  latency_json(&j, "tpot", s.tpot, false);
  latency_json(&j, "itl", s.itl, true);
  j["connections_opened"] = s.connections_opened;
  j["client_cpu_percent"] = s.client_cpu_percent;
  nlohmann::json error_counts = nlohmann::json::array();
  for (const auto& [message, count] : s.errors) error_counts.push_back({{"error", message}, {"count", count}});
  j["error_counts"] = error_counts;

  // Per request, in request order; times in seconds as bench_serving writes them.
  auto& input_lens = j["input_lens"] = nlohmann::json::array();
  auto& output_lens = j["output_lens"] = nlohmann::json::array();
  auto& server_input_lens = j["server_input_lens"] = nlohmann::json::array();
  auto& output_len_from_usage = j["output_len_from_usage"] = nlohmann::json::array();
  auto& start_times = j["start_times"] = nlohmann::json::array();
  auto& ttfts = j["ttfts"] = nlohmann::json::array();
  auto& e2es = j["e2e_latencies"] = nlohmann::json::array();
  auto& itls = j["itls"] = nlohmann::json::array();
  auto& successes = j["success"] = nlohmann::json::array();
  auto& errors = j["errors"] = nlohmann::json::array();
  for (const RequestResult& r : run.results) {
    input_lens.push_back(r.prompt_tokens);
    output_lens.push_back(r.output_tokens);
    server_input_lens.push_back(r.server_prompt_tokens >= 0 ? nlohmann::json(r.server_prompt_tokens) : nlohmann::json(nullptr));
    output_len_from_usage.push_back(r.output_tokens_from_usage);
    start_times.push_back(r.start_s);
    ttfts.push_back(r.ttft_s);
    e2es.push_back(r.e2e_s);
    itls.push_back(r.itl_s);
    successes.push_back(r.success);
    errors.push_back(r.error);
  }
  return j;
}

}  // namespace mx::bench
