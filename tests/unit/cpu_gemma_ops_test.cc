// The ops Gemma-4 adds to the Backend, on the CPU reference, against values computed here independently:
// weightless RMSNorm (per row and per head), the logit soft-cap, GeGLU with tanh-approximate GELU, the
// layer scalar, per-head q/k/v norms, attention without sinks, the router without a bias and with
// per-expert scales, and bf16 GeGLU experts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/profiling_backend.h"

namespace mx {
namespace {

TEST(CpuGemmaOps, UnitRmsNormPerRowAndPerHead) {
  auto backend = make_cpu_backend({1});
  const std::vector<float> x = {3, 4, 0, 0, -1, 1, 2, -2};
  std::vector<float> out(x.size(), -99.0f);
  // As [2, 4] rows: row 0 has mean square 25/4, row 1 has 10/4.
  ASSERT_TRUE(backend
                  ->unit_rms_norm(TensorView(const_cast<float*>(x.data()), DType::kF32, {2, 4}), 0.0f,
                                  TensorView(out.data(), DType::kF32, {2, 4}))
                  .is_ok());
  EXPECT_FLOAT_EQ(out[0], 3 / 2.5f);
  EXPECT_FLOAT_EQ(out[1], 4 / 2.5f);
  EXPECT_FLOAT_EQ(out[6], 2 / std::sqrt(2.5f));
  // As [4, 2] heads: each pair on its own; eps enters under the root.
  const float eps = 1e-6f;
  ASSERT_TRUE(backend
                  ->unit_rms_norm(TensorView(const_cast<float*>(x.data()), DType::kF32, {4, 2}), eps,
                                  TensorView(out.data(), DType::kF32, {4, 2}))
                  .is_ok());
  EXPECT_FLOAT_EQ(out[0], 3 / std::sqrt(12.5f + eps));
  EXPECT_FLOAT_EQ(out[2], 0.0f);  // an all-zero head stays zero
  EXPECT_FLOAT_EQ(out[5], 1 / std::sqrt(1.0f + eps));
}

TEST(CpuGemmaOps, SoftCapBoundsAndKeepsSmallValues) {
  auto backend = make_cpu_backend({1});
  std::vector<float> x = {0.0f, 0.3f, -0.3f, 30.0f, -90.0f, 1e6f};
  const std::vector<float> in = x;
  ASSERT_TRUE(backend->soft_cap(TensorView(x.data(), DType::kF32, {2, 3}), 30.0f).is_ok());
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_NEAR(x[i], 30.0 * std::tanh(static_cast<double>(in[i]) / 30.0), 1e-5) << i;
    EXPECT_LE(std::fabs(x[i]), 30.0f);
  }
  EXPECT_NEAR(x[1], 0.3f, 1e-4);             // near zero the cap is the identity
  EXPECT_NEAR(x[3], 30.0f * 0.7615942f, 1e-4);  // tanh(1)
  EXPECT_FALSE(backend->soft_cap(TensorView(x.data(), DType::kF32, {6}), 0.0f).is_ok());
}

TEST(CpuGemmaOps, GeluTanhMul) {
  auto backend = make_cpu_backend({1});
  const std::vector<float> gate = {0.0f, 1.0f, -1.0f, 3.0f, -6.0f};
  const std::vector<float> up = {5.0f, 2.0f, 1.0f, -1.0f, 1.0f};
  std::vector<float> out(gate.size(), -99.0f);
  ASSERT_TRUE(backend
                  ->gelu_tanh_mul(TensorView(const_cast<float*>(gate.data()), DType::kF32, {5}),
                                  TensorView(const_cast<float*>(up.data()), DType::kF32, {5}),
                                  TensorView(out.data(), DType::kF32, {5}))
                  .is_ok());
  // torch.nn.functional.gelu(x, approximate="tanh") at 1, -1, 3, -6.
  EXPECT_NEAR(out[0], 0.0f, 1e-7);
  EXPECT_NEAR(out[1], 2 * 0.8411920f, 1e-6);
  EXPECT_NEAR(out[2], -0.1588080f, 1e-6);
  EXPECT_NEAR(out[3], -2.9963627f, 1e-5);
  EXPECT_NEAR(out[4], 0.0f, 1e-6);
}

TEST(CpuGemmaOps, ScaleByBf16Factor) {
  auto backend = make_cpu_backend({1});
  std::vector<float> x = {1.0f, -2.0f, 0.5f};
  const uint16_t factor = f32_to_bf16(0.375f);
  ASSERT_TRUE(backend
                  ->scale_by(TensorView(x.data(), DType::kF32, {3}),
                             TensorView(const_cast<uint16_t*>(&factor), DType::kBF16, {1}))
                  .is_ok());
  EXPECT_EQ(x, (std::vector<float>{0.375f, -0.75f, 0.1875f}));
}

using Rng = std::mt19937;

std::vector<float> random_floats(Rng& rng, size_t n, float scale) {
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(n);
  for (float& f : v) f = dist(rng);
  return v;
}

std::vector<uint16_t> bf16_of(const std::vector<float>& v) {
  std::vector<uint16_t> out;
  for (float f : v) out.push_back(f32_to_bf16(f));
  return out;
}

float bf(uint16_t b) { return bf16_to_f32(b); }

double gelu_ref(double x) { return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }

TEST(CpuGemmaOps, QkvNormsPerHead) {
  auto backend = make_cpu_backend({1});
  Rng rng(3);
  const int64_t T = 3, nq = 2, nkv = 1, hd = 6, heads = nq + 2 * nkv;
  auto qkv = random_floats(rng, static_cast<size_t>(T * heads * hd), 2.0f);
  const auto in = qkv;
  const auto qn = bf16_of(random_floats(rng, hd, 1.5f)), kn = bf16_of(random_floats(rng, hd, 1.5f));
  QkvNormParams p{TensorView(qkv.data(), DType::kF32, {T, heads * hd}),
                  TensorView(const_cast<uint16_t*>(qn.data()), DType::kBF16, {hd}),
                  TensorView(const_cast<uint16_t*>(kn.data()), DType::kBF16, {hd}), nq, nkv, hd, 1e-6f};
  ASSERT_TRUE(backend->qkv_norms(p).is_ok());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      const float* x = in.data() + (t * heads + h) * hd;
      double ms = 0;
      for (int64_t i = 0; i < hd; ++i) ms += double(x[i]) * x[i] / hd;
      for (int64_t i = 0; i < hd; ++i) {
        const double w = h < nq ? bf(qn[i]) : h < nq + nkv ? bf(kn[i]) : 1.0;
        EXPECT_NEAR(qkv[(t * heads + h) * hd + i], w * x[i] / std::sqrt(ms + 1e-6), 1e-5) << t << " " << h << " " << i;
      }
    }
}

