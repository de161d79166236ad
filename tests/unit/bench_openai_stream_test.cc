// The pieces of `bench serve` that need no network: the OpenAI stream reader on every chunk shape servers
// send, error bodies, base URL parsing, and the summary statistics.
#include <gtest/gtest.h>

#include <cmath>

#include "tools/bench/bench_report.h"
#include "tools/bench/http_url.h"
#include "tools/bench/openai_stream.h"

namespace mx::bench {
namespace {

using Kind = OpenAiStreamReader::Kind;

Kind read(OpenAiStreamReader& reader, const std::string& data, const std::string& event = "") {
  return reader.read(SseEvent{event, data, ""});
}

TEST(OpenAiStreamReader, ChatChunkShapes) {
  OpenAiStreamReader r;
  EXPECT_EQ(read(r, R"({"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]})"), Kind::kNothing);
  EXPECT_EQ(read(r, R"({"choices":[{"index":0,"delta":{}}]})"), Kind::kNothing);
  EXPECT_EQ(read(r, R"({"choices":[{"index":0,"delta":{"content":null}}]})"), Kind::kNothing);
  EXPECT_EQ(read(r, R"({"choices":[{"index":0,"delta":{"reasoning_content":"Hmm"}}]})"), Kind::kTokens);
  EXPECT_EQ(read(r, R"({"choices":[{"index":0,"delta":{"reasoning":"so"}}]})"), Kind::kTokens);
  EXPECT_EQ(read(r, R"({"choices":[{"index":0,"delta":{"content":"Hi"}}]})"), Kind::kTokens);
  EXPECT_EQ(read(r, R"({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{"}}]}}]})"),
            Kind::kTokens);
  EXPECT_FALSE(r.finish_reason_seen());
  EXPECT_EQ(read(r, R"({"choices":[{"index":0,"delta":{},"finish_reason":"length"}]})"), Kind::kNothing);
  EXPECT_TRUE(r.finish_reason_seen());
  EXPECT_EQ(r.usage_completion_tokens(), -1);
  EXPECT_EQ(read(r, R"({"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":4,"total_tokens":16}})"), Kind::kNothing);
  EXPECT_EQ(r.usage_completion_tokens(), 4);
  EXPECT_EQ(r.usage_prompt_tokens(), 12);
  EXPECT_EQ(r.token_chunks(), 4);
  EXPECT_FALSE(r.done());
  EXPECT_EQ(read(r, "[DONE]"), Kind::kDone);
  EXPECT_TRUE(r.done());
}

TEST(OpenAiStreamReader, CompletionChunkShapes) {
  OpenAiStreamReader r;
  EXPECT_EQ(read(r, R"({"choices":[{"index":0,"text":"","finish_reason":null}]})"), Kind::kNothing);
  EXPECT_EQ(read(r, R"({"choices":[{"index":0,"text":" a","finish_reason":null}]})"), Kind::kTokens);
  EXPECT_EQ(read(r, R"({"choices":[{"index":0,"text":"b","finish_reason":"length"}],"usage":null})"), Kind::kTokens);
  EXPECT_TRUE(r.finish_reason_seen());
  EXPECT_EQ(r.token_chunks(), 2);
}

TEST(OpenAiStreamReader, ErrorsInTheStream) {
  {
    OpenAiStreamReader r;
    EXPECT_EQ(read(r, R"({"error":{"message":"out of memory","type":"server_error"}})"), Kind::kError);
    EXPECT_EQ(r.error(), "out of memory");
  }
  {
    OpenAiStreamReader r;
    EXPECT_EQ(read(r, R"({"error":{"message":"boom"}})", "error"), Kind::kError);
    EXPECT_EQ(r.error(), "boom");
  }
  {
    OpenAiStreamReader r;
    EXPECT_EQ(read(r, "engine died", "error"), Kind::kError);
    EXPECT_EQ(r.error(), "engine died");
  }
  {
    OpenAiStreamReader r;
    EXPECT_EQ(read(r, R"({"choices":[{"text":"x"})"), Kind::kError);
    EXPECT_NE(r.error().find("not JSON"), std::string::npos);
    EXPECT_EQ(read(r, "[1,2]"), Kind::kError);
  }
  {  // "error": null is no error (some servers send it on every chunk)
    OpenAiStreamReader r;
    EXPECT_EQ(read(r, R"({"error":null,"choices":[{"text":"x"}]})"), Kind::kTokens);
  }
}

TEST(OpenAiStreamReader, ErrorBodies) {
  EXPECT_EQ(error_message_from_body(R"({"error":{"message":"Not implemented","type":"x"}})"), "Not implemented");
  EXPECT_EQ(error_message_from_body(R"({"error":"plain"})"), "plain");
  EXPECT_EQ(error_message_from_body(R"({"object":"error","message":"vllm style"})"), "vllm style");
  EXPECT_EQ(error_message_from_body(R"({"detail":"Not Found"})"), "Not Found");
  EXPECT_EQ(error_message_from_body("<html>\nbad gateway</html>"), "<html> bad gateway</html>");
  EXPECT_EQ(error_message_from_body(std::string(300, 'x')).size(), 203u);
}

