// `mxserve serve` as users run it: binds, answers, drains on SIGTERM and exits 0; bad flags are one line.
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "serve_process_util.h"
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

// --preset: a synthetic model made in memory (benchmarks), named by its preset, with --tokenizer's vocabulary.
TEST(ServeCli, ServesAPresetMadeInMemory) {
  const auto [pid, port] = start_serve({"--preset", "demo", "--tokenizer", fixture("tokenizer/o200k_base.tiktoken")});
  ASSERT_GT(port, 0);
  const HttpReply models = http_call(port, "GET", "/v1/models");
  EXPECT_NE(models.body.find("\"id\":\"demo\""), std::string::npos) << models.body;
  const HttpReply r = http_call(port, "POST", "/v1/completions", R"({"prompt":"Hello","max_tokens":4,"ignore_eos":true})");
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_NE(r.body.find("\"completion_tokens\":4"), std::string::npos) << r.body;
  kill(pid, SIGTERM);
  EXPECT_EQ(wait_exit(pid), 0);
}

TEST(ServeCli, BadFlagsAreOneLineErrors) {
  const std::pair<std::string, std::string> cases[] = {
      {"serve --port 70000", "--port must be between 0 and 65535"},
      {"serve --backend tpu", "unknown backend 'tpu'"},
      {"serve --max-running-requests 0", "--max-running-requests must be at least 1"},
      {"serve --shutdown-timeout -1", "--shutdown-timeout must be between"},
      {"serve --model /nonexistent", "--model /nonexistent: no such directory"},
      {"serve --model " + fixture("."), "no config.json there"},
      {"serve --test-forced-tokens /nonexistent", "--test-forced-tokens /nonexistent: no such file"},
      {"serve --port 0 --model " + fixture("tiny-gpt-oss"), "tokenizer"},
      {"serve --host 256.1.1.1 --port 0", "cannot"},
      {"serve --preset demo", "--preset demo needs --tokenizer"},
      {"serve --preset nope --tokenizer x", "--preset nope: unknown"},
      {"serve --preset demo --tokenizer x --model " + fixture("tiny-gpt-oss"), "give --model or --preset, not both"},
      {"serve --tokenizer x", "--tokenizer goes with --preset"},
      {"serve --preset demo --tokenizer x --tp 2", "not with --tensor-parallel-size"},
      {"serve --port 0 --preset demo --tokenizer /nonexistent", "--tokenizer /nonexistent"},
  };
  for (const auto& [args, expected] : cases) {
    const auto r = run_mxserve(args);
    EXPECT_EQ(r.exit_code, 1) << args;
    EXPECT_NE(r.stderr_text.find(expected), std::string::npos) << args << " -> " << r.stderr_text;
  }
}

// vLLM and SGLang command lines: their spellings reach our settings, their values we cannot honour are
// refused with the reason, typos get a suggestion.
TEST(ServeCli, PeerFlagsAreAliasesOrRefusedWithAReason) {
  const struct {
    std::string args;
    int exit_code;
    std::string expected;
  } cases[] = {
      {"serve --tensor-parallel-size 0", 1, "--tensor-parallel-size must be in [1, 64]"},
      {"serve --port 0 --tp 3", 1, "tensor parallel size 3 does not divide the model's 8 attention heads"},
      {"serve --dtype float16", 1, "--dtype float16: mxserve computes in bfloat16"},
      {"serve --kv-cache-dtype fp8", 1, "--kv-cache-dtype fp8: only a bfloat16 KV cache"},
      {"serve --reasoning-parser deepseek_r1", 1, "give gpt_oss or leave it out"},
      {"serve --tool-call-parser hermes", 1, "give openai or leave it out"},
      {"serve --max-num-seq 4", 2, "unknown option --max-num-seq (did you mean --max-num-seqs?)"},
      {"serve --gpu-memory-util 0.8", 2, "(did you mean --gpu-memory-utilization?)"},
      {"serve --frobnicate", 2, "unknown option --frobnicate\n"},
      {"serve dir1 dir2", 2, "unexpected argument 'dir2'"},
      {"serve dir1 --model dir2", 2, "both name the model"},
      {"serve --max-model-len 8", 1, "must be at least 16"},
      {"serve --port 0 --kv-events-topic t", 1, "the --kv-events-* options need --kv-events-endpoint"},
      {"serve --port 0 --kv-events-endpoint tcp://127.0.0.1:* --kv-events-block-size 64", 1,
       "--kv-events-block-size 64 must equal --page-size (16)"},
      {"serve --port 0 --kv-events-endpoint bogus://x", 1, "--kv-events-endpoint bogus://x"},
  };
  for (const auto& c : cases) {
    const auto r = run_mxserve(c.args);
    EXPECT_EQ(r.exit_code, c.exit_code) << c.args << " -> " << r.stderr_text;
    EXPECT_NE(r.stderr_text.find(c.expected), std::string::npos) << c.args << " -> " << r.stderr_text;
  }
  const auto help = run_mxserve("serve --help");
  EXPECT_NE(help.stdout_text.find("(also --max-num-seqs)"), std::string::npos) << help.stdout_text;
  for (const char* args : {"--version", "serve --version"}) {
    const auto v = run_mxserve(args);
    EXPECT_EQ(v.exit_code, 0) << args;
    EXPECT_EQ(v.stdout_text.rfind("mxserve ", 0), 0u) << args << " -> " << v.stdout_text;
  }
}