TEST(CpuGemmaOps, AttentionWithoutSinksIsPlainSoftmax) {
  auto backend = make_cpu_backend({1});
  Rng rng(4);
  const int64_t nq = 2, nkv = 1, hd = 4, page = 4, len = 5, pages = 2;
  auto q = random_floats(rng, static_cast<size_t>(len * nq * hd), 1.0f);
  auto k = random_floats(rng, static_cast<size_t>(pages * page * nkv * hd), 1.0f);
  auto v = random_floats(rng, k.size(), 1.0f);
  std::vector<float> out(q.size(), -99.0f);
  std::vector<int32_t> ids(len, 0), positions(len), token_seq(len, 0), table = {0, 1};
  for (int64_t i = 0; i < len; ++i) positions[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  BatchView b;
  b.num_tokens = len;
  b.num_seqs = 1;
  b.token_ids = TensorView(ids.data(), DType::kI32, {len});
  b.positions = TensorView(positions.data(), DType::kI32, {len});
  b.token_seq = TensorView(token_seq.data(), DType::kI32, {len});
  b.page_tables[0] = TensorView(table.data(), DType::kI32, {1, pages});
  const int64_t window = 3;
  AttentionParams p;
  p.q = TensorView(q.data(), DType::kF32, {len, nq * hd});
  p.kv.k = TensorView(k.data(), DType::kF32, {pages, page, nkv, hd});
  p.kv.v = TensorView(v.data(), DType::kF32, {pages, page, nkv, hd});
  p.kv.page_size = page;
  p.out = TensorView(out.data(), DType::kF32, {len, nq * hd});
  p.n_q = nq;
  p.n_kv = nkv;
  p.head_dim = hd;
  p.window = window;
  p.softmax_scale = 1.0f;
  ASSERT_TRUE(backend->attention(p, b).is_ok());
  for (int64_t t = 0; t < len; ++t)
    for (int64_t h = 0; h < nq; ++h) {
      std::vector<double> w;
      double denom = 0;
      const int64_t first = std::max<int64_t>(0, t - window + 1);
      for (int64_t j = first; j <= t; ++j) {
        double s = 0;
        for (int64_t d = 0; d < hd; ++d) s += double(q[(t * nq + h) * hd + d]) * k[j * hd + d];
        w.push_back(std::exp(s));
        denom += w.back();
      }
      for (int64_t d = 0; d < hd; ++d) {
        double o = 0;
        for (int64_t j = first; j <= t; ++j) o += w[j - first] / denom * v[j * hd + d];
        EXPECT_NEAR(out[(t * nq + h) * hd + d], o, 1e-5) << t << " " << h;
      }
    }
}

TEST(CpuGemmaOps, RouterWithoutBiasWithExpertScale) {
  auto backend = make_cpu_backend({1});
  const int64_t T = 1, H = 2, E = 4, K = 2;
  const std::vector<float> x = {1.0f, 0.5f};
  const auto w = bf16_of({1, 0, 0, 1, 2, 0, -1, 0});  // logits 1, 0.5, 2, -1
  const auto scale = bf16_of({0.5f, 2, 3, 4});
  std::vector<float> logits(E), weights(K);
  std::vector<int32_t> topk(K);
  RouterParams p{TensorView(const_cast<float*>(x.data()), DType::kF32, {T, H}),
                 TensorView(const_cast<uint16_t*>(w.data()), DType::kBF16, {E, H}), TensorView(),
                 TensorView(logits.data(), DType::kF32, {T, E}), TensorView(topk.data(), DType::kI32, {T, K}),
                 TensorView(weights.data(), DType::kF32, {T, K}), K,
                 TensorView(const_cast<uint16_t*>(scale.data()), DType::kBF16, {E}), 0.0f, TensorView()};
  ASSERT_TRUE(backend->router_topk(p).is_ok());
  EXPECT_EQ(topk, (std::vector<int32_t>{2, 0}));
  const double p2 = 1 / (1 + std::exp(-1.0));  // softmax over the two picked logits 2 and 1
  EXPECT_NEAR(weights[0], p2 * 3, 1e-6);
  EXPECT_NEAR(weights[1], (1 - p2) * 0.5, 1e-6);
}

// x_norm_eps > 0: the router normalizes x without a weight first (the fused form of Gemma-4's router),
// the same logits as unit_rms_norm followed by the router; an f32 weight is read as is.
TEST(CpuGemmaOps, RouterFusedNormMatchesUnitNormThenRouter) {
  auto backend = make_cpu_backend({1});
  const int64_t T = 2, H = 4, E = 3, K = 2;
  const std::vector<float> x = {3, 4, 0, 0, -1, 1, 2, -2}, w = {1, 0, 0, 0, 0, 1, 0, 0, 0.5f, 0.5f, 1, 1};
  std::vector<float> normed(x.size()), logits(T * E), ref_logits(T * E), weights(T * K), ref_weights(T * K);
  std::vector<int32_t> topk(T * K), ref_topk(T * K);
  const float eps = 1e-6f;
  ASSERT_TRUE(backend
                  ->unit_rms_norm(TensorView(const_cast<float*>(x.data()), DType::kF32, {T, H}), eps,
                                  TensorView(normed.data(), DType::kF32, {T, H}))
                  .is_ok());
  const TensorView wv(const_cast<float*>(w.data()), DType::kF32, {E, H});
  RouterParams ref{TensorView(normed.data(), DType::kF32, {T, H}), wv, TensorView(),
                   TensorView(ref_logits.data(), DType::kF32, {T, E}), TensorView(ref_topk.data(), DType::kI32, {T, K}),
                   TensorView(ref_weights.data(), DType::kF32, {T, K}), K, TensorView(), 0.0f, TensorView()};
  RouterParams fused{TensorView(const_cast<float*>(x.data()), DType::kF32, {T, H}), wv, TensorView(),
                     TensorView(logits.data(), DType::kF32, {T, E}), TensorView(topk.data(), DType::kI32, {T, K}),
                     TensorView(weights.data(), DType::kF32, {T, K}), K, TensorView(), eps, TensorView()};
  ASSERT_TRUE(backend->router_topk(ref).is_ok());
  ASSERT_TRUE(backend->router_topk(fused).is_ok());
  EXPECT_EQ(logits, ref_logits);
  EXPECT_EQ(topk, ref_topk);
  EXPECT_EQ(weights, ref_weights);
  EXPECT_NEAR(logits[0], 3 / 2.5, 1e-6);  // row 0: mean square 25/4
}

// x_scale: the normed x times a per-dimension scale before the logits, the same as that scale folded into
// an f32 weight (powers of two here, so both orders round alike).
TEST(CpuGemmaOps, RouterXScaleMatchesTheScaleFoldedIntoTheWeight) {
  auto backend = make_cpu_backend({1});
  const int64_t T = 2, H = 4, E = 3, K = 2;
  const std::vector<float> x = {3, 4, 0, 1, -1, 1, 2, -2}, scale = {0.5f, 2, 1, 0.25f};
  const std::vector<float> w = {1, -3, 0.5f, 2, 0, 1, 0, 6, 0.75f, 0.5f, 1, 1};
  std::vector<float> folded(w.size());
  for (size_t i = 0; i < w.size(); ++i) folded[i] = w[i] * scale[i % H];
  const auto w_bf16 = bf16_of(w);
  struct Out {
    std::vector<float> logits = std::vector<float>(T * E), weights = std::vector<float>(T * K);
    std::vector<int32_t> ids = std::vector<int32_t>(T * K);
  } a, b;
  auto route = [&](TensorView weight, TensorView x_scale, Out& o) {
    RouterParams p{TensorView(const_cast<float*>(x.data()), DType::kF32, {T, H}), weight, TensorView(),
                   TensorView(o.logits.data(), DType::kF32, {T, E}), TensorView(o.ids.data(), DType::kI32, {T, K}),
                   TensorView(o.weights.data(), DType::kF32, {T, K}), K, TensorView(), 1e-6f, x_scale};
    ASSERT_TRUE(backend->router_topk(p).is_ok());
  };
  route(TensorView(const_cast<uint16_t*>(w_bf16.data()), DType::kBF16, {E, H}),
        TensorView(const_cast<float*>(scale.data()), DType::kF32, {H}), a);
  route(TensorView(folded.data(), DType::kF32, {E, H}), TensorView(), b);
  EXPECT_EQ(a.logits, b.logits);
  EXPECT_EQ(a.ids, b.ids);
  EXPECT_EQ(a.weights, b.weights);
  EXPECT_NE(a.logits[0], 0.0f);
}

TEST(CpuGemmaOps, GegluExpertsMatchADirectSum) {
  auto backend = make_cpu_backend({2});
  Rng rng(5);
  const int64_t T = 3, H = 5, I = 3, E = 4, K = 2;
  auto x = random_floats(rng, static_cast<size_t>(T * H), 1.0f);
  const auto gate_up = bf16_of(random_floats(rng, static_cast<size_t>(E * 2 * I * H), 1.0f));
  const auto down = bf16_of(random_floats(rng, static_cast<size_t>(E * H * I), 1.0f));
  std::vector<int32_t> ids = {3, 0, 1, 3, 2, 1};
  std::vector<float> weights = {0.7f, 0.3f, 0.5f, 1.5f, 0.25f, 0.0f};
  std::vector<float> out(static_cast<size_t>(T * H), -99.0f);
  GegluMoeParams p{TensorView(x.data(), DType::kF32, {T, H}), TensorView(ids.data(), DType::kI32, {T, K}),
                   TensorView(weights.data(), DType::kF32, {T, K}),
                   TensorView(const_cast<uint16_t*>(gate_up.data()), DType::kBF16, {E, 2 * I, H}),
                   TensorView(const_cast<uint16_t*>(down.data()), DType::kBF16, {E, H, I}),
                   TensorView(out.data(), DType::kF32, {T, H}), K};
  ASSERT_TRUE(backend->moe_geglu_experts(p).is_ok());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t r = 0; r < H; ++r) {
      double sum = 0;
      for (int64_t j = 0; j < K; ++j) {
        const int64_t e = ids[t * K + j];
        double y = 0;
        for (int64_t i = 0; i < I; ++i) {
          double g = 0, u = 0;
          for (int64_t c = 0; c < H; ++c) {
            g += bf(gate_up[(e * 2 * I + i) * H + c]) * double(x[t * H + c]);
            u += bf(gate_up[(e * 2 * I + I + i) * H + c]) * double(x[t * H + c]);
          }
          y += bf(down[(e * H + r) * I + i]) * gelu_ref(g) * u;
        }
        sum += weights[t * K + j] * y;
      }
      EXPECT_NEAR(out[t * H + r], sum, 1e-5) << t << " " << r;
    }
}

}  // namespace
}  // namespace mx

