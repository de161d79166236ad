// FP8 dense weights (--dense-dtype fp8): per-row quantization, the CPU twin of linear_fp8, the gpt-oss
// model loaded with FP8 projections (close to bf16, not equal: the flag is not ignored), and the flag's
// errors.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "e4m3_rounding_util.h"
#include "fixture_reference_util.h"
#include "model/dense_fp8.h"
#include "model/gpt_oss/gpt_oss_model.h"
#include "model/load_options.h"
#include "test_util.h"

namespace mx {
namespace {

std::vector<uint16_t> random_bf16(std::mt19937& rng, int64_t n, float stddev) {
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<uint16_t> v(static_cast<size_t>(n));
  for (auto& b : v) b = f32_to_bf16(dist(rng));
  return v;
}

TEST(DenseFp8, RowsUseTheWholeRangeAndRoundTrip) {
  std::mt19937 rng(3);
  const int64_t n = 5, k = 37;
  std::vector<uint16_t> w = random_bf16(rng, n * k, 0.02f);
  for (int64_t i = 0; i < k; ++i) w[static_cast<size_t>(3 * k + i)] = 0;  // an all-zero row
  const Fp8Rows q = quantize_rows_fp8(TensorView(w.data(), DType::kBF16, {n, k}));
  ASSERT_EQ(q.values.size(), static_cast<size_t>(n * k));
  ASSERT_EQ(q.scales.size(), static_cast<size_t>(n));
  EXPECT_EQ(q.scales[3], 1.0f);
  for (int64_t r = 0; r < n; ++r) {
    float amax = 0, qmax = 0;
    for (int64_t i = 0; i < k; ++i) {
      const float want = bf16_to_f32(w[static_cast<size_t>(r * k + i)]);
      const float got = q.scales[static_cast<size_t>(r)] * fp8e4m3_to_f32(q.values[static_cast<size_t>(r * k + i)]);
      amax = std::max(amax, std::fabs(want));
      qmax = std::max(qmax, std::fabs(fp8e4m3_to_f32(q.values[static_cast<size_t>(r * k + i)])));
      // e4m3 keeps 3 mantissa bits: half a unit in the last place is 1/16 of the value; below 2^-6 (subnormals)
      // the step is 2^-9 of the scale.
      EXPECT_LE(std::fabs(got - want), std::max(std::fabs(want) / 16, q.scales[static_cast<size_t>(r)] * 0x1p-10f) * 1.0001f)
          << "row " << r << " col " << i;
    }
    if (amax > 0) {
      EXPECT_EQ(qmax, 448.0f) << "row " << r;  // its largest value is e4m3's largest
    }
  }
}

TEST(DenseFp8, CpuLinearFp8IsLinearOnTheDequantizedWeights) {
  std::mt19937 rng(5);
  const int64_t m = 3, n = 19, k = 40;
  std::vector<uint16_t> w = random_bf16(rng, n * k, 0.05f), bias = random_bf16(rng, n, 1.0f);
  const Fp8Rows q = quantize_rows_fp8(TensorView(w.data(), DType::kBF16, {n, k}));
  std::vector<float> x(static_cast<size_t>(m * k)), deq(static_cast<size_t>(n * k));
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (auto& v : x) v = dist(rng);
  for (int64_t i = 0; i < n * k; ++i) deq[i] = q.scales[static_cast<size_t>(i / k)] * fp8e4m3_to_f32(q.values[i]);
  auto backend = make_cpu_backend(CpuBackendOptions{2});
  std::vector<float> got(static_cast<size_t>(m * n), NAN), want(static_cast<size_t>(m * n), NAN);
  const TensorView xv(x.data(), DType::kF32, {m, k}), bv(bias.data(), DType::kBF16, {n});
  ASSERT_TRUE(backend
                  ->linear_fp8(xv, TensorView(const_cast<uint8_t*>(q.values.data()), DType::kF8E4M3, {n, k}),
                               TensorView(const_cast<float*>(q.scales.data()), DType::kF32, {n}), bv,
                               TensorView(got.data(), DType::kF32, {m, n}))
                  .is_ok());
  ASSERT_TRUE(backend->linear(xv, TensorView(deq.data(), DType::kF32, {n, k}), bv, TensorView(want.data(), DType::kF32, {m, n}))
                  .is_ok());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-4f * (1 + std::fabs(want[i]))) << i;
}

TEST(DenseFp8, TinyModelWithFp8ProjectionsIsCloseToBf16) {
  auto backend = make_cpu_backend(CpuBackendOptions{2});
  const std::string dir = test::fixture("tiny-gpt-oss");
  auto bf16 = GptOssModel::load(dir, *backend);
  ASSERT_TRUE(bf16.is_ok()) << bf16.status().to_string();
  ModelLoadOptions options;
  options.dense_dtype = DType::kF8E4M3;
  auto fp8 = GptOssModel::load(dir, *backend, options);
  ASSERT_TRUE(fp8.is_ok()) << fp8.status().to_string();
  const std::vector<std::vector<int32_t>> prompts = {{1, 5, 9, 200, 17, 4}, {3, 3, 8}};
  auto a = test::prefill_logits(**bf16, prompts);
  auto b = test::prefill_logits(**fp8, prompts);
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a->size(); ++i) {
    diff += ((*b)[i] - (*a)[i]) * ((*b)[i] - (*a)[i]);
    norm += (*a)[i] * (*a)[i];
  }
  const double rel = std::sqrt(diff / norm);
  EXPECT_GT(rel, 0.0);   // the projections really are FP8
  EXPECT_LT(rel, 0.1);   // and close: per-channel e4m3 costs a few percent at most
  std::printf("tiny-gpt-oss prefill logits, fp8 dense vs bf16: rel-L2 %.4f\n", rel);
}

