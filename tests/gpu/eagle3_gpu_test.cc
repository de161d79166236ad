// EAGLE-3 on CUDA against the CPU twin: the ops it adds (silu_mul, convert) on odd sizes, and the drafter's
// forward passes (the fused target hidden states, the extend over several sequences, the chain) on the
// tiny-gpt-oss-eagle3 draft, compared on the logits and pre-norm hidden state of the last pass; and the
// drafter's chain replayed from CUDA graphs against its eager chain on CUDA.
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gpu_test_util.h"
#include "model/eagle3/eagle3_drafter.h"
#include "model/eagle3/eagle3_synthetic.h"

namespace mx::gpu_test {
namespace {

constexpr int64_t kTinyHidden = 256, kTinyVocab = 1024, kTinyLayers = 4;  // the tiny target the draft fits

TEST(Eagle3Gpu, SiluMul) {
  Arena cpu(cpu_backend()), cuda(cuda_backend());
  std::mt19937 rng(test_seed());
  for (const auto& [rows, cols, in_place] :
       {std::tuple<int64_t, int64_t, bool>{5, 17280, false}, {37, 67, false}, {3, 96, true}, {1, 9, true}}) {
    Bf16Data g = random_bf16(rng, rows * cols, 3.0f), u = random_bf16(rng, rows * cols, 1.0f);
    Pair pg = upload_activation(cpu, cuda, g, {rows, cols}), pu = upload_activation(cpu, cuda, u, {rows, cols});
    TensorView o_c = in_place ? pg.cpu : cpu.make(DType::kF32, {rows, cols});
    TensorView o_g = in_place ? pg.cuda : cuda.make(DType::kBF16, {rows, cols});
    ASSERT_TRUE(cpu_backend().silu_mul(pg.cpu, pu.cpu, o_c).is_ok());
    ASSERT_TRUE(cuda_backend().silu_mul(pg.cuda, pu.cuda, o_g).is_ok());
    check("silu_mul", std::to_string(rows) + "x" + std::to_string(cols) + (in_place ? " in place" : ""),
          cuda.download_f32(o_g), cpu.download_f32(o_c), 5e-3);
  }
}

TEST(Eagle3Gpu, Convert) {
  Arena cpu(cpu_backend()), cuda(cuda_backend());
  std::mt19937 rng(test_seed());
  std::normal_distribution<float> d(0.0f, 10.0f);
  for (int64_t n : {int64_t{1}, int64_t{1001}, int64_t{3 * 2880 * 7}}) {
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x) v = d(rng);
    TensorView xc = cpu.upload(DType::kF32, {n}, x.data()), xg = cuda.upload(DType::kF32, {n}, x.data());
    TensorView bc = cpu.make(DType::kBF16, {n}), bg = cuda.make(DType::kBF16, {n});
    ASSERT_TRUE(cpu_backend().convert(xc, bc).is_ok());
    ASSERT_TRUE(cuda_backend().convert(xg, bg).is_ok());
    EXPECT_EQ(cuda.download_bytes(bg), cpu.download_bytes(bc)) << "f32 -> bf16, n " << n;  // RNE both sides
    TensorView back = cuda.make(DType::kF32, {n});
    ASSERT_TRUE(cuda_backend().convert(bg, back).is_ok());
    check("convert", "f32 -> bf16 -> f32 n " + std::to_string(n), cuda.download_f32(back), x, 4e-3);
  }
}

// The tiny-gpt-oss-eagle3 draft on `b` over a random target embedding (the same for every backend: `embed`).
std::unique_ptr<Eagle3Model> load_tiny_draft(Backend& b, Arena& arena, const Bf16Data& embed) {
  auto config = eagle3_preset("tiny-gpt-oss-eagle3");
  EXPECT_TRUE(config.is_ok());
  const TensorView table = arena.upload(DType::kBF16, {kTinyVocab, kTinyHidden}, embed.bits.data());
  auto ck = eagle3_checkpoint_in_memory(*config, SyntheticOptions{});
  EXPECT_TRUE(ck.is_ok());
  auto m = Eagle3Model::from_checkpoint(*config, std::move(*ck), b, Eagle3Target{kTinyLayers, kTinyHidden, kTinyVocab, table, {}, {}});
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  return std::move(*m);
}

std::unique_ptr<Eagle3Drafter> make_drafter(const Eagle3Model& m, int64_t page_size) {
  auto d = Eagle3Drafter::create(m, Eagle3DrafterLimits{64, 4});
  EXPECT_TRUE(d.is_ok()) << d.status().to_string();
  EXPECT_TRUE((*d)->attach_pool(Eagle3DraftPool{32, page_size}).is_ok());
  return std::move(*d);
}

// The same random captures of `rows` target rows into each drafter.
void capture_random(std::mt19937& rng, int64_t rows, std::initializer_list<std::pair<Eagle3Drafter*, Arena*>> into) {
  for (int64_t index = 0; index <= kTinyLayers; ++index) {
    Bf16Data s = random_bf16(rng, rows * kTinyHidden, 1.0f);
    for (const auto& [d, arena] : into) d->capture_observer()(index, arena->upload(DType::kF32, {rows, kTinyHidden}, s.values.data()));
  }
}

// One drafter per backend over the same steps: 3 sequences (prefill rows, a one-row decode, 2 verified
// rows), K = 3, the captured streams random.
TEST(Eagle3Gpu, DrafterPassesMatchTheCpu) {
  std::mt19937 rng(test_seed());
  const int64_t V = kTinyVocab;
  Bf16Data embed = random_bf16(rng, V * kTinyHidden, 1.0f);
  Arena cpu(cpu_backend()), cuda(cuda_backend());
  auto cpu_model = load_tiny_draft(cpu_backend(), cpu, embed), cuda_model = load_tiny_draft(cuda_backend(), cuda, embed);
  auto on_cpu = make_drafter(*cpu_model, 16), on_cuda = make_drafter(*cuda_model, 16);

  const int64_t T = 24;  // target rows of the step: 21 prefill rows, 1 decode row, 2 verified rows
  capture_random(rng, T, {{on_cpu.get(), &cpu}, {on_cuda.get(), &cuda}});
  std::vector<int32_t> tokens(T);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % V);
  const std::vector<int32_t> pages0 = {4, 9}, pages1 = {0, 1, 2}, pages2 = {7};
  const Eagle3SequenceStep seqs[3] = {
      {0, 0, std::span<const int32_t>(tokens).subspan(0, 21), pages0, 3},
      {21, 40, std::span<const int32_t>(tokens).subspan(21, 1), pages1, 1},
      {22, 5, std::span<const int32_t>(tokens).subspan(22, 2), pages2, 2},
  };
  std::vector<std::vector<int32_t>> drafts_cpu, drafts_cuda;
  ASSERT_TRUE(on_cpu->step(seqs, &drafts_cpu).is_ok());
  ASSERT_TRUE(on_cuda->step(seqs, &drafts_cuda).is_ok());
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(drafts_cuda[i].size(), static_cast<size_t>(seqs[i].num_drafts));
  // The last pass is the second chain step of sequence 0 (3 drafts); it depends on the chain's first draft,
  // so its inputs are equal only when the two backends drafted the same tokens.
  const Eagle3Workspace& wc = on_cpu->workspace();
  const Eagle3Workspace& wg = on_cuda->workspace();
  if (drafts_cpu[0] == drafts_cuda[0]) {
    check("eagle3 drafter", "last chain pass logits", cuda.download_f32(wg.logits.rows(0, 1)),
          cpu.download_f32(wc.logits.rows(0, 1)), 2e-2);
    check("eagle3 drafter", "last chain pass g", cuda.download_f32(wg.next_hidden.rows(0, 1)),
          cpu.download_f32(wc.next_hidden.rows(0, 1)), 2e-2);
  }
  // Drafts agree (bf16 may flip a near tie of random weights: count, do not fail, beyond one).
  int64_t same = 0, total = 0;
  for (size_t i = 0; i < 3; ++i)
    for (size_t j = 0; j < drafts_cpu[i].size() && j < drafts_cuda[i].size(); ++j, ++total)
      same += drafts_cpu[i][j] == drafts_cuda[i][j] ? 1 : 0;
  record("eagle3 drafter", "drafts equal to the CPU's: " + std::to_string(same) + "/" + std::to_string(total), 0, 0,
         0, same + 1 >= total);
  EXPECT_GE(same + 1, total);
}

