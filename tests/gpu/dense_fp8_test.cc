// FP8 dense weights (--dense-dtype fp8): the CUDA linear_fp8 against its CPU twin (skinny kernel up to 16
// rows, bf16 slabs + cuBLASLt above), and on every tiny fixture the FP8 model's prefill logits against the
// fp32 twin of the same FP8 model, gated at issue 13's bound (2x transformers' own bf16 error); reported
// with them: the error against the fixture's fp32 logits (the e4m3 rounding of the weights), against our
// bf16 path, and greedy agreement over 256 tokens (free-running common prefix and teacher-forced argmax
// agreement on the bf16 continuation). MX_FP8_ACCURACY_PRESET=gpt-oss-20b adds the greedy report for a
// synthetic preset (random weights, random prompts; reported, not gated).
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernel_configs.h"
#include "e4m3_rounding_util.h"
#include "fixture_reference_util.h"
#include "gpu_test_util.h"
#include "model/dense_fp8.h"
#include "model/gpt_oss/gpt_oss_model.h"
#include "model/model_registry.h"
#include "model/synthetic_model.h"
#include "routing_probe_util.h"
#include "runtime/static_generator.h"

namespace mx::gpu_test {
namespace {

using test::rel_l2;

int64_t argmax(const float* row, int64_t n) { return std::max_element(row, row + n) - row; }

TEST(DenseFp8, LinearMatchesCpuTwin) {
  Arena cpu(cpu_backend()), cuda(cuda_backend());
  std::mt19937 rng(test_seed());
  struct Case {
    int64_t m, n, k;
    bool bias, f32;
    int skinny_max_rows = -1;  // -1: the backend's choice; 0 forces the bf16 slabs + cuBLASLt
  };
  // Skinny: one and two token tiles, n not a multiple of 16, k a multiple of 8 but not of 16, each tile count
  // with its strips in one wave at 2 CTAs per SM and not (5120 and 4500 rows on 132 SMs: the 3-CTA forms).
  // Slabs: above 16 rows, forced at 4, and a weight of two slabs (12000 x 2880 bf16 is over the 64 MiB slab).
  for (const Case& c : {Case{1, 5120, 2880, true, false}, Case{3, 77, 328, true, true}, Case{9, 133, 2888, true, false},
                        Case{11, 4500, 1000, true, false},
                        Case{16, 1000, 64, false, true}, Case{1, 2880, 4096, true, false}, Case{13, 35, 24, true, true},
                        Case{17, 640, 320, true, false}, Case{64, 2880, 4096, true, true}, Case{4, 203, 1000, false, false, 0},
                        Case{20, 12000, 2880, false, true}, Case{33, 12000, 2880, true, false}}) {
    ASSERT_TRUE(set_cuda_skinny_linear_options(cuda_backend(), {c.skinny_max_rows}).is_ok());
    Bf16Data x = random_bf16(rng, c.m * c.k, 1.0f), w = random_bf16(rng, c.n * c.k, 0.05f), b = random_bf16(rng, c.n, 1.0f);
    const Fp8Rows q = quantize_rows_fp8(TensorView(w.bits.data(), DType::kBF16, {c.n, c.k}));
    Pair px = upload_activation(cpu, cuda, x, {c.m, c.k});
    TensorView w_c = cpu.upload(DType::kF8E4M3, {c.n, c.k}, q.values.data()),
               w_g = cuda.upload(DType::kF8E4M3, {c.n, c.k}, q.values.data());
    TensorView s_c = cpu.upload(DType::kF32, {c.n}, q.scales.data()), s_g = cuda.upload(DType::kF32, {c.n}, q.scales.data());
    TensorView b_c, b_g;
    if (c.bias) {
      b_c = cpu.upload(DType::kBF16, {c.n}, b.bits.data());
      b_g = cuda.upload(DType::kBF16, {c.n}, b.bits.data());
    }
    TensorView o_c = cpu.make(DType::kF32, {c.m, c.n}), o_g = cuda.make(c.f32 ? DType::kF32 : DType::kBF16, {c.m, c.n});
    ASSERT_TRUE(cpu_backend().linear_fp8(px.cpu, w_c, s_c, b_c, o_c).is_ok());
    const Status st = cuda_backend().linear_fp8(px.cuda, w_g, s_g, b_g, o_g);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    const bool skinny = cuda::use_skinny_linear(c.m, c.k, c.skinny_max_rows);
    ASSERT_TRUE(set_cuda_skinny_linear_options(cuda_backend(), {}).is_ok());
    // The slabs round scale * w to bf16 (one more rounding than the twin); the skinny kernel uses w exactly.
    const double tol = skinny && c.f32 ? 1e-4 : 5e-3;
    check("linear_fp8", std::to_string(c.m) + "x" + std::to_string(c.n) + "x" + std::to_string(c.k) +
                            (c.bias ? " bias" : "") + (c.f32 ? " f32-out" : " bf16-out") + (skinny ? " skinny" : " slabs"),
          cuda.download_f32(o_g), cpu.download_f32(o_c), tol);
  }
}

// Greedy continuations of `prompts` (tokens each) and the teacher-forced logits of prompt + `forced`
// continuation at the continuation's positions (the logits that predict forced[0..n)).
struct Greedy {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<float>> forced_logits;  // [continuation length, vocab] per prompt
};

Result<Greedy> run_greedy(const Model& model, const std::vector<std::vector<int32_t>>& prompts, int64_t tokens,
                          const std::vector<std::vector<int32_t>>* forced) {
  Greedy g;
  std::vector<GenerateRequest> requests;
  for (const auto& p : prompts) requests.push_back({p, tokens, {}, false});
  MX_ASSIGN_OR_RETURN(auto out, generate_static(model, requests, StaticGeneratorOptions{16, {}}));
  for (auto& r : out) g.tokens.push_back(std::move(r.output_ids));
  const std::vector<std::vector<int32_t>>& cont = forced ? *forced : g.tokens;
  const int64_t vocab = model.dims().vocab_size;
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::vector<int32_t> ids = prompts[i];
    ids.insert(ids.end(), cont[i].begin(), cont[i].end());
    GenerateRequest r{ids, 1, {}, true};
    MX_ASSIGN_OR_RETURN(auto one, generate_static(model, {r}, StaticGeneratorOptions{16, {}}));
    const int64_t first = static_cast<int64_t>(prompts[i].size()) - 1, n = static_cast<int64_t>(cont[i].size());
    const float* base = one[0].prompt_logits.data() + first * vocab;
    g.forced_logits.emplace_back(base, base + n * vocab);
  }
  return g;
}

// Logits rel-L2 of fp8 against bf16 on the bf16 continuation, and how far the two greedy runs agree.
void report_greedy(const std::string& what, const Model& bf16, const Model& fp8,
                   const std::vector<std::vector<int32_t>>& prompts) {
  constexpr int64_t kTokens = 256;
  auto base = run_greedy(bf16, prompts, kTokens, nullptr);
  ASSERT_TRUE(base.is_ok()) << base.status().to_string();
  auto got = run_greedy(fp8, prompts, kTokens, &base->tokens);
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  const int64_t vocab = bf16.dims().vocab_size;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto& a = base->tokens[i];
    const auto& b = got->tokens[i];
    size_t prefix = 0;
    while (prefix < a.size() && prefix < b.size() && a[prefix] == b[prefix]) ++prefix;
    const int64_t n = static_cast<int64_t>(a.size());
    int64_t forced_agree = 0;
    for (int64_t t = 0; t < n; ++t) forced_agree += argmax(got->forced_logits[i].data() + t * vocab, vocab) == a[t];
    const double err = rel_l2(got->forced_logits[i].data(), base->forced_logits[i].data(), n * vocab);
    char buf[256];
    std::snprintf(buf, sizeof buf, "%s prompt %zu: logits rel-L2 vs bf16 %.4f over %lld tokens; greedy common prefix %zu/%lld, "
                  "teacher-forced argmax agreement %.1f%%", what.c_str(), i, err, static_cast<long long>(n), prefix,
                  static_cast<long long>(n), 100.0 * forced_agree / std::max<int64_t>(n, 1));
    std::printf("[fp8 accuracy] %s\n", buf);
    record("fp8 dense greedy (report)", buf, err, 0, 0, true);
  }
}

