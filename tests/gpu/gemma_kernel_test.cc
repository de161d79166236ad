// The CUDA ops Gemma-4 adds against their CPU twins: soft-cap, GeGLU, the layer scalar, the weightless norm,
// per-head q/k/v norms, the fused norms between a layer's blocks, the fused router (norm, logits, top-k,
// softmax, per-expert scale; f32 and bf16 weights) and the bf16 GeGLU experts at decode (8-token tiles, both
// the register-load and the bulk-copy kernels, the latter also routed before its PDL wait) and prefill
// (64-token tiles). Fresh random inputs, poisoned outputs, odd sizes (partial vectors, strips and k chunks).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "core/dtype.h"
#include "gpu_test_util.h"

namespace mx::gpu_test {
namespace {

std::string dims(std::initializer_list<int64_t> d) {
  std::string s;
  for (int64_t v : d) s += (s.empty() ? "" : "x") + std::to_string(v);
  return s;
}

std::vector<float> random_f32(std::mt19937& rng, int64_t n, float mean, float stddev) {
  std::normal_distribution<float> dist(mean, stddev);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

class GemmaKernelTest : public ::testing::Test {
 protected:
  GemmaKernelTest() : cpu_(cpu_backend()), cuda_(cuda_backend()), rng_(test_seed()) {}
  Pair f32_pair(const std::vector<float>& v, Shape shape) {
    return {cpu_.upload(DType::kF32, shape, v.data()), cuda_.upload(DType::kF32, shape, v.data())};
  }
  Arena cpu_, cuda_;
  std::mt19937 rng_;
};

TEST_F(GemmaKernelTest, SoftCap) {
  // 4-wide and one-value paths; values well past the cap (tanh saturates) and near zero.
  for (const auto& [rows, vocab] : {std::pair<int64_t, int64_t>{3, 1001}, {2, 4096}, {1, 262144}}) {
    Pair x = f32_pair(random_f32(rng_, rows * vocab, 0.0f, 40.0f), {rows, vocab});
    ASSERT_TRUE(cpu_backend().soft_cap(x.cpu, 30.0f).is_ok());
    ASSERT_TRUE(cuda_backend().soft_cap(x.cuda, 30.0f).is_ok());
    check("soft_cap", dims({rows, vocab}) + " cap 30", cuda_.download_f32(x.cuda), cpu_.download_f32(x.cpu), 1e-6);
  }
  EXPECT_FALSE(cuda_backend().soft_cap(cuda_.make(DType::kF32, {4}), 0.0f).is_ok());
}

TEST_F(GemmaKernelTest, GeluTanhMul) {
  // n % 8 == 0 (16-byte path), odd n, and the output written over the gate (the model's in-place use).
  for (const auto& [rows, cols, in_place] :
       {std::tuple<int64_t, int64_t, bool>{5, 2112, false}, {37, 67, false}, {3, 2112, true}, {1, 9, true}}) {
    Bf16Data g = random_bf16(rng_, rows * cols, 2.0f), u = random_bf16(rng_, rows * cols, 1.0f);
    Pair pg = upload_activation(cpu_, cuda_, g, {rows, cols}), pu = upload_activation(cpu_, cuda_, u, {rows, cols});
    TensorView o_c = in_place ? pg.cpu : cpu_.make(DType::kF32, {rows, cols});
    TensorView o_g = in_place ? pg.cuda : cuda_.make(DType::kBF16, {rows, cols});
    ASSERT_TRUE(cpu_backend().gelu_tanh_mul(pg.cpu, pu.cpu, o_c).is_ok());
    ASSERT_TRUE(cuda_backend().gelu_tanh_mul(pg.cuda, pu.cuda, o_g).is_ok());
    check("gelu_tanh_mul", dims({rows, cols}) + (in_place ? " in place" : ""), cuda_.download_f32(o_g),
          cpu_.download_f32(o_c), 5e-3);
  }
}

// The fused gate|up form: halves of one row; inter % 8 == 0 (16-byte path) and odd.
TEST_F(GemmaKernelTest, Geglu) {
  for (const auto& [rows, inter] : {std::pair<int64_t, int64_t>{1, 2112}, {9, 2112}, {5, 37}, {64, 704}}) {
    Bf16Data gu = random_bf16(rng_, rows * 2 * inter, 2.0f);
    Pair p = upload_activation(cpu_, cuda_, gu, {rows, 2 * inter});
    TensorView o_c = cpu_.make(DType::kF32, {rows, inter}), o_g = cuda_.make(DType::kBF16, {rows, inter});
    ASSERT_TRUE(cpu_backend().geglu(p.cpu, o_c).is_ok());
    ASSERT_TRUE(cuda_backend().geglu(p.cuda, o_g).is_ok());
    check("geglu", dims({rows, 2 * inter}), cuda_.download_f32(o_g), cpu_.download_f32(o_c), 5e-3);
  }
  EXPECT_FALSE(cuda_backend().geglu(cuda_.make(DType::kBF16, {2, 10}), cuda_.make(DType::kBF16, {2, 4})).is_ok());
}

TEST_F(GemmaKernelTest, ScaleByAndUnitRmsNorm) {
  for (const auto& [rows, h, f32_factor] : {std::tuple<int64_t, int64_t, bool>{5, 2816, false}, {7, 1001, true}}) {
    Pair x = f32_pair(random_f32(rng_, rows * h, 0.0f, 3.0f), {rows, h});
    const float factor = 0.37109375f;  // bf16-exact
    const uint16_t factor_bits = 0x3ebe;
    TensorView f_c = cpu_.upload(DType::kF32, {1}, &factor);
    TensorView f_g = f32_factor ? cuda_.upload(DType::kF32, {1}, &factor) : cuda_.upload(DType::kBF16, {1}, &factor_bits);
    ASSERT_TRUE(cpu_backend().scale_by(x.cpu, f_c).is_ok());
    ASSERT_TRUE(cuda_backend().scale_by(x.cuda, f_g).is_ok());
    check("scale_by", dims({rows, h}) + (f32_factor ? " f32 factor" : " bf16 factor"), cuda_.download_f32(x.cuda),
          cpu_.download_f32(x.cpu), 1e-7);
  }
  for (const auto& [rows, h, f32_in] : {std::tuple<int64_t, int64_t, bool>{9, 2816, true}, {3, 64, false}}) {
    Bf16Data xb = random_bf16(rng_, rows * h, 2.0f);
    Pair x = f32_in ? f32_pair(random_f32(rng_, rows * h, 0.5f, 2.0f), {rows, h}) : upload_activation(cpu_, cuda_, xb, {rows, h});
    TensorView o_c = cpu_.make(DType::kF32, {rows, h}), o_g = cuda_.make(DType::kBF16, {rows, h});
    ASSERT_TRUE(cpu_backend().unit_rms_norm(x.cpu, 1e-6f, o_c).is_ok());
    ASSERT_TRUE(cuda_backend().unit_rms_norm(x.cuda, 1e-6f, o_g).is_ok());
    check("unit_rms_norm", dims({rows, h}) + (f32_in ? " f32 in" : " bf16 in"), cuda_.download_f32(o_g),
          cpu_.download_f32(o_c), 5e-3);
  }
}

TEST_F(GemmaKernelTest, QkvNorms) {
  struct Case {
    int64_t t, n_q, n_kv, hd;
  };
  // Sliding (256) and full (512) layers of 26B-A4B, the tiny fixtures' 32/64, and an odd head dim of 40.
  for (const Case& c : {Case{5, 16, 8, 256}, Case{3, 16, 2, 512}, Case{7, 4, 2, 32}, Case{2, 3, 1, 40}, Case{1, 4, 2, 64}}) {
    const int64_t width = (c.n_q + 2 * c.n_kv) * c.hd;
    Bf16Data qkv = random_bf16(rng_, c.t * width, 1.5f), qn = random_bf16(rng_, c.hd, 1.0f), kn = random_bf16(rng_, c.hd, 1.0f);
    Pair p = upload_activation(cpu_, cuda_, qkv, {c.t, width});
    TensorView qn_c = cpu_.upload(DType::kBF16, {c.hd}, qn.bits.data()), qn_g = cuda_.upload(DType::kBF16, {c.hd}, qn.bits.data());
    TensorView kn_c = cpu_.upload(DType::kBF16, {c.hd}, kn.bits.data()), kn_g = cuda_.upload(DType::kBF16, {c.hd}, kn.bits.data());
    ASSERT_TRUE(cpu_backend().qkv_norms({p.cpu, qn_c, kn_c, c.n_q, c.n_kv, c.hd, 1e-6f}).is_ok());
    ASSERT_TRUE(cuda_backend().qkv_norms({p.cuda, qn_g, kn_g, c.n_q, c.n_kv, c.hd, 1e-6f}).is_ok());
    check("qkv_norms", "T " + std::to_string(c.t) + " q " + std::to_string(c.n_q) + " kv " + std::to_string(c.n_kv) +
                           " hd " + std::to_string(c.hd),
          cuda_.download_f32(p.cuda), cpu_.download_f32(p.cpu), 5e-3);
  }
}

// The fused norms between a layer's blocks: every output (the f32 residual, the bf16 norm outputs) against
// the twin, with and without the experts' outputs, a bf16 / f32 / absent layer scalar, widths that leave
// threads with 1-4 chunks or none (64, 1000, 2816, 8192).
// The fused row kernels' forms (CudaGemmaRowForm) on CUDA: each gives the default form's bits (the same chunks, order
// and sums), 2 chunks a thread only where the row fits 4096 values.
std::vector<std::pair<CudaGemmaRowForm, std::string>> gemma_row_forms(int64_t hidden) {
  std::vector<std::pair<CudaGemmaRowForm, std::string>> forms{{CudaGemmaRowForm::kFourChunks, ", 4 chunks"}};
  if (hidden <= 4096) {
    forms.push_back({CudaGemmaRowForm::kTwoChunks, ", 2 chunks"});
    forms.push_back({CudaGemmaRowForm::kTwoChunksBounded, ", 2 chunks bounded"});
  }
  return forms;
}

TEST_F(GemmaKernelTest, FusedAttentionEndNorms) {
  for (const auto& [rows, h, moe] : {std::tuple<int64_t, int64_t, bool>{1, 2816, true}, {5, 2816, true}, {3, 1000, false},
                                     {2, 8192, true}, {33, 64, true}, {300, 2816, true}}) {
    Bf16Data attn = random_bf16(rng_, rows * h, 3.0f);
    std::vector<Bf16Data> w;
    for (int i = 0; i < 3; ++i) w.push_back(random_bf16(rng_, h, 1.0f));
    Pair a = upload_activation(cpu_, cuda_, attn, {rows, h});
    const std::vector<float> res0 = random_f32(rng_, rows * h, 0.2f, 4.0f);
    Pair res = f32_pair(res0, {rows, h});
    Pair wp[3];
    for (int i = 0; i < 3; ++i)
      wp[i] = {cpu_.upload(DType::kBF16, {h}, w[i].bits.data()), cuda_.upload(DType::kBF16, {h}, w[i].bits.data())};
    TensorView mlp_c = cpu_.make(DType::kF32, {rows, h}), moe_c = cpu_.make(DType::kF32, {rows, h});
    TensorView mlp_g = cuda_.make(DType::kBF16, {rows, h}), moe_g = cuda_.make(DType::kBF16, {rows, h});
    ASSERT_TRUE(cpu_backend()
                    .gemma_attention_end({a.cpu, res.cpu, wp[0].cpu, wp[1].cpu, moe ? wp[2].cpu : TensorView(), mlp_c,
                                          moe_c, 1e-6f})
                    .is_ok());
    ASSERT_TRUE(cuda_backend()
                    .gemma_attention_end({a.cuda, res.cuda, wp[0].cuda, wp[1].cuda, moe ? wp[2].cuda : TensorView(),
                                          mlp_g, moe_g, 1e-6f})
                    .is_ok());
    const std::string what = dims({rows, h}) + (moe ? " with experts" : " dense only");
    check("gemma_attention_end residual", what, cuda_.download_f32(res.cuda), cpu_.download_f32(res.cpu), 1e-5);
    check("gemma_attention_end mlp_in", what, cuda_.download_f32(mlp_g), cpu_.download_f32(mlp_c), 5e-3);
    if (moe) check("gemma_attention_end moe_in", what, cuda_.download_f32(moe_g), cpu_.download_f32(moe_c), 5e-3);
    for (const auto& [form, form_name] : gemma_row_forms(h)) {
      ASSERT_TRUE(set_cuda_gemma_row_options(cuda_backend(), {form}).is_ok());
      TensorView r2 = cuda_.upload(DType::kF32, {rows, h}, res0.data());
      TensorView mlp2 = cuda_.make(DType::kBF16, {rows, h}), moe2 = cuda_.make(DType::kBF16, {rows, h});
      ASSERT_TRUE(cuda_backend()
                      .gemma_attention_end({a.cuda, r2, wp[0].cuda, wp[1].cuda, moe ? wp[2].cuda : TensorView(), mlp2,
                                            moe2, 1e-6f})
                      .is_ok());
      const bool same = cuda_.download_f32(r2) == cuda_.download_f32(res.cuda) &&
                        cuda_.download_f32(mlp2) == cuda_.download_f32(mlp_g) &&
                        (!moe || cuda_.download_f32(moe2) == cuda_.download_f32(moe_g));
      record("gemma_attention_end forms", what + form_name + (same ? ": identical" : ": DIFFER"), same ? 0 : 1, 0, 0,
             same);
      EXPECT_TRUE(same) << what << form_name;
    }
    ASSERT_TRUE(set_cuda_gemma_row_options(cuda_backend(), {}).is_ok());
  }
  TensorView x = cuda_.make(DType::kBF16, {2, 12}), r = cuda_.make(DType::kF32, {2, 12}), w = cuda_.make(DType::kBF16, {12});
  EXPECT_FALSE(cuda_backend().gemma_attention_end({x, r, w, w, TensorView(), x, x, 1e-6f}).is_ok());  // 12 % 8 != 0
  TensorView w16 = cuda_.make(DType::kBF16, {16});
  EXPECT_FALSE(cuda_backend().gemma_attention_end({x, r, w16, w16, TensorView(), x, x, 1e-6f}).is_ok());  // width
}

TEST_F(GemmaKernelTest, FusedLayerEndNorms) {
  enum class Scalar { kNone, kBf16, kF32 };
  for (const auto& [rows, h, moe, scalar] :
       {std::tuple<int64_t, int64_t, bool, Scalar>{1, 2816, true, Scalar::kBf16}, {7, 2816, true, Scalar::kF32},
        {3, 1000, false, Scalar::kBf16}, {2, 8192, true, Scalar::kNone}, {33, 64, false, Scalar::kF32},
        {300, 2816, true, Scalar::kBf16}}) {
    Bf16Data dense = random_bf16(rng_, rows * h, 2.0f), experts = random_bf16(rng_, rows * h, 0.5f);
    std::vector<Bf16Data> w;
    for (int i = 0; i < 4; ++i) w.push_back(random_bf16(rng_, h, 1.0f));
    Pair d = upload_activation(cpu_, cuda_, dense, {rows, h}), m = upload_activation(cpu_, cuda_, experts, {rows, h});
    const std::vector<float> res0 = random_f32(rng_, rows * h, -0.3f, 5.0f);
    Pair res = f32_pair(res0, {rows, h});
    Pair wp[4];
    for (int i = 0; i < 4; ++i)
      wp[i] = {cpu_.upload(DType::kBF16, {h}, w[i].bits.data()), cuda_.upload(DType::kBF16, {h}, w[i].bits.data())};
    const float factor = 0.6171875f;  // bf16-exact
    const uint16_t factor_bits = 0x3f1e;
    Pair sc;
    if (scalar != Scalar::kNone) {
      sc.cpu = cpu_.upload(DType::kF32, {1}, &factor);
      sc.cuda = scalar == Scalar::kF32 ? cuda_.upload(DType::kF32, {1}, &factor) : cuda_.upload(DType::kBF16, {1}, &factor_bits);
    }
    TensorView next_c = cpu_.make(DType::kF32, {rows, h}), next_g = cuda_.make(DType::kBF16, {rows, h});
    ASSERT_TRUE(cpu_backend()
                    .gemma_layer_end({d.cpu, moe ? m.cpu : TensorView(), wp[0].cpu, wp[1].cpu, wp[2].cpu, sc.cpu,
                                      res.cpu, wp[3].cpu, next_c, 1e-6f})
                    .is_ok());
    ASSERT_TRUE(cuda_backend()
                    .gemma_layer_end({d.cuda, moe ? m.cuda : TensorView(), wp[0].cuda, wp[1].cuda, wp[2].cuda, sc.cuda,
                                      res.cuda, wp[3].cuda, next_g, 1e-6f})
                    .is_ok());
    const char* scalar_name = scalar == Scalar::kNone ? "no scalar" : scalar == Scalar::kBf16 ? "bf16 scalar" : "f32 scalar";
    const std::string what = dims({rows, h}) + (moe ? " with experts, " : " dense only, ") + scalar_name;
    check("gemma_layer_end residual", what, cuda_.download_f32(res.cuda), cpu_.download_f32(res.cpu), 1e-5);
    check("gemma_layer_end next_in", what, cuda_.download_f32(next_g), cpu_.download_f32(next_c), 5e-3);
    for (const auto& [form, form_name] : gemma_row_forms(h)) {
      ASSERT_TRUE(set_cuda_gemma_row_options(cuda_backend(), {form}).is_ok());
      TensorView r2 = cuda_.upload(DType::kF32, {rows, h}, res0.data()), next2 = cuda_.make(DType::kBF16, {rows, h});
      ASSERT_TRUE(cuda_backend()
                      .gemma_layer_end({d.cuda, moe ? m.cuda : TensorView(), wp[0].cuda, wp[1].cuda, wp[2].cuda, sc.cuda,
                                        r2, wp[3].cuda, next2, 1e-6f})
                      .is_ok());
      const bool same = cuda_.download_f32(r2) == cuda_.download_f32(res.cuda) &&
                        cuda_.download_f32(next2) == cuda_.download_f32(next_g);
      record("gemma_layer_end forms", what + form_name + (same ? ": identical" : ": DIFFER"), same ? 0 : 1, 0, 0, same);
      EXPECT_TRUE(same) << what << form_name;
    }
    ASSERT_TRUE(set_cuda_gemma_row_options(cuda_backend(), {}).is_ok());
  }
  TensorView x = cuda_.make(DType::kBF16, {2, 16}), r = cuda_.make(DType::kF32, {2, 16}), w = cuda_.make(DType::kBF16, {16});
  TensorView two = cuda_.make(DType::kF32, {2});
  EXPECT_FALSE(cuda_backend().gemma_layer_end({x, TensorView(), w, w, w, two, r, w, x, 1e-6f}).is_ok());  // scalar
}

// The router kernels a batch of `tokens` can take: the split kernel (the default's cluster size, and 8
// CTAs) and the ticket kernel at every size; past CudaGemmaRouterOptions::kClusterMaxTokens the default's
// choice; up to it the cluster kernel, with the default's cluster size (16 CTAs up to 4 tokens where the
// device runs them) and with 8 CTAs, weights by loads and by bulk copies.
struct RouterKernel {
  CudaGemmaRouterOptions options;
  std::string name;
};
std::vector<RouterKernel> router_kernels(int64_t tokens) {
  std::vector<RouterKernel> kernels{{{CudaGemmaRouterDecode::kSplit}, ", split"},
                                    {{CudaGemmaRouterDecode::kSplit, 8}, ", split of 8"}};
  if (tokens > CudaGemmaRouterOptions::kClusterMaxTokens) {
    kernels.push_back({{}, ""});
    kernels.push_back({{CudaGemmaRouterDecode::kTicket}, ", ticket"});
    return kernels;
  }
  kernels.insert(kernels.end(), {{{CudaGemmaRouterDecode::kTicket}, ", ticket"},
                                 {{CudaGemmaRouterDecode::kCluster, 0, 1}, ", cluster, bulk copies"},
                                 {{CudaGemmaRouterDecode::kCluster, 8, 1}, ", cluster of 8, bulk copies"},
                                 {{CudaGemmaRouterDecode::kCluster, 0, -1}, ", cluster, loads"},
                                 {{CudaGemmaRouterDecode::kCluster, 8, -1}, ", cluster of 8, loads"}});
  return kernels;
}

// Rejects the forced form where the shape does not fit it: bulk copies and the split kernel of rows not a
// multiple of 16 bytes.
bool router_rejects(const RouterKernel& kernel, int64_t hidden) {
  return hidden % 8 != 0 &&
         (kernel.options.bulk_weights > 0 || kernel.options.decode == CudaGemmaRouterDecode::kSplit);
}

std::vector<int32_t> ids_of(const std::vector<uint8_t>& bytes) {
  std::vector<int32_t> ids(bytes.size() / sizeof(int32_t));
  std::memcpy(ids.data(), bytes.data(), ids.size() * sizeof(int32_t));
  return ids;
}

// The router's picks against the twin's, token by token: identical, or rerouted across a near tie (at every
// position the twin's logits of the two picks lie within `tie`: the GEMM tiles' fp32 sums differ from the
// twin's by up to ~3e-5 at 2816 channels, so among 2100 tokens an 8th and a 9th logit that close turn up
// now and then; seed 2971656804 had one). The routing weights are compared on the tokens routed alike.
struct RouteComparison {
  int64_t near_ties = 0, other = 0;
  std::vector<float> weights_got, weights_want;  // of the tokens routed alike
};
RouteComparison compare_routes(const std::vector<int32_t>& got, const std::vector<int32_t>& want,
                               const std::vector<float>& logits_want, const std::vector<float>& weights_got,
                               const std::vector<float>& weights_want, int64_t experts, int64_t k, float tie) {
  RouteComparison r;
  for (size_t t = 0; t * k < want.size(); ++t) {
    const size_t first = t * k;
    if (std::equal(want.begin() + first, want.begin() + first + k, got.begin() + first)) {
      r.weights_got.insert(r.weights_got.end(), weights_got.begin() + first, weights_got.begin() + first + k);
      r.weights_want.insert(r.weights_want.end(), weights_want.begin() + first, weights_want.begin() + first + k);
      continue;
    }
    bool near = true;
    for (size_t j = first; j < first + k; ++j) {
      const bool valid = got[j] >= 0 && got[j] < experts;
      near = near && valid &&
             std::abs(logits_want[t * experts + got[j]] - logits_want[t * experts + want[j]]) <= tie;
    }
    ++(near ? r.near_ties : r.other);
  }
  return r;
}

// The fused router against the twin's norm -> logits -> top-k -> softmax -> scale: logits, weights and ids.
TEST_F(GemmaKernelTest, FusedRouter) {
  struct Case {
    int64_t t, e, h, k;
    bool norm, f32_x, f32_scale;
  };
  // The ticket kernel's 4-token tiles (2 experts per CTA): partial tiles, expert counts that leave a CTA
  // partly empty, hidden sizes not a multiple of 32 or 128. The split kernel on every case:
  // 8- to 32-token tiles, CTAs without hidden chunks (hidden 64), two m tiles per warp (256 experts), two
  // register passes over a CTA's chunks (5000), partial m tiles (33, 40 experts). Up to 8 tokens also the cluster
  // kernel (router_kernels): CTAs without experts (6 experts), partial groups (40), two groups per CTA (256),
  // two passes over the hidden row (5000), rows not a multiple of 16 bytes (hidden 204: no bulk copies). Every
  // case with a bf16 weight and a random x_scale, the twin with the same.
  for (const Case& c : {Case{1, 128, 2816, 8, true, true, false}, Case{3, 128, 2816, 8, true, true, false},
                        Case{8, 128, 2816, 8, true, true, true}, Case{33, 128, 2816, 8, true, true, false},
                        Case{77, 128, 2816, 8, true, false, false}, Case{7, 6, 64, 3, true, true, false},
                        Case{5, 40, 200, 5, false, false, true}, Case{50, 33, 204, 16, true, true, false},
                        Case{2, 256, 1024, 8, false, true, false}, Case{40, 256, 512, 8, true, true, false},
                        Case{4, 64, 5000, 8, true, false, true}, Case{130, 128, 2816, 8, true, true, true},
                        Case{2100, 128, 2816, 8, true, true, false}, Case{2049, 40, 200, 5, true, false, true},
                        Case{3, 33, 204, 5, true, false, false}}) {
    const Bf16Data w = random_bf16(rng_, c.e * c.h, 0.05f);
    const std::vector<float> scale = random_f32(rng_, c.e, 1.0f, 0.3f), x_scale = random_f32(rng_, c.h, 1.0f, 0.3f);
    Bf16Data scale_b = random_bf16(rng_, c.e, 0.3f);
    for (size_t i = 0; i < scale_b.bits.size(); ++i) {  // |N(1, 0.3)| in bf16
      scale_b.values[i] = std::abs(scale_b.values[i] + 1.0f);
      const uint32_t u = std::bit_cast<uint32_t>(scale_b.values[i]) & 0xffff0000u;
      scale_b.values[i] = std::bit_cast<float>(u);
      scale_b.bits[i] = static_cast<uint16_t>(u >> 16);
    }
    Pair pw{cpu_.upload(DType::kBF16, {c.e, c.h}, w.bits.data()), cuda_.upload(DType::kBF16, {c.e, c.h}, w.bits.data())};
    Pair pxs = f32_pair(x_scale, {c.h});
    Pair ps = c.f32_scale ? f32_pair(scale, {c.e})
                          : Pair{cpu_.upload(DType::kF32, {c.e}, scale_b.values.data()),
                                 cuda_.upload(DType::kBF16, {c.e}, scale_b.bits.data())};
    Bf16Data xb = random_bf16(rng_, c.t * c.h, 1.0f);
    Pair px = c.f32_x ? f32_pair(random_f32(rng_, c.t * c.h, 0.1f, 4.0f), {c.t, c.h})
                      : upload_activation(cpu_, cuda_, xb, {c.t, c.h});
    const float eps = c.norm ? 1e-6f : 0.0f;
    RouterParams r_c{px.cpu, pw.cpu, TensorView(), cpu_.make(DType::kF32, {c.t, c.e}), cpu_.make(DType::kI32, {c.t, c.k}),
                     cpu_.make(DType::kF32, {c.t, c.k}), c.k, ps.cpu, eps, pxs.cpu};
    ASSERT_TRUE(cpu_backend().router_topk(r_c).is_ok());
    const std::vector<int32_t> ids_c = ids_of(cpu_.download_bytes(r_c.topk_ids));
    const std::vector<float> logits_c = cpu_.download_f32(r_c.logits), weights_c = cpu_.download_f32(r_c.topk_weights);
    for (const RouterKernel& kernel : router_kernels(c.t)) {
      ASSERT_TRUE(set_cuda_gemma_router_options(cuda_backend(), kernel.options).is_ok());
      RouterParams r_g{px.cuda, pw.cuda, TensorView(), cuda_.make(DType::kF32, {c.t, c.e}),
                       cuda_.make(DType::kI32, {c.t, c.k}), cuda_.make(DType::kF32, {c.t, c.k}), c.k, ps.cuda, eps,
                       pxs.cuda};
      const Status st = cuda_backend().router_topk(r_g);
      if (router_rejects(kernel, c.h)) {  // forced copies or split tiles of 408-byte rows
        EXPECT_FALSE(st.is_ok()) << kernel.name;
        continue;
      }
      ASSERT_TRUE(st.is_ok()) << kernel.name << ": " << st.to_string();
      const std::string what = std::to_string(c.t) + " tokens, " + std::to_string(c.e) + " experts, hidden " +
                               std::to_string(c.h) + ", top-" + std::to_string(c.k) + (c.norm ? ", norm" : "") +
                               (c.f32_x ? ", f32 x" : ", bf16 x") + (c.f32_scale ? ", f32 scale" : ", bf16 scale") +
                               kernel.name;
      check("gemma router logits", what, cuda_.download_f32(r_g.logits), logits_c, 1e-5);
      const RouteComparison routes = compare_routes(ids_of(cuda_.download_bytes(r_g.topk_ids)), ids_c, logits_c,
                                                    cuda_.download_f32(r_g.topk_weights), weights_c, c.e, c.k, 1e-4f);
      check("gemma router weights", what, routes.weights_got, routes.weights_want, 1e-5);
      const bool ok = routes.other == 0;
      record("gemma router ids", what + (routes.near_ties + routes.other == 0 ? " identical"
                                         : ok ? ": " + std::to_string(routes.near_ties) + " near-tie reroutes"
                                              : " DIFFER"),
             ok ? 0 : 1, 0, 0, ok);
      EXPECT_TRUE(ok) << what << ": " << routes.other << " tokens rerouted beyond a near tie";
    }
    ASSERT_TRUE(set_cuda_gemma_router_options(cuda_backend(), {}).is_ok());
  }
  // Equal logits rank the lower expert first (the twin's order): every expert gets the same weight row.
  const int64_t e = 128, h = 256, k = 8;
  const Bf16Data row = random_bf16(rng_, h, 0.05f);
  std::vector<uint16_t> w;
  for (int64_t i = 0; i < e; ++i) w.insert(w.end(), row.bits.begin(), row.bits.end());
  TensorView w_g = cuda_.upload(DType::kBF16, {e, h}, w.data());
  Pair px = f32_pair(random_f32(rng_, h, 0.0f, 1.0f), {1, h}), ones = f32_pair(std::vector<float>(h, 1.0f), {h});
  for (const RouterKernel& kernel : router_kernels(1)) {
    ASSERT_TRUE(set_cuda_gemma_router_options(cuda_backend(), kernel.options).is_ok());
    RouterParams r_g{px.cuda, w_g, TensorView(), cuda_.make(DType::kF32, {1, e}), cuda_.make(DType::kI32, {1, k}),
                     cuda_.make(DType::kF32, {1, k}), k, TensorView(), 1e-6f, ones.cuda};
    ASSERT_TRUE(cuda_backend().router_topk(r_g).is_ok());
    const auto ids = cuda_.download_bytes(r_g.topk_ids);
    std::vector<int32_t> got(k), want(k);
    std::memcpy(got.data(), ids.data(), ids.size());
    std::iota(want.begin(), want.end(), 0);
    record("gemma router ties", "128 equal logits -> experts 0..7" + kernel.name, got == want ? 0 : 1, 0, 0,
           got == want);
    EXPECT_EQ(got, want) << kernel.name;
  }
  // A token's logits from the split kernel do not depend on the tokens beside it or on the tile size, at a
  // given cluster size (kAuto's moves from 16 CTAs to 8 past 128 tokens: another order of the sums): the
  // first 9 of 130 tokens (24-token tiles at 16 CTAs, 16 at 8) routed alone (8-token tiles) give the same bits.
  for (const RouterKernel& kernel : std::vector<RouterKernel>{{{CudaGemmaRouterDecode::kSplit, 16}, ", split of 16"},
                                                              {{CudaGemmaRouterDecode::kSplit, 8}, ", split of 8"}}) {
    if (!set_cuda_gemma_router_options(cuda_backend(), kernel.options).is_ok()) continue;
    const int64_t hb = 2816, n = 130, few = 9;
    const Bf16Data wb = random_bf16(rng_, e * hb, 0.05f);
    TensorView wv = cuda_.upload(DType::kBF16, {e, hb}, wb.bits.data());
    Pair xb = f32_pair(random_f32(rng_, n * hb, 0.1f, 4.0f), {n, hb});
    Pair xsb = f32_pair(random_f32(rng_, hb, 1.0f, 0.3f), {hb});
    std::vector<std::vector<float>> logits;
    for (const int64_t t : {n, few}) {
      RouterParams r_g{xb.cuda.rows(0, t), wv, TensorView(), cuda_.make(DType::kF32, {t, e}),
                       cuda_.make(DType::kI32, {t, k}), cuda_.make(DType::kF32, {t, k}), k, TensorView(), 1e-6f,
                       xsb.cuda};
      const Status st = cuda_backend().router_topk(r_g);
      if (!st.is_ok() && kernel.options.cluster_ctas == 16) break;  // a device without clusters of 16
      ASSERT_TRUE(st.is_ok()) << kernel.name << ": " << st.to_string();
      logits.push_back(cuda_.download_f32(r_g.logits));
    }
    if (logits.size() < 2) continue;
    const bool same = std::equal(logits[1].begin(), logits[1].end(), logits[0].begin());
    record("gemma router batch independence", "9 of 130 tokens alone" + kernel.name, same ? 0 : 1, 0, 0, same);
    EXPECT_TRUE(same) << kernel.name;
  }
  ASSERT_TRUE(set_cuda_gemma_router_options(cuda_backend(), {}).is_ok());
}

// The attention end with the router of its new residual (GemmaAttentionEndParams::route): on CUDA one launch
// up to 8 tokens (gemma_attention_end_route.cu), two from 9. Against the twin (logits, routes, weights) and
// against the two CUDA launches (residual and normed rows bit for bit); CTAs without experts (6 experts), two
// expert groups per CTA (256), a partial group (40), widths that leave threads one chunk or none (1000, 64);
// graph replay == eager.
TEST_F(GemmaKernelTest, AttentionEndRoute) {
  struct Case {
    int64_t t, e, h, k;
  };
  for (const Case& c : {Case{1, 128, 2816, 8}, Case{3, 128, 2816, 8}, Case{8, 128, 2816, 8}, Case{9, 128, 2816, 8},
                        Case{2, 6, 64, 3}, Case{4, 256, 512, 8}, Case{1, 40, 1000, 5}}) {
    const std::string what = std::to_string(c.t) + " tokens, " + std::to_string(c.e) + " experts, hidden " +
                             std::to_string(c.h) + ", top-" + std::to_string(c.k);
    Bf16Data attn = random_bf16(rng_, c.t * c.h, 3.0f);
    const std::vector<float> res0 = random_f32(rng_, c.t * c.h, 0.2f, 4.0f);
    Pair a = upload_activation(cpu_, cuda_, attn, {c.t, c.h});
    Pair wp[3];
    for (Pair& w : wp) {
      const Bf16Data d = random_bf16(rng_, c.h, 1.0f);
      w = {cpu_.upload(DType::kBF16, {c.h}, d.bits.data()), cuda_.upload(DType::kBF16, {c.h}, d.bits.data())};
    }
    const Bf16Data rw = random_bf16(rng_, c.e * c.h, 0.05f);
    Pair pw{cpu_.upload(DType::kBF16, {c.e, c.h}, rw.bits.data()), cuda_.upload(DType::kBF16, {c.e, c.h}, rw.bits.data())};
    Pair pxs = f32_pair(random_f32(rng_, c.h, 1.0f, 0.3f), {c.h}), ps = f32_pair(random_f32(rng_, c.e, 1.0f, 0.3f), {c.e});
    // One run: the residual restored, then the op (fused: with route; else the attention end, then the router).
    struct Outputs {
      std::vector<float> residual, mlp_in, moe_in, logits, weights;
      std::vector<int32_t> ids;
    };
    auto run = [&](bool cuda, bool fused) -> Outputs {
      Arena& arena = cuda ? cuda_ : cpu_;
      Backend& backend = cuda ? cuda_backend() : cpu_backend();
      const DType act = cuda ? DType::kBF16 : DType::kF32;
      TensorView res = arena.upload(DType::kF32, {c.t, c.h}, res0.data());
      TensorView mlp = arena.make(act, {c.t, c.h}), moe = arena.make(act, {c.t, c.h});
      RouterParams r{res, cuda ? pw.cuda : pw.cpu, TensorView(), arena.make(DType::kF32, {c.t, c.e}),
                     arena.make(DType::kI32, {c.t, c.k}), arena.make(DType::kF32, {c.t, c.k}), c.k,
                     cuda ? ps.cuda : ps.cpu, 1e-6f, cuda ? pxs.cuda : pxs.cpu};
      GemmaAttentionEndParams end{cuda ? a.cuda : a.cpu, res, cuda ? wp[0].cuda : wp[0].cpu, cuda ? wp[1].cuda : wp[1].cpu,
                                  cuda ? wp[2].cuda : wp[2].cpu, mlp, moe, 1e-6f};
      end.route = fused ? &r : nullptr;
      Status st = backend.gemma_attention_end(end);
      if (st.is_ok() && !fused) st = backend.router_topk(r);
      EXPECT_TRUE(st.is_ok()) << what << ": " << st.to_string();
      return {arena.download_f32(res), arena.download_f32(mlp), arena.download_f32(moe), arena.download_f32(r.logits),
              arena.download_f32(r.topk_weights), ids_of(arena.download_bytes(r.topk_ids))};
    };
    const Outputs twin = run(false, true), fused = run(true, true), apart = run(true, false);
    check("attention end route residual", what, fused.residual, twin.residual, 1e-5);
    check("attention end route mlp_in", what, fused.mlp_in, twin.mlp_in, 5e-3);
    check("attention end route logits", what, fused.logits, twin.logits, 1e-5);
    const RouteComparison routes =
        compare_routes(fused.ids, twin.ids, twin.logits, fused.weights, twin.weights, c.e, c.k, 1e-4f);
    check("attention end route weights", what, routes.weights_got, routes.weights_want, 1e-5);
    EXPECT_EQ(routes.other, 0) << what << ": " << routes.other << " tokens rerouted beyond a near tie";
    const bool same = fused.residual == apart.residual && fused.mlp_in == apart.mlp_in && fused.moe_in == apart.moe_in;
    record("attention end route vs two launches", what + (same ? ": residual and norms identical" : ": DIFFER"),
           same ? 0 : 1, 0, 0, same);
    EXPECT_TRUE(same) << what;
    if (c.t != 1) continue;
    // Graph replay: the residual restored before each replay; the eager run's bits.
    TensorView res = cuda_.make(DType::kF32, {c.t, c.h}), mlp = cuda_.make(DType::kBF16, {c.t, c.h}),
               moe = cuda_.make(DType::kBF16, {c.t, c.h});
    RouterParams r{res, pw.cuda, TensorView(), cuda_.make(DType::kF32, {c.t, c.e}), cuda_.make(DType::kI32, {c.t, c.k}),
                   cuda_.make(DType::kF32, {c.t, c.k}), c.k, ps.cuda, 1e-6f, pxs.cuda};
    GemmaAttentionEndParams end{a.cuda, res, wp[0].cuda, wp[1].cuda, wp[2].cuda, mlp, moe, 1e-6f};
    end.route = &r;
    auto graph = cuda_backend().capture([&] { return cuda_backend().gemma_attention_end(end); });
    ASSERT_TRUE(graph.is_ok()) << graph.status().to_string();
    for (int replay = 0; replay < 2; ++replay) {
      ASSERT_TRUE(cuda_backend().copy_from_host(res, res0.data()).is_ok());
      ASSERT_TRUE((*graph)->replay().is_ok());
    }
    const bool replayed = cuda_.download_f32(res) == fused.residual && cuda_.download_f32(r.logits) == fused.logits &&
                          ids_of(cuda_.download_bytes(r.topk_ids)) == fused.ids;
    record("attention end route graph replay", what + (replayed ? ": identical" : ": DIFFER"), replayed ? 0 : 1, 0, 0,
           replayed);
    EXPECT_TRUE(replayed) << what;
  }
  // The route's x must be the residual the op updates.
  TensorView x = cuda_.make(DType::kBF16, {1, 64}), r1 = cuda_.make(DType::kF32, {1, 64}), r2 = cuda_.make(DType::kF32, {1, 64});
  TensorView w = cuda_.make(DType::kBF16, {64}), rw = cuda_.make(DType::kBF16, {6, 64}), xs = cuda_.make(DType::kF32, {64});
  RouterParams r{r2, rw, TensorView(), cuda_.make(DType::kF32, {1, 6}), cuda_.make(DType::kI32, {1, 2}),
                 cuda_.make(DType::kF32, {1, 2}), 2, TensorView(), 1e-6f, xs};
  GemmaAttentionEndParams end{x, r1, w, w, w, x, x, 1e-6f};
  end.route = &r;
  EXPECT_FALSE(cuda_backend().gemma_attention_end(end).is_ok());
}

struct GegluCase {
  int64_t e, h, i, k, t;
  bool hot;  // expert 0 in every token's top-k (one expert with many tiles)
  int64_t used = 0;  // tokens route among experts [0, used) only (the others stay empty); 0 = all
};

// One model's expert tables on both backends.
struct GegluExpertTables {
  TensorView gu_c, gu_g, dn_c, dn_g;
};
// The tables of one shape, made and uploaded once per process and shared by every case of that shape in
// MoeGegluExperts and SideStreamGroup (26B-A4B's are 1.5 GB, which each of the two tests made for itself); routings
// and activations stay fresh per case. Seeded by the test seed and the shape, so MX_GPU_TEST_SEED replays them.
// Never freed (the backends are function-local statics too; the process ends with them).
const GegluExpertTables& shared_geglu_experts(int64_t e, int64_t h, int64_t i) {
  static auto* cache = new std::map<std::tuple<int64_t, int64_t, int64_t>, GegluExpertTables>;
  static auto* cpu = new Arena(cpu_backend());
  static auto* cuda = new Arena(cuda_backend());
  const auto key = std::make_tuple(e, h, i);
  if (auto it = cache->find(key); it != cache->end()) return it->second;
  std::mt19937_64 rng(test_seed() ^ static_cast<uint64_t>((e * 1000003 + h) * 1000003 + i));
  const std::vector<uint16_t> gu = quick_random_bf16_bits(rng, e * 2 * i * h, 0.05f),
                              dn = quick_random_bf16_bits(rng, e * h * i, 0.05f);
  const GegluExpertTables w{cpu->upload(DType::kBF16, {e, 2 * i, h}, gu.data()),
                            cuda->upload(DType::kBF16, {e, 2 * i, h}, gu.data()),
                            cpu->upload(DType::kBF16, {e, h, i}, dn.data()), cuda->upload(DType::kBF16, {e, h, i}, dn.data())};
  return cache->emplace(key, w).first->second;
}

// A case's fresh routing (each token's top-k distinct experts; weights in [0.05, 1.05)) and input rows on both
// backends, and the CPU twin's output on its expert tables.
struct GegluInputs {
  Pair x, weights;
  TensorView ids_cuda;
  std::vector<float> want;
};
GegluInputs geglu_inputs(Arena& cpu, Arena& cuda, std::mt19937& rng, const GegluCase& c, const GegluExpertTables& w) {
  std::vector<int32_t> ids(static_cast<size_t>(c.t * c.k));
  std::vector<float> weights(ids.size());
  std::vector<int32_t> order(static_cast<size_t>(c.e));
  std::iota(order.begin(), order.end(), 0);
  for (int64_t t = 0; t < c.t; ++t) {
    std::shuffle(order.begin(), order.begin() + (c.used > 0 ? c.used : c.e), rng);
    if (c.hot) std::swap(order[0], *std::find(order.begin(), order.end(), 0));
    for (int64_t j = 0; j < c.k; ++j) {
      ids[t * c.k + j] = order[j];
      weights[t * c.k + j] = 0.05f + static_cast<float>(rng() % 1000) / 1000.0f;
    }
  }
  Bf16Data x = random_bf16(rng, c.t * c.h, 1.0f);
  GegluInputs in{upload_activation(cpu, cuda, x, {c.t, c.h}),
                 {cpu.upload(DType::kF32, {c.t, c.k}, weights.data()), cuda.upload(DType::kF32, {c.t, c.k}, weights.data())},
                 cuda.upload(DType::kI32, {c.t, c.k}, ids.data()),
                 {}};
  TensorView id_c = cpu.upload(DType::kI32, {c.t, c.k}, ids.data()), o_c = cpu.make(DType::kF32, {c.t, c.h});
  EXPECT_TRUE(cpu_backend().moe_geglu_experts({in.x.cpu, id_c, in.weights.cpu, w.gu_c, w.dn_c, o_c, c.k}).is_ok());
  in.want = cpu.download_f32(o_c);
  return in;
}

TEST_F(GemmaKernelTest, MoeGegluExperts) {
  // 26B-A4B's shapes at decode (1 and 4 tokens: <= 32 slots, self-routed with the combine fused; 5, 33 and
  // 100 tokens: routing metadata, 8-token tiles, k split; also streamed); the tiny fixture's; odd sizes (I
  // and H not multiples of 64, H % 16 != 0: partial strips and k chunks); prefill with 64-token tiles
  // (slots >= 32 per expert), a hot expert spanning many tiles, 128 experts top-8 at 1000 tokens, empty
  // experts, every token on one expert. The cases of one shape share its expert tables (shared_geglu_experts;
  // 26B's are 1.5 GB), their routings and inputs are fresh per case.
  for (const GegluCase& c : {GegluCase{128, 2816, 704, 8, 1, false}, GegluCase{128, 2816, 704, 8, 4, true},
                             GegluCase{128, 2816, 704, 8, 5, false},
                             GegluCase{128, 2816, 704, 8, 33, true}, GegluCase{128, 2816, 704, 8, 100, false},
                             GegluCase{6, 64, 32, 3, 7, false}, GegluCase{5, 136, 72, 2, 3, false},
                             GegluCase{9, 264, 200, 3, 11, false}, GegluCase{8, 264, 200, 2, 300, true},
                             GegluCase{16, 512, 256, 4, 600, false}, GegluCase{4, 128, 72, 4, 130, false},
                             GegluCase{128, 128, 64, 8, 1000, false}, GegluCase{8, 136, 96, 2, 129, false, 3},
                             GegluCase{4, 128, 64, 1, 200, false, 1}, GegluCase{5, 192, 136, 2, 3, false},
                             GegluCase{6, 200, 128, 3, 5, false}, GegluCase{7, 320, 128, 2, 20, true}}) {
    const GegluExpertTables& w = shared_geglu_experts(c.e, c.h, c.i);
    const TensorView &gu_g = w.gu_g, &dn_g = w.dn_g;
    const GegluInputs in = geglu_inputs(cpu_, cuda_, rng_, c, w);
    const Pair &px = in.x, &pwt = in.weights;
    const TensorView& id_g = in.ids_cuda;
    const std::vector<float>& want = in.want;
    const bool prefill = c.t * c.k >= 32 * c.e, self_routed = c.t * c.k <= 32;
    const std::string what = dims({c.e, c.h, c.i}) + " top" + std::to_string(c.k) + " T=" + std::to_string(c.t) +
                             (c.hot ? " hot expert" : "") +
                             (c.used > 0 ? " on experts 0.." + std::to_string(c.used - 1) : "") +
                             (prefill ? " (grouped)" : self_routed ? " (self-routed, fused combine)"
                                                                                   : " (8-token tiles)");
    // The current kernel replayed from a CUDA graph (a fixed grid; the tile count is read on the device) gives
    // the eager bits `eager`.
    auto expect_graph_replay = [&](const std::string& test, const std::string& detail,
                                   const std::vector<float>& eager) {
      TensorView o_r = cuda_.make(DType::kBF16, {c.t, c.h});
      auto graph = cuda_backend().capture(
          [&] { return cuda_backend().moe_geglu_experts({px.cuda, id_g, pwt.cuda, gu_g, dn_g, o_r, c.k}); });
      ASSERT_TRUE(graph.is_ok()) << graph.status().to_string();
      ASSERT_TRUE((*graph)->replay().is_ok());
      const bool replayed = cuda_.download_f32(o_r) == eager;
      record(test, detail + ", graph replay" + (replayed ? ": identical" : ": DIFFER"), replayed ? 0 : 1, 0, 0,
             replayed);
      EXPECT_TRUE(replayed) << detail;
    };
    // 64-token tiles: the mma.sync kernel and (sm_90 only) the wgmma one, which also takes 128-token tiles and
    // gives the same bits on both; each wgmma run replayed from a CUDA graph gives its eager bits.
    std::vector<float> wgmma_got;
    // 128-token tiles also by weight rows a CTA and ring stages of each GEMM (up rows x stages, down rows x stages).
    struct PrefillKernel {
      CudaBf16ExpertsPrefill kernel;
      int tile_tokens;
      const char* name;
      int up_rows = 0, up_stages = 0, down_rows = 0, down_stages = 0;
      int warp_specialized = -1;  // 128-token tiles: 1 the warp-specialized kernel, -1 a CTA per item, 0 the default
    };
    for (const auto& [kernel, tile_tokens, name, up_rows, up_stages, down_rows, down_stages, warp_specialized] :
         {PrefillKernel{CudaBf16ExpertsPrefill::kMmaSync, 64, ", mma.sync"},
          PrefillKernel{CudaBf16ExpertsPrefill::kWgmma, 64, ", wgmma"},
          PrefillKernel{CudaBf16ExpertsPrefill::kWgmma, 128, ", wgmma 128-token tiles"},
          PrefillKernel{CudaBf16ExpertsPrefill::kWgmma, 128, ", wgmma 128-token tiles, up 128x6 down 128x6", 128, 6, 128, 6},
          PrefillKernel{CudaBf16ExpertsPrefill::kWgmma, 128, ", wgmma 128-token tiles, up 176x5 down 256x4", 176, 5, 256, 4},
          PrefillKernel{CudaBf16ExpertsPrefill::kWgmma, 128, ", wgmma 128-token tiles, up 256x4 down 128x3", 256, 4, 128, 3},
          PrefillKernel{CudaBf16ExpertsPrefill::kWgmma, 128, ", wgmma warp-specialized, up 176x5 down 256x4", 176, 5, 256, 4,
                        1},
          PrefillKernel{CudaBf16ExpertsPrefill::kWgmma, 128, ", wgmma warp-specialized, up 128x6 down 128x6", 128, 6, 128, 6,
                        1},
          PrefillKernel{CudaBf16ExpertsPrefill::kWgmma, 128, ", wgmma 128-token tiles, the default form", 0, 0, 0, 0, 0}}) {
      if (!prefill) break;
      CudaBf16ExpertsOptions o;
      o.prefill = kernel;
      o.prefill_tile_tokens = tile_tokens;
      o.prefill_up_rows = up_rows;
      o.prefill_up_stages = up_stages;
      o.prefill_down_rows = down_rows;
      o.prefill_down_stages = down_stages;
      o.prefill_warp_specialized = warp_specialized;
      ASSERT_TRUE(set_cuda_bf16_experts_options(cuda_backend(), o).is_ok());
      TensorView o_g = cuda_.make(DType::kBF16, {c.t, c.h});
      const Status st = cuda_backend().moe_geglu_experts({px.cuda, id_g, pwt.cuda, gu_g, dn_g, o_g, c.k});
      if (kernel != CudaBf16ExpertsPrefill::kMmaSync && st.code() == StatusCode::kUnimplemented) break;  // not sm_90
      ASSERT_TRUE(st.is_ok()) << st.to_string();
      const std::vector<float> got = cuda_.download_f32(o_g);
      check("moe_geglu_experts", what + name, got, want, 1e-2);
      if (kernel == CudaBf16ExpertsPrefill::kMmaSync) continue;
      // A token's row sums in the same order on either tile size and every weight tile: the first one's bits.
      if (wgmma_got.empty()) wgmma_got = got;
      const bool same = got == wgmma_got;
      record("moe_geglu_experts wgmma", what + name + (same ? ": the wgmma bits" : ": DIFFERS from wgmma"), same ? 0 : 1,
             0, 0, same);
      EXPECT_TRUE(same);
      expect_graph_replay("moe_geglu_experts wgmma", what + name, got);
    }
    // Both decode kernels on 8-token tiles; a token's row alone equals its row in the batch, bit for bit.
    for (const auto& [decode, name] : {std::pair{CudaBf16ExpertsDecode::kRegisterLoads, ", register loads"},
                                       std::pair{CudaBf16ExpertsDecode::kBulkCopies, ", bulk copies"}}) {
      if (prefill) break;
      ASSERT_TRUE(set_cuda_bf16_experts_options(cuda_backend(), {decode}).is_ok());
      TensorView o_g = cuda_.make(DType::kBF16, {c.t, c.h}), one_g = cuda_.make(DType::kBF16, {1, c.h});
      Status st = cuda_backend().moe_geglu_experts({px.cuda, id_g, pwt.cuda, gu_g, dn_g, o_g, c.k});
      ASSERT_TRUE(st.is_ok()) << st.to_string();
      const std::vector<float> got = cuda_.download_f32(o_g);
      check("moe_geglu_experts", what + name, got, want, 1e-2);
      // The bulk kernels' second GEMM with other tile counts per CTA (auto: 1 self-routed, else 3), and both GEMMs
      // in ring stages of 512 or 768 k, by copies per row and as TMA tensor boxes (where k % 64 == 0; else the
      // copies per row): the same sums in the same order, so bit for bit the same (also with the routing ready,
      // where the experts route themselves). The boxes' first form also replayed from a graph.
      for (const CudaBulkCopyForm form : {CudaBulkCopyForm::kRows, CudaBulkCopyForm::kBoxes}) {
        for (const auto& [tiles_per_cta, up_stage_k, down_stage_k] :
             {std::tuple{1, 256, 256}, std::tuple{3, 256, 256}, std::tuple{1, 512, 768}, std::tuple{3, 768, 512},
              std::tuple{1, 256, 768}, std::tuple{2, 512, 256}}) {
          if (decode != CudaBf16ExpertsDecode::kBulkCopies) break;
          CudaBf16ExpertsOptions o{decode, tiles_per_cta};
          o.bulk_up_stage_k = up_stage_k;
          o.bulk_down_stage_k = down_stage_k;
          o.bulk_copy_form = form;
          ASSERT_TRUE(set_cuda_bf16_experts_options(cuda_backend(), o).is_ok());
          const std::string form_name = form == CudaBulkCopyForm::kBoxes ? ", tensor boxes" : "";
          for (int run = 0; run < (self_routed ? 2 : 1); ++run) {
            TensorView o_t = cuda_.make(DType::kBF16, {c.t, c.h});
            const Status st = cuda_backend().moe_geglu_experts({px.cuda, id_g, pwt.cuda, gu_g, dn_g, o_t, c.k, run == 1});
            ASSERT_TRUE(st.is_ok()) << st.to_string();
            const bool same = cuda_.download_f32(o_t) == got;
            const std::string how = what + name + form_name + ", " + std::to_string(tiles_per_cta) +
                                    " per CTA, stages of " + std::to_string(up_stage_k) + " and " +
                                    std::to_string(down_stage_k) + (run == 1 ? ", routing ready" : "");
            record("moe_geglu_experts tiles per CTA", how + (same ? ": identical" : ": DIFFER"), same ? 0 : 1, 0, 0, same);
            EXPECT_TRUE(same) << tiles_per_cta << " " << up_stage_k << " " << down_stage_k << " " << run << form_name;
          }
          if (form == CudaBulkCopyForm::kBoxes && tiles_per_cta == 1 && up_stage_k == 256 && down_stage_k == 256)
            expect_graph_replay("moe_geglu_experts tensor boxes", what + name + form_name, got);
          ASSERT_TRUE(set_cuda_bf16_experts_options(cuda_backend(), {decode}).is_ok());
        }
      }
      // The streamed kernel (routing metadata only) on tiles of 8, 16 and 32 tokens and rings of 2 and 5 slots, by
      // copies per row and as TMA tensor boxes (where k % 64 == 0; else the copies per row): the bulk kernel's
      // fragments, k order and warp-order sums, so bit for bit its result.
      for (const CudaBulkCopyForm form : {CudaBulkCopyForm::kRows, CudaBulkCopyForm::kBoxes}) {
        for (const auto& [tile_tokens, ring_slots] : {std::pair{8, 4}, std::pair{16, 2}, std::pair{32, 5}}) {
          if (self_routed || decode != CudaBf16ExpertsDecode::kBulkCopies) break;
          CudaBf16ExpertsOptions o{CudaBf16ExpertsDecode::kStreamed};
          o.stream_tile_tokens = tile_tokens;
          o.stream_ring_slots = ring_slots;
          o.bulk_copy_form = form;
          ASSERT_TRUE(set_cuda_bf16_experts_options(cuda_backend(), o).is_ok());
          TensorView o_s = cuda_.make(DType::kBF16, {c.t, c.h});
          st = cuda_backend().moe_geglu_experts({px.cuda, id_g, pwt.cuda, gu_g, dn_g, o_s, c.k});
          ASSERT_TRUE(st.is_ok()) << st.to_string();
          const bool same = cuda_.download_f32(o_s) == got;
          const std::string how = what + (form == CudaBulkCopyForm::kBoxes ? ", tensor boxes, " : ", ") +
                                  std::to_string(tile_tokens) + "-token tiles";
          record("moe_geglu_experts streamed", how + ", " + std::to_string(ring_slots) + " slots" +
                                                   (same ? ": identical to bulk copies" : ": DIFFER"),
                 same ? 0 : 1, 0, 0, same);
          EXPECT_TRUE(same) << tile_tokens << " " << ring_slots << " " << static_cast<int>(form);
          expect_graph_replay("moe_geglu_experts streamed", how, got);
          ASSERT_TRUE(set_cuda_bf16_experts_options(cuda_backend(), {decode}).is_ok());
        }
      }
      if (self_routed && decode == CudaBf16ExpertsDecode::kBulkCopies) {  // routed before the PDL wait
        GegluMoeParams ready{px.cuda, id_g, pwt.cuda, gu_g, dn_g, cuda_.make(DType::kBF16, {c.t, c.h}), c.k};
        ready.routing_ready = true;
        ASSERT_TRUE(cuda_backend().moe_geglu_experts(ready).is_ok());
        const bool same = cuda_.download_f32(ready.out) == got;
        record("moe_geglu_experts routing ready", what + name + (same ? ": identical" : ": DIFFER"), same ? 0 : 1, 0, 0,
               same);
        EXPECT_TRUE(same);
        // Both GEMMs in one persistent launch (kFused) on rings of 2 and 5 slots, eager (twice: the counters
        // reset themselves) and from a graph: the bulk kernels' sums in their order, so bit for bit.
        for (const int ring_slots : {2, 5}) {
          CudaBf16ExpertsOptions o{CudaBf16ExpertsDecode::kFused};
          o.fused_ring_slots = ring_slots;
          ASSERT_TRUE(set_cuda_bf16_experts_options(cuda_backend(), o).is_ok());
          const std::string how = what + ", fused, " + std::to_string(ring_slots) + " slots";
          for (int run = 0; run < 2; ++run) {
            TensorView o_f = cuda_.make(DType::kBF16, {c.t, c.h});
            st = cuda_backend().moe_geglu_experts({px.cuda, id_g, pwt.cuda, gu_g, dn_g, o_f, c.k, run == 1});
            ASSERT_TRUE(st.is_ok()) << st.to_string();
            const bool fused_same = cuda_.download_f32(o_f) == got;
            record("moe_geglu_experts fused", how + (run == 1 ? ", routing ready" : "") +
                                                  (fused_same ? ": identical to bulk copies" : ": DIFFER"),
                   fused_same ? 0 : 1, 0, 0, fused_same);
            EXPECT_TRUE(fused_same) << ring_slots << " " << run;
          }
          TensorView o_r = cuda_.make(DType::kBF16, {c.t, c.h});
          GegluMoeParams replayed_params{px.cuda, id_g, pwt.cuda, gu_g, dn_g, o_r, c.k};
          replayed_params.routing_ready = true;
          auto graph = cuda_backend().capture([&] { return cuda_backend().moe_geglu_experts(replayed_params); });
          ASSERT_TRUE(graph.is_ok()) << graph.status().to_string();
          for (int replay = 0; replay < 2; ++replay) ASSERT_TRUE((*graph)->replay().is_ok());
          const bool replayed = cuda_.download_f32(o_r) == got;
          record("moe_geglu_experts fused", how + ", graph replayed twice" + (replayed ? ": identical" : ": DIFFER"),
                 replayed ? 0 : 1, 0, 0, replayed);
          EXPECT_TRUE(replayed) << ring_slots;
        }
        ASSERT_TRUE(set_cuda_bf16_experts_options(cuda_backend(), {decode}).is_ok());
      }
      if (c.t == 1) continue;
      st = cuda_backend().moe_geglu_experts({px.cuda.rows(0, 1), id_g.rows(0, 1), pwt.cuda.rows(0, 1),
                                             gu_g, dn_g, one_g, c.k});
      ASSERT_TRUE(st.is_ok()) << st.to_string();
      const bool same = cuda_.download_f32(one_g) == std::vector<float>(got.begin(), got.begin() + c.h);
      record("moe_geglu_experts batch independence", what + name + (same ? ": token 0 alone identical" : ": DIFFER"),
             same ? 0 : 1, 0, 0, same);
      EXPECT_TRUE(same);
    }
    ASSERT_TRUE(set_cuda_bf16_experts_options(cuda_backend(), {}).is_ok());
  }
}

// Runs the experts MX_GPU_TEST_RUNS times (default 24) on one input under options `o`, the first run against the
// CPU twin, and records how many later runs' bits differ from the first's (a ring slot refilled while its reads
// were still pending gives a wrong block of rows in an odd run, not a rounding: docs/PERF.md, session 20).
void check_experts_repeatable(Arena& cuda, const GegluCase& c, const GegluExpertTables& w, const GegluInputs& in,
                              const CudaBf16ExpertsOptions& o, const std::string& what) {
  const char* runs_env = std::getenv("MX_GPU_TEST_RUNS");
  const int runs = runs_env != nullptr && std::atoi(runs_env) > 1 ? std::atoi(runs_env) : 24;
  ASSERT_TRUE(set_cuda_bf16_experts_options(cuda_backend(), o).is_ok());
  std::vector<float> first;
  int differ = 0;
  int64_t values = 0;  // differing values over all runs, and the largest difference
  double largest = 0;
  for (int run = 0; run < runs; ++run) {
    TensorView o_g = cuda.make(DType::kBF16, {c.t, c.h});
    ASSERT_TRUE(cuda_backend().moe_geglu_experts({in.x.cuda, in.ids_cuda, in.weights.cuda, w.gu_g, w.dn_g, o_g, c.k})
                    .is_ok());
    std::vector<float> got = cuda.download_f32(o_g);
    if (run == 0) {
      check("moe_geglu_experts repeatable", what, got, in.want, 1e-2);
      first = std::move(got);
    } else if (got != first) {
      ++differ;
      for (size_t i = 0; i < got.size(); ++i) {
        values += got[i] != first[i];
        largest = std::max(largest, static_cast<double>(std::fabs(got[i] - first[i])));
      }
    }
  }
  record("moe_geglu_experts repeatable",
         what + ": " + std::to_string(differ) + " of " + std::to_string(runs - 1) + " runs differ from the first (" +
             std::to_string(values) + " values)",
         differ, largest, 0, differ == 0);
  EXPECT_EQ(differ, 0) << what;
  ASSERT_TRUE(set_cuda_bf16_experts_options(cuda_backend(), {}).is_ok());
}

// The bulk kernels through routing metadata with several 8-token tiles per CTA reuse their ring slots across the
// tiles (the second GEMM at 256-wide stages: 9 stages in 4 slots): one input run many times gives the first run's
// bits every time, for each copy form at 1 and 3 tiles per CTA (session 19 saw one run of 3 differ), and the first
// run is within the CPU twin's tolerance. 26B-A4B's shapes at 100 tokens and a small model at 60. MX_GPU_TEST_RUNS
// sets the runs per form (default 24; fewer under compute-sanitizer).
TEST_F(GemmaKernelTest, MoeGegluExpertsRepeatable) {
  for (const GegluCase& c : {GegluCase{128, 2816, 704, 8, 100, false}, GegluCase{16, 256, 704, 4, 60, false}}) {
    const GegluExpertTables& w = shared_geglu_experts(c.e, c.h, c.i);
    const GegluInputs in = geglu_inputs(cpu_, cuda_, rng_, c, w);
    for (const CudaBulkCopyForm form : {CudaBulkCopyForm::kBoxes, CudaBulkCopyForm::kRows}) {
      for (const int tiles_per_cta : {3, 1}) {
        CudaBf16ExpertsOptions o{CudaBf16ExpertsDecode::kBulkCopies, tiles_per_cta};
        o.bulk_up_stage_k = 256;
        o.bulk_down_stage_k = 256;
        o.bulk_copy_form = form;
        check_experts_repeatable(cuda_, c, w, in, o,
                                 dims({c.e, c.h, c.i}) + " top" + std::to_string(c.k) + " T=" + std::to_string(c.t) +
                                     (form == CudaBulkCopyForm::kBoxes ? ", tensor boxes, " : ", copies per row, ") +
                                     std::to_string(tiles_per_cta) + " per CTA, stages of 256");
      }
    }
  }
}

// The same repeat test for the kernels whose producer warp refills ring slots after the consumers release them
// through `empty` mbarriers (and a proxy fence, fence_ring_refill): the streamed kernel (routing metadata: batched
// decode from 5 tokens of 26B-A4B) at each tile size and at 2 and 4 ring slots (2: a slot refilled every other
// stage), and the fused one (both GEMMs in one persistent launch: 2 to 4 tokens) at 2 and 6 slots. H200, session 21
// W1, 80 runs a form beside a Gemma-4 load: none differed, with the fence or without it.
TEST_F(GemmaKernelTest, MoeGegluStreamedFusedRepeatable) {
  struct Case {
    GegluCase c;
    CudaBf16ExpertsDecode decode;
    int tile_tokens, slots;
  };
  using D = CudaBf16ExpertsDecode;
  const GegluCase big100{128, 2816, 704, 8, 100, false}, big4{128, 2816, 704, 8, 4, false},
      small60{16, 256, 704, 4, 60, false}, small8{16, 256, 704, 4, 8, false};
  for (const Case& k : {Case{big100, D::kStreamed, 16, 4}, Case{big100, D::kStreamed, 16, 2},
                        Case{big100, D::kStreamed, 32, 2}, Case{small60, D::kStreamed, 8, 2},
                        Case{big100, D::kStreamed, 16, -4},
                        Case{big4, D::kFused, 0, 6}, Case{big4, D::kFused, 0, 2}, Case{small8, D::kFused, 0, 2}}) {
    const GegluCase& c = k.c;
    const GegluExpertTables& w = shared_geglu_experts(c.e, c.h, c.i);
    const GegluInputs in = geglu_inputs(cpu_, cuda_, rng_, c, w);
    // slots < 0: the streamed kernel's copies per row (kRows) on -slots; else its default (tensor boxes at k % 64 == 0).
    const int slots = k.slots < 0 ? -k.slots : k.slots;
    CudaBf16ExpertsOptions o{k.decode, 0};
    o.stream_tile_tokens = k.tile_tokens;
    o.stream_ring_slots = k.decode == D::kStreamed ? slots : 0;
    o.fused_ring_slots = k.decode == D::kFused ? slots : 0;
    if (k.slots < 0) o.bulk_copy_form = CudaBulkCopyForm::kRows;
    const std::string form = k.decode == D::kStreamed
                                 ? ", streamed " + std::to_string(k.tile_tokens) + "-token tiles, " +
                                       (k.slots < 0 ? "copies per row, " : "")
                                 : std::string(", fused, ");
    check_experts_repeatable(cuda_, c, w, in, o,
                             dims({c.e, c.h, c.i}) + " top" + std::to_string(c.k) + " T=" + std::to_string(c.t) + form +
                                 std::to_string(slots) + " slots");
  }
}

// Backend::begin_side on CUDA: the model's dense MLP (gate|up on the skinny kernel, geglu, down) as the side group
// on a second stream beside the experts (routing not ready: they follow the op that routed), eagerly and replayed
// twice from a graph, gives the in-order run's bits; both against the CPU twin running every op in order. Gemma-4
// 26B-A4B's shapes at one token, an odd model at 3 tokens, and a step past max_tokens (in order: begin_side false).
TEST_F(GemmaKernelTest, SideStreamGroup) {
  struct Case {
    int64_t t, h, inter, e, i, k;
  };
  std::mt19937_64 table_rng(rng_());
  ASSERT_TRUE(set_cuda_side_stream_options(cuda_backend(), {4}).is_ok());
  for (const Case& c : {Case{1, 2816, 2112, 128, 704, 8}, Case{3, 264, 200, 9, 200, 3}, Case{5, 264, 200, 9, 200, 3}}) {
    const GegluExpertTables& w = shared_geglu_experts(c.e, c.h, c.i);
    const std::vector<uint16_t> gu_bits = quick_random_bf16_bits(table_rng, 2 * c.inter * c.h, 0.02f),
                                dn_bits = quick_random_bf16_bits(table_rng, c.h * c.inter, 0.02f);
    const TensorView gu_c = cpu_.upload(DType::kBF16, {2 * c.inter, c.h}, gu_bits.data()),
                     gu_g = cuda_.upload(DType::kBF16, {2 * c.inter, c.h}, gu_bits.data());
    const TensorView dn_c = cpu_.upload(DType::kBF16, {c.h, c.inter}, dn_bits.data()),
                     dn_g = cuda_.upload(DType::kBF16, {c.h, c.inter}, dn_bits.data());
    std::vector<int32_t> ids(static_cast<size_t>(c.t * c.k)), order(static_cast<size_t>(c.e));
    std::vector<float> weights(ids.size());
    std::iota(order.begin(), order.end(), 0);
    for (int64_t t = 0; t < c.t; ++t) {
      std::shuffle(order.begin(), order.end(), rng_);
      for (int64_t j = 0; j < c.k; ++j) {
        ids[static_cast<size_t>(t * c.k + j)] = order[static_cast<size_t>(j)];
        weights[static_cast<size_t>(t * c.k + j)] = 0.05f + static_cast<float>(rng_() % 1000) / 1000.0f;
      }
    }
    const Pair x = upload_activation(cpu_, cuda_, random_bf16(rng_, c.t * c.h, 1.0f), {c.t, c.h});
    const Pair x_moe = upload_activation(cpu_, cuda_, random_bf16(rng_, c.t * c.h, 1.0f), {c.t, c.h});
    const TensorView id_c = cpu_.upload(DType::kI32, {c.t, c.k}, ids.data()),
                     id_g = cuda_.upload(DType::kI32, {c.t, c.k}, ids.data());
    const Pair wt = f32_pair(weights, {c.t, c.k});
    // The CPU twin, every op in order.
    const TensorView gate_up_c = cpu_.make(DType::kF32, {c.t, 2 * c.inter});
    const TensorView act_c = cpu_.make(DType::kF32, {c.t, c.inter});
    const TensorView proj_c = cpu_.make(DType::kF32, {c.t, c.h}), moe_c = cpu_.make(DType::kF32, {c.t, c.h});
    ASSERT_TRUE(cpu_backend().linear(x.cpu, gu_c, TensorView(), gate_up_c).is_ok());
    ASSERT_TRUE(cpu_backend().geglu(gate_up_c, act_c).is_ok());
    ASSERT_TRUE(cpu_backend().linear(act_c, dn_c, TensorView(), proj_c).is_ok());
    ASSERT_TRUE(cpu_backend().moe_geglu_experts({x_moe.cpu, id_c, wt.cpu, w.gu_c, w.dn_c, moe_c, c.k}).is_ok());
    // The same ops on CUDA: in order, or with the MLP as the side group; fresh outputs per run.
    const TensorView gate_up = cuda_.make(DType::kBF16, {c.t, 2 * c.inter});
    const TensorView act = cuda_.make(DType::kBF16, {c.t, c.inter});
    auto run = [&](bool side, TensorView proj, TensorView moe, bool* forked) -> Status {
      bool beside = false;
      if (side) {
        MX_ASSIGN_OR_RETURN(beside, cuda_backend().begin_side(c.t));
      }
      *forked = beside;
      MX_RETURN_IF_ERROR(cuda_backend().linear(x.cuda, gu_g, TensorView(), gate_up));
      MX_RETURN_IF_ERROR(cuda_backend().geglu(gate_up, act));
      MX_RETURN_IF_ERROR(cuda_backend().linear(act, dn_g, TensorView(), proj));
      if (beside) MX_RETURN_IF_ERROR(cuda_backend().end_side());
      MX_RETURN_IF_ERROR(cuda_backend().moe_geglu_experts({x_moe.cuda, id_g, wt.cuda, w.gu_g, w.dn_g, moe, c.k}));
      return beside ? cuda_backend().join_side() : Status::ok();
    };
    const std::string what = "T=" + std::to_string(c.t) + " " + dims({c.h, c.inter}) + " MLP beside " +
                             dims({c.e, c.i}) + " top" + std::to_string(c.k) + " experts";
    TensorView proj0 = cuda_.make(DType::kBF16, {c.t, c.h}), moe0 = cuda_.make(DType::kBF16, {c.t, c.h});
    bool forked = false;
    ASSERT_TRUE(run(false, proj0, moe0, &forked).is_ok());
    const std::vector<float> want_proj = cuda_.download_f32(proj0), want_moe = cuda_.download_f32(moe0);
    check("side stream group", what + ", in order: MLP vs CPU", want_proj, cpu_.download_f32(proj_c), 1e-2);
    check("side stream group", what + ", in order: experts vs CPU", want_moe, cpu_.download_f32(moe_c), 1e-2);
    TensorView proj1 = cuda_.make(DType::kBF16, {c.t, c.h}), moe1 = cuda_.make(DType::kBF16, {c.t, c.h});
    const Status st = run(true, proj1, moe1, &forked);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    EXPECT_EQ(forked, c.t <= 4);
    ASSERT_TRUE(cuda_backend().synchronize().is_ok());
    const bool eager_same = cuda_.download_f32(proj1) == want_proj && cuda_.download_f32(moe1) == want_moe;
    const std::string how = what + (forked ? ", side stream" : ", past max_tokens (in order)");
    record("side stream group", how + (eager_same ? ": in-order bits" : ": DIFFER"), eager_same ? 0 : 1, 0, 0,
           eager_same);
    EXPECT_TRUE(eager_same);
    TensorView proj2 = cuda_.make(DType::kBF16, {c.t, c.h}), moe2 = cuda_.make(DType::kBF16, {c.t, c.h});
    auto graph = cuda_backend().capture([&] { return run(true, proj2, moe2, &forked); });
    ASSERT_TRUE(graph.is_ok()) << graph.status().to_string();
    for (int replay = 0; replay < 2; ++replay) ASSERT_TRUE((*graph)->replay().is_ok());
    ASSERT_TRUE(cuda_backend().synchronize().is_ok());
    const bool replayed = cuda_.download_f32(proj2) == want_proj && cuda_.download_f32(moe2) == want_moe;
    record("side stream group", how + ", graph replayed twice" + (replayed ? ": in-order bits" : ": DIFFER"),
           replayed ? 0 : 1, 0, 0, replayed);
    EXPECT_TRUE(replayed);
  }
  // A second begin_side before the first group is joined is an error; the group then joins as usual.
  auto first = cuda_backend().begin_side(1);
  ASSERT_TRUE(first.is_ok() && *first);
  EXPECT_FALSE(cuda_backend().begin_side(1).is_ok());
  EXPECT_FALSE(cuda_backend().join_side().is_ok());  // before end_side
  ASSERT_TRUE(cuda_backend().end_side().is_ok());
  ASSERT_TRUE(cuda_backend().join_side().is_ok());
  ASSERT_TRUE(set_cuda_side_stream_options(cuda_backend(), {}).is_ok());
}

}  // namespace
}  // namespace mx::gpu_test