// Chain graphs on CUDA: a drafter whose chains replay graphs (3 sequences padded to a bucket of 4, page
// tables as wide as the widest row) against an eager one, over two steps (the first captures, the second
// replays): the same drafts (a near tie may flip one: the attention splits differ with the table's width),
// and the last chain pass's logits close. Also with tables 20001 pages wide (a long context limit), whose
// used columns go up apart (one cudaMemcpy2DAsync) and whose unused ones hold stale pages no kernel reads.
TEST(Eagle3Gpu, ChainGraphsMatchTheEagerChain) {
  std::mt19937 rng(test_seed() + 1);
  Bf16Data embed = random_bf16(rng, kTinyVocab * kTinyHidden, 1.0f);
  Arena cuda(cuda_backend());
  auto model = load_tiny_draft(cuda_backend(), cuda, embed);
  auto eager = make_drafter(*model, 4), graphed = make_drafter(*model, 4), wide = make_drafter(*model, 4);
  const std::vector<int64_t> buckets = {1, 2, 4};
  ASSERT_TRUE(graphed->enable_chain_graphs(buckets, 6).is_ok());
  ASSERT_TRUE(wide->enable_chain_graphs(buckets, 20000).is_ok());
  std::vector<std::vector<int32_t>> tokens(3, std::vector<int32_t>(24));
  for (auto& seq : tokens)
    for (auto& t : seq) t = static_cast<int32_t>(rng() % kTinyVocab);
  const std::vector<std::vector<int32_t>> pages = {{4, 9, 1, 2, 3}, {0, 5}, {7, 8, 10}};
  int64_t same = 0, total = 0, wide_same = 0;
  // Step 1: rows at positions 0 .. n - 1; step 2: two more rows each (the chain of sequence 1 spills).
  for (const auto& [first, count] : {std::pair<std::vector<int64_t>, std::vector<int64_t>>{{0, 0, 0}, {9, 3, 6}},
                                     {{9, 3, 6}, {2, 4, 2}}}) {
    std::vector<Eagle3SequenceStep> steps;
    int64_t rows = 0;
    for (size_t i = 0; i < 3; ++i) {
      steps.push_back({rows, first[i], std::span<const int32_t>(tokens[i]).subspan(static_cast<size_t>(first[i] + 1), static_cast<size_t>(count[i])),
                       pages[i], 4});
      rows += count[i];
    }
    capture_random(rng, rows, {{eager.get(), &cuda}, {graphed.get(), &cuda}, {wide.get(), &cuda}});
    std::vector<std::vector<int32_t>> a, b, c;
    ASSERT_TRUE(eager->step(steps, &a).is_ok());
    ASSERT_TRUE(graphed->step(steps, &b).is_ok());
    ASSERT_TRUE(wide->step(steps, &c).is_ok());
    for (size_t i = 0; i < 3; ++i)
      for (size_t j = 0; j < a[i].size() && j < b[i].size() && j < c[i].size(); ++j, ++total) {
        same += a[i][j] == b[i][j] ? 1 : 0;
        wide_same += a[i][j] == c[i][j] ? 1 : 0;
      }
    if (a == b)
      check("eagle3 chain graph", "last chain pass logits, step " + std::to_string(first[0] == 0 ? 1 : 2),
            cuda.download_f32(graphed->workspace().logits.rows(0, 3)), cuda.download_f32(eager->workspace().logits.rows(0, 3)), 1e-2);
  }
  EXPECT_EQ(graphed->num_chain_graph_replays(), 1);
  EXPECT_EQ(wide->num_chain_graph_replays(), 1);
  record("eagle3 chain graph", "drafts equal to the eager chain's: " + std::to_string(same) + "/" + std::to_string(total),
         0, 0, 0, same + 1 >= total);
  record("eagle3 chain graph", "20001-page tables: drafts equal to the eager chain's: " + std::to_string(wide_same) + "/" +
         std::to_string(total), 0, 0, 0, wide_same + 1 >= total);
  EXPECT_GE(same + 1, total);
  EXPECT_GE(wide_same + 1, total);
}

}  // namespace
}  // namespace mx::gpu_test