class DenseFp8Fixture : public ::testing::TestWithParam<std::string> {};

// The gate, per prompt: CUDA's FP8 logits against the fp32 CPU twin of the same FP8 model (the e4m3 weights
// exactly, f32 activations) within 2x transformers' own bf16 error (issue 13's bound). Where CUDA's router
// picked other experts than the twin, the twin replays CUDA's route and every such choice must be a near tie
// (RoutingProbe), as in the bf16 fixture test. Reported beside it: the FP8 model against the fixture's fp32
// logits (the weights' e4m3 rounding, 0.04-0.14 here: per-channel e4m3 cannot meet 2x bf16 against the
// original weights on these random fixtures, see docs/PERF.md), against our bf16 path, and greedy agreement.
TEST_P(DenseFp8Fixture, LogitsWithinTwiceBf16ErrorOfTheFp8Twin) {
  const char* env = std::getenv("MX_FIXTURES_DIR");
  const std::string dir = std::string(env ? env : MX_FIXTURES_DIR) + "/" + GetParam();
  ModelLoadOptions options;
  options.dense_dtype = DType::kF8E4M3;
  test::RoutingProbe cuda_probe = test::RoutingProbe::recorder(cuda_backend());
  auto fp8 = GptOssModel::load(dir, cuda_probe, options);
  ASSERT_TRUE(fp8.is_ok()) << fp8.status().to_string();
  auto ref = test::load_fixture_reference(dir);
  ASSERT_TRUE(ref.is_ok()) << ref.status().to_string();
  auto got = test::prefill_logits(**fp8, ref->prompts);
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  test::RoutingProbe cpu_probe = test::RoutingProbe::forcer(cpu_backend(), cuda_probe.route());
  auto twin = GptOssModel::load(dir, cpu_probe, options);
  ASSERT_TRUE(twin.is_ok()) << twin.status().to_string();
  auto routed = test::prefill_logits(**twin, ref->prompts);
  ASSERT_TRUE(routed.is_ok()) << routed.status().to_string();
  auto bf16 = GptOssModel::load(dir, cuda_backend());
  ASSERT_TRUE(bf16.is_ok()) << bf16.status().to_string();
  auto base = test::prefill_logits(**bf16, ref->prompts);
  ASSERT_TRUE(base.is_ok()) << base.status().to_string();
  const int64_t vocab = (*fp8)->config().vocab_size;
  int64_t row = 0;
  for (size_t i = 0; i < ref->prompts.size(); ++i) {
    const auto len = static_cast<int64_t>(ref->prompts[i].size());
    const std::string p = "prompt_" + std::to_string(i);
    const TensorView want = *ref->file->get(p + "_logits"), hf_bf16 = *ref->file->get(p + "_logits_bf16");
    std::vector<float> hf(static_cast<size_t>(hf_bf16.numel()));
    for (int64_t j = 0; j < hf_bf16.numel(); ++j)
      hf[j] = hf_bf16.dtype() == DType::kBF16 ? bf16_to_f32(hf_bf16.ptr<const uint16_t>()[j]) : hf_bf16.ptr<const float>()[j];
    const double hf_err = rel_l2(hf.data(), want.ptr<const float>(), want.numel());
    const float* mine = got->data() + row * vocab;
    const double err = rel_l2(mine, routed->data() + row * vocab, len * vocab);
    const double vs_fp32 = rel_l2(mine, want.ptr<const float>(), want.numel());
    const double twin_vs_fp32 = rel_l2(routed->data() + row * vocab, want.ptr<const float>(), want.numel());
    const double vs_bf16 = rel_l2(mine, base->data() + row * vocab, len * vocab);
    int64_t flips = 0;
    bool near_ties = true;
    for (const test::RoutingFlip& f : cpu_probe.flips())
      if (f.token >= row && f.token < row + len) ++flips, near_ties = near_ties && f.near_tie();
    const double tol = 2 * hf_err;
    const bool pass = near_ties && err <= tol;
    char buf[320];
    std::snprintf(buf, sizeof buf, "%s %s (%lld tok): vs fp8 twin %.4f (%lld flips, near ties: %s), HF bf16 %.4f; "
                  "vs fp32: fp8 %.4f, twin %.4f; fp8 vs our bf16 %.4f", GetParam().c_str(), p.c_str(),
                  static_cast<long long>(len), err, static_cast<long long>(flips), near_ties ? "yes" : "NO", hf_err,
                  vs_fp32, twin_vs_fp32, vs_bf16);
    std::printf("[fp8 accuracy] %s\n", buf);
    record("fp8 dense logits vs fp8 twin (tol 2x HF bf16)", buf, err, 0, tol, pass);
    EXPECT_TRUE(pass) << buf;
    row += len;
  }
  report_greedy(GetParam(), **bf16, **fp8, ref->prompts);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DenseFp8Fixture, ::testing::ValuesIn(test::kTinyFixtures), test::FixtureParamName());

