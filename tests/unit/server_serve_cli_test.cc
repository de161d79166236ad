// `mxserve serve` as users run it: binds, answers, drains on SIGTERM and exits 0; bad flags are one line.
#include <gtest/gtest.h>

#include <fstream>

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "server_test_util.h"
#include "test_util.h"

namespace mx::test {
namespace {

TEST(ServeCli, ServesTheDemoModelThenDrainsOnSigterm) {
  const auto [pid, port] = start_serve({"--api-key", "k", "--served-model-name", "demo", "--shutdown-timeout", "1"});
  ASSERT_GT(port, 0);
  EXPECT_EQ(http_call(port, "GET", "/health").status, 200);
  EXPECT_EQ(http_call(port, "GET", "/v1/models").status, 401);
  const HttpReply models = http_call(port, "GET", "/v1/models", "", {"Authorization: Bearer k"});
  EXPECT_NE(models.body.find("\"id\":\"demo\""), std::string::npos) << models.body;
  const HttpReply chat = http_call(port, "POST", "/v1/chat/completions",
                                   R"({"messages":[{"role":"user","content":"x"}],"max_tokens":8})", {"Authorization: Bearer k"});
  EXPECT_EQ(chat.status, 200) << chat.body;
  EXPECT_NE(chat.body.find("\"completion_tokens\":"), std::string::npos) << chat.body;

  // SIGTERM with a stream in flight: it is aborted after the timeout, ends with [DONE], and the process exits 0.
  RawClient stream(port, 20000);
  stream.send(make_request("POST", "/v1/chat/completions",
                           R"({"messages":[{"role":"user","content":"x"}],"stream":true,"max_tokens":50000,"ignore_eos":true})",
                           {"Authorization: Bearer k"}));
  EXPECT_EQ(stream.read_head().status, 200);
  kill(pid, SIGTERM);
  std::string rest;
  for (std::string piece; rest.find("[DONE]") == std::string::npos && !(piece = stream.read_some()).empty();) rest += piece;
  EXPECT_NE(rest.find("\"finish_reason\":\"abort\""), std::string::npos);
  EXPECT_EQ(wait_exit(pid), 0);
}

TEST(ServeCli, ForcedTranscriptsOptionPlaysHarmony) {
  const std::string path = std::string(MX_BINARY_DIR) + "/serve_cli_forced.json";
  {
    std::ofstream f(path);
    f << R"({"transcripts":[{"text":"<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Done.<|return|>"}]})";
  }
  const auto [pid, port] = start_serve({"--test-forced-tokens", path});
  ASSERT_GT(port, 0);
  const HttpReply chat = http_call(port, "POST", "/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}]})");
  EXPECT_EQ(chat.status, 200);
  EXPECT_NE(chat.body.find("\"content\":\"Done.\""), std::string::npos) << chat.body;
  EXPECT_NE(chat.body.find("\"reasoning_content\":\"Think.\""), std::string::npos) << chat.body;
  kill(pid, SIGTERM);
  EXPECT_EQ(wait_exit(pid), 0);
}

TEST(ServeCli, BadFlagsAreOneLineErrors) {
  const std::pair<std::string, std::string> cases[] = {
      {"serve --port 70000", "--port must be between 0 and 65535"},
      {"serve --backend tpu", "unknown backend 'tpu'"},
      {"serve --max-running-requests 0", "--max-running-requests must be at least 1"},
      {"serve --shutdown-timeout -1", "--shutdown-timeout must be between"},
      {"serve --model /nonexistent", "no config.json there"},
      {"serve --test-forced-tokens /nonexistent", "--test-forced-tokens /nonexistent: no such file"},
      {"serve --port 0 --model " + fixture("tiny-gpt-oss"), "tokenizer"},
      {"serve --host 256.1.1.1 --port 0", "cannot"},
  };
  for (const auto& [args, expected] : cases) {
    const auto r = run_mxserve(args);
    EXPECT_EQ(r.exit_code, 1) << args;
    EXPECT_NE(r.stderr_text.find(expected), std::string::npos) << args << " -> " << r.stderr_text;
  }
}

}  // namespace
}  // namespace mx::test
