// `mxserve bench latency` on the CPU backend with the tiny preset (the contract of its JSON; speed is
// measured on GPUs only), the floors' cost model against PERF-GOALS.md's byte counts, and the default
// CUDA graph batch sizes.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "model/gpt_oss/gpt_oss_cost.h"
#include "model/gpt_oss/gpt_oss_synthetic.h"
#include "runtime/engine_config.h"
#include "test_util.h"

namespace mx {
namespace {

TEST(BenchLatencyCli, WritesOneResultPerBatchSizeWithFloors) {
  test::TempDir dir;
  // Two prompt lengths; 3 x (40 + 6) tokens do not fit a 128-token pool, so that pair is skipped, not run in waves.
  const auto r = test::run_mxserve("bench latency --preset tiny --backend cpu --threads 2 --batch-size 1,3 --input-len 12,40"
                                   " --output-len 6 --max-num-batched-tokens 16 --num-kv-pages 8 --json " + dir.file("out.json"));
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  const auto j = nlohmann::json::parse(test::read_file(dir.file("out.json")));
  EXPECT_EQ(j["bench"], "latency");
  EXPECT_EQ(j["model"], "preset:tiny");
  ASSERT_EQ(j["results"].size(), 3u);
  for (const auto& res : j["results"]) {
    EXPECT_GT(res["ttft_ms_mean"].get<double>(), 0);
    EXPECT_GT(res["tpot_ms_median"].get<double>(), 0);
    EXPECT_GT(res["decode_floor_ms"].get<double>(), 0);
    EXPECT_GT(res["prefill_floor_ms"].get<double>(), 0);
    EXPECT_GT(res["decode_steps_measured"].get<int64_t>(), 0);
  }
  EXPECT_EQ(j["results"][1]["batch_size"], 3);
  EXPECT_EQ(j["results"][1]["input_len"], 12);
  EXPECT_EQ(j["results"][2]["batch_size"], 1);
  EXPECT_EQ(j["results"][2]["input_len"], 40);
  ASSERT_EQ(j["skipped"].size(), 1u);
  EXPECT_EQ(j["skipped"][0]["batch_size"], 3);
  EXPECT_EQ(j["skipped"][0]["kv_tokens_in_pool"], 128);
  EXPECT_GT(j["startup"]["kv_tokens"].get<int64_t>(), 0);
  EXPECT_NE(r.stdout_text.find("TPOT ms"), std::string::npos);

  // --compare-batched-tokens: every batch once per step budget; the smaller budget prefills in more steps.
  const auto budgets = test::run_mxserve("bench latency --preset tiny --backend cpu --threads 2 --batch-size 2 --input-len 12"
                                         " --output-len 3 --compare-batched-tokens 8,24 --num-kv-pages 8 --json " +
                                         dir.file("budgets.json"));
  ASSERT_EQ(budgets.exit_code, 0) << budgets.stderr_text;
  const auto jb = nlohmann::json::parse(test::read_file(dir.file("budgets.json")));
  ASSERT_EQ(jb["results"].size(), 2u);
  EXPECT_EQ(jb["results"][0]["max_num_batched_tokens"], 8);
  EXPECT_EQ(jb["results"][1]["max_num_batched_tokens"], 24);
  EXPECT_GT(jb["results"][0]["engine_steps"].get<int64_t>(), jb["results"][1]["engine_steps"].get<int64_t>());
  EXPECT_NE(budgets.stdout_text.find("step budget 8 tokens"), std::string::npos);
  // --compare-host-sampling: every batch twice, its host-sampled request taking the whole step to the host, then alone.
  const auto host = test::run_mxserve("bench latency --preset tiny --backend cpu --threads 2 --batch-size 3 --input-len 12"
                                      " --output-len 4 --num-kv-pages 8 --host-sampled-requests 1 --compare-host-sampling"
                                      " --json " + dir.file("host.json"));
  ASSERT_EQ(host.exit_code, 0) << host.stderr_text;
  const auto jh = nlohmann::json::parse(test::read_file(dir.file("host.json")));
  ASSERT_EQ(jh["results"].size(), 2u);
  EXPECT_EQ(jh["results"][0]["whole_batch_host_sampling"], true);
  EXPECT_EQ(jh["results"][1]["whole_batch_host_sampling"], false);
  EXPECT_EQ(jh["results"][1]["host_sampled_requests"], 1);
  EXPECT_NE(host.stdout_text.find("only the host rows on the host"), std::string::npos);
  // A refused command exits 1 and names the problem on stderr.
  const auto refused = [](const std::string& args, const std::string& message) {
    const auto r = test::run_mxserve(args);
    EXPECT_EQ(r.exit_code, 1) << args;
    EXPECT_NE(r.stderr_text.find(message), std::string::npos) << args << "\n" << r.stderr_text;
  };
  // A known value passes the check and is then refused by a build or backend without CUDA.
  const auto needs_cuda = [](const std::string& args) {
    const auto r = test::run_mxserve(args);
    EXPECT_EQ(r.exit_code, 1) << args;
    EXPECT_EQ(r.stderr_text.find("must be"), std::string::npos) << args << "\n" << r.stderr_text;
    EXPECT_NE(r.stderr_text.find("CUDA"), std::string::npos) << args << "\n" << r.stderr_text;
  };
  refused("bench latency --preset tiny --backend cpu --compare-batched-tokens 8 --compare-overlap",
          "sets the step budgets itself");
  refused("bench latency --preset tiny --backend cpu --compare-host-sampling", "needs --host-sampled-requests");
  // Every value is checked before the first is applied (which a CPU backend would refuse).
  refused("bench latency --preset tiny --backend cpu --bf16-experts-decode auto,nosuch",
          "--bf16-experts-decode must be auto, rows, register-loads, bulk-copies, streamed or fused, got nosuch");

  refused("bench latency --preset tiny --backend cpu --bf16-experts-decode nosuch", "--bf16-experts-decode");
  refused("bench latency --preset tiny --backend cpu --skinny-strip-rows 7,16",
          "--skinny-strip-rows must be auto or 8 to 16");
  refused("bench latency --preset tiny --backend cpu --moe-decode-combine norm,gemm",
          "--moe-decode-combine must be auto, norm-wait-first, gemm, norm-inputs-after-wait or norm-route-apart");
  refused("bench latency --preset tiny --backend cpu --moe-decode-form staged",
          "--moe-decode-form must be auto, registers, session20, session21 or session23");
  needs_cuda("bench latency --preset tiny --backend cpu --moe-decode-form registers");
  needs_cuda("bench latency --preset tiny --backend cpu --moe-decode-form session20");
  needs_cuda("bench latency --preset tiny --backend cpu --moe-decode-form session21");
  needs_cuda("bench latency --preset tiny --backend cpu --moe-decode-form session23");
  refused("bench latency --preset tiny --backend cpu --qkv-rope-epilogue 15,auto",
          "--qkv-rope-epilogue must be auto, on, fp8, off or an even 8 to 16, got 15");
  needs_cuda("bench latency --preset tiny --backend cpu --qkv-rope-epilogue fp8");
  needs_cuda("bench latency --preset tiny --backend cpu --qkv-rope-epilogue 14");
  refused("bench latency --preset tiny --backend cpu --skinny-decode-form session21,inputs-first+prefetch",
          "--skinny-decode-form must be auto, session21 or even-strips, inputs-first, persistent, fp8-staged, "
          "staged-head, qkv-staged joined by '+', got "
          "inputs-first+prefetch");
  refused("bench latency --preset tiny --backend cpu --skinny-decode-form even-strips+even-strips", "joined by '+'");
  needs_cuda("bench latency --preset tiny --backend cpu --skinny-decode-form even-strips+inputs-first");
  refused("bench latency --preset tiny --backend cpu --moe-wgmma-loads tma,auto",
          "--moe-wgmma-loads must be auto, cp-async, copy-engine or copy-engine-pairs");
  refused("bench latency --preset tiny --backend cpu --qkv-rope-form epilogue",
          "--qkv-rope-form must be auto, decode, stream or q-written, got epilogue");
  needs_cuda("bench latency --preset tiny --backend cpu --moe-wgmma-loads copy-engine-pairs");
  refused("bench latency --preset tiny --backend cpu --moe-wgmma-glue fused,auto",
          "--moe-wgmma-glue must be auto, separate, combine-kernel or combine-in-norm");
  refused("bench latency --preset tiny --backend cpu --moe-wgmma-order widest,auto",
          "--moe-wgmma-order must be auto, wide-first or expert-order");
  needs_cuda("bench latency --preset tiny --backend cpu --moe-wgmma-order expert-order");
  refused("bench latency --preset tiny --backend cpu --moe-wgmma-prefill-loads tma",
          "--moe-wgmma-prefill-loads must be auto, cp-async, copy-engine, copy-engine-mid, copy-engine-96 or "
          "copy-engine-256");
  needs_cuda("bench latency --preset tiny --backend cpu --moe-wgmma-prefill-loads copy-engine");
  refused("bench latency --preset tiny --backend cpu --bf16-experts-decode auto,fused --skinny-strip-rows 16,auto",
          "another flag's several values");

  refused("bench latency --preset tiny --model x --backend cpu", "exactly one of --model or --preset");
  refused("bench latency --preset tiny --backend cpu --breakdown", "device timer");
  const auto unknown = test::run_mxserve("bench nosuch");
  EXPECT_EQ(unknown.exit_code, 2);
}

TEST(GptOssCost, DecodeBytesMatchPerfGoals) {
  // PERF-GOALS.md: 3.708 GB (20b) and 5.003 GB (120b) of weights per decoded token at batch 1.
  for (const auto& [preset, want] : {std::pair{"gpt-oss-20b", 3.708e9}, std::pair{"gpt-oss-120b", 5.003e9}}) {
    const GptOssConfig c = *gpt_oss_preset(preset);
    const DecodeStepBytes b = decode_step_bytes(c, 1, 4, 1);
    EXPECT_NEAR(b.dense + b.experts, want, 0.01 * want) << preset;
  }
  const GptOssConfig c = *gpt_oss_preset("gpt-oss-20b");
  // KV at 1K context: 12 full layers x 1024 keys + 12 sliding x 128, K and V, 8 x 64 bf16.
  EXPECT_DOUBLE_EQ(decode_step_bytes(c, 2, 4, 1024).kv, 2.0 * (12 * 1024 + 12 * 128) * 2 * 512 * 2);
  EXPECT_NEAR(expected_distinct_experts(32, 4, 1), 4.0, 1e-9);
  EXPECT_NEAR(expected_distinct_experts(32, 4, 1000), 32.0, 1e-6);
  // 20b is ~3.6B active parameters per token of which ~0.58B embedding/lm_head: ~6.1 GFLOP per prompt token.
  const double per_token = prefill_flops(c, 1024, 1) / 1024;
  EXPECT_GT(per_token, 6.0e9);
  EXPECT_LT(per_token, 6.6e9);
}

TEST(EngineConfig, CudaGraphBatchSizes) {
  EngineConfig c;
  c.max_running_requests = 100;
  EXPECT_EQ(cuda_graph_batch_sizes(c),
            (std::vector<int64_t>{1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 100}));  // 112.. become 100
  c.max_running_requests = 1024;
  EXPECT_EQ(cuda_graph_batch_sizes(c).back(), 512);
  c.max_num_batched_tokens = 4;
  EXPECT_EQ(cuda_graph_batch_sizes(c), (std::vector<int64_t>{1, 2, 4}));
  c.cuda_graph_batch_sizes = {8, 3, 3, 1};
  EXPECT_EQ(cuda_graph_batch_sizes(c), (std::vector<int64_t>{1, 3, 4}));
  c.cuda_graph_batch_sizes = {1, 2};  // none above the cap: the list as given
  EXPECT_EQ(cuda_graph_batch_sizes(c), (std::vector<int64_t>{1, 2}));
}

}  // namespace
}  // namespace mx
