// Tensor parallel on the CPU backend: the thread communicator's collectives (rank-order sums, uneven
// gathers, abort), gpt-oss's and Gemma-4's shard plans, and every fixture split over 2, 3 or 4 ranks giving
// the logits (within 1e-5) and greedy tokens of one rank, through `mxserve generate` and `serve`.
#include <gtest/gtest.h>

#include <cmath>
#include <csignal>
#include <cstring>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "backend/cpu/cpu_communicator.h"
#include "core/dtype.h"
#include "engine_test_util.h"
#include "fixture_reference_util.h"
#include "io/safetensors.h"
#include "model/gemma4/gemma4_shard.h"
#include "model/gpt_oss/gpt_oss_shard.h"
#include "serve_process_util.h"
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
// by the ranks of a GQA group when the ranks outnumber the KV heads), its experts (split by expert), its
// lm_head rows.
TEST(GptOssShard, PlansCoverEveryHeadExpertAndVocabularyRowOnce) {
  const GptOssConfig big = config_of(64, 8, 128, 201088);  // gpt-oss-120b
  for (int n : {1, 2, 4, 8}) {
    int64_t next_head = 0, next_expert = 0, next_vocab = 0, o_bias = 0;
    for (int r = 0; r < n; ++r) {
      auto p = plan_gpt_oss_shard(big, ModelShard{r, n}, MoeSplit::kByExpert);
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
  EXPECT_EQ(plan_gpt_oss_shard(config_of(6, 3, 6, 1024), ModelShard{0, 3}, MoeSplit::kByExpert)->vocab, 342);
  EXPECT_EQ(plan_gpt_oss_shard(config_of(6, 3, 6, 1024), ModelShard{2, 3}, MoeSplit::kByExpert)->first_vocab, 683);
  // Two KV heads over four ranks: ranks 0-1 keep KV head 0, ranks 2-3 KV head 1 (their query heads' group).
  for (int r = 0; r < 4; ++r) {
    auto p = plan_gpt_oss_shard(config_of(16, 2, 8, 1024), ModelShard{r, 4}, MoeSplit::kByExpert);
    ASSERT_TRUE(p.is_ok());
    EXPECT_EQ(p->kv_heads, 1);
    EXPECT_EQ(p->first_kv_head, r / 2);
    EXPECT_EQ(p->first_head / 8, p->first_kv_head);  // 8 query heads per KV head
  }
  EXPECT_NE(plan_gpt_oss_shard(config_of(16, 2, 8, 1024), ModelShard{0, 3}, MoeSplit::kByExpert)
                .status()
                .message()
                .find("16 attention heads"),
            std::string::npos);
  EXPECT_NE(plan_gpt_oss_shard(config_of(6, 3, 6, 1024), ModelShard{0, 2}, MoeSplit::kByExpert).status().message().find("3 KV heads"),
            std::string::npos);
  EXPECT_NE(plan_gpt_oss_shard(config_of(8, 2, 6, 1024), ModelShard{0, 4}, MoeSplit::kByExpert).status().message().find("6 experts"),
            std::string::npos);
}

// By intermediate dimension: every rank all the experts and whole 64-channel slices of their 2880 (45 slices:
// the first ranks one more), the down bias on rank 0 only.
TEST(GptOssShard, IntermediateSplitDealsWholeSlicesOfEveryExpert) {
  GptOssConfig big = config_of(64, 8, 128, 201088);  // gpt-oss-120b
  big.intermediate_size = 2880;
  const std::map<int, std::vector<int64_t>> widths = {
      {1, {2880}}, {2, {1472, 1408}}, {4, {768, 704, 704, 704}}, {8, {384, 384, 384, 384, 384, 320, 320, 320}}};
  for (const auto& [n, want] : widths) {
    int64_t next = 0, down_bias = 0;
    for (int r = 0; r < n; ++r) {
      auto p = plan_gpt_oss_shard(big, ModelShard{r, n}, MoeSplit::kByIntermediate);
      ASSERT_TRUE(p.is_ok()) << p.status().to_string();
      EXPECT_EQ(p->moe_split, MoeSplit::kByIntermediate);
      EXPECT_EQ(p->first_expert, 0);
      EXPECT_EQ(p->experts, 128);
      EXPECT_EQ(p->first_intermediate, next);
      EXPECT_EQ(p->intermediate, want[static_cast<size_t>(r)]) << "TP " << n << " rank " << r;
      next += p->intermediate, down_bias += p->adds_down_bias;
    }
    EXPECT_EQ(next, 2880);
    EXPECT_EQ(down_bias, 1);
  }
  // By expert, every rank keeps every channel and its down bias.
  auto by_expert = plan_gpt_oss_shard(big, ModelShard{1, 4}, MoeSplit::kByExpert);
  ASSERT_TRUE(by_expert.is_ok());
  EXPECT_EQ(by_expert->intermediate, 2880);
  EXPECT_TRUE(by_expert->adds_down_bias);
  EXPECT_EQ(by_expert->first_expert, 32);
  EXPECT_EQ(plan_gpt_oss_shard(big, ModelShard{0, 2})->moe_split, MoeSplit::kByIntermediate);  // the default
  // 45 slices cannot feed 64 ranks; 96 channels are not whole slices.
  const std::string too_many = plan_gpt_oss_shard(big, ModelShard{0, 64}, MoeSplit::kByIntermediate).status().message();
  EXPECT_NE(too_many.find("2880 intermediate channels do not split into 64 slices"), std::string::npos) << too_many;
  big.intermediate_size = 96;
  EXPECT_FALSE(plan_gpt_oss_shard(big, ModelShard{0, 2}, MoeSplit::kByIntermediate).is_ok());
  EXPECT_TRUE(plan_gpt_oss_shard(big, ModelShard{0, 2}, MoeSplit::kByExpert).is_ok());
  // Asked for nothing, such a model takes the expert split.
  EXPECT_EQ(plan_gpt_oss_shard(big, ModelShard{0, 2})->moe_split, MoeSplit::kByExpert);
}

// A rank's slice of the experts: gate_up rows 2 first.. (gate/up pairs together), down_proj's blocks of the
// slice in every output row, the down bias or zeros. Copied on one thread (these tensors are far under the
// threshold) and on three (threshold lowered to a byte: 5 experts, or 5 x 64 down_proj rows, split unevenly),
// with the same bytes.
TEST(GptOssShard, SlicedExpertsHoldTheirChannelsOfEveryExpert) {
  const int64_t E = 5, H = 64, I = 128, first = 64, count = 64;
  std::vector<uint8_t> w1b(E * 2 * I * (H / 32) * 16), w1s(E * 2 * I * (H / 32)), w2b(E * H * (I / 32) * 16),
      w2s(E * H * (I / 32));
  std::vector<uint16_t> w1bias(E * 2 * I), w2bias(E * H);
  for (std::vector<uint8_t>* v : {&w1b, &w1s, &w2b, &w2s})
    for (size_t i = 0; i < v->size(); ++i) (*v)[i] = static_cast<uint8_t>(i * 7 + i / 251);
  for (size_t i = 0; i < w1bias.size(); ++i) w1bias[i] = static_cast<uint16_t>(i + 1);
  for (size_t i = 0; i < w2bias.size(); ++i) w2bias[i] = static_cast<uint16_t>(i + 1);
  ExpertWeights whole;
  whole.num_experts = E, whole.hidden = H, whole.intermediate = I;
  whole.w1_blocks = TensorView(w1b.data(), DType::kU8, {E, 2 * I, H / 32, 16});
  whole.w1_scales = TensorView(w1s.data(), DType::kU8, {E, 2 * I, H / 32});
  whole.w1_bias = TensorView(w1bias.data(), DType::kBF16, {E, 2 * I});
  whole.w2_blocks = TensorView(w2b.data(), DType::kU8, {E, H, I / 32, 16});
  whole.w2_scales = TensorView(w2s.data(), DType::kU8, {E, H, I / 32});
  whole.w2_bias = TensorView(w2bias.data(), DType::kBF16, {E, H});
  const auto same_bytes = [](const TensorView& a, const TensorView& b) {
    return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), static_cast<size_t>(a.bytes())) == 0;
  };
  for (bool down_bias : {true, false}) {
    std::vector<std::vector<uint8_t>> storage;
    auto s = slice_expert_intermediate(whole, first, count, down_bias, &storage);
    ASSERT_TRUE(s.is_ok()) << s.status().to_string();
    auto threaded = slice_expert_intermediate(whole, first, count, down_bias, &storage, SliceCopyThreads{1, 3});
    ASSERT_TRUE(threaded.is_ok()) << threaded.status().to_string();
    EXPECT_TRUE(same_bytes(s->w1_blocks, threaded->w1_blocks));
    EXPECT_TRUE(same_bytes(s->w1_scales, threaded->w1_scales));
    EXPECT_TRUE(same_bytes(s->w1_bias, threaded->w1_bias));
    EXPECT_TRUE(same_bytes(s->w2_blocks, threaded->w2_blocks));
    EXPECT_TRUE(same_bytes(s->w2_scales, threaded->w2_scales));
    EXPECT_TRUE(same_bytes(s->w2_bias, threaded->w2_bias));
    EXPECT_EQ(s->intermediate, count);
    EXPECT_EQ(s->w1_blocks.shape(), Shape({E, 2 * count, H / 32, 16}));
    EXPECT_EQ(s->w2_blocks.shape(), Shape({E, H, count / 32, 16}));
    for (int64_t e = 0; e < E; ++e) {
      for (int64_t j = 0; j < 2 * count; ++j) {  // row j of the slice is checkpoint row 2 first + j
        const int64_t src = e * 2 * I + 2 * first + j, dst = e * 2 * count + j;
        ASSERT_EQ(s->w1_blocks.ptr<uint8_t>()[dst * (H / 32) * 16 + 5], w1b[src * (H / 32) * 16 + 5]);
        ASSERT_EQ(s->w1_scales.ptr<uint8_t>()[dst * (H / 32) + 1], w1s[src * (H / 32) + 1]);
        ASSERT_EQ(s->w1_bias.ptr<uint16_t>()[dst], w1bias[src]);
      }
      for (int64_t row = 0; row < H; ++row)
        for (int64_t b = 0; b < count / 32; ++b) {  // block b of the slice is block first / 32 + b
          const int64_t src = (e * H + row) * (I / 32) + first / 32 + b, dst = (e * H + row) * (count / 32) + b;
          ASSERT_EQ(s->w2_blocks.ptr<uint8_t>()[dst * 16 + 15], w2b[src * 16 + 15]);
          ASSERT_EQ(s->w2_scales.ptr<uint8_t>()[dst], w2s[src]);
        }
    }
    EXPECT_EQ(s->w2_bias.ptr<uint16_t>()[E * H - 1], down_bias ? w2bias[E * H - 1] : 0);
  }
  std::vector<std::vector<uint8_t>> storage;
  EXPECT_FALSE(slice_expert_intermediate(whole, 16, 32, true, &storage).is_ok());  // not whole MXFP4 blocks
  EXPECT_FALSE(slice_expert_intermediate(whole, 96, 64, true, &storage).is_ok());  // past the end
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

Generated generate(const std::string& fixture, int tp, MoeSplit split, const test::TempDir& dir) {
  const auto& fx = test::fixture_model(fixture);
  std::string jsonl;
  for (const auto& p : fx.prompts) jsonl += nlohmann::json(p).dump() + "\n";
  test::write_file(dir.file("prompts.jsonl"), jsonl);
  const std::string logits = dir.file("logits-" + std::to_string(tp) + ".safetensors");
  const auto r = test::run_mxserve("generate --model " + test::fixture(fixture) + " --threads 1 --prompt-ids-file " +
                                   dir.file("prompts.jsonl") + " --max-new-tokens 24 --logits-out " + logits +
                                   " --tensor-parallel-size " + std::to_string(tp) + " " + test::moe_split_flag(split));
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
  std::map<std::string, Generated> one_rank;  // by fixture: each runs once, whatever its splits
  for (const test::TensorParallelCase& c : test::kTensorParallelCases) {
    test::TempDir dir;
    if (!one_rank.contains(c.fixture)) one_rank[c.fixture] = generate(c.fixture, 1, MoeSplit::kAuto, dir);
    const Generated& one = one_rank[c.fixture];
    const Generated split = generate(c.fixture, c.tp, c.moe_split, dir);
    const std::string label = c.fixture + " TP " + std::to_string(c.tp) + " " + moe_split_name(c.moe_split);
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
    std::printf("%s: largest logit difference to one rank %.3g (largest logit %.3g)\n", label.c_str(), worst, largest);
    EXPECT_LE(worst, 1e-5 * std::max(1.0, largest)) << label;
    EXPECT_GT(worst, 0.0) << label << ": bit-identical logits, so were the ranks split at all?";
    EXPECT_EQ(one.tokens, split.tokens) << label;
  }
}

TEST(TensorParallel, UnsplittableShapesAndBackendsAreOneLineErrors) {
  const auto three = test::run_mxserve("generate --model " + test::fixture("tiny-gpt-oss") + " --prompt-ids 1,2 --tp 3");
  EXPECT_EQ(three.exit_code, 1);
  EXPECT_NE(three.stderr_text.find("tensor parallel size 3 does not divide the model's 16 attention heads"), std::string::npos)
      << three.stderr_text;
  // The MoE split flags: vLLM's and SGLang's spellings, never both ways at once, SGLang's size 1 or the TP size.
  const std::pair<const char*, const char*> flag_errors[] = {
      {"--tp 2 --enable-expert-parallel --no-enable-expert-parallel", "contradict each other"},
      {"--tp 2 --enable-expert-parallel --ep-size 1", "--expert-parallel-size 1 contradicts --enable-expert-parallel"},
      {"--tp 4 --expert-parallel-size 2", "--expert-parallel-size must be 1 (the MoE split by intermediate dimension) "
                                          "or the tensor-parallel size 4 (split by expert), got 2"},
      {"--enable-expert-parallel", "--enable-expert-parallel needs --tensor-parallel-size 2 or more"}};
  for (const auto& [flags, error] : flag_errors) {
    const auto r = test::run_mxserve("generate --model " + test::fixture("tiny-gpt-oss") + " --prompt-ids 1,2 " + flags);
    EXPECT_EQ(r.exit_code, 1) << flags;
    EXPECT_NE(r.stderr_text.find(error), std::string::npos) << flags << ": " << r.stderr_text;
  }
  const auto gemma = test::run_mxserve("generate --model " + test::fixture("tiny-gemma4") +
                                       " --prompt-ids 1,2 --tp 2 --enable-expert-parallel");
  EXPECT_EQ(gemma.exit_code, 1);
  EXPECT_NE(gemma.stderr_text.find("Gemma-4's experts split by the intermediate dimension only"), std::string::npos)
      << gemma.stderr_text;
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
