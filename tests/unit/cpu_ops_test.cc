// The CPU reference ops on cases with closed-form answers: the sink softmax, the sliding window,
// RMSNorm, linear with bias, router top-k, MXFP4 dequantization and the clamped SwiGLU expert.
#include "backend/cpu/ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

namespace mx {
namespace {

std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> out;
  for (float f : v) out.push_back(f32_to_bf16(f));
  return out;
}

// A single-sequence batch of `n` tokens at positions [start, start + n) with pages 0..pages-1.
struct OneSequenceBatch {
  std::vector<int32_t> ids, positions, token_seq, pages, rows;
  BatchView view;
  OneSequenceBatch(int64_t start, int64_t n, int64_t num_pages) {
    for (int64_t i = 0; i < n; ++i) {
      ids.push_back(0);
      positions.push_back(static_cast<int32_t>(start + i));
      token_seq.push_back(0);
    }
    pages.resize(static_cast<size_t>(num_pages));
    std::iota(pages.rbegin(), pages.rend(), 0);  // reversed: logical page != physical page
    view.num_tokens = n;
    view.num_seqs = 1;
    view.token_ids = TensorView(ids.data(), DType::kI32, {n});
    view.positions = TensorView(positions.data(), DType::kI32, {n});
    view.token_seq = TensorView(token_seq.data(), DType::kI32, {n});
    view.page_tables[0] = TensorView(pages.data(), DType::kI32, {1, num_pages});
  }
};

// QK = 0 and V = 1 make every weight equal: the output is n / (n + e^S) for n visible keys.
TEST(CpuAttention, SinkClosedFormAndWindow) {
  cpu::ThreadPool pool(2);
  const int64_t n_q = 4, n_kv = 2, hd = 8, page = 4, len = 11, pages = 3;
  std::vector<float> k(static_cast<size_t>(pages * page * n_kv * hd), 0.0f);
  std::vector<float> v(k.size(), 1.0f);
  std::vector<float> q(static_cast<size_t>(len * n_q * hd), 0.5f);
  std::vector<float> out(q.size(), -99.0f);
  const std::vector<float> sinks = {0.0f, 1.0f, -2.0f, 3.5f};
  auto sinks_bf16 = to_bf16(sinks);
  OneSequenceBatch b(0, len, pages);
  for (int64_t window : {0, 5}) {
    AttentionParams p;
    p.q = TensorView(q.data(), DType::kF32, {len, n_q * hd});
    p.kv.k = TensorView(k.data(), DType::kF32, {pages, page, n_kv, hd});
    p.kv.v = TensorView(v.data(), DType::kF32, {pages, page, n_kv, hd});
    p.kv.page_size = page;
    p.sinks = TensorView(sinks_bf16.data(), DType::kBF16, {n_q});
    p.out = TensorView(out.data(), DType::kF32, {len, n_q * hd});
    p.n_q = n_q;
    p.n_kv = n_kv;
    p.head_dim = hd;
    p.window = window;
    p.softmax_scale = 0.125f;
    cpu::attention(pool, p, b.view);
    for (int64_t t = 0; t < len; ++t) {
      const double visible = window ? std::min<int64_t>(t + 1, window) : t + 1;
      for (int64_t h = 0; h < n_q; ++h) {
        const double want = visible / (visible + std::exp(static_cast<double>(sinks[h])));
        for (int64_t d = 0; d < hd; ++d) ASSERT_NEAR(out[(t * n_q + h) * hd + d], want, 1e-6) << t << " " << h;
      }
    }
  }
}

// With distinct values per position, the window decides exactly which keys contribute.
TEST(CpuAttention, WindowIncludesTheCurrentKeyAndExactlyWindowMinusOneBefore) {
  cpu::ThreadPool pool(1);
  const int64_t hd = 2, page = 2, len = 7, pages = 4, window = 3;
  std::vector<float> k(static_cast<size_t>(pages * page * hd), 0.0f), v(k.size(), 0.0f);
  OneSequenceBatch b(0, len, pages);
  // Value of position j is j (in both dims); with equal scores the output is the mean of visible positions.
  for (int64_t j = 0; j < len; ++j) {
    const int64_t phys = b.pages[static_cast<size_t>(j / page)];
    for (int64_t d = 0; d < hd; ++d) v[(phys * page + j % page) * hd + d] = static_cast<float>(j);
  }
  std::vector<float> q(static_cast<size_t>(len * hd), 0.0f), out(q.size(), -1.0f);
  auto sink = to_bf16({-1000.0f});  // no sink mass
  AttentionParams p;
  p.q = TensorView(q.data(), DType::kF32, {len, hd});
  p.kv = {TensorView(k.data(), DType::kF32, {pages, page, 1, hd}), TensorView(v.data(), DType::kF32, {pages, page, 1, hd}),
          page};
  p.sinks = TensorView(sink.data(), DType::kBF16, {1});
  p.out = TensorView(out.data(), DType::kF32, {len, hd});
  p.n_q = p.n_kv = 1;
  p.head_dim = hd;
  p.window = window;
  p.softmax_scale = 1.0f;
  cpu::attention(pool, p, b.view);
  for (int64_t t = 0; t < len; ++t) {
    const int64_t first = std::max<int64_t>(0, t - window + 1);
    const double mean = 0.5 * static_cast<double>(first + t);
    EXPECT_NEAR(out[t * hd], mean, 1e-5) << "position " << t;
  }
}

TEST(CpuOps, RmsNormAndFusedAdd) {
  std::vector<float> x = {1, 2, 3, 4}, out(4), delta = {1, 1, 1, 1};
  auto w = to_bf16({1, 2, 0.5f, 1});
  const TensorView weight(w.data(), DType::kBF16, {4});
  cpu::rms_norm(TensorView(x.data(), DType::kF32, {1, 4}), weight, 0.0f, TensorView(out.data(), DType::kF32, {1, 4}));
  const float rms = std::sqrt((1 + 4 + 9 + 16) / 4.0f);
  EXPECT_NEAR(out[1], 2 * 2 / rms, 1e-6);
  cpu::add_rms_norm(TensorView(x.data(), DType::kF32, {1, 4}), TensorView(delta.data(), DType::kF32, {1, 4}), weight, 0.0f,
                    TensorView(out.data(), DType::kF32, {1, 4}));
  EXPECT_EQ(x[3], 5.0f);
  const float rms2 = std::sqrt((4 + 9 + 16 + 25) / 4.0f);
  EXPECT_NEAR(out[2], 0.5f * 4 / rms2, 1e-6);
}

// Rows of any element size: bf16 rows are half the bytes of f32 rows of the same width.
TEST(CpuOps, GatherRowsCopiesWholeRowsOfAnyDtype) {
  const std::vector<int32_t> rows = {2, 0, 2};
  const std::vector<uint16_t> bf16 = {10, 11, 12, 20, 21, 22, 30, 31, 32};
  std::vector<uint16_t> bf16_out(9, 0xffff);
  cpu::gather_rows(TensorView(const_cast<uint16_t*>(bf16.data()), DType::kBF16, {3, 3}),
                   TensorView(const_cast<int32_t*>(rows.data()), DType::kI32, {3}),
                   TensorView(bf16_out.data(), DType::kBF16, {3, 3}));
  EXPECT_EQ(bf16_out, (std::vector<uint16_t>{30, 31, 32, 10, 11, 12, 30, 31, 32}));
  const std::vector<float> f32 = {1.5f, -2, 3, 4};
  std::vector<float> f32_out(2, 0);
  const std::vector<int32_t> one = {1};
  cpu::gather_rows(TensorView(const_cast<float*>(f32.data()), DType::kF32, {2, 2}),
                   TensorView(const_cast<int32_t*>(one.data()), DType::kI32, {1}),
                   TensorView(f32_out.data(), DType::kF32, {1, 2}));
  EXPECT_EQ(f32_out, (std::vector<float>{3, 4}));
}

TEST(CpuOps, LinearWithBias) {
  cpu::ThreadPool pool(2);
  const int64_t t = 3, k = 37, n = 130;  // odd sizes: tails of the unrolled dot product
  std::vector<float> x(static_cast<size_t>(t * k)), wf(static_cast<size_t>(n * k)), bf(static_cast<size_t>(n));
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.3f * static_cast<float>(i));
  for (size_t i = 0; i < wf.size(); ++i) wf[i] = bf16_to_f32(f32_to_bf16(std::cos(0.7f * static_cast<float>(i))));
  for (size_t i = 0; i < bf.size(); ++i) bf[i] = bf16_to_f32(f32_to_bf16(0.01f * static_cast<float>(i)));
  auto w = to_bf16(wf), b = to_bf16(bf);
  std::vector<float> out(static_cast<size_t>(t * n), -7.0f);
  cpu::linear(pool, TensorView(x.data(), DType::kF32, {t, k}), TensorView(w.data(), DType::kBF16, {n, k}),
              TensorView(b.data(), DType::kBF16, {n}), TensorView(out.data(), DType::kF32, {t, n}));
  for (int64_t i = 0; i < t; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double want = bf[j];
      for (int64_t c = 0; c < k; ++c) want += static_cast<double>(x[i * k + c]) * wf[j * k + c];
      ASSERT_NEAR(out[i * n + j], want, 1e-4);
    }
}