namespace mx {
namespace {

// The decorators (bench latency's profiler, the tests' routing probe, tensor-parallel rank 0) must pass the
// Gemma ops on: Backend's defaults answer unimplemented, which here would mean a decorator swallowed the call.
TEST(CpuGemmaOps, ProfilingBackendForwardsEveryGemmaOp) {
  ProfilingBackend backend(make_cpu_backend({1}));
  std::vector<float> x = {3, 4};
  std::vector<float> out(2);
  EXPECT_TRUE(backend.unit_rms_norm(TensorView(x.data(), DType::kF32, {1, 2}), 0.0f,
                                    TensorView(out.data(), DType::kF32, {1, 2})).is_ok());
  EXPECT_TRUE(backend.soft_cap(TensorView(x.data(), DType::kF32, {2}), 30.0f).is_ok());
  EXPECT_TRUE(backend.gelu_tanh_mul(TensorView(x.data(), DType::kF32, {2}), TensorView(x.data(), DType::kF32, {2}),
                                    TensorView(out.data(), DType::kF32, {2})).is_ok());
  const float factor = 2.0f;
  EXPECT_TRUE(backend.scale_by(TensorView(x.data(), DType::kF32, {2}),
                               TensorView(const_cast<float*>(&factor), DType::kF32, {1})).is_ok());
  // One token, one q and one kv head of size 2; one expert of width 1.
  std::vector<float> qkv = {1, 2, 3, 4, 5, 6};
  const std::vector<uint16_t> ones = {f32_to_bf16(1.0f), f32_to_bf16(1.0f)};
  TensorView norm(const_cast<uint16_t*>(ones.data()), DType::kBF16, {2});
  EXPECT_TRUE(backend.qkv_norms({TensorView(qkv.data(), DType::kF32, {1, 6}), norm, norm, 1, 1, 2}).is_ok());
  int32_t id = 0;
  float weight = 1.0f;
  GegluMoeParams moe;
  moe.topk_ids = TensorView(&id, DType::kI32, {1, 1});
  moe.topk_weights = TensorView(&weight, DType::kF32, {1, 1});
  moe.gate_up = TensorView(const_cast<uint16_t*>(ones.data()), DType::kBF16, {1, 2, 1});  // E = 1, I = 1, H = 1
  moe.x = TensorView(x.data(), DType::kF32, {1, 1});
  moe.down = TensorView(const_cast<uint16_t*>(ones.data()), DType::kBF16, {1, 1, 1});
  moe.out = TensorView(out.data(), DType::kF32, {1, 1});
  moe.top_k = 1;
  EXPECT_TRUE(backend.moe_geglu_experts(moe).is_ok());
}

}  // namespace
}  // namespace mx
