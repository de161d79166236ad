// MTP speculation through the server, as users run it: `mxserve serve` on a synthetic Gemma-4 (the gemma-demo
// preset: the real vocabulary, tiny widths, its tokenizer) with --speculative-algorithm mtp and a random
// assistant made for it answers /v1/completions at temperature 0 exactly as the same server without
// speculation, and /metrics counts the drafts it verified.
#include <gtest/gtest.h>

#include <signal.h>

#include <nlohmann/json.hpp>

#include "model/gemma4/gemma4_assistant_synthetic.h"
#include "model/gemma4/gemma4_synthetic.h"
#include "serve_process_util.h"
#include "test_util.h"

namespace mx::test {
namespace {

using Json = nlohmann::json;

// The value of the first series whose line starts with `name` (0 when absent).
double metric(const std::string& text, const std::string& name) {
  for (size_t at = text.find(name); at != std::string::npos; at = text.find(name, at + 1)) {
    if (at > 0 && text[at - 1] != '\n') continue;
    const size_t end = text.find('\n', at);
    const std::string line = text.substr(at, end - at);
    return std::stod(line.substr(line.rfind(' ') + 1));
  }
  return 0;
}

TEST(ServerMtp, CompletionsEqualThePlainServersAndDraftsAreCounted) {
  TempDir dir;
  const std::string target = dir.file("gemma"), assistant = dir.file("assistant");
  SyntheticOptions options;
  options.seed = 3;
  options.threads = 2;
  ASSERT_TRUE(write_synthetic_model("gemma-demo", target, options).is_ok());
  auto preset = gemma4_preset("gemma-demo");
  ASSERT_TRUE(preset.is_ok());
  ASSERT_TRUE(write_gemma4_assistant_checkpoint(gemma4_assistant_for(preset->text, 2, 32, 48), assistant, options).is_ok());

  const std::vector<std::string> common = {"--model", target, "--num-kv-pages", "256", "--max-running-requests", "4"};
  std::vector<std::string> with_mtp = common;
  for (const char* flag : {"--speculative-algorithm", "mtp", "--speculative-num-draft-tokens", "3", "--speculative-draft-model"})
    with_mtp.push_back(flag);
  with_mtp.push_back(assistant);
  const auto [plain_pid, plain_port] = start_serve(common);
  const auto [mtp_pid, mtp_port] = start_serve(with_mtp);
  ASSERT_GT(plain_port, 0);
  ASSERT_GT(mtp_port, 0);
  const std::string body =
      R"({"prompt":[[17, 2000, 3000, 4000, 17, 2000], [9, 8, 7, 6, 5, 4, 3], [1200]],"max_tokens":24,"temperature":0,)"
      R"("logprobs":1,"ignore_eos":true})";
  const HttpReply x = http_call(mtp_port, "POST", "/v1/completions", body);
  const HttpReply y = http_call(plain_port, "POST", "/v1/completions", body);
  ASSERT_EQ(x.status, 200) << x.body;
  ASSERT_EQ(y.status, 200) << y.body;
  const Json a = Json::parse(x.body), p = Json::parse(y.body);
  ASSERT_EQ(a["choices"].size(), 3u);
  for (size_t i = 0; i < a["choices"].size(); ++i) {
    EXPECT_EQ(a["choices"][i]["text"], p["choices"][i]["text"]) << i;
    EXPECT_EQ(a["choices"][i]["logprobs"]["tokens"], p["choices"][i]["logprobs"]["tokens"]) << i;
  }
  EXPECT_EQ(a["usage"], p["usage"]);
  const std::string metrics = http_call(mtp_port, "GET", "/metrics").body;
  const double drafts = metric(metrics, "vllm:spec_decode_num_drafts_total");
  const double draft_tokens = metric(metrics, "vllm:spec_decode_num_draft_tokens_total");
  EXPECT_GT(drafts, 0) << metrics;
  EXPECT_GE(draft_tokens, drafts);
  EXPECT_LE(metric(metrics, "vllm:spec_decode_num_accepted_tokens_total"), draft_tokens);
  kill(plain_pid, SIGTERM);
  kill(mtp_pid, SIGTERM);
  EXPECT_EQ(wait_exit(plain_pid), 0);
  EXPECT_EQ(wait_exit(mtp_pid), 0);
}

}  // namespace
}  // namespace mx::test