TEST(CpuOps, RouterTopkSoftmaxOverSelected) {
  // Identity-like weights: logit e = x[e] + bias[e].
  const int64_t e_count = 5, h = 5, k = 2;
  std::vector<float> wf(e_count * h, 0.0f);
  for (int64_t e = 0; e < e_count; ++e) wf[e * h + e] = 1.0f;
  auto w = to_bf16(wf), b = to_bf16({0, 0, 0, 0, 0.5f});
  std::vector<float> x = {0.1f, 2.0f, -1.0f, 1.0f, 0.75f}, logits(e_count);
  std::vector<int32_t> ids(k);
  std::vector<float> weights(k);
  RouterParams p{TensorView(x.data(), DType::kF32, {1, h}), TensorView(w.data(), DType::kBF16, {e_count, h}),
                 TensorView(b.data(), DType::kBF16, {e_count}), TensorView(logits.data(), DType::kF32, {1, e_count}),
                 TensorView(ids.data(), DType::kI32, {1, k}), TensorView(weights.data(), DType::kF32, {1, k}), k,
                 TensorView(), 0.0f, TensorView()};  // no expert scale, norm or x scale (gpt-oss)
  cpu::router_topk(p);
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 4}));  // 2.0, then 1.25
  EXPECT_NEAR(weights[0], 1 / (1 + std::exp(-0.75)), 1e-6);
  EXPECT_NEAR(weights[0] + weights[1], 1.0, 1e-6);
}

