// What `mxserve bench serve` reports: the summary lines serving benchmarks print (SGLang's bench_serving
// names and order, so numbers compare line by line), and a JSON document with the same fields under the
// same keys plus the per-request arrays.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tools/bench/load_client.h"

namespace mx::bench {

// Summary of a sample in seconds. Percentiles interpolate linearly between order statistics (numpy's
// default); std is the population standard deviation. All zero for an empty sample.
struct Distribution {
  int64_t count = 0;
  double mean = 0, median = 0, std = 0, p90 = 0, p95 = 0, p99 = 0, max = 0;
};
Distribution summarize(std::vector<double> values);

// The run's settings, echoed in the report.
struct BenchConfig {
  std::string command_line;
  std::string date;      // ISO 8601, UTC
  std::string base_url;
  std::string endpoint;  // "completions" or "chat"
  std::string model;
  int64_t num_prompts = 0;
  int64_t input_len = 0;
  int64_t output_len = 0;
  double range_ratio = 1;
  double request_rate = 0;      // infinity: all at once
  int64_t max_concurrency = 0;  // 0: not set
  uint64_t seed = 0;
  bool ignore_eos = true;
  int64_t warmup_requests = 0;
};

struct BenchSummary {
  int64_t completed = 0;
  int64_t failed = 0;
  int64_t total_input_tokens = 0;   // of the successful requests, the client's count
  int64_t server_input_tokens = -1;  // the same from the servers' usage.prompt_tokens; -1 unless all sent it
  int64_t total_output_tokens = 0;  // of the successful requests
  int64_t output_counts_from_usage = 0;  // successful requests whose output count came from usage
  double duration_s = 0;
  double request_throughput = 0, input_throughput = 0, output_throughput = 0, total_throughput = 0;
  double concurrency = 0;  // sum of successful e2e latencies / duration
  Distribution ttft, tpot, itl, e2e;
  std::vector<std::pair<std::string, int64_t>> errors;  // distinct messages, first seen first, with counts
  int64_t connections_opened = 0;
  double client_cpu_percent = 0;  // of one core, over the run
};

BenchSummary summarize_run(const LoadRun& run);

// The human-readable block (stdout). Lists at most `max_errors` distinct error messages.
std::string format_report(const BenchConfig& config, const BenchSummary& summary, size_t max_errors = 5);

nlohmann::json report_json(const BenchConfig& config, const BenchSummary& summary, const LoadRun& run);

}  // namespace mx::bench