// The fixture with its dense projections e4m3-rounded (see e4m3_rounding_util.h) in `out_dir`.
void write_e4m3_rounded_fixture(const std::string& fixture_dir, const std::string& out_dir) {
  auto ck = Checkpoint::open_dir(fixture_dir);
  ASSERT_TRUE(ck.is_ok()) << ck.status().to_string();
  const Status written = test::write_e4m3_rounded_checkpoint(*ck, out_dir + "/model.safetensors");
  ASSERT_TRUE(written.is_ok()) << written.to_string();
  for (const char* file : {"config.json", "generation_config.json"})
    test::copy_file(fixture_dir + "/" + file, out_dir + "/" + file);
}

double rel_l2(const std::vector<float>& got, const std::vector<float>& want) {
  return test::rel_l2(got.data(), want.data(), static_cast<int64_t>(got.size()));
}

// The FP8 model computes what the bf16 model computes on the e4m3-rounded weights: its whole error is the
// weights' rounding, none comes from the path (a scale on the wrong axis or weight, the fused qkv rows, the
// lm_head shard, would be ~1). On the tiny fixtures that rounding alone is 0.09-0.12 rel-L2 of the logits
// (e4m3's 3 mantissa bits: ~2.5% per projection, amplified by these random models' routing), see PERF.md.
TEST(DenseFp8, ModelEqualsBf16ModelOnTheE4m3RoundedWeights) {
  auto backend = make_cpu_backend(CpuBackendOptions{2});
  for (const std::string& name : test::kTinyFixtures) {
    const std::string dir = test::fixture(name);
    test::TempDir rounded_dir;
    write_e4m3_rounded_fixture(dir, rounded_dir.path());
    ModelLoadOptions options;
    options.dense_dtype = DType::kF8E4M3;
    auto fp8 = GptOssModel::load(dir, *backend, options);
    ASSERT_TRUE(fp8.is_ok()) << fp8.status().to_string();
    auto rounded = GptOssModel::load(rounded_dir.path(), *backend);
    ASSERT_TRUE(rounded.is_ok()) << rounded.status().to_string();
    auto bf16 = GptOssModel::load(dir, *backend);
    ASSERT_TRUE(bf16.is_ok()) << bf16.status().to_string();
    auto ref = test::load_fixture_reference(dir);
    ASSERT_TRUE(ref.is_ok()) << ref.status().to_string();
    auto got = test::prefill_logits(**fp8, ref->prompts);
    auto want = test::prefill_logits(**rounded, ref->prompts);
    auto base = test::prefill_logits(**bf16, ref->prompts);
    ASSERT_TRUE(got.is_ok() && want.is_ok() && base.is_ok());
    const double err = rel_l2(*got, *want), rounding = rel_l2(*want, *base);
    std::printf("%s prefill logits: fp8 path vs bf16 on rounded weights %.2e; rounded vs original weights %.4f\n",
                name.c_str(), err, rounding);
    EXPECT_LT(err, 0.03) << name;  // a routing near tie can flip (CPU: 0.003-0.012)
    EXPECT_GT(rounding, 0.02) << name;  // the rounding is real (and the flag not ignored)
  }
}