// One batched prefill: its logits and the hidden states after each layer (as f32).
struct Traced {
  std::vector<float> logits;
  std::vector<std::vector<float>> hidden;
};

Result<Traced> trace(const Model& model, const std::vector<std::vector<int32_t>>& prompts) {
  Traced t;
  Backend& b = model.backend();
  HiddenObserver observer = [&](int64_t index, const TensorView& h) {
    if (t.hidden.size() <= static_cast<size_t>(index)) t.hidden.resize(static_cast<size_t>(index) + 1);
    std::vector<float>& dst = t.hidden[static_cast<size_t>(index)];
    dst.resize(static_cast<size_t>(h.numel()));
    if (h.dtype() == DType::kF32) {
      MX_CHECK_OK(b.copy_to_host(dst.data(), h));
      return;
    }
    std::vector<uint16_t> bits(dst.size());
    MX_CHECK_OK(b.copy_to_host(bits.data(), h));
    for (size_t j = 0; j < bits.size(); ++j) dst[j] = bf16_to_f32(bits[j]);
  };
  MX_ASSIGN_OR_RETURN(t.logits, test::prefill_logits(model, prompts, &observer));
  return t;
}

std::string by_layer(const Traced& got, const Traced& want) {
  std::string s;
  for (size_t l = 0; l < got.hidden.size() && l < want.hidden.size(); ++l) {
    char buf[16];
    std::snprintf(buf, sizeof buf, " %.3f", rel_l2(got.hidden[l].data(), want.hidden[l].data(),
                                                   static_cast<int64_t>(want.hidden[l].size())));
    s += buf;
  }
  return s;
}

