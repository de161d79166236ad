// `mxserve bench serve` end to end: the async client against the fake OpenAI server (every awkward stream
// shape, failures, keep-alive resends, a thousand concurrent streams), against mxserve's own HTTP front with
// a scripted service, and the CLI against the fake server and against `mxserve serve`.
#include <gtest/gtest.h>

#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "fake_openai_util.h"
#include "server_test_util.h"
#include "test_util.h"
#include "tools/bench/bench_report.h"
#include "tools/bench/serve_bench.h"

namespace mx::test {
namespace {

using bench::BenchPrompt;
using bench::RequestResult;

bench::ServeBenchOptions options_for(const std::string& base_url, const std::string& endpoint, int64_t concurrency) {
  bench::ServeBenchOptions o;
  auto url = bench::parse_http_url(base_url);
  EXPECT_TRUE(url.is_ok());
  o.url = *url;
  o.endpoint = endpoint;
  o.model = "fake-model";
  o.max_concurrency = concurrency;
  o.warmup_requests = 0;
  o.idle_timeout_s = 30;
  return o;
}

BenchPrompt prompt(const std::string& text, int64_t output_len, int64_t prompt_tokens = 7) {
  return BenchPrompt{text, prompt_tokens, output_len};
}

// Latencies that a 2 ms token gap makes plausible: positive, ordered, and below a second.
void expect_sane_timing(const RequestResult& r, const std::string& what) {
  EXPECT_GT(r.ttft_s, 0) << what;
  EXPECT_LE(r.ttft_s, r.e2e_s) << what;
  EXPECT_LT(r.e2e_s, 5.0) << what;
  ASSERT_EQ(static_cast<int64_t>(r.itl_s.size()), r.token_chunks - 1) << what;
  double sum = 0;
  for (double gap : r.itl_s) {
    EXPECT_GE(gap, 0) << what;
    sum += gap;
  }
  EXPECT_LE(r.ttft_s + sum, r.e2e_s + 1e-9) << what;
}

void run_against_fake(const std::string& endpoint) {
  FakeOpenAiServer server;
  const std::vector<BenchPrompt> prompts = {
      prompt("p0", 8), prompt("p1", 8),          prompt("fail please", 8), prompt("p2", 8),
      prompt("mid-error", 8), prompt("p3", 8),   prompt("close-early", 8), prompt("no-usage", 5),
      prompt("p4", 8), prompt("eof-body", 3),    prompt("p5", 8),
  };
  auto run = bench::run_serve_bench(options_for(server.base_url(), endpoint, 3), prompts);
  ASSERT_TRUE(run.is_ok()) << run.status().to_string();
  const auto& results = run->run.results;
  ASSERT_EQ(results.size(), prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    const RequestResult& r = results[i];
    const std::string& p = prompts[i].text;
    SCOPED_TRACE(endpoint + " " + p);
    if (p == "fail please") {
      EXPECT_FALSE(r.success);
      EXPECT_EQ(r.error, "HTTP 500: scripted failure");
    } else if (p == "mid-error") {
      EXPECT_FALSE(r.success);
      EXPECT_EQ(r.error, "scripted mid-stream error");
      EXPECT_EQ(r.token_chunks, 2);
    } else if (p == "close-early") {
      EXPECT_FALSE(r.success);
      EXPECT_NE(r.error.find("closed the connection mid-stream after 2 chunks"), std::string::npos) << r.error;
    } else {
      ASSERT_TRUE(r.success) << r.error;
      EXPECT_EQ(r.token_chunks, prompts[i].output_len);
      EXPECT_EQ(r.output_tokens, prompts[i].output_len);
      EXPECT_EQ(r.output_tokens_from_usage, p != "no-usage");
      if (p != "no-usage") {
        EXPECT_EQ(r.server_prompt_tokens, static_cast<int64_t>(p.size()));
      }
      EXPECT_EQ(r.prompt_tokens, 7);
      expect_sane_timing(r, p);
    }
  }
  const bench::BenchSummary s = bench::summarize_run(run->run);
  EXPECT_EQ(s.completed, 8);
  EXPECT_EQ(s.failed, 3);
  EXPECT_EQ(s.total_output_tokens, 6 * 8 + 5 + 3);
  EXPECT_EQ(s.total_input_tokens, 8 * 7);
  EXPECT_EQ(s.output_counts_from_usage, 7);
  EXPECT_EQ(s.server_input_tokens, -1);  // the no-usage stream has none
  EXPECT_GT(s.itl.mean, 0.0005);  // tokens are written 2 ms apart
  EXPECT_LT(s.itl.mean, 0.5);
  EXPECT_GT(s.tpot.mean, 0.0005);
  EXPECT_GT(s.concurrency, 0.5);
  EXPECT_LE(s.concurrency, 3.01);
  EXPECT_LE(server.max_open_streams.load(), 3);
  // Three slots, plus a new connection after each response that closed its own (close-early, eof-body).
  EXPECT_LE(run->run.connections_opened, 5);
  EXPECT_EQ(server.generation_requests.load(), static_cast<int64_t>(prompts.size()));
  for (const std::string& body : server.bodies()) {
    const auto j = nlohmann::json::parse(body);
    EXPECT_EQ(j["stream"], true);
    EXPECT_EQ(j["stream_options"]["include_usage"], true);
    EXPECT_EQ(j["ignore_eos"], true);
    EXPECT_EQ(j["model"], "fake-model");
    EXPECT_EQ(j.contains("messages"), endpoint == "chat");
  }
}

TEST(BenchServe, CompletionsAgainstFakeServer) { run_against_fake("completions"); }
TEST(BenchServe, ChatAgainstFakeServer) { run_against_fake("chat"); }

TEST(BenchServe, ResendsWhenAKeptAliveConnectionWasClosed) {
  FakeOpenAiServer server(FakeOpenAiOptions{.token_gap_ms = 0, .close_after_each_response = true});
  std::vector<BenchPrompt> prompts(12, prompt("p", 3));
  auto run = bench::run_serve_bench(options_for(server.base_url(), "completions", 1), prompts);
  ASSERT_TRUE(run.is_ok());
  for (const RequestResult& r : run->run.results) EXPECT_TRUE(r.success) << r.error;
  EXPECT_EQ(server.generation_requests.load(), 12);
}

TEST(BenchServe, AStalledStreamTimesOutAndFreesItsSlot) {
  FakeOpenAiServer server(FakeOpenAiOptions{.token_gap_ms = 0});
  auto options = options_for(server.base_url(), "completions", 1);
  options.idle_timeout_s = 0.3;
  auto run = bench::run_serve_bench(options, {prompt("stall", 4), prompt("p", 4)});
  ASSERT_TRUE(run.is_ok());
  const auto& r = run->run.results;
  EXPECT_FALSE(r[0].success);
  EXPECT_EQ(r[0].error, "no data from the server for 0.3 s");
  EXPECT_EQ(r[0].token_chunks, 1);
  EXPECT_GE(r[0].e2e_s, 0.29);
  EXPECT_TRUE(r[1].success) << r[1].error;
}

TEST(BenchServe, PoissonArrivalsAreSpreadAndInOrder) {
  FakeOpenAiServer server(FakeOpenAiOptions{.token_gap_ms = 0});
  auto options = options_for(server.base_url(), "completions", 0);
  options.request_rate = 400;
  options.seed = 3;
  std::vector<BenchPrompt> prompts(40, prompt("p", 2));
  auto run = bench::run_serve_bench(options, prompts);
  ASSERT_TRUE(run.is_ok());
  const auto& results = run->run.results;
  for (size_t i = 1; i < results.size(); ++i) EXPECT_LE(results[i - 1].start_s, results[i].start_s);
  // 39 exponential gaps of mean 2.5 ms: about 0.1 s; far from "all at once" and far from a second.
  EXPECT_GT(results.back().start_s, 0.03);
  EXPECT_LT(results.back().start_s, 1.0);
}

TEST(BenchServe, AThousandConcurrentStreamsOnOneThread) {
  rlimit limit{};
  getrlimit(RLIMIT_NOFILE, &limit);
  bench::raise_open_file_limit();
  getrlimit(RLIMIT_NOFILE, &limit);
  // Client and server sockets both live in this process.
  const int64_t streams = std::min<int64_t>(1000, (static_cast<int64_t>(limit.rlim_cur) - 200) / 2);
  // Streams start once all are open: under load the client may open sockets slower than 16 tokens take.
  FakeOpenAiServer server(FakeOpenAiOptions{.token_gap_ms = 5, .hold_until_open_streams = streams});
  std::vector<BenchPrompt> prompts(streams, prompt("p", 16));
  auto run = bench::run_serve_bench(options_for(server.base_url(), "completions", streams), prompts);
  ASSERT_TRUE(run.is_ok());
  const bench::BenchSummary s = bench::summarize_run(run->run);
  EXPECT_EQ(s.completed, streams) << (s.errors.empty() ? "" : s.errors[0].first);
  EXPECT_EQ(s.total_output_tokens, streams * 16);
  EXPECT_EQ(run->run.connections_opened, streams);
  EXPECT_EQ(server.max_open_streams.load(), streams);
  // For the record only (a loaded CI machine stretches these): the client's CPU per token chunk.
  std::printf("%lld streams x 16 tokens: %.2f s, client thread CPU %.3f s (%.1f us per chunk), mean ITL %.1f ms\n",
              static_cast<long long>(streams), s.duration_s, run->run.client_cpu_s,
              1e6 * run->run.client_cpu_s / static_cast<double>(streams * 16), s.itl.mean * 1e3);
}

TEST(BenchServe, AgainstMxserveHttpFront) {
  TestServer server;
  auto options = options_for("http://127.0.0.1:" + std::to_string(server.port()), "chat", 4);
  options.model = "test-model";
  std::vector<BenchPrompt> prompts = {prompt("hello", 16), prompt("hi", 16), prompt("fail-late", 16), prompt("yo", 16)};
  auto run = bench::run_serve_bench(options, prompts);
  ASSERT_TRUE(run.is_ok());
  const auto& r = run->run.results;
  for (size_t i : {0, 1, 3}) {
    ASSERT_TRUE(r[i].success) << r[i].error;
    EXPECT_EQ(r[i].token_chunks, 4);  // "Thinking." then "Hello", " world", "!"
    EXPECT_EQ(r[i].output_tokens, 4);
    EXPECT_TRUE(r[i].output_tokens_from_usage);
  }
  EXPECT_FALSE(r[2].success);
  EXPECT_EQ(r[2].error, "The engine failed this request.");
  auto models = bench::fetch_model_id(options.url, "");
  ASSERT_TRUE(models.is_ok()) << models.status().to_string();
  EXPECT_EQ(*models, "test-model");
}

std::string tokenizer_flag() { return " --tokenizer " + fixture("tokenizer/o200k_base.tiktoken"); }

TEST(BenchServeCli, RunsAgainstFakeServerAndWritesJson) {
  FakeOpenAiServer server(FakeOpenAiOptions{.token_gap_ms = 1});
  TempDir dir;
  const auto r = run_mxserve("bench serve --base-url " + server.base_url() +
                             "/v1 --num-prompts 12 --random-input-len 40 --random-output-len 6 --max-concurrency 4 "
                             "--endpoint chat --json " + dir.file("out.json"));  // the built-in tokenizer
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text << r.stdout_text;
  for (const char* line : {"Successful requests:                     12", "Total input tokens:                      480",
                           "Total generated tokens:                  72", "Max request concurrency:                 4",
                           "Model:                                   fake-model", "Mean ITL (ms):"})
    EXPECT_NE(r.stdout_text.find(line), std::string::npos) << line << "\n" << r.stdout_text;
  const auto j = nlohmann::json::parse(read_file(dir.file("out.json")));
  EXPECT_EQ(j["completed"], 12);
  EXPECT_EQ(j["failed"], 0);
  EXPECT_EQ(j["total_output_tokens"], 72);
  EXPECT_EQ(j["max_concurrency"], 4);
  EXPECT_EQ(j["input_lens"].size(), 12u);
  for (const auto& len : j["input_lens"]) EXPECT_EQ(len, 40);
  EXPECT_EQ(j["itls"][0].size(), 5u);
  EXPECT_GT(j["total_input_tokens_server"].get<int64_t>(), 0);  // the fake counts prompt bytes
  EXPECT_NE(j["command_line"].get<std::string>().find("mxserve bench serve --base-url"), std::string::npos);
  EXPECT_EQ(j["date"].get<std::string>().size(), 20u);
  EXPECT_GT(j["mean_ttft_ms"].get<double>(), 0);
  EXPECT_EQ(server.generation_requests.load(), 13);  // one warm-up request first
  // The prompts differ (no prefix cache hits between them) and are the same on every run with this seed.
  const auto bodies = server.bodies();
  const auto first = nlohmann::json::parse(bodies[1])["messages"][0]["content"].get<std::string>();
  const auto second = nlohmann::json::parse(bodies[2])["messages"][0]["content"].get<std::string>();
  EXPECT_NE(first, second);
  EXPECT_EQ(nlohmann::json::parse(bodies[1])["max_tokens"], 6);
  // The warm-up prompt is none of the measured ones, not even their first 16 bytes (a prefix-cache hit).
  const auto warmup = nlohmann::json::parse(bodies[0])["messages"][0]["content"].get<std::string>();
  for (size_t i = 1; i < bodies.size(); ++i) {
    const auto measured = nlohmann::json::parse(bodies[i])["messages"][0]["content"].get<std::string>();
    EXPECT_NE(measured.substr(0, 16), warmup.substr(0, 16)) << "request " << i;
  }
}

TEST(BenchServe, WarmupNeedsItsOwnPrompts) {
  FakeOpenAiServer server;
  auto options = options_for(server.base_url(), "completions", 1);
  options.warmup_requests = 2;
  const std::vector<BenchPrompt> prompts = {prompt("p", 2)};
  auto refused = bench::run_serve_bench(options, prompts);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.status().message().find("their own prompts"), std::string::npos);
  auto run = bench::run_serve_bench(options, prompts, {prompt("warm", 2)});
  ASSERT_TRUE(run.is_ok()) << run.status().message();
  const auto bodies = server.bodies();
  ASSERT_EQ(bodies.size(), 3u);
  for (size_t i : {0, 1}) EXPECT_EQ(nlohmann::json::parse(bodies[i])["prompt"], "warm");
  EXPECT_EQ(nlohmann::json::parse(bodies[2])["prompt"], "p");
}

// The quick real run: `mxserve bench serve` against `mxserve serve` with the demo model on the CPU (cached
// under the build tree, shared with the server tests).
TEST(BenchServeCli, AgainstMxserveServe) {
  const auto [pid, port] = start_serve({"--served-model-name", "demo", "--shutdown-timeout", "1"});
  ASSERT_GT(port, 0);
  TempDir dir;
  const auto r = run_mxserve("bench serve --base-url http://127.0.0.1:" + std::to_string(port) +
                             " --num-prompts 6 --random-input-len 32 --random-output-len 8 --max-concurrency 3 --json " +
                             dir.file("out.json") + tokenizer_flag());
  kill(pid, SIGTERM);
  wait_exit(pid);
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text << r.stdout_text;
  const auto j = nlohmann::json::parse(read_file(dir.file("out.json")));
  EXPECT_EQ(j["completed"], 6);
  EXPECT_EQ(j["total_output_tokens"], 6 * 8);
  EXPECT_EQ(j["output_counts_from_usage"], 6);
  // /v1/completions encodes the raw prompt with the same o200k: the server counts what the client counted.
  EXPECT_EQ(j["total_input_tokens"], 6 * 32);
  EXPECT_EQ(j["total_input_tokens_server"], 6 * 32);
  EXPECT_GT(j["mean_ttft_ms"].get<double>(), 0);
  EXPECT_GT(j["mean_tpot_ms"].get<double>(), 0);
}

TEST(BenchServeCli, BadFlagsAndUnreachableServers) {
  const std::pair<std::string, std::string> cases[] = {
      {"--base-url https://example.com", "https is not supported"},
      {"--endpoint responses", "--endpoint must be completions or chat"},
      {"--request-rate 0", "--request-rate must be > 0"},
      {"--max-concurrency 0", "--max-concurrency must be at least 1"},
      {"--random-range-ratio 2", "--random-range-ratio must be in [0, 1]"},
      {"--extra-body '[1]'", "--extra-body must be a JSON object"},
      {"--num-prompts 0", "--num-prompts must be in"},
      {"--base-url http://127.0.0.1:1", "cannot connect to 127.0.0.1:1"},
      {"--tokenizer /nonexistent.tiktoken --model m", "nonexistent"},
  };
  for (const auto& [args, expected] : cases) {
    const std::string tok = args.find("--tokenizer") == std::string::npos ? tokenizer_flag() : "";
    const auto r = run_mxserve("bench serve --num-prompts 2 --random-input-len 4 --random-output-len 2 " + args + tok);
    EXPECT_EQ(r.exit_code, 1) << args;
    EXPECT_NE(r.stderr_text.find(expected), std::string::npos) << args << " -> " << r.stderr_text;
  }
  // With --model, no /v1/models call: every request fails to connect, and that is reported, not a crash.
  const auto r = run_mxserve("bench serve --base-url http://127.0.0.1:1 --model m --num-prompts 3 --random-input-len 4 "
                             "--random-output-len 2 --warmup-requests 0" + tokenizer_flag());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.stdout_text.find("3x cannot connect to 127.0.0.1:1"), std::string::npos) << r.stdout_text;
  EXPECT_EQ(run_mxserve("bench").exit_code, 2);
  EXPECT_EQ(run_mxserve("bench nosuch").exit_code, 2);
  const auto help = run_mxserve("bench serve --help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.stdout_text.find("http only"), std::string::npos);
}

}  // namespace
}  // namespace mx::test