TEST(HttpUrl, Parses) {
  auto u = parse_http_url("http://127.0.0.1:8000");
  ASSERT_TRUE(u.is_ok()) << u.status().to_string();
  EXPECT_EQ(u->host, "127.0.0.1");
  EXPECT_EQ(u->port, 8000);
  EXPECT_EQ(u->target("/v1/models"), "/v1/models");
  EXPECT_EQ(u->host_header, "127.0.0.1:8000");

  u = parse_http_url("HTTP://Example.com/v1/");
  ASSERT_TRUE(u.is_ok());
  EXPECT_EQ(u->host, "Example.com");
  EXPECT_EQ(u->port, 80);
  EXPECT_EQ(u->host_header, "Example.com");
  EXPECT_EQ(u->target("/v1/completions"), "/v1/completions");

  u = parse_http_url("http://[::1]:9000/proxy/llm");
  ASSERT_TRUE(u.is_ok());
  EXPECT_EQ(u->host, "::1");
  EXPECT_EQ(u->port, 9000);
  EXPECT_EQ(u->host_header, "[::1]:9000");
  EXPECT_EQ(u->target("/v1/models"), "/proxy/llm/v1/models");
  EXPECT_EQ(u->to_string(), "http://[::1]:9000/proxy/llm");
}

TEST(HttpUrl, RejectsWithClearMessages) {
  const std::pair<const char*, const char*> cases[] = {
      {"https://host", "https is not supported"},
      {"localhost:8000", "must look like http://"},
      {"http://", "has no host"},
      {"http://:80", "has no host"},
      {"http://host:", "port must be a number"},
      {"http://host:0", "1..65535"},
      {"http://host:65536", "1..65535"},
      {"http://host:80x", "port must be a number"},
      {"http://user:pw@host", "user:password@"},
      {"http://host/a?b=c", "query"},
      {"http://[::1", "unclosed"},
      {"http://[zz]:80", "bad IPv6"},
      {"http://ho st", "bad character"},
  };
  for (const auto& [url, expected] : cases) {
    auto u = parse_http_url(url);
    ASSERT_FALSE(u.is_ok()) << url;
    EXPECT_NE(u.status().message().find(expected), std::string::npos) << url << " -> " << u.status().message();
  }
}

TEST(BenchReport, PercentilesInterpolateLikeNumpy) {
  std::vector<double> values;
  for (int i = 100; i >= 1; --i) values.push_back(i);
  const Distribution d = summarize(values);
  EXPECT_EQ(d.count, 100);
  EXPECT_DOUBLE_EQ(d.mean, 50.5);
  EXPECT_DOUBLE_EQ(d.median, 50.5);
  EXPECT_NEAR(d.p99, 99.01, 1e-9);
  EXPECT_NEAR(d.p95, 95.05, 1e-9);
  EXPECT_DOUBLE_EQ(d.max, 100);
  EXPECT_NEAR(d.std, std::sqrt((100.0 * 100.0 - 1.0) / 12.0), 1e-9);
  EXPECT_EQ(summarize({}).count, 0);
  EXPECT_DOUBLE_EQ(summarize({3}).p99, 3);
}

TEST(BenchReport, SummaryCountsOnlySuccessesAndGroupsErrors) {
  LoadRun run;
  run.duration_s = 2;
  RequestResult ok;
  ok.success = true;
  ok.prompt_tokens = 10;
  ok.output_tokens = 5;
  ok.output_tokens_from_usage = true;
  ok.token_chunks = 5;
  ok.ttft_s = 0.1;
  ok.e2e_s = 0.5;
  ok.itl_s = {0.1, 0.1, 0.1, 0.1};
  RequestResult bad;
  bad.error = "HTTP 501: not wired";
  bad.prompt_tokens = 10;
  run.results = {ok, bad, ok, bad};
  run.results[3].error = "other";
  const BenchSummary s = summarize_run(run);
  EXPECT_EQ(s.completed, 2);
  EXPECT_EQ(s.failed, 2);
  EXPECT_EQ(s.total_input_tokens, 20);
  EXPECT_EQ(s.total_output_tokens, 10);
  EXPECT_DOUBLE_EQ(s.output_throughput, 5);
  EXPECT_DOUBLE_EQ(s.total_throughput, 15);
  EXPECT_DOUBLE_EQ(s.concurrency, 0.5);
  EXPECT_NEAR(s.tpot.mean, 0.1, 1e-12);
  EXPECT_EQ(s.itl.count, 8);
  ASSERT_EQ(s.errors.size(), 2u);
  EXPECT_EQ(s.errors[0].first, "HTTP 501: not wired");

  BenchConfig config;
  config.endpoint = "completions";
  config.request_rate = INFINITY;
  const std::string text = format_report(config, s);
  for (const char* line : {"Successful requests:                     2", "Failed requests:                         2",
                           "Total generated tokens:                  10", "Mean TPOT (ms):                          100.00",
                           "Traffic request rate:                    inf", "1x HTTP 501: not wired"})
    EXPECT_NE(text.find(line), std::string::npos) << line << "\n" << text;
  const auto json = report_json(config, s, run);
  EXPECT_EQ(json["completed"], 2);
  EXPECT_EQ(json["request_rate"], "inf");
  EXPECT_EQ(json["itls"].size(), 4u);
  EXPECT_EQ(json["errors"][1], "HTTP 501: not wired");
}

}  // namespace
}  // namespace mx::bench