TEST(ServeCli, HuggingFaceIdsResolveFromTheLocalCacheOnly) {
  TempDir hf;
  setenv("HF_HOME", hf.path().c_str(), 1);
  const auto missing = run_mxserve("serve openai/gpt-oss-20b");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.stderr_text.find("huggingface-cli download openai/gpt-oss-20b"), std::string::npos) << missing.stderr_text;

  // A cache entry for "acme/tiny": refs/main names a snapshot that links to a checkpoint directory.
  const std::string repo = hf.path() + "/hub/models--acme--tiny";
  ASSERT_EQ(std::system(("mkdir -p " + repo + "/refs " + repo + "/snapshots && printf abc123 > " + repo +
                         "/refs/main && ln -s " + fixture("tiny-gpt-oss") + " " + repo + "/snapshots/abc123").c_str()), 0);
  // The fixture has no tokenizer: getting that far proves the id resolved to the snapshot.
  const auto found = run_mxserve("serve --port 0 acme/tiny");
  EXPECT_EQ(found.exit_code, 1);
  EXPECT_NE(found.stderr_text.find("tokenizer"), std::string::npos) << found.stderr_text;
  EXPECT_EQ(found.stderr_text.find("Hugging Face cache"), std::string::npos) << found.stderr_text;
  unsetenv("HF_HOME");
}

// The flags' meanings, through a running server: aliases reach the settings, --seed makes unseeded
// sampling reproducible across restarts, positional model and served name.
TEST(ServeCli, AliasesReachTheirSettingsAndSeedReproduces) {
  auto first_sample = [](const std::vector<std::string>& extra) {
    auto [pid, port] = start_serve(extra);
    EXPECT_GT(port, 0);
    const HttpReply models = http_call(port, "GET", "/v1/models");
    const HttpReply metrics = http_call(port, "GET", "/metrics");
    const HttpReply r = http_call(port, "POST", "/v1/completions",
                                  R"({"prompt":"Hello","max_tokens":12,"temperature":1.0,"ignore_eos":true})");
    kill(pid, SIGTERM);
    EXPECT_EQ(wait_exit(pid), 0);
    const auto body = nlohmann::json::parse(r.body, nullptr, false);
    EXPECT_TRUE(body.is_object()) << r.body;
    return std::make_tuple(models.body, metrics.body, body.is_object() ? body["choices"][0]["text"].dump() : "");
  };
  const std::vector<std::string> flags = {"--max-num-seqs", "3", "--max-model-len", "1024", "--seed", "7",
                                          "--no-enable-prefix-caching", "--dtype", "bfloat16", "--tp", "1",
                                          "--reasoning-parser", "gpt_oss", "--tool-call-parser", "openai",
                                          "--enable-auto-tool-choice", "--trust-remote-code", "--disable-log-requests"};
  const auto [models, metrics, sample] = first_sample(flags);
  EXPECT_NE(models.find("\"max_model_len\":1024"), std::string::npos) << models;
  EXPECT_NE(metrics.find("enable_prefix_caching=\"False\""), std::string::npos);
  const auto again = first_sample(flags);
  EXPECT_EQ(std::get<2>(again), sample) << "--seed 7 should repeat the first unseeded sample";
}

}  // namespace
}  // namespace mx::test