// A synthetic preset (random weights, 4 random 128-token prompts): FP8 against bf16 (logits and greedy over
// 256 tokens), and where the difference comes from: the bf16 model on the e4m3-rounded weights against
// bf16 (the rounding alone) and FP8 against it (the FP8 path alone), hidden states layer by layer.
TEST(DenseFp8, SyntheticPresetReport) {
  const char* preset = std::getenv("MX_FP8_ACCURACY_PRESET");
  if (!preset) GTEST_SKIP() << "set MX_FP8_ACCURACY_PRESET=gpt-oss-20b for the synthetic report";
  auto load = [&](DType dense, bool rounded) -> Result<std::unique_ptr<Model>> {
    MX_ASSIGN_OR_RETURN(SyntheticCheckpoint s, synthetic_checkpoint_in_memory(preset, SyntheticOptions{}));
    if (rounded) {  // the rounded copy in an anonymous in-memory file, mapped like any checkpoint
      const int fd = ::memfd_create("mx-e4m3-rounded", MFD_CLOEXEC);
      if (fd < 0) return io_error("memfd_create failed");
      const std::string path = "/proc/self/fd/" + std::to_string(fd);
      Status written = test::write_e4m3_rounded_checkpoint(s.checkpoint, path);
      Result<Checkpoint> copy = written.is_ok() ? Checkpoint::open_file(path) : Result<Checkpoint>(written);
      ::close(fd);
      MX_RETURN_IF_ERROR(copy.status());
      s.checkpoint = std::move(*copy);
    }
    ModelLoadOptions options;
    options.dense_dtype = dense;
    return model_from_checkpoint(s.config_json, std::string("preset ") + preset, std::move(s.generation_config),
                                 std::move(s.checkpoint), cuda_backend(), options);
  };
  auto bf16 = load(DType::kBF16, false);
  ASSERT_TRUE(bf16.is_ok()) << bf16.status().to_string();
  auto fp8 = load(DType::kF8E4M3, false);
  ASSERT_TRUE(fp8.is_ok()) << fp8.status().to_string();
  auto rounded = load(DType::kBF16, true);
  ASSERT_TRUE(rounded.is_ok()) << rounded.status().to_string();
  std::mt19937 rng(7);
  std::vector<std::vector<int32_t>> prompts(4);
  for (auto& p : prompts) {
    p.resize(128);
    for (auto& id : p) id = static_cast<int32_t>(rng() % 200000);
  }
  auto tb = trace(**bf16, prompts), tf = trace(**fp8, prompts), tr = trace(**rounded, prompts);
  ASSERT_TRUE(tb.is_ok() && tf.is_ok() && tr.is_ok());
  const auto n = static_cast<int64_t>(tb->logits.size());
  std::printf("[fp8 accuracy] %s prefill (4 x 128 tokens), logits rel-L2 and hidden rel-L2 after each layer:\n"
              "  fp8 vs bf16               %.4f |%s\n  rounded bf16 vs bf16       %.4f |%s\n"
              "  fp8 vs rounded bf16        %.4f |%s\n",
              preset, rel_l2(tf->logits.data(), tb->logits.data(), n), by_layer(*tf, *tb).c_str(),
              rel_l2(tr->logits.data(), tb->logits.data(), n), by_layer(*tr, *tb).c_str(),
              rel_l2(tf->logits.data(), tr->logits.data(), n), by_layer(*tf, *tr).c_str());
  report_greedy(preset, **bf16, **fp8, prompts);
  report_greedy(std::string(preset) + " (fp8 vs bf16 on e4m3-rounded weights)", **rounded, **fp8, prompts);
}

}  // namespace
}  // namespace mx::gpu_test
