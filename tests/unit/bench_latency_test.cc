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
  const auto clash = test::run_mxserve("bench latency --preset tiny --backend cpu --compare-batched-tokens 8 --compare-overlap");
  EXPECT_EQ(clash.exit_code, 1);
  EXPECT_NE(clash.stderr_text.find("sets the step budgets itself"), std::string::npos);

  const auto experts = test::run_mxserve("bench latency --preset tiny --backend cpu --bf16-experts-decode nosuch");
  EXPECT_EQ(experts.exit_code, 1);
  EXPECT_NE(experts.stderr_text.find("--bf16-experts-decode"), std::string::npos);
  const auto strips = test::run_mxserve("bench latency --preset tiny --backend cpu --skinny-strip-rows 7,16");
  EXPECT_EQ(strips.exit_code, 1);
  EXPECT_NE(strips.stderr_text.find("--skinny-strip-rows must be auto or 8 to 16"), std::string::npos);
  const auto combine = test::run_mxserve("bench latency --preset tiny --backend cpu --moe-decode-combine norm,gemm");
  EXPECT_EQ(combine.exit_code, 1);
  EXPECT_NE(combine.stderr_text.find("--moe-decode-combine must be auto or gemm"), std::string::npos);
  const auto epilogue = test::run_mxserve("bench latency --preset tiny --backend cpu --qkv-rope-epilogue 15,auto");
  EXPECT_EQ(epilogue.exit_code, 1);
  EXPECT_NE(epilogue.stderr_text.find("--qkv-rope-epilogue must be auto, on, off or an even 8 to 16, got 15"),
            std::string::npos);
  const auto fourteen = test::run_mxserve("bench latency --preset tiny --backend cpu --qkv-rope-epilogue 14");
  EXPECT_EQ(fourteen.exit_code, 1);
  EXPECT_EQ(fourteen.stderr_text.find("must be"), std::string::npos) << fourteen.stderr_text;
  EXPECT_NE(fourteen.stderr_text.find("CUDA"), std::string::npos) << fourteen.stderr_text;
  const auto loads = test::run_mxserve("bench latency --preset tiny --backend cpu --moe-wgmma-loads tma,auto");
  EXPECT_EQ(loads.exit_code, 1);
  EXPECT_NE(loads.stderr_text.find("--moe-wgmma-loads must be auto, cp-async, copy-engine or copy-engine-pairs"), std::string::npos);
  const auto rope = test::run_mxserve("bench latency --preset tiny --backend cpu --qkv-rope-form epilogue");
  EXPECT_EQ(rope.exit_code, 1);
  EXPECT_NE(rope.stderr_text.find("--qkv-rope-form must be auto, decode, stream or q-written, got epilogue"), std::string::npos);
  // A known value is checked first, then refused by a build or backend without CUDA.
  const auto pairs = test::run_mxserve("bench latency --preset tiny --backend cpu --moe-wgmma-loads copy-engine-pairs");
  EXPECT_EQ(pairs.exit_code, 1);
  EXPECT_EQ(pairs.stderr_text.find("must be"), std::string::npos) << pairs.stderr_text;
  EXPECT_NE(pairs.stderr_text.find("CUDA"), std::string::npos) << pairs.stderr_text;
  const auto glue = test::run_mxserve("bench latency --preset tiny --backend cpu --moe-wgmma-glue fused,auto");
  EXPECT_EQ(glue.exit_code, 1);
  EXPECT_NE(glue.stderr_text.find("--moe-wgmma-glue must be auto, separate, combine-kernel or combine-in-norm"), std::string::npos);
  const auto two = test::run_mxserve(
      "bench latency --preset tiny --backend cpu --bf16-experts-decode auto,fused --skinny-strip-rows 16,auto");
  EXPECT_EQ(two.exit_code, 1);
  EXPECT_NE(two.stderr_text.find("another flag's several values"), std::string::npos);

  const auto both = test::run_mxserve("bench latency --preset tiny --model x --backend cpu");
  EXPECT_EQ(both.exit_code, 1);
  EXPECT_NE(both.stderr_text.find("exactly one of --model or --preset"), std::string::npos);
  const auto breakdown = test::run_mxserve("bench latency --preset tiny --backend cpu --breakdown");
  EXPECT_EQ(breakdown.exit_code, 1);
  EXPECT_NE(breakdown.stderr_text.find("device timer"), std::string::npos);
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