// A checkpoint that already holds FP8 dense weights (e4m3 + per-channel f32 scales, [N] or [N, 1]) loads
// them as they are: with --dense-dtype fp8 the model is the one converted at load from bf16 (bit for bit,
// the same values and scales), with bf16 the weights are widened (the bf16 model on the rounded weights).
TEST(DenseFp8, CheckpointFp8WeightsLoadDirectly) {
  auto backend = make_cpu_backend(CpuBackendOptions{2});
  const std::string dir = test::fixture("tiny-gpt-oss");
  auto ck = Checkpoint::open_dir(dir);
  ASSERT_TRUE(ck.is_ok()) << ck.status().to_string();
  test::TempDir fp8_dir, rounded_dir;
  for (const std::string* out : {&fp8_dir.path(), &rounded_dir.path()})
    for (const char* file : {"config.json", "generation_config.json"}) test::copy_file(dir + "/" + file, *out + "/" + file);
  ASSERT_TRUE(test::write_fp8_dense_checkpoint(*ck, fp8_dir.file("model.safetensors")).is_ok());
  ASSERT_TRUE(test::write_e4m3_rounded_checkpoint(*ck, rounded_dir.file("model.safetensors")).is_ok());
  ModelLoadOptions fp8;
  fp8.dense_dtype = DType::kF8E4M3;
  const std::vector<std::vector<int32_t>> prompts = {{1, 5, 9, 200, 17, 4}, {3, 3, 8}};
  auto logits = [&](const std::string& d, const ModelLoadOptions& o) -> std::vector<float> {
    auto m = GptOssModel::load(d, *backend, o);
    EXPECT_TRUE(m.is_ok()) << m.status().to_string();
    if (!m.is_ok()) return {};
    auto l = test::prefill_logits(**m, prompts);
    EXPECT_TRUE(l.is_ok());
    return l.is_ok() ? *l : std::vector<float>{};
  };
  const std::vector<float> direct = logits(fp8_dir.path(), fp8), converted = logits(dir, fp8);
  ASSERT_FALSE(direct.empty());
  EXPECT_EQ(direct, converted);
  const std::vector<float> widened = logits(fp8_dir.path(), ModelLoadOptions{}),
                           rounded = logits(rounded_dir.path(), ModelLoadOptions{});
  ASSERT_FALSE(widened.empty());
  EXPECT_EQ(widened, rounded);
  EXPECT_NE(widened, direct);  // one is the bf16 path, the other the fp8 one

  // An FP8 weight without its scales, and scales that do not fit, are errors naming the tensor.
  test::TempDir bad;
  for (const char* file : {"config.json", "generation_config.json"}) test::copy_file(dir + "/" + file, bad.file(file));
  ASSERT_TRUE(test::write_fp8_dense_checkpoint(*ck, bad.file("model.safetensors"), "model.layers.1.self_attn.o_proj.weight").is_ok());
  auto missing = GptOssModel::load(bad.path(), *backend, fp8);
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find("'model.layers.1.self_attn.o_proj.weight' is FP8 (F8_E4M3) but the checkpoint "
                                            "has no 'model.layers.1.self_attn.o_proj.weight_scale'"),
            std::string::npos)
      << missing.status().message();
}

TEST(DenseFp8, FlagValuesAndErrors) {
  EXPECT_EQ(*parse_dense_dtype("bf16"), DType::kBF16);
  EXPECT_EQ(*parse_dense_dtype("fp8"), DType::kF8E4M3);
  EXPECT_EQ(parse_dense_dtype("int4").status().message(), "--dense-dtype must be bf16 or fp8 (got 'int4')");
  const std::string model = " --model " + test::fixture("tiny-gpt-oss") + " --prompt-ids 1,2,3 --max-new-tokens 2";
  const auto bad = test::run_mxserve("generate --dense-dtype fp4" + model);
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.stderr_text.find("--dense-dtype must be bf16 or fp8"), std::string::npos) << bad.stderr_text;
  const auto ok = test::run_mxserve("generate --dense-dtype fp8 --threads 2" + model);
  EXPECT_EQ(ok.exit_code, 0) << ok.stderr_text;
}

}  // namespace
}  // namespace mx
