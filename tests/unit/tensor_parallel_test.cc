// Tensor parallel on the CPU backend: the thread communicator's collectives (rank-order sums, uneven
// gathers, abort), gpt-oss's and Gemma-4's shard plans, and every fixture split over 2, 3 or 4 ranks giving
// the logits (within 1e-5) and greedy tokens of one rank, through `mxserve generate` and `serve`.
#include <gtest/gtest.h>

#include <cmath>
#include <csignal>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <thread>

#include "backend/cpu/cpu_communicator.h"
#include "core/dtype.h"
#include "engine_test_util.h"
#include "fixture_reference_util.h"
#include "io/safetensors.h"
#include "model/gemma4/gemma4_shard.h"
#include "model/gpt_oss/gpt_oss_shard.h"
#include "server_test_util.h"
#include "test_util.h"

namespace mx {
namespace {

// Runs fn(rank, communicator) on one thread per rank.
void on_ranks(CpuCommGroup& group, const std::function<void(int, Communicator&)>& fn) {
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < group.size(); ++r) comms.push_back(group.communicator(r));
  std::vector<std::thread> threads;
  for (int r = 0; r < group.size(); ++r) threads.emplace_back([&, r] { fn(r, *comms[static_cast<size_t>(r)]); });
  for (auto& t : threads) t.join();
}

TEST(CpuCommunicator, AllReduceGivesEveryRankTheRankOrderSum) {
  auto owner = CpuCommGroup::create(3);
  CpuCommGroup& group = *owner;
  std::vector<std::vector<float>> f32(3);
  std::vector<std::vector<uint16_t>> bf16(3);
  for (int r = 0; r < 3; ++r) {
    for (int i = 0; i < 1000; ++i) {
      f32[r].push_back(std::sin(static_cast<float>(i * (r + 1))) * 1e3f + 1e-4f * static_cast<float>(r));
      bf16[r].push_back(f32_to_bf16(static_cast<float>(i % 17) * 0.25f * static_cast<float>(r + 1)));
    }
  }
  const auto want_f32 = [&](int i) { return (f32[0][i] + f32[1][i]) + f32[2][i]; };
  const auto want_bf16 = [&](int i) {
    return f32_to_bf16((bf16_to_f32(bf16[0][i]) + bf16_to_f32(bf16[1][i])) + bf16_to_f32(bf16[2][i]));
  };
  std::vector<float> sums(1000);
  std::vector<uint16_t> sums_bf16(1000);
  for (int i = 0; i < 1000; ++i) sums[i] = want_f32(i), sums_bf16[i] = want_bf16(i);
  on_ranks(group, [&](int r, Communicator& c) {
    EXPECT_EQ(c.rank(), r);
    EXPECT_EQ(c.size(), 3);
    EXPECT_TRUE(c.all_reduce_sum(TensorView(f32[r].data(), DType::kF32, {10, 100})).is_ok());
    EXPECT_TRUE(c.all_reduce_sum(TensorView(bf16[r].data(), DType::kBF16, {1000})).is_ok());
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(f32[r], sums) << "rank " << r;  // the same bits everywhere
    EXPECT_EQ(bf16[r], sums_bf16) << "rank " << r;
  }
}

TEST(CpuCommunicator, AllGatherPutsUnevenBlocksSideBySide) {
  auto owner = CpuCommGroup::create(3);
  CpuCommGroup& group = *owner;
  const int64_t rows = 4, widths[] = {3, 2, 2}, total = 7;  // as split_range splits 7 over 3
  std::vector<std::vector<float>> local(3), out(3, std::vector<float>(rows * total, -1.0f));
  for (int r = 0; r < 3; ++r)
    for (int64_t i = 0; i < rows * widths[r]; ++i) local[r].push_back(static_cast<float>(100 * r + i));
  on_ranks(group, [&](int r, Communicator& c) {
    EXPECT_TRUE(c.all_gather_columns(TensorView(local[r].data(), DType::kF32, {rows, widths[r]}),
                                     TensorView(out[r].data(), DType::kF32, {rows, total}))
                    .is_ok());
  });
  for (int r = 0; r < 3; ++r) {
    for (int64_t i = 0; i < rows; ++i) {
      EXPECT_EQ(out[r][i * total + 0], static_cast<float>(i * 3));       // rank 0's row i, column 0
      EXPECT_EQ(out[r][i * total + 4], static_cast<float>(100 + i * 2 + 1));  // rank 1's column 1
      EXPECT_EQ(out[r][i * total + 6], static_cast<float>(200 + i * 2 + 1));  // rank 2's column 1
    }
  }
  // A wrong output shape fails on every rank instead of hanging the others.
  std::vector<Status> st(3);
  on_ranks(group, [&](int r, Communicator& c) {
    st[r] = c.all_gather_columns(TensorView(local[r].data(), DType::kF32, {rows, widths[r]}),
                                 TensorView(out[r].data(), DType::kF32, {rows, total - 1}));
  });
  for (const Status& s : st) EXPECT_FALSE(s.is_ok());
}

TEST(CpuCommunicator, AbortWakesTheRanksWaitingAndResetStartsAgain) {
  auto owner = CpuCommGroup::create(3);
  CpuCommGroup& group = *owner;
  std::vector<float> x(3 * 8, 1.0f);
  std::vector<Status> st(3);
  on_ranks(group, [&](int r, Communicator& c) {
    if (r == 2) {
      c.abort();  // this rank failed before the collective
      return;
    }
    st[r] = c.all_reduce_sum(TensorView(x.data() + 8 * r, DType::kF32, {8}));
  });
  EXPECT_EQ(st[0].message(), kTensorParallelAborted);
  EXPECT_EQ(st[1].message(), kTensorParallelAborted);
  group.reset();
  on_ranks(group, [&](int r, Communicator& c) { st[r] = c.all_reduce_sum(TensorView(x.data() + 8 * r, DType::kF32, {8})); });
  for (const Status& s : st) EXPECT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_EQ(x[0], 3.0f);
}

GptOssConfig config_of(int64_t heads, int64_t kv_heads, int64_t experts, int64_t vocab) {
  GptOssConfig c;
  c.num_heads = heads;
  c.num_kv_heads = kv_heads;
  c.num_experts = experts;
  c.vocab_size = vocab;
  return c;
}

// Every weight a rank keeps: its heads' q rows, sinks and o_proj columns, its KV heads' k and v rows (shared
// by the ranks of a GQA group when the ranks outnumber the KV heads), its experts, its lm_head rows.
TEST(GptOssShard, PlansCoverEveryHeadExpertAndVocabularyRowOnce) {
  const GptOssConfig big = config_of(64, 8, 128, 201088);  // gpt-oss-120b
  for (int n : {1, 2, 4, 8}) {
    int64_t next_head = 0, next_expert = 0, next_vocab = 0, o_bias = 0;
    for (int r = 0; r < n; ++r) {
      auto p = plan_gpt_oss_shard(big, ModelShard{r, n});
      ASSERT_TRUE(p.is_ok()) << p.status().to_string();
      EXPECT_EQ(p->first_head, next_head);
      EXPECT_EQ(p->heads, 64 / n);
      EXPECT_EQ(p->kv_heads, 8 / n);
      EXPECT_EQ(p->first_kv_head, r * (8 / n));
      EXPECT_EQ(p->first_expert, next_expert);
      EXPECT_EQ(p->first_vocab, next_vocab);
      next_head += p->heads, next_expert += p->experts, next_vocab += p->vocab, o_bias += p->adds_o_bias;
    }
    EXPECT_EQ(next_head, 64);
    EXPECT_EQ(next_expert, 128);
    EXPECT_EQ(next_vocab, 201088);
    EXPECT_EQ(o_bias, 1);
  }
  // Uneven vocabulary: 1500 over 4 ranks is 375 each; 1024 over 3 is 342, 341, 341.
  EXPECT_EQ(plan_gpt_oss_shard(config_of(6, 3, 6, 1024), ModelShard{0, 3})->vocab, 342);
  EXPECT_EQ(plan_gpt_oss_shard(config_of(6, 3, 6, 1024), ModelShard{2, 3})->first_vocab, 683);
  // Two KV heads over four ranks: ranks 0-1 keep KV head 0, ranks 2-3 KV head 1 (their query heads' group).
  for (int r = 0; r < 4; ++r) {
    auto p = plan_gpt_oss_shard(config_of(16, 2, 8, 1024), ModelShard{r, 4});
    ASSERT_TRUE(p.is_ok());
    EXPECT_EQ(p->kv_heads, 1);
    EXPECT_EQ(p->first_kv_head, r / 2);
    EXPECT_EQ(p->first_head / 8, p->first_kv_head);  // 8 query heads per KV head
  }
  EXPECT_NE(plan_gpt_oss_shard(config_of(16, 2, 8, 1024), ModelShard{0, 3}).status().message().find("16 attention heads"),
            std::string::npos);
  EXPECT_NE(plan_gpt_oss_shard(config_of(6, 3, 6, 1024), ModelShard{0, 2}).status().message().find("3 KV heads"),
            std::string::npos);
  EXPECT_NE(plan_gpt_oss_shard(config_of(8, 2, 6, 1024), ModelShard{0, 4}).status().message().find("6 experts"),
            std::string::npos);
}

// Gemma-4 26B-A4B's shapes: 16 query heads; sliding layers 8 KV heads, full layers 2 (replicated past TP 2);
// dense MLP 2112 wide, experts 704 (split as evenly as they go, so any size that divides the heads works).
TEST(Gemma4Shard, PlansCoverEveryHeadIntermediateAndVocabularyRowOnce) {
  Gemma4Config c;
  c.num_heads = 16;
  c.layer_kv_heads = {8, 8, 8, 8, 8, 2};
  c.layer_is_sliding = {true, true, true, true, true, false};
  c.intermediate_size = 2112;
  c.moe = true;
  c.moe_intermediate_size = 704;
  c.vocab_size = 262144;
  for (int n : {1, 2, 4, 8}) {
    int64_t next_head = 0, next_i = 0, next_m = 0, next_vocab = 0;
    for (int r = 0; r < n; ++r) {
      auto p = plan_gemma4_shard(c, ModelShard{r, n});
      ASSERT_TRUE(p.is_ok()) << p.status().to_string();
      EXPECT_EQ(p->first_head, next_head);
      EXPECT_EQ(p->heads, 16 / n);
      EXPECT_EQ(p->kv_heads[0], 8 / n);
      EXPECT_EQ(p->first_kv_head[0], r * (8 / n));
      // Full layers: 2 KV heads; past TP 2 each serves the ranks whose query heads are in its group.
      EXPECT_EQ(p->kv_heads[5], std::max(1, 2 / n));
      EXPECT_EQ(p->first_kv_head[5], n <= 2 ? r * (2 / n) : r / (n / 2));
      EXPECT_EQ(p->first_head / 8, p->first_kv_head[5]);  // 8 query heads per full-layer KV head
      EXPECT_EQ(p->first_intermediate, next_i);
      EXPECT_EQ(p->first_expert_intermediate, next_m);
      EXPECT_EQ(p->first_vocab, next_vocab);
      next_head += p->heads, next_i += p->intermediate, next_m += p->expert_intermediate, next_vocab += p->vocab;
    }
    EXPECT_EQ(next_head, 16);
    EXPECT_EQ(next_i, 2112);
    EXPECT_EQ(next_m, 704);
    EXPECT_EQ(next_vocab, 262144);
  }
  // Slices of 8 (CUDA's experts need them) where each rank gets one: 24 over 2 is 16 + 8; over 4, 6 each.
  c.moe_intermediate_size = 24;
  EXPECT_EQ(plan_gemma4_shard(c, ModelShard{0, 2})->expert_intermediate, 16);
  EXPECT_EQ(plan_gemma4_shard(c, ModelShard{1, 2})->first_expert_intermediate, 16);
  EXPECT_EQ(plan_gemma4_shard(c, ModelShard{3, 4})->expert_intermediate, 6);
  EXPECT_NE(plan_gemma4_shard(c, ModelShard{0, 3}).status().message().find("16 attention heads"), std::string::npos);
  c.num_heads = 24;  // divisible by 3, but 8 and 2 KV heads are not
  EXPECT_NE(plan_gemma4_shard(c, ModelShard{0, 3}).status().message().find("8 KV heads"), std::string::npos);
  c.num_heads = 16;
  c.moe_intermediate_size = 2;
  EXPECT_NE(plan_gemma4_shard(c, ModelShard{0, 4}).status().message().find("exceeds the model's MLP widths"),
            std::string::npos);
}

struct Generated {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<float>> logits;  // each prompt's prompt logits
};

Generated generate(const std::string& fixture, int tp, const test::TempDir& dir) {
  const auto& fx = test::fixture_model(fixture);
  std::string jsonl;
  for (const auto& p : fx.prompts) jsonl += nlohmann::json(p).dump() + "\n";
  test::write_file(dir.file("prompts.jsonl"), jsonl);
  const std::string logits = dir.file("logits-" + std::to_string(tp) + ".safetensors");
  const auto r = test::run_mxserve("generate --model " + test::fixture(fixture) + " --threads 1 --prompt-ids-file " +
                                   dir.file("prompts.jsonl") + " --max-new-tokens 24 --logits-out " + logits +
                                   " --tensor-parallel-size " + std::to_string(tp));
  EXPECT_EQ(r.exit_code, 0) << r.stderr_text;
  Generated g;
  std::istringstream lines(r.stdout_text);
  for (std::string line; std::getline(lines, line);)
    g.tokens.push_back(nlohmann::json::parse(line)["output_ids"].get<std::vector<int32_t>>());
  auto file = Checkpoint::open_file(logits);
  EXPECT_TRUE(file.is_ok()) << file.status().to_string();
  if (!file.is_ok()) return g;
  for (size_t i = 0; i < fx.prompts.size(); ++i) {
    auto t = file->get("prompt_" + std::to_string(i) + "_logits");
    EXPECT_TRUE(t.is_ok());
    if (!t.is_ok()) continue;
    const auto* p = t->ptr<const float>();
    g.logits.emplace_back(p, p + t->numel());
  }
  return g;
}

TEST(TensorParallel, EveryFixtureSplitGivesTheLogitsAndTokensOfOneRank) {
  for (const test::TensorParallelCase& c : test::kTensorParallelCases) {
    test::TempDir dir;
    const Generated one = generate(c.fixture, 1, dir), split = generate(c.fixture, c.tp, dir);
    ASSERT_EQ(one.logits.size(), split.logits.size());
    ASSERT_FALSE(one.logits.empty());
    // Within 1e-5 of one rank's logits, relative to the largest of them (fp32 sums in another order; Gemma-4's
    // logits reach the soft cap's tens).
    double worst = 0, largest = 0;
    for (size_t i = 0; i < one.logits.size(); ++i) {
      ASSERT_EQ(one.logits[i].size(), split.logits[i].size());
      for (size_t j = 0; j < one.logits[i].size(); ++j) {
        worst = std::max(worst, static_cast<double>(std::fabs(one.logits[i][j] - split.logits[i][j])));
        largest = std::max(largest, static_cast<double>(std::fabs(one.logits[i][j])));
      }
    }
    std::printf("%s TP %d: largest logit difference to one rank %.3g (largest logit %.3g)\n", c.fixture.c_str(), c.tp, worst,
                largest);
    EXPECT_LE(worst, 1e-5 * std::max(1.0, largest)) << c.fixture << " TP " << c.tp;
    EXPECT_GT(worst, 0.0) << c.fixture << " TP " << c.tp << ": bit-identical logits, so were the ranks split at all?";
    EXPECT_EQ(one.tokens, split.tokens) << c.fixture << " TP " << c.tp;
  }
}

TEST(TensorParallel, UnsplittableShapesAndBackendsAreOneLineErrors) {
  const auto three = test::run_mxserve("generate --model " + test::fixture("tiny-gpt-oss") + " --prompt-ids 1,2 --tp 3");
  EXPECT_EQ(three.exit_code, 1);
  EXPECT_NE(three.stderr_text.find("tensor parallel size 3 does not divide the model's 16 attention heads"), std::string::npos)
      << three.stderr_text;
  const auto tpu = test::run_mxserve("generate --model " + test::fixture("tiny-gpt-oss") + " --prompt-ids 1,2 --tp 2 --backend tpu");
  EXPECT_EQ(tpu.exit_code, 1);
  EXPECT_NE(tpu.stderr_text.find("tensor parallel runs on the cpu and cuda backends, not tpu"), std::string::npos)
      << tpu.stderr_text;
}

// bench latency splits a model directory too; a synthetic preset (made in memory, one copy) cannot be.
TEST(TensorParallel, BenchLatencyRunsOnRanks) {
  const auto r = test::run_mxserve("bench latency --model " + test::fixture("tiny-gpt-oss") +
                                   " --backend cpu --threads 1 --batch-size 1,3 --input-len 12 --output-len 6 --tp 2");
  EXPECT_EQ(r.exit_code, 0) << r.stderr_text;
  EXPECT_NE(r.stdout_text.find("TPOT"), std::string::npos) << r.stdout_text;
  const auto preset = test::run_mxserve("bench latency --preset tiny --tp 2");
  EXPECT_EQ(preset.exit_code, 1);
  EXPECT_NE(preset.stderr_text.find("--tensor-parallel-size needs --model"), std::string::npos) << preset.stderr_text;
}

// The server on two ranks answers like any other (the demo model: one KV head, replicated on both ranks).
TEST(TensorParallel, ServeOnTwoRanksAnswers) {
  auto [pid, port] = test::start_serve({"--tp", "2"});
  ASSERT_GT(port, 0);
  const auto reply = test::http_call(port, "POST", "/v1/chat/completions",
                                     R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":6})");
  EXPECT_EQ(reply.status, 200) << reply.body;
  const auto j = nlohmann::json::parse(reply.body);
  EXPECT_EQ(j["usage"]["completion_tokens"], 6);
  kill(pid, SIGTERM);
  EXPECT_EQ(test::wait_exit(pid), 0);
}

}  // namespace
}  // namespace mx