TEST(CpuOps, Mxfp4RowDequantization) {
  // Block 0: scale 2^1, bytes 0x21 -> elements (1 -> 0.5, 2 -> 1.0) * 2; block 1: scale 2^-2, byte 0xF9 -> (-0.5, -6).
  std::vector<uint8_t> blocks(32, 0), scales = {128, 125};
  blocks[0] = 0x21;
  blocks[16] = 0xF9;
  std::vector<float> out(64);
  cpu::dequantize_mxfp4_row(blocks.data(), scales.data(), 64, out.data());
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], 2.0f);
  EXPECT_EQ(out[2], 0.0f);
  EXPECT_EQ(out[32], -0.5f * 0.25f);
  EXPECT_EQ(out[33], -6.0f * 0.25f);
}

// One expert whose W1 rows are all +1 (gate) / +1 (up) and W2 all +1: the SwiGLU clamp, the +1 on the
// linear half, alpha, and the down bias inside the routing weight are visible in closed form.
TEST(CpuOps, MoeClampedSwiGluClosedForm) {
  cpu::ThreadPool pool(2);
  const int64_t h = 32, inter = 32, e = 2;
  // FP4 code 2 = 1.0 in every nibble (0x22), scale 127 = 1.0.
  std::vector<uint8_t> w1b(static_cast<size_t>(e * 2 * inter * h / 2), 0x22), w1s(static_cast<size_t>(e * 2 * inter), 127);
  std::vector<uint8_t> w2b(static_cast<size_t>(e * h * inter / 2), 0x22), w2s(static_cast<size_t>(e * h), 127);
  std::vector<float> b1f(static_cast<size_t>(e * 2 * inter), 0.0f);
  for (int64_t j = 0; j < inter; ++j) b1f[static_cast<size_t>(inter * 2 + 2 * j + 1)] = 0.25f;  // expert 1, up rows
  auto b1 = to_bf16(b1f);
  auto b2 = to_bf16(std::vector<float>(static_cast<size_t>(e * h), 0.5f));
  ExpertWeights w{ExpertLayout::kMxfp4Checkpoint,
                  TensorView(w1b.data(), DType::kU8, {e, 2 * inter, h / 32, 16}),
                  TensorView(w1s.data(), DType::kU8, {e, 2 * inter, h / 32}),
                  TensorView(b1.data(), DType::kBF16, {e, 2 * inter}),
                  TensorView(w2b.data(), DType::kU8, {e, h, inter / 32, 16}),
                  TensorView(w2s.data(), DType::kU8, {e, h, inter / 32}),
                  TensorView(b2.data(), DType::kBF16, {e, h}), e, h, inter};
  for (float xv : {0.01f, 1.0f}) {  // sum x = 0.32 (no clamp) and 32 (gate clamped at the limit)
    std::vector<float> x(h, xv), out(h, -1.0f), weights = {0.75f, 0.25f};
    std::vector<int32_t> ids = {0, 1};
    MoeParams p{TensorView(x.data(), DType::kF32, {1, h}), TensorView(ids.data(), DType::kI32, {1, 2}),
                TensorView(weights.data(), DType::kF32, {1, 2}), &w, TensorView(out.data(), DType::kF32, {1, h}),
                2, 7.0f, 1.702f};
    cpu::moe_experts(pool, p);
    const double s = std::min(32.0 * xv, 7.0);
    auto act = [&](double up) { return s / (1 + std::exp(-1.702 * s)) * (std::clamp(up, -7.0, 7.0) + 1); };
    const double y0 = inter * act(32.0 * xv) + 0.5, y1 = inter * act(32.0 * xv + 0.25) + 0.5;
    EXPECT_NEAR(out[0], 0.75 * y0 + 0.25 * y1, 1e-3 * std::fabs(y0)) << "x = " << xv;
  }
}

}  // namespace
}  // namespace mx
