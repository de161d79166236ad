// Every CUDA op against its CPU twin on fresh random inputs: outputs poisoned with NaN first, odd sizes,
// page-boundary shapes, long contexts past the sliding window, decode (split-KV) and prefill paths.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <thread>
#include <tuple>

#include "backend/cuda/attention_wide_config.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_info.h"
#include "backend/cuda/kernel_configs.h"
#include "backend/kv_cache.h"
#include "core/dtype.h"
#include "gpu_test_util.h"
#include "model/dense_fp8.h"
#include "model/gemma4/gemma4_model.h"
#include "model/rope.h"
#include "runtime/batch_staging.h"

namespace mx::gpu_test {
namespace {

std::string shape_str(std::initializer_list<int64_t> dims) {
  std::string s;
  for (int64_t d : dims) {
    if (!s.empty()) s += "x";
    s += std::to_string(d);
  }
  return s;
}

class KernelTest : public ::testing::Test {
 protected:
  KernelTest() : cpu_(cpu_backend()), cuda_(cuda_backend()), rng_(test_seed()) {}
  // gemma_rope: Gemma-4's frequencies (theta, partial factor) instead of YaRN's, scale 1.
  // norms: Gemma-4's per-head q/k/v norms fused into the op (QkvRopeParams::norm_eps).
  void run_qkv_rope(int64_t n_q, int64_t n_kv, int64_t hd, const Gemma4Rope* gemma_rope = nullptr, bool norms = false,
                    bool prefetch = false);
  Arena cpu_, cuda_;
  std::mt19937 rng_;
};

TEST_F(KernelTest, EmbeddingAndGather) {
  const int64_t vocab = 1000, h = 320, t = 37;
  Bf16Data table = random_bf16(rng_, vocab * h, 1.0f);
  std::vector<int32_t> ids(t);
  for (auto& id : ids) id = static_cast<int32_t>(rng_() % vocab);
  Pair tab = upload_activation(cpu_, cuda_, table, {vocab, h});
  TensorView ids_c = cpu_.upload(DType::kI32, {t}, ids.data()), ids_g = cuda_.upload(DType::kI32, {t}, ids.data());
  // The CPU embedding reads a bf16 table; give both the bf16 bits.
  TensorView tab_cpu = cpu_.upload(DType::kBF16, {vocab, h}, table.bits.data());
  TensorView out_c = cpu_.make(DType::kF32, {t, h}), out_g = cuda_.make(DType::kBF16, {t, h});
  ASSERT_TRUE(cpu_backend().embedding(tab_cpu, ids_c, out_c).is_ok());
  ASSERT_TRUE(cuda_backend().embedding(tab.cuda, ids_g, out_g).is_ok());
  check("embedding", shape_str({vocab, h, t}) + " bf16 out", cuda_.download_f32(out_g), cpu_.download_f32(out_c), 0.0);
  TensorView out_f = cuda_.make(DType::kF32, {t, h});
  ASSERT_TRUE(cuda_backend().embedding(tab.cuda, ids_g, out_f).is_ok());
  check("embedding", shape_str({vocab, h, t}) + " f32 out", cuda_.download_f32(out_f), cpu_.download_f32(out_c), 0.0);

  std::vector<int32_t> rows = {5, 0, 36, 17, 17};
  TensorView rows_c = cpu_.upload(DType::kI32, {5}, rows.data()), rows_g = cuda_.upload(DType::kI32, {5}, rows.data());
  TensorView g_c = cpu_.make(DType::kF32, {5, h}), g_g = cuda_.make(DType::kBF16, {5, h});
  ASSERT_TRUE(cpu_backend().gather_rows(out_c, rows_c, g_c).is_ok());
  ASSERT_TRUE(cuda_backend().gather_rows(out_g, rows_g, g_g).is_ok());
  check("gather_rows", "5 of 37 rows", cuda_.download_f32(g_g), cpu_.download_f32(g_c), 0.0);
}

TEST_F(KernelTest, RmsNormAndResidualAdd) {
  for (int64_t h : {320, 2880, 4096}) {
    const int64_t rows = 33;
    const bool f32_residual = h != 320;  // the CUDA backend's residual stream is f32; bf16 is supported too
    Bf16Data x = random_bf16(rng_, rows * h, 2.0f), d = random_bf16(rng_, rows * h, 1.0f), w = random_bf16(rng_, h, 1.0f);
    if (f32_residual) {
      std::normal_distribution<float> dist(0.0f, 2.0f);
      for (auto& v : x.values) v = dist(rng_);  // not bf16-representable: the f32 path must keep the bits
    }
    Pair px = f32_residual ? Pair{cpu_.upload(DType::kF32, {rows, h}, x.values.data()),
                                  cuda_.upload(DType::kF32, {rows, h}, x.values.data())}
                           : upload_activation(cpu_, cuda_, x, {rows, h});
    Pair pd = upload_activation(cpu_, cuda_, d, {rows, h});
    TensorView w_c = cpu_.upload(DType::kBF16, {h}, w.bits.data()), w_g = cuda_.upload(DType::kBF16, {h}, w.bits.data());
    TensorView o_c = cpu_.make(DType::kF32, {rows, h}), o_g = cuda_.make(DType::kBF16, {rows, h});
    ASSERT_TRUE(cpu_backend().rms_norm(px.cpu, w_c, 1e-5f, o_c).is_ok());
    ASSERT_TRUE(cuda_backend().rms_norm(px.cuda, w_g, 1e-5f, o_g).is_ok());
    const std::string res = f32_residual ? " f32 residual" : " bf16 residual";
    check("rms_norm", shape_str({rows, h}) + res, cuda_.download_f32(o_g), cpu_.download_f32(o_c), 5e-3);
    ASSERT_TRUE(cpu_backend().add_rms_norm(px.cpu, pd.cpu, w_c, 1e-5f, o_c).is_ok());
    ASSERT_TRUE(cuda_backend().add_rms_norm(px.cuda, pd.cuda, w_g, 1e-5f, o_g).is_ok());
    check("add_rms_norm out", shape_str({rows, h}) + res, cuda_.download_f32(o_g), cpu_.download_f32(o_c), 5e-3);
    check("add_rms_norm residual", shape_str({rows, h}) + res, cuda_.download_f32(px.cuda), cpu_.download_f32(px.cpu),
          f32_residual ? 1e-6 : 5e-3);
  }
}

// A linear's operands on both backends: x [m, k] as an activation, bf16 w [n, k] and (with `bias`) b [n].
struct LinearOperands {
  Pair x;
  TensorView w_c, w_g, b_c, b_g;
};
LinearOperands upload_linear(Arena& cpu, Arena& cuda, std::mt19937& rng, int64_t m, int64_t n, int64_t k, bool bias) {
  const Bf16Data x = random_bf16(rng, m * k, 1.0f), w = random_bf16(rng, n * k, 0.05f), b = random_bf16(rng, n, 1.0f);
  LinearOperands o{upload_activation(cpu, cuda, x, {m, k}), cpu.upload(DType::kBF16, {n, k}, w.bits.data()),
                   cuda.upload(DType::kBF16, {n, k}, w.bits.data()), TensorView(), TensorView()};
  if (bias) {
    o.b_c = cpu.upload(DType::kBF16, {n}, b.bits.data());
    o.b_g = cuda.upload(DType::kBF16, {n}, b.bits.data());
  }
  return o;
}

TEST_F(KernelTest, Linear) {
  struct Case {
    int64_t m, n, k;
    bool bias, f32;
    int skinny_max_rows = 16;  // skinny_linear max_rows: 16 forces the skinny kernel, 0 cuBLASLt
    int k_splits = 0;          // > 0 forces the skinny kernel's k split
    int chunks = 0;            // 8: the 8-chunk variant with one token tile
    int strip_rows = 0;        // 8 to 16 forces the skinny kernel's strips (0: skinny_linear_strip_rows)
  };
  // Up to 16 rows the skinny kernel runs: one and two token tiles, n not a multiple of 16, k a multiple of
  // 8 but not of 32 (a partial last chunk), k shorter than the CTA's 8 warps' chunks; the same shapes once
  // more through cuBLASLt.
  for (const Case& c : {Case{1, 5120, 2880, true, false}, Case{7, 640, 320, true, false}, Case{64, 2880, 4096, true, false},
                        Case{3, 1024, 256, false, true}, Case{33, 200, 320, true, true}, Case{1, 77, 328, true, false},
                        Case{8, 2880, 4096, true, false}, Case{9, 133, 2888, true, false}, Case{16, 1000, 64, false, true},
                        Case{13, 35, 24, true, true}, Case{2, 5120, 2880, true, false, 0}, Case{16, 77, 328, true, true, 0},
                        Case{5, 300, 2888, true, true, 16, 8}, Case{12, 2880, 4096, true, false, 16, 3},
                        Case{3, 5120, 2880, true, false, 16, 0, 8}, Case{6, 203, 1000, false, true, 16, 2, 8},
                        Case{1, 2816, 4096, true, false}, Case{1, 2816, 4096, true, false, 16, 0, 0, 16},
                        Case{9, 2816, 2112, false, true, 16, 0, 0, 13}, Case{5, 300, 2888, true, true, 16, 3, 0, 9},
                        Case{3, 77, 328, true, false, 16, 0, 8, 11}, Case{16, 1000, 64, false, true, 16, 0, 0, 8}}) {
    ASSERT_TRUE(set_cuda_skinny_linear_options(cuda_backend(), {c.skinny_max_rows, c.k_splits, c.chunks, c.strip_rows})
                    .is_ok());
    const auto [px, w_c, w_g, b_c, b_g] = upload_linear(cpu_, cuda_, rng_, c.m, c.n, c.k, c.bias);
    TensorView o_c = cpu_.make(DType::kF32, {c.m, c.n}), o_g = cuda_.make(c.f32 ? DType::kF32 : DType::kBF16, {c.m, c.n});
    ASSERT_TRUE(cpu_backend().linear(px.cpu, w_c, b_c, o_c).is_ok());
    ASSERT_TRUE(cuda_backend().linear(px.cuda, w_g, b_g, o_g).is_ok());
    const bool skinny = cuda::use_skinny_linear(c.m, c.k, c.skinny_max_rows);
    ASSERT_TRUE(set_cuda_skinny_linear_options(cuda_backend(), {}).is_ok());
    check("linear", shape_str({c.m, c.n, c.k}) + (c.bias ? " bias" : "") + (c.f32 ? " f32-out" : " bf16-out") +
                        (skinny ? " skinny" : " cublaslt") +
                        (c.k_splits ? " k-splits " + std::to_string(c.k_splits) : std::string()) +
                        (c.chunks ? " chunks " + std::to_string(c.chunks) : std::string()) +
                        (c.strip_rows ? " strips of " + std::to_string(c.strip_rows) : std::string()),
          cuda_.download_f32(o_g), cpu_.download_f32(o_c), c.f32 ? 1e-4 : 5e-3);
  }
}

// A token's output row of the skinny kernel does not depend on the other rows of the batch (the k split
// is fixed by k): the same token alone and among 15 others gives the same bits.
TEST_F(KernelTest, SkinnyLinearRowsAreBatchIndependent) {
  const int64_t n = 2880, k = 4096, m = 16;
  Bf16Data x = random_bf16(rng_, m * k, 1.0f), w = random_bf16(rng_, n * k, 0.05f), b = random_bf16(rng_, n, 1.0f);
  TensorView w_g = cuda_.upload(DType::kBF16, {n, k}, w.bits.data()), b_g = cuda_.upload(DType::kBF16, {n}, b.bits.data());
  TensorView x_g = cuda_.upload(DType::kBF16, {m, k}, x.bits.data());
  TensorView all = cuda_.make(DType::kBF16, {m, n});
  ASSERT_TRUE(set_cuda_skinny_linear_options(cuda_backend(), {16}).is_ok());
  ASSERT_TRUE(cuda_backend().linear(x_g, w_g, b_g, all).is_ok());
  const std::vector<float> all_h = cuda_.download_f32(all);
  for (int64_t rows : {1, 5, 8}) {
    TensorView part = cuda_.make(DType::kBF16, {rows, n});
    ASSERT_TRUE(cuda_backend().linear(x_g.rows(0, rows), w_g, b_g, part).is_ok());
    const std::vector<float> part_h = cuda_.download_f32(part);
    const std::vector<float> want(all_h.begin(), all_h.begin() + rows * n);
    check("skinny linear batch independence", std::to_string(rows) + " of 16 rows", part_h, want, 0.0);
  }
  ASSERT_TRUE(set_cuda_skinny_linear_options(cuda_backend(), {}).is_ok());
}

// The staged skinny linear (CudaSkinnyLinearOptions::staged: a CTA's strip in shared memory before its PDL wait)
// gives the skinny kernel's bits, eagerly and replayed from a graph; both against the CPU twin. Gemma-4's o_proj
// (sliding), gate|up and down at one token, gpt-oss's o_proj, odd shapes (partial strips, k % 32 != 0, k shorter
// than the warps' chunks, 8 tokens, f32 out, no bias), shapes that do not fit one wave (the skinny kernel), and with
// CudaSkinnyLinearOptions::staged_waves 2 or 3 the shapes of 2-3 waves (Gemma-4's q|k|v, sliding and full, and its
// full layers' o_proj; gpt-oss's q|k|v at 8 tokens).
TEST_F(KernelTest, SkinnyLinearStaged) {
  auto placement = cuda_placement(cuda_backend());
  ASSERT_TRUE(placement.is_ok());
  auto dev = cuda::query_device_info(placement->device);
  ASSERT_TRUE(dev.is_ok());
  struct Case {
    int64_t m, n, k;
    bool bias, f32;
    int strip_rows;  // 0: skinny_linear_strip_rows
    int waves = 1;   // CudaSkinnyLinearOptions::staged_waves
  };
  for (const Case& c : {Case{1, 2816, 4096, false, false, 0}, Case{1, 4224, 2816, false, false, 0},
                        Case{1, 2816, 2112, false, false, 0}, Case{1, 2880, 4096, true, false, 0},
                        Case{3, 77, 328, true, false, 11}, Case{8, 203, 1000, false, true, 9},
                        Case{5, 133, 2888, true, true, 13}, Case{2, 35, 24, true, false, 16},
                        Case{1, 2816, 8192, false, false, 0}, Case{9, 640, 320, true, false, 0},
                        Case{1, 8192, 2816, false, false, 0, 2}, Case{1, 10240, 2816, false, false, 0, 3},
                        Case{1, 2816, 8192, false, false, 0, 2}, Case{8, 5120, 2880, true, false, 0, 2}}) {
    const auto [px, w_c, w_g, b_c, b_g] = upload_linear(cpu_, cuda_, rng_, c.m, c.n, c.k, c.bias);
    const DType out_dtype = c.f32 ? DType::kF32 : DType::kBF16;
    TensorView o_c = cpu_.make(DType::kF32, {c.m, c.n});
    ASSERT_TRUE(cpu_backend().linear(px.cpu, w_c, b_c, o_c).is_ok());
    CudaSkinnyLinearOptions o{16, 0, 0, c.strip_rows};
    o.staged = false;
    ASSERT_TRUE(set_cuda_skinny_linear_options(cuda_backend(), o).is_ok());
    TensorView want_g = cuda_.make(out_dtype, {c.m, c.n});
    ASSERT_TRUE(cuda_backend().linear(px.cuda, w_g, b_g, want_g).is_ok());
    const std::vector<float> want = cuda_.download_f32(want_g);
    o.staged = true;
    o.staged_waves = c.waves;
    ASSERT_TRUE(set_cuda_skinny_linear_options(cuda_backend(), o).is_ok());
    TensorView got_g = cuda_.make(out_dtype, {c.m, c.n}), replay_g = cuda_.make(out_dtype, {c.m, c.n});
    const Status st = cuda_backend().linear(px.cuda, w_g, b_g, got_g);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    auto graph = cuda_backend().capture([&] { return cuda_backend().linear(px.cuda, w_g, b_g, replay_g); });
    ASSERT_TRUE(graph.is_ok()) << graph.status().to_string();
    for (int replay = 0; replay < 2; ++replay) ASSERT_TRUE((*graph)->replay().is_ok());
    ASSERT_TRUE(cuda_backend().synchronize().is_ok());
    ASSERT_TRUE(set_cuda_skinny_linear_options(cuda_backend(), {}).is_ok());
    const int rows = c.strip_rows > 0 ? c.strip_rows : cuda::skinny_linear_strip_rows(*dev, c.n);
    // Over several waves the backend also asks for the last wave a third full (gpt-oss's q|k|v is not): no label.
    const bool staged = cuda::skinny_linear_staged_fits(*dev, c.m, c.n, c.k, rows);
    const std::string what = shape_str({c.m, c.n, c.k}) + (c.bias ? " bias" : "") + (c.f32 ? " f32-out" : " bf16-out") +
                             " strips of " + std::to_string(rows) +
                             (c.waves > 1 ? ", staged_waves " + std::to_string(c.waves)
                                          : staged ? " staged" : " (does not fit: skinny)");
    check("skinny linear staged", what + " vs CPU", cuda_.download_f32(got_g), cpu_.download_f32(o_c),
          c.f32 ? 1e-4 : 5e-3);
    check("skinny linear staged", what + " vs skinny, bit for bit", cuda_.download_f32(got_g), want, 0.0);
    check("skinny linear staged", what + ", graph replayed twice vs skinny", cuda_.download_f32(replay_g), want, 0.0);
  }
}

// The skinny kernel's decode forms (CudaSkinnyLinearOptions::inputs_first: the epilogue's scale and bias read before
// the PDL wait; with persistent too: strips past one wave on one wave of CTAs looping over them; the staged kernel with
// fp8_staged and fp8_staged_head_rows) give the plain kernel's bits, eagerly and replayed from a graph; both against the CPU
// twin. bf16 and FP8 weights: gpt-oss's o_proj at one token (FP8 on 16-row and on skinny_linear_strip_rows' strips:
// fp8_even_strips; staged), a strip count of many waves (the lm_head's form; persistent: 2-4 strips a CTA; past
// kSkinnyLinearManyWaves waves FP8 staged at 4 CTAs an SM, fp8_staged_head_rows 8, short k so that the CPU twin is
// quick), k % 16 == 8 (FP8's 8-byte loads; not staged), two token tiles, a k split (each split's own chunks; never
// persistent or staged), f32 out.
TEST_F(KernelTest, SkinnyLinearDecodeForms) {
  struct Case {
    int64_t m, n, k;
    bool fp8, bias, f32;
    int k_splits = 0;
    bool even = false;  // fp8_even_strips
  };
  for (const Case& c : {Case{1, 2880, 4096, true, true, false}, Case{1, 2880, 4096, true, true, false, 0, true},
                        Case{1, 20000, 2880, true, false, true}, Case{3, 77, 328, true, true, true},
                        Case{9, 133, 2888, true, true, false}, Case{1, 5120, 2880, false, true, false},
                        Case{12, 2880, 4096, false, true, false}, Case{5, 300, 2888, false, true, true, 3},
                        Case{2, 1000, 2888, true, false, false, 4}, Case{1, 9000, 2888, false, true, true},
                        Case{12, 9000, 1000, false, false, true}, Case{9, 7000, 2888, true, true, false},
                        Case{3, 5000, 328, true, true, true}, Case{1, 70000, 64, true, false, true},
                        Case{8, 68001, 208, true, true, false}}) {
    Bf16Data x = random_bf16(rng_, c.m * c.k, 1.0f), w = random_bf16(rng_, c.n * c.k, 0.05f), b = random_bf16(rng_, c.n, 1.0f);
    Pair px = upload_activation(cpu_, cuda_, x, {c.m, c.k});
    TensorView w_c, w_g, s_c, s_g, b_c, b_g;
    if (c.fp8) {
      const Fp8Rows q = quantize_rows_fp8(TensorView(w.bits.data(), DType::kBF16, {c.n, c.k}));
      w_c = cpu_.upload(DType::kF8E4M3, {c.n, c.k}, q.values.data()), w_g = cuda_.upload(DType::kF8E4M3, {c.n, c.k}, q.values.data());
      s_c = cpu_.upload(DType::kF32, {c.n}, q.scales.data()), s_g = cuda_.upload(DType::kF32, {c.n}, q.scales.data());
    } else {
      w_c = cpu_.upload(DType::kBF16, {c.n, c.k}, w.bits.data()), w_g = cuda_.upload(DType::kBF16, {c.n, c.k}, w.bits.data());
    }
    if (c.bias) {
      b_c = cpu_.upload(DType::kBF16, {c.n}, b.bits.data());
      b_g = cuda_.upload(DType::kBF16, {c.n}, b.bits.data());
    }
    const DType out_dtype = c.f32 ? DType::kF32 : DType::kBF16;
    auto run = [&](Backend& be, const TensorView& xv, const TensorView& wv, const TensorView& sv, const TensorView& bv,
                   TensorView out) { return c.fp8 ? be.linear_fp8(xv, wv, sv, bv, out) : be.linear(xv, wv, bv, out); };
    TensorView o_c = cpu_.make(DType::kF32, {c.m, c.n});
    ASSERT_TRUE(run(cpu_backend(), px.cpu, w_c, s_c, b_c, o_c).is_ok());
    CudaSkinnyLinearOptions o;
    o.max_rows = 16, o.k_splits = c.k_splits, o.staged = false, o.fp8_even_strips = c.even, o.inputs_first = false;
    ASSERT_TRUE(set_cuda_skinny_linear_options(cuda_backend(), o).is_ok());
    TensorView want_g = cuda_.make(out_dtype, {c.m, c.n});
    Status st = run(cuda_backend(), px.cuda, w_g, s_g, b_g, want_g);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    const std::vector<float> want = cuda_.download_f32(want_g);
    for (const int form : {0, 1, 2}) {  // inputs first; + persistent; + staged (FP8 and past one wave)
      const bool persistent = form == 1;
      o.inputs_first = true, o.persistent = persistent;
      o.staged = o.fp8_staged = form == 2;
      o.fp8_staged_head_rows = form == 2 ? 8 : 0;
      ASSERT_TRUE(set_cuda_skinny_linear_options(cuda_backend(), o).is_ok());
      TensorView got_g = cuda_.make(out_dtype, {c.m, c.n}), replay_g = cuda_.make(out_dtype, {c.m, c.n});
      st = run(cuda_backend(), px.cuda, w_g, s_g, b_g, got_g);
      ASSERT_TRUE(st.is_ok()) << st.to_string();
      auto graph = cuda_backend().capture([&] { return run(cuda_backend(), px.cuda, w_g, s_g, b_g, replay_g); });
      ASSERT_TRUE(graph.is_ok()) << graph.status().to_string();
      for (int replay = 0; replay < 2; ++replay) ASSERT_TRUE((*graph)->replay().is_ok());
      ASSERT_TRUE(cuda_backend().synchronize().is_ok());
      const std::string what = shape_str({c.m, c.n, c.k}) + (c.fp8 ? " fp8" : " bf16") + (c.bias ? " bias" : "") +
                               (c.f32 ? " f32-out" : " bf16-out") +
                               (c.k_splits ? " k-splits " + std::to_string(c.k_splits) : std::string()) +
                               (c.even ? " even strips" : "") +
                               (form == 1 ? ", inputs first + persistent"
                                : form == 2 ? ", inputs first + staged (fp8, head)" : ", inputs first");
      check("skinny linear decode forms", what + " vs CPU", cuda_.download_f32(got_g), cpu_.download_f32(o_c),
            c.f32 ? 1e-4 : 5e-3);
      check("skinny linear decode forms", what + " vs the plain kernel, bit for bit", cuda_.download_f32(got_g), want, 0.0);
      check("skinny linear decode forms", what + ", graph replayed twice vs the plain kernel", cuda_.download_f32(replay_g),
            want, 0.0);
    }
    ASSERT_TRUE(set_cuda_skinny_linear_options(cuda_backend(), {}).is_ok());
  }
}

// Builds the same batch and paged cache on both backends.
struct PagedSetup {
  std::vector<std::vector<int32_t>> tokens, pages;
  std::vector<BatchSequence> seqs;
  int64_t num_pages = 0, max_pages = 0, total = 0;
};

PagedSetup make_paged(std::mt19937& rng, const std::vector<std::pair<int64_t, int64_t>>& spans, int64_t page_size) {
  PagedSetup s;
  for (auto [start, len] : spans) {
    const int64_t pages = (start + len + page_size - 1) / page_size;
    s.max_pages = std::max(s.max_pages, pages);
    s.num_pages += pages;
    s.total += len;
  }
  s.num_pages += 3;  // spare pages nobody owns
  std::vector<int32_t> perm(static_cast<size_t>(s.num_pages));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  size_t next = 0;
  for (auto [start, len] : spans) {
    const int64_t pages = (start + len + page_size - 1) / page_size;
    s.pages.emplace_back(perm.begin() + next, perm.begin() + next + pages);
    next += pages;
    s.tokens.emplace_back(static_cast<size_t>(len), 0);
  }
  for (size_t i = 0; i < spans.size(); ++i) s.seqs.push_back({s.tokens[i], spans[i].first, s.pages[i], false, false});
  return s;
}

// The same sequences (make_paged's) staged on both backends: each backend's staging and the batch view it staged.
// The sequences point into `paged` and the views into the stagings, so the whole is neither copied nor moved;
// the tests ASSERT ok() before they use the views.
struct StagedPair {
  StagedPair(Arena& cpu, Arena& cuda, std::mt19937& rng, const std::vector<std::pair<int64_t, int64_t>>& spans,
             int64_t page_size)
      : paged(make_paged(rng, spans, page_size)), tokens(paged.total), seqs(static_cast<int64_t>(spans.size())) {
    const BatchLimits lim{tokens, seqs, paged.max_pages, tokens};
    auto st_c = BatchStaging::create(cpu.backend(), lim);
    auto st_g = BatchStaging::create(cuda.backend(), lim);
    if (!st_c.is_ok() || !st_g.is_ok()) return;
    staging_cpu.emplace(std::move(*st_c));
    staging_cuda.emplace(std::move(*st_g));
    auto b_c = staging_cpu->stage(paged.seqs);
    auto b_g = staging_cuda->stage(paged.seqs);
    if (b_c.is_ok()) cpu_batch = *b_c;
    if (b_g.is_ok()) cuda_batch = *b_g;
  }
  StagedPair(const StagedPair&) = delete;
  StagedPair& operator=(const StagedPair&) = delete;
  bool ok() const { return cpu_batch.has_value() && cuda_batch.has_value(); }

  PagedSetup paged;
  int64_t tokens = 0, seqs = 0;  // T, S
  std::optional<BatchStaging> staging_cpu, staging_cuda;
  std::optional<BatchView> cpu_batch, cuda_batch;
};

struct AttnCase {
  std::string name;
  int64_t n_q, n_kv, hd, window, page_size;
  std::vector<std::pair<int64_t, int64_t>> spans;  // (cached tokens, new tokens) per sequence
  bool sinks = true;
  float scale = 0.0f;  // 0: 1 / sqrt(hd); Gemma-4 uses 1.0 (q and k are normed)
  bool kv_shared = false;  // V is K's storage (Gemma-4's full layers)
};

// `label` names the prefill kernel in the report (the backend's options choose it). `replay`: the same call
// captured in a graph and replayed into a fresh (poisoned) output must give the eager bits.
void run_attention(Arena& cpu, Arena& cuda, std::mt19937& rng, const AttnCase& c, const std::string& label = "",
                   bool replay = false) {
  const StagedPair sp(cpu, cuda, rng, c.spans, c.page_size);
  ASSERT_TRUE(sp.ok());
  const PagedSetup& s = sp.paged;
  const BatchView &batch_c = *sp.cpu_batch, &batch_g = *sp.cuda_batch;
  const int64_t T = sp.tokens, S = sp.seqs;
  const Shape cache_shape{s.num_pages, c.page_size, c.n_kv, c.hd};
  // Long caches (Gemma's 40 x 3000 tokens at hd 512: 250M values) are drawn quickly; V only where it is not K.
  const Bf16Data k = quick_random_bf16(rng, cache_shape.numel(), 1.0f);
  const Bf16Data v = c.kv_shared ? Bf16Data{} : quick_random_bf16(rng, cache_shape.numel(), 1.0f);
  Bf16Data q = random_bf16(rng, T * c.n_q * c.hd, 1.0f), sinks = random_bf16(rng, c.n_q, 1.0f);
  const Pair pk = upload_activation(cpu, cuda, k, cache_shape);
  const Pair pv = c.kv_shared ? pk : upload_activation(cpu, cuda, v, cache_shape);
  Pair pq = upload_activation(cpu, cuda, q, {T, c.n_q * c.hd});
  TensorView sk_c, sk_g;  // empty: no sinks
  if (c.sinks) {
    sk_c = cpu.upload(DType::kBF16, {c.n_q}, sinks.bits.data());
    sk_g = cuda.upload(DType::kBF16, {c.n_q}, sinks.bits.data());
  }
  TensorView o_c = cpu.make(DType::kF32, {T, c.n_q * c.hd}), o_g = cuda.make(DType::kBF16, {T, c.n_q * c.hd});
  const float scale = c.scale > 0.0f ? c.scale : 1.0f / std::sqrt(static_cast<float>(c.hd));
  AttentionParams a_c{pq.cpu, {pk.cpu, pv.cpu, c.page_size}, sk_c, o_c, c.n_q, c.n_kv, c.hd, c.window, scale};
  AttentionParams a_g{pq.cuda, {pk.cuda, pv.cuda, c.page_size}, sk_g, o_g, c.n_q, c.n_kv, c.hd, c.window, scale};
  ASSERT_TRUE(cpu.backend().attention(a_c, batch_c).is_ok());
  const Status st = cuda.backend().attention(a_g, batch_g);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  // The automatic path takes the decode kernel for up to 8 queries per sequence (verify rows).
  const bool decode = T == S || (label.empty() && batch_g.max_seq_tokens <= 8);
  check("attention " + std::string(decode ? "decode" : "prefill") + label, c.name, cuda.download_f32(o_g),
        cpu.download_f32(o_c), 1e-2);
  if (!replay) return;
  TensorView o_r = cuda.make(DType::kBF16, {T, c.n_q * c.hd});
  AttentionParams a_r = a_g;
  a_r.out = o_r;
  auto graph = cuda.backend().capture([&] { return cuda.backend().attention(a_r, batch_g); });
  ASSERT_TRUE(graph.is_ok()) << graph.status().to_string();
  ASSERT_TRUE((*graph)->replay().is_ok());
  EXPECT_EQ(cuda.download_bytes(o_r), cuda.download_bytes(o_g)) << c.name << label << ": graph replay != eager";
}

// RoPE for Q in the attention (AttentionParams::q_inv_freq after a qkv_rope with q_out empty) against the CPU's
// two ops (qkv_rope writing Q, then the attention) and against the GPU's own two ops: the attention reads the
// q|k|v projection and rotates Q as it loads it (the window kernel) or into scratch first (every other kernel),
// with the same bits as qkv_rope's Q, so the output and the K/V the K/V-only qkv_rope wrote are bit-equal to
// the two-op path. `replay`: the pair captured in a graph and replayed equals eager.
void run_attention_rope_q(Arena& cpu, Arena& cuda, std::mt19937& rng, const AttnCase& c, const std::string& label,
                          bool replay = false) {
  const StagedPair sp(cpu, cuda, rng, c.spans, c.page_size);
  ASSERT_TRUE(sp.ok());
  const PagedSetup& s = sp.paged;
  const BatchView &batch_c = *sp.cpu_batch, &batch_g = *sp.cuda_batch;
  const int64_t T = sp.tokens, width = (c.n_q + 2 * c.n_kv) * c.hd;
  const Shape cache_shape{s.num_pages, c.page_size, c.n_kv, c.hd};
  Bf16Data k = quick_random_bf16(rng, cache_shape.numel(), 1.0f), v = quick_random_bf16(rng, cache_shape.numel(), 1.0f);
  Bf16Data qkv = random_bf16(rng, T * width, 1.0f), sinks = random_bf16(rng, c.n_q, 1.0f);
  // Two GPU caches (the fused path's and the two-op path's) from the same bits.
  Pair pk = upload_activation(cpu, cuda, k, cache_shape), pv = upload_activation(cpu, cuda, v, cache_shape);
  Pair pk2 = upload_activation(cpu, cuda, k, cache_shape), pv2 = upload_activation(cpu, cuda, v, cache_shape);
  Pair pqkv = upload_activation(cpu, cuda, qkv, {T, width});
  std::vector<float> freq(static_cast<size_t>(c.hd / 2));
  for (size_t i = 0; i < freq.size(); ++i) freq[i] = std::pow(150000.0f, -2.0f * static_cast<float>(i) / c.hd);
  TensorView f_c = cpu.upload(DType::kF32, {c.hd / 2}, freq.data());
  TensorView f_g = cuda.upload(DType::kF32, {c.hd / 2}, freq.data());
  const float rope_scale = 1.25f;
  TensorView sk_c, sk_g;
  if (c.sinks) {
    sk_c = cpu.upload(DType::kBF16, {c.n_q}, sinks.bits.data());
    sk_g = cuda.upload(DType::kBF16, {c.n_q}, sinks.bits.data());
  }
  const float scale = c.scale > 0.0f ? c.scale : 1.0f / std::sqrt(static_cast<float>(c.hd));
  // CPU: the two ops.
  TensorView q_c = cpu.make(DType::kF32, {T, c.n_q * c.hd}), o_c = cpu.make(DType::kF32, {T, c.n_q * c.hd});
  QkvRopeParams r_c{pqkv.cpu, q_c, {pk.cpu, pv.cpu, c.page_size}, f_c, rope_scale, c.n_q, c.n_kv, c.hd, {}, {}, 0, {}};
  ASSERT_TRUE(cpu.backend().qkv_rope(r_c, batch_c).is_ok());
  AttentionParams a_c{q_c, {pk.cpu, pv.cpu, c.page_size}, sk_c, o_c, c.n_q, c.n_kv, c.hd, c.window, scale};
  ASSERT_TRUE(cpu.backend().attention(a_c, batch_c).is_ok());
  // The CPU's own fused form (its twin) gives the same.
  TensorView o_c2 = cpu.make(DType::kF32, {T, c.n_q * c.hd});
  AttentionParams a_c2{pqkv.cpu, {pk.cpu, pv.cpu, c.page_size}, sk_c, o_c2, c.n_q, c.n_kv, c.hd, c.window, scale, f_c,
                       rope_scale};
  ASSERT_TRUE(cpu.backend().attention(a_c2, batch_c).is_ok());
  check("attention rope q (cpu twin)" + label, c.name, cpu.download_f32(o_c2), cpu.download_f32(o_c), 1e-6);
  // GPU: qkv_rope for K and V alone, the attention rotating Q.
  TensorView o_g = cuda.make(DType::kBF16, {T, c.n_q * c.hd});
  QkvRopeParams r_g{pqkv.cuda, {}, {pk.cuda, pv.cuda, c.page_size}, f_g, rope_scale, c.n_q, c.n_kv, c.hd,
                    {}, {}, 0, {}};
  AttentionParams a_g{pqkv.cuda, {pk.cuda, pv.cuda, c.page_size}, sk_g, o_g, c.n_q, c.n_kv, c.hd, c.window, scale, f_g,
                      rope_scale};
  ASSERT_TRUE(cuda.backend().qkv_rope(r_g, batch_g).is_ok());
  const Status st = cuda.backend().attention(a_g, batch_g);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  check("attention rope q" + label, c.name, cuda.download_f32(o_g), cpu.download_f32(o_c), 1e-2);
  // GPU: the two ops.
  TensorView q_g2 = cuda.make(DType::kBF16, {T, c.n_q * c.hd}), o_g2 = cuda.make(DType::kBF16, {T, c.n_q * c.hd});
  QkvRopeParams r_g2{pqkv.cuda, q_g2, {pk2.cuda, pv2.cuda, c.page_size}, f_g, rope_scale, c.n_q, c.n_kv, c.hd,
                     {}, {}, 0, {}};
  AttentionParams a_g2{q_g2, {pk2.cuda, pv2.cuda, c.page_size}, sk_g, o_g2, c.n_q, c.n_kv, c.hd, c.window, scale};
  ASSERT_TRUE(cuda.backend().qkv_rope(r_g2, batch_g).is_ok());
  ASSERT_TRUE(cuda.backend().attention(a_g2, batch_g).is_ok());
  const std::string what = c.name + label;
  EXPECT_EQ(cuda.download_bytes(o_g), cuda.download_bytes(o_g2)) << what << ": rope in the Q load != two ops";
  EXPECT_EQ(cuda.download_bytes(pk.cuda), cuda.download_bytes(pk2.cuda)) << what << ": K (K/V-only qkv_rope)";
  EXPECT_EQ(cuda.download_bytes(pv.cuda), cuda.download_bytes(pv2.cuda)) << what << ": V (K/V-only qkv_rope)";
  if (!replay) return;
  TensorView o_r = cuda.make(DType::kBF16, {T, c.n_q * c.hd});
  AttentionParams a_r = a_g;
  a_r.out = o_r;
  auto graph = cuda.backend().capture([&]() -> Status {
    MX_RETURN_IF_ERROR(cuda.backend().qkv_rope(r_g, batch_g));
    return cuda.backend().attention(a_r, batch_g);
  });
  ASSERT_TRUE(graph.is_ok()) << graph.status().to_string();
  ASSERT_TRUE((*graph)->replay().is_ok());
  EXPECT_EQ(cuda.download_bytes(o_r), cuda.download_bytes(o_g)) << c.name << label << ": graph replay != eager";
}

TEST_F(KernelTest, AttentionPrefill) {
  const std::vector<AttnCase> cases = {
      {"gpt-oss hd64 g8 full, 3 seqs, P16", 16, 2, 64, 0, 16, {{0, 37}, {0, 64}, {0, 5}}},
      {"hd64 g8 window 16, chunked (cached ctx)", 16, 2, 64, 16, 16, {{100, 20}, {0, 70}, {33, 1}}},
      {"hd64 g8 window 128, 300 tok, P32", 64, 8, 64, 128, 32, {{0, 300}}},
      {"hd32 g2 full, odd page 5", 6, 3, 32, 0, 5, {{0, 23}, {7, 40}, {0, 1}}},
      {"hd32 g2 window 8, mixed decode+prefill", 6, 3, 32, 8, 4, {{50, 1}, {0, 19}, {9, 1}, {3, 12}}},
      {"hd64 g3 (odd group) full", 6, 2, 64, 0, 16, {{0, 45}, {20, 30}}},
      {"hd64 g8 long ctx 2000+64, window 128", 16, 2, 64, 128, 16, {{2000, 64}}},
  };
  for (const auto& c : cases) run_attention(cpu_, cuda_, rng_, c);
  // The mma.sync kernel stays the reference (and the path of sm_100/sm_120): checked on every device.
  ASSERT_TRUE(set_cuda_attention_options(cuda_backend(), {CudaAttentionPath::kMmaSync}).is_ok());
  for (const auto& c : cases) run_attention(cpu_, cuda_, rng_, c, " (mma.sync)");
  ASSERT_TRUE(set_cuda_attention_options(cuda_backend(), {}).is_ok());
}

// The wgmma prefill kernels (sm_90a): attention_wgmma_ws.cu's two shapes (192 rows of (token, head) pairs
// per CTA and 128-key tiles, in turn; 128 rows and 64-key tiles, overlapped) and the window kernel:
// query counts and cached prefixes that are not multiples of either, sequences that share a CTA, every
// group size that packs differently, pages that split tiles, windows and full, a 4097-token prompt, and
// graph replay equal to eager.
TEST_F(KernelTest, AttentionPrefillWgmma) {
  auto placement = cuda_placement(cuda_backend());
  ASSERT_TRUE(placement.is_ok());
  auto dev = cuda::query_device_info(placement->device);
  ASSERT_TRUE(dev.is_ok());
  if (!cuda::choose_attention_prefill_wgmma_ws_config(*dev, 64, cuda::kAttnWsWide).enabled) GTEST_SKIP() << "no wgmma on " << dev->name;
  const std::vector<AttnCase> cases = {
      {"gpt-oss g8 full, 129 tok", 64, 8, 64, 0, 16, {{0, 129}}},
      {"gpt-oss g8 window 128, 7 tok", 64, 8, 64, 128, 16, {{0, 7}}},
      {"g8 full, 9 tok, one CTA", 8, 1, 64, 0, 16, {{0, 9}}},
      {"g8 full, 16 tok, one CTA", 8, 1, 64, 0, 16, {{0, 16}}},
      {"g8 full, 17 tok, two CTAs", 8, 1, 64, 0, 16, {{0, 17}}},
      {"g8 full 4097 tok", 16, 2, 64, 0, 16, {{0, 4097}}},
      {"g8 window 128, 4097 tok, P32", 16, 2, 64, 128, 32, {{0, 4097}}},
      {"g8 window 128, chunk 300 after 1000 cached", 16, 2, 64, 128, 16, {{1000, 300}}},
      {"g8 full, chunk 77 after 700 cached + new seq of 50, P32", 16, 2, 64, 0, 32, {{700, 77}, {0, 50}}},
      {"g8 full, mixed decode + prefill seqs", 16, 2, 64, 0, 16, {{50, 1}, {0, 19}, {9, 1}, {3, 12}}},
      {"g8 window 128, 5 seqs in one CTA, odd page 5", 16, 2, 64, 128, 5, {{130, 3}, {0, 4}, {200, 2}, {1, 5}, {0, 2}}},
      {"g4 full, odd page 5", 8, 2, 64, 0, 5, {{0, 200}, {13, 7}}},
      {"g16 window 128", 32, 2, 64, 128, 16, {{0, 300}}},
      {"g1 (MHA) window 128", 4, 4, 64, 128, 16, {{0, 333}}},
      {"g3 (odd group) full", 6, 2, 64, 0, 16, {{0, 45}, {20, 30}}},
      {"g64 full, 2 tokens per CTA", 64, 1, 64, 0, 16, {{0, 41}, {100, 9}}},
      {"g8 full, no sinks, scale 1", 16, 2, 64, 0, 16, {{0, 300}, {40, 9}}, false, 1.0f},
      // The warp-specialized kernel's 24-token CTAs (g8): chunks around that and the 128-key tiles after a
      // long cached prefix (the ring wraps many times within a pass), and several multi-tile passes per CTA.
      {"g8 full, chunks 23 / 25 / 48 after 3000 / 129 / 0 cached", 16, 2, 64, 0, 16, {{3000, 23}, {129, 25}, {0, 48}}},
      {"g8 window 128, chunk 200 after 2900 cached, odd page 7", 16, 2, 64, 128, 7, {{2900, 200}}},
      {"g8 full, 3 seqs of 8 in one CTA after 500 / 900 / 260 cached", 16, 2, 64, 0, 16, {{500, 8}, {900, 8}, {260, 8}}},
      // The 64-key-tile shape's 16-token CTAs (g8): one and two CTAs, a window whose tiles start mid-page,
      // windows of 64 and 127 keys, and a CTA that runs many 64-key tiles after a long prefix (multi-tile
      // CTAs were where an earlier 64-key kernel went wrong).
      {"g8 window 128, 16 tok, one 64-key CTA", 8, 1, 64, 128, 16, {{0, 16}}},
      {"g8 window 128, chunk 33 after 130 cached", 8, 1, 64, 128, 16, {{130, 33}}},
      {"g8 full, 16 tok after 1000 cached, odd page 7", 8, 1, 64, 0, 7, {{1000, 16}}},
      {"g8 window 127, 500 tok", 16, 2, 64, 127, 16, {{0, 500}}},
      {"g8 window 64, chunk 200 after 77 cached", 16, 2, 64, 64, 16, {{77, 200}}},
  };
  for (const auto& [path, label] : {std::pair{CudaAttentionPath::kWgmmaWs, " (wgmma-ws)"},
                                    std::pair{CudaAttentionPath::kWgmmaWs64, " (wgmma-ws64)"}}) {
    ASSERT_TRUE(set_cuda_attention_options(cuda_backend(), {path}).is_ok());
    for (const auto& c : cases) run_attention(cpu_, cuda_, rng_, c, label, /*replay=*/&c == &cases[0]);
  }
  // The sliding-window kernel (attention_wgmma_window.cu) on the window cases (it leaves full layers to
  // kAuto) plus CTAs that walk many blocks: sequences that start and end mid-block and mid-tile, several
  // sequences in one CTA's walk, a long prompt whose CTAs walk 8 blocks each, decode rows among them.
  std::vector<AttnCase> window_cases;
  for (const auto& c : cases)
    if (c.window > 0) window_cases.push_back(c);
  window_cases.push_back({"g8 window 128, 3 chunks after 900 / 0 / 61 cached", 16, 2, 64, 128, 16, {{900, 333}, {0, 40}, {61, 200}}});
  window_cases.push_back({"g8 window 128, 4096 tok (8-block CTAs on 132 SMs)", 64, 8, 64, 128, 16, {{0, 4096}}});
  window_cases.push_back({"g4 window 100, 700 tok + 9 decode rows", 8, 2, 64, 100, 16, {{0, 700}, {40, 1}, {300, 8}}});
  // Blocks of two passes whose first spans 4 tiles (a sequence's last 12 tokens) and whose second needs the
  // ring's next slot (the next sequence's first tokens): the fast case once left that slot unreleased and hung.
  window_cases.push_back({"g8 window 128, a 4-tile pass then a new sequence in one block", 16, 2, 64, 128, 16,
                          {{0, 8}, {0, 196}, {0, 8}}});
  window_cases.push_back({"gpt-oss g8 window 128, 8 x 1028 tok (the memory plan's warm-up)", 64, 8, 64, 128, 16,
                          std::vector<std::pair<int64_t, int64_t>>(8, {0, 1028})});
  ASSERT_TRUE(set_cuda_attention_options(cuda_backend(), {CudaAttentionPath::kWgmmaWindow}).is_ok());
  for (const auto& c : window_cases)
    run_attention(cpu_, cuda_, rng_, c, " (wgmma-window)", /*replay=*/&c == &window_cases[0]);
  ASSERT_TRUE(set_cuda_attention_options(cuda_backend(), {}).is_ok());
}

// RoPE for Q in the attention's Q load (the window kernel; every other kernel through scratch): odd token counts
// (1, 7, 129, 4097), chunks after cached prefixes across window and tile edges, several sequences in one CTA,
// group sizes that pack differently (g3: a block's last rows hold no token), with and without sinks; the
// kernels by kAuto (window layers: the window kernel; full layers and decode rows: scratch), the window kernel
// forced, and mma.sync.
TEST_F(KernelTest, AttentionPrefillWgmmaRopeQ) {
  const std::vector<AttnCase> cases = {
      {"gpt-oss g8 window 128, 129 tok", 64, 8, 64, 128, 16, {{0, 129}}},
      {"gpt-oss g8 window 128, 1 tok", 64, 8, 64, 128, 16, {{0, 1}}},
      {"g8 window 128, 7 tok", 16, 2, 64, 128, 16, {{0, 7}}},
      {"g8 window 128, 4097 tok, P32", 16, 2, 64, 128, 32, {{0, 4097}}},
      {"g8 window 128, chunk 300 after 1000 cached", 16, 2, 64, 128, 16, {{1000, 300}}},
      {"g8 window 128, 3 chunks after 900 / 0 / 61 cached", 16, 2, 64, 128, 16, {{900, 333}, {0, 40}, {61, 200}}},
      {"g8 window 128, 5 seqs in one CTA, odd page 5", 16, 2, 64, 128, 5, {{130, 3}, {0, 4}, {200, 2}, {1, 5}, {0, 2}}},
      {"g8 window 128, a 4-tile pass then a new sequence in one block", 16, 2, 64, 128, 16, {{0, 8}, {0, 196}, {0, 8}}},
      {"g4 window 100, 700 tok + 9 decode rows", 8, 2, 64, 100, 16, {{0, 700}, {40, 1}, {300, 8}}},
      {"g16 window 128, no sinks", 32, 2, 64, 128, 16, {{0, 300}}, false},
      {"g3 (odd group) window 128", 6, 2, 64, 128, 16, {{0, 150}, {20, 77}}},
      {"g1 (MHA) window 128", 4, 4, 64, 128, 16, {{0, 333}}},
      {"gpt-oss g8 full, 129 tok", 64, 8, 64, 0, 16, {{0, 129}}},
      {"g8 full, chunk 77 after 700 cached + new seq of 50, P32", 16, 2, 64, 0, 32, {{700, 77}, {0, 50}}},
  };
  for (const auto& c : cases) run_attention_rope_q(cpu_, cuda_, rng_, c, " (auto)", /*replay=*/&c == &cases[0]);
  auto placement = cuda_placement(cuda_backend());
  ASSERT_TRUE(placement.is_ok());
  auto dev = cuda::query_device_info(placement->device);
  ASSERT_TRUE(dev.is_ok());
  if (cuda::choose_attention_window_wgmma_config(*dev, 64).enabled) {
    ASSERT_TRUE(set_cuda_attention_options(cuda_backend(), {CudaAttentionPath::kWgmmaWindow}).is_ok());
    for (const auto& c : cases)
      if (c.window > 0 && c.spans.size() < 3) run_attention_rope_q(cpu_, cuda_, rng_, c, " (wgmma-window)");
  }
  ASSERT_TRUE(set_cuda_attention_options(cuda_backend(), {CudaAttentionPath::kMmaSync}).is_ok());
  for (size_t i : {0, 4, 12}) run_attention_rope_q(cpu_, cuda_, rng_, cases[i], " (mma.sync)");
  ASSERT_TRUE(set_cuda_attention_options(cuda_backend(), {}).is_ok());
}

// One batch (`c`'s spans) through the window kernel against the CPU twin: K, V and Q ~N(0, 1), each token's Q row
// times q_scale(token) when given; RoPE in the Q load (`rope`, gpt-oss's prefill) or Q written. The call is waited
// for at most 10 s (a working one takes well under a millisecond): a kernel still running then is taken for a
// hang, the batch printed and the process aborted, since a hung GPU cannot be left to the next test.
Errors run_window_batch(Arena& cpu, Arena& cuda, std::mt19937& rng, cudaStream_t stream, const AttnCase& c, bool rope,
                        const std::function<float(int64_t)>& q_scale = {}) {
  const StagedPair sp(cpu, cuda, rng, c.spans, c.page_size);
  if (!sp.ok()) return Errors{1e9, 0, 1};
  const int64_t T = sp.tokens, width = (c.n_q + 2 * c.n_kv) * c.hd, q_width = rope ? width : c.n_q * c.hd;
  const Shape cache_shape{sp.paged.num_pages, c.page_size, c.n_kv, c.hd};
  const Bf16Data k = quick_random_bf16(rng, cache_shape.numel(), 1.0f);
  const Bf16Data v = quick_random_bf16(rng, cache_shape.numel(), 1.0f);
  Bf16Data q = random_bf16(rng, T * q_width, 1.0f);
  const Bf16Data sinks = random_bf16(rng, c.n_q, 1.0f);
  if (q_scale)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = t * q_width; i < t * q_width + c.n_q * c.hd; ++i) {
        q.bits[i] = f32_to_bf16(q.values[i] * q_scale(t));
        q.values[i] = bf16_to_f32(q.bits[i]);
      }
  const Pair pk = upload_activation(cpu, cuda, k, cache_shape), pv = upload_activation(cpu, cuda, v, cache_shape);
  const Pair pq = upload_activation(cpu, cuda, q, {T, q_width});
  std::vector<float> freq(static_cast<size_t>(c.hd / 2));
  for (size_t f = 0; f < freq.size(); ++f) freq[f] = std::pow(150000.0f, -2.0f * static_cast<float>(f) / c.hd);
  TensorView f_c, f_g;
  if (rope) {
    f_c = cpu.upload(DType::kF32, {c.hd / 2}, freq.data());
    f_g = cuda.upload(DType::kF32, {c.hd / 2}, freq.data());
  }
  // With RoPE the twin reads Q rotated as the CPU's qkv_rope rotates it (cos and sin in double, times the scale) and
  // rounded to bf16, as the GPU's rotation writes it: the fp32 rotation alone differs from it by ~1e-2 rel-L2 where
  // logits reach ~50 (AttentionWgmmaWindowLogitJumps' rows x40), far above the kernel's own error.
  TensorView q_c = pq.cpu;
  if (rope) {
    std::vector<float> qr(static_cast<size_t>(T * c.n_q * c.hd));
    const int64_t half = c.hd / 2;
    for (int64_t t = 0; t < T; ++t) {
      const int32_t pos = sp.cpu_batch->positions.ptr<const int32_t>()[t];
      for (int64_t i = 0; i < half; ++i) {
        const double angle = static_cast<double>(static_cast<float>(pos) * freq[static_cast<size_t>(i)]);
        const float cs = static_cast<float>(std::cos(angle)) * 1.25f, sn = static_cast<float>(std::sin(angle)) * 1.25f;
        for (int64_t h = 0; h < c.n_q; ++h) {
          const float a = q.values[t * q_width + h * c.hd + i], b = q.values[t * q_width + h * c.hd + i + half];
          float* y = &qr[static_cast<size_t>((t * c.n_q + h) * c.hd + i)];
          y[0] = bf16_to_f32(f32_to_bf16(a * cs - b * sn));
          y[half] = bf16_to_f32(f32_to_bf16(b * cs + a * sn));
        }
      }
    }
    q_c = cpu.upload(DType::kF32, {T, c.n_q * c.hd}, qr.data());
  }
  const TensorView sk_c = cpu.upload(DType::kBF16, {c.n_q}, sinks.bits.data());
  const TensorView sk_g = cuda.upload(DType::kBF16, {c.n_q}, sinks.bits.data());
  TensorView o_c = cpu.make(DType::kF32, {T, c.n_q * c.hd}), o_g = cuda.make(DType::kBF16, {T, c.n_q * c.hd});
  const float scale = 0.125f;
  const AttentionParams a_c{q_c, {pk.cpu, pv.cpu, c.page_size}, sk_c, o_c, c.n_q, c.n_kv, c.hd, c.window, scale};
  const AttentionParams a_g{pq.cuda, {pk.cuda, pv.cuda, c.page_size}, sk_g, o_g, c.n_q, c.n_kv, c.hd, c.window,
                            scale, f_g, 1.25f};
  const Status st = cuda.backend().attention(a_g, *sp.cuda_batch);
  if (!st.is_ok()) return Errors{1e9, 0, 1};
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (cudaStreamQuery(stream) == cudaErrorNotReady) {
    if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr, "window kernel: batch %s still runs after 10 s: a hang\n", c.name.c_str());
      std::abort();
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  if (!cpu.backend().attention(a_c, *sp.cpu_batch).is_ok()) return Errors{1e9, 0, 1};
  return compare(cuda.download_f32(o_g), cpu.download_f32(o_c));
}

// The window kernel's K/V ring on random mixed batches (a hang fails the test): 1-8 sequences, each a prefill chunk
// (1-400 tokens, odd counts) after 0 or up to 3,000 cached tokens, or a decode row, so that sequences start and
// end inside blocks and tiles; gpt-oss's heads (64 q / 8 kv: many blocks a CTA from ~600 tokens) and 16 / 2,
// with g4, g3, g16 and g1 (window 64) among them; odd pages. Mostly with RoPE in the Q load (gpt-oss's
// prefill), a quarter with Q written. A block that holds a sequence's last tokens and the next one's first
// hung the kernel's fast case until 98f8cc3 (a model of the ring hangs 670 of 3,000 batches drawn so).
TEST_F(KernelTest, AttentionWgmmaWindowRandomBatches) {
  auto placement = cuda_placement(cuda_backend());
  ASSERT_TRUE(placement.is_ok());
  auto dev = cuda::query_device_info(placement->device);
  ASSERT_TRUE(dev.is_ok());
  if (!cuda::choose_attention_window_wgmma_config(*dev, 64).enabled) GTEST_SKIP() << "no window kernel (sm_90a)";
  const auto stream = static_cast<cudaStream_t>(placement->stream);
  struct Geometry {
    const char* name;
    int64_t n_q, n_kv, window;
  };
  const Geometry geometries[] = {{"gpt-oss g8", 64, 8, 128}, {"g8", 16, 2, 128}, {"g8", 16, 2, 128},
                                 {"g4", 8, 2, 128},          {"g3", 6, 2, 128},  {"g16", 32, 2, 128},
                                 {"g1 window 64", 2, 2, 64}};
  const int64_t pages[] = {5, 7, 16, 32};
  std::uniform_int_distribution<int> pick(0, 99);
  auto below = [&](int64_t n) { return static_cast<int64_t>(rng_() % static_cast<uint32_t>(n)); };
  ASSERT_TRUE(set_cuda_attention_options(cuda_backend(), {CudaAttentionPath::kWgmmaWindow}).is_ok());
  constexpr int kBatches = 48;
  double worst = 0;
  int64_t tokens = 0;
  for (int i = 0; i < kBatches; ++i) {
    const Geometry& geo = geometries[below(std::size(geometries))];
    AttnCase c{geo.name, geo.n_q, geo.n_kv, 64, geo.window, pages[below(std::size(pages))], {}};
    const int64_t seqs = 1 + below(8);
    for (int64_t s = 0; s < seqs; ++s) {
      const int roll = pick(rng_);
      const int64_t cached = roll < 50 ? 0 : below(3001);
      const int64_t fresh = roll % 4 == 0 ? 1 : 1 + below(400);  // a quarter decode rows
      c.spans.push_back({cached, fresh});
      tokens += fresh;
    }
    std::string spans;
    for (auto [cached, fresh] : c.spans) spans += " (" + std::to_string(cached) + ", " + std::to_string(fresh) + ")";
    const bool rope = pick(rng_) >= 25;
    c.name = std::string(geo.name) + (rope ? " rope-q" : " q written") + ", page " + std::to_string(c.page_size) +
             ", spans" + spans;
    const Errors e = run_window_batch(cpu_, cuda_, rng_, stream, c, rope);
    worst = std::max(worst, e.rel_l2);
    EXPECT_TRUE(e.rel_l2 <= 1e-2 && e.non_finite == 0)
        << c.name << ": rel-L2 " << e.rel_l2 << ", " << e.non_finite << " not finite";
  }
  ASSERT_TRUE(set_cuda_attention_options(cuda_backend(), {}).is_ok());
  record("attention wgmma-window random batches",
         std::to_string(kBatches) + " batches, " + std::to_string(tokens) + " tokens (worst rel-L2 of any)", worst, 0,
         1e-2, !HasFailure());
}

// Logits that jump from block to block: Q rows times 1 or 40 in turns of 16 tokens (a block of the default form at
// g8), so that a row's logits reach ~50 (x1.25 by the RoPE scale) in one block and ~1 in the next; a prompt and a
// chunk after a cached prefix, RoPE in the Q load and Q written. The twin reads the rotated Q rounded to bf16 as the
// kernel does (run_window_batch): against the fp32 rotation the bf16 rounding alone is ~1e-2 rel-L2 at these logits
// (a CPU model of this batch: 9.7e-3 to 1.09e-2 by seed), the kernel's own roundings (P and O in bf16) ~1e-3.
TEST_F(KernelTest, AttentionWgmmaWindowLogitJumps) {
  auto placement = cuda_placement(cuda_backend());
  ASSERT_TRUE(placement.is_ok());
  auto dev = cuda::query_device_info(placement->device);
  ASSERT_TRUE(dev.is_ok());
  if (!cuda::choose_attention_window_wgmma_config(*dev, 64).enabled) GTEST_SKIP() << "no window kernel (sm_90a)";
  const auto stream = static_cast<cudaStream_t>(placement->stream);
  ASSERT_TRUE(set_cuda_attention_options(cuda_backend(), {CudaAttentionPath::kWgmmaWindow}).is_ok());
  double worst = 0;
  for (const bool rope : {true, false}) {
    const AttnCase c{rope ? "gpt-oss g8 rope-q" : "gpt-oss g8 q written", 64, 8, 64, 128, 16, {{0, 1000}, {300, 257}}};
    const Errors e =
        run_window_batch(cpu_, cuda_, rng_, stream, c, rope, [](int64_t t) { return (t / 16) % 3 == 1 ? 40.f : 1.f; });
    worst = std::max(worst, e.rel_l2);
    EXPECT_TRUE(e.rel_l2 <= 5e-3 && e.non_finite == 0)
        << c.name << ": rel-L2 " << e.rel_l2 << ", " << e.non_finite << " not finite";
  }
  ASSERT_TRUE(set_cuda_attention_options(cuda_backend(), {}).is_ok());
  record("attention wgmma-window logit jumps", "Q x1 / x40 by 16-token turns, rope-q and q written (worst rel-L2)",
         worst, 0, 5e-3, !HasFailure());
}

// Gemma-4 geometry (issue 15): sliding layers hd 256, 16 q / 8 kv heads, window 1024; full layers hd 512,
// 16 q / 2 kv heads; no sinks, scale 1.0. Several warps share a row block there (kernel_configs.h), so
// also group sizes that fill a CTA's rows exactly, sinks at the large head dims, pages that split the
// 32-key tiles, windows crossed inside a chunk, verify-style rows (a few tokens after a long prefix).
TEST_F(KernelTest, AttentionGemmaPrefill) {
  const std::vector<AttnCase> cases = {
      {"gemma sliding hd256 g2 w1024, 1500 tok", 16, 8, 256, 1024, 16, {{0, 1500}}, false, 1.0f},
      {"gemma sliding chunk 300 after 1000 cached + new 37, page 5", 16, 8, 256, 1024, 5, {{1000, 300}, {0, 37}}, false, 1.0f},
      {"gemma sliding verify rows 4 after 2000 + mixed", 16, 8, 256, 1024, 16, {{2000, 4}, {50, 1}, {0, 19}, {3, 12}}, false, 1.0f},
      {"gemma full hd512 g8, 3 seqs", 16, 2, 512, 0, 16, {{0, 77}, {5, 33}, {0, 1}}, false, 1.0f},
      {"gemma full hd512 chunk 129 after 2000 cached, P32", 16, 2, 512, 0, 32, {{2000, 129}}, false, 1.0f},
      {"gemma full hd512 verify rows 3 after 700, page 7", 16, 2, 512, 0, 7, {{700, 3}, {10, 5}}, false, 1.0f},
      {"hd256 g16 (4 tokens per CTA), sinks", 32, 2, 256, 0, 16, {{0, 45}, {20, 30}}},
      {"hd512 g32 (1 token per CTA), sinks, window 100", 32, 1, 512, 100, 16, {{0, 150}}},
      {"hd512 g3 (odd group), sinks", 6, 2, 512, 0, 16, {{0, 41}, {100, 9}}},
      {"hd128 g4 full (tiny-gemma4), 2 seqs", 4, 1, 128, 0, 16, {{0, 70}, {9, 13}}, false, 1.0f},
      {"hd128 g2 window 100, sinks, page 7", 8, 4, 128, 100, 7, {{0, 150}, {200, 9}}},
      {"hd64 g8 no sinks, scale 1", 16, 2, 64, 0, 16, {{0, 200}, {37, 5}}, false, 1.0f},
  };
  for (const auto& c : cases) run_attention(cpu_, cuda_, rng_, c);
  ASSERT_TRUE(set_cuda_attention_options(cuda_backend(), {CudaAttentionPath::kMmaSync}).is_ok());
  run_attention(cpu_, cuda_, rng_, cases.back(), " (mma.sync)");
  ASSERT_TRUE(set_cuda_attention_options(cuda_backend(), {}).is_ok());
}

// The wide-head wgmma prefill kernel (attention_wgmma_wide.cu, sm_90a) on Gemma-4's geometry and around it:
// hd 256 (128 rows a CTA: 64 tokens at g2) with window 1024 crossed inside a prompt and inside a chunk after
// a cached prefix, hd 512 (64 rows: 8 tokens at g8; the two warpgroups' partial scores summed) with K and V
// in one storage (Gemma-4's full layers) and apart; 1- and 7-token sequences beside others, odd groups,
// sinks, pages that split tiles, a window whose edge falls mid-tile, and graph replay equal to eager. The
// mma.sync kernel (the reference, and the path of sm_100/sm_120) runs a few of them too.
TEST_F(KernelTest, AttentionGemmaPrefillWgmma) {
  auto placement = cuda_placement(cuda_backend());
  ASSERT_TRUE(placement.is_ok());
  auto dev = cuda::query_device_info(placement->device);
  ASSERT_TRUE(dev.is_ok());
  if (!cuda::choose_attention_wide_wgmma_config(*dev, 256, false).enabled) GTEST_SKIP() << "no wgmma on " << dev->name;
  const std::vector<AttnCase> cases = {
      {"hd256 g2 w1024, 129 tok", 16, 8, 256, 1024, 16, {{0, 129}}, false, 1.0f},
      {"hd256 g2 w1024, 1100 tok", 16, 8, 256, 1024, 16, {{0, 1100}}, false, 1.0f},
      {"hd256 g2 w1024, chunk 300 after 900 cached + 7 new, page 5", 16, 8, 256, 1024, 5, {{900, 300}, {0, 7}}, false, 1.0f},
      {"hd256 g2 w1024, 1 tok + 7 tok + a decode row", 16, 8, 256, 1024, 16, {{0, 1}, {0, 7}, {40, 1}}, false, 1.0f},
      {"hd256 g2 full, chunk 129 after 2000 cached, P32", 16, 8, 256, 0, 32, {{2000, 129}}, false, 1.0f},
      {"hd256 g16, sinks", 32, 2, 256, 0, 16, {{0, 45}, {20, 30}}},
      {"hd256 g3 (odd group), sinks, window 100, page 7", 6, 2, 256, 100, 7, {{0, 150}, {200, 9}}},
      {"hd512 g8 full, 129 tok, shared K/V", 16, 2, 512, 0, 16, {{0, 129}}, false, 1.0f, true},
      {"hd512 g8 full, 1100 tok, shared K/V", 16, 2, 512, 0, 16, {{0, 1100}}, false, 1.0f, true},
      {"hd512 g8 full, 1 + 7 tok + chunk 77 after 700 cached, page 7, shared K/V", 16, 2, 512, 0, 7,
       {{0, 1}, {0, 7}, {700, 77}}, false, 1.0f, true},
      {"hd512 g8 full, chunk 129 after 2000 cached, P32", 16, 2, 512, 0, 32, {{2000, 129}}, false, 1.0f},
      {"hd512 g32, sinks, window 100", 32, 1, 512, 100, 16, {{0, 150}}},
      {"hd512 g3 (odd group), sinks", 6, 2, 512, 0, 16, {{0, 41}, {100, 9}}},
  };
  ASSERT_TRUE(set_cuda_attention_options(cuda_backend(), {CudaAttentionPath::kWgmmaWide}).is_ok());
  for (const auto& c : cases)
    run_attention(cpu_, cuda_, rng_, c, " (wgmma-wide)", /*replay=*/&c == &cases[2] || &c == &cases[9] || &c == &cases[10]);
  ASSERT_TRUE(set_cuda_attention_options(cuda_backend(), {CudaAttentionPath::kMmaSync}).is_ok());
  for (const AttnCase* c : {&cases[2], &cases[9]}) run_attention(cpu_, cuda_, rng_, *c, " (mma.sync)");
  ASSERT_TRUE(set_cuda_attention_options(cuda_backend(), {}).is_ok());
}

TEST_F(KernelTest, AttentionGemmaDecode) {
  const std::vector<AttnCase> cases = {
      {"gemma sliding hd256 w1024, ctx 1..5000", 16, 8, 256, 1024, 16, {{0, 1}, {1023, 1}, {1024, 1}, {4999, 1}}, false, 1.0f},
      {"gemma sliding hd256 w1024, 1 seq ctx 1000", 16, 8, 256, 1024, 16, {{999, 1}}, false, 1.0f},
      {"gemma full hd512, 1 seq ctx 8000, page 5", 16, 2, 512, 0, 5, {{7999, 1}}, false, 1.0f},
      {"gemma full hd512, ctx 1..33 (tile edges)", 16, 2, 512, 0, 16, {{0, 1}, {31, 1}, {32, 1}, {33, 1}}, false, 1.0f},
      {"gemma full hd512, 40 seqs ctx 3000", 16, 2, 512, 0, 16, std::vector<std::pair<int64_t, int64_t>>(40, {2999, 1}), false, 1.0f},
      {"hd512 g20 (2 head blocks), sinks, window 300", 40, 2, 512, 300, 16, {{2000, 1}, {10, 1}}},
      {"hd256 g2 sinks ctx 3001", 16, 8, 256, 0, 16, {{3000, 1}, {1, 1}}},
      {"hd64 g8 no sinks, scale 1, ctx 5000", 16, 2, 64, 0, 16, {{4999, 1}, {0, 1}}, false, 1.0f},
      {"hd128 g4 full (tiny-gemma4), ctx 1..3000", 4, 1, 128, 0, 16, {{0, 1}, {63, 1}, {64, 1}, {2999, 1}}, false, 1.0f},
      {"hd128 g2 window 100, sinks, page 5", 8, 4, 128, 100, 5, {{1000, 1}, {5, 1}}},
      {"gemma sliding hd256 w1024, verify 4 rows after 1022 + 8 after 3000", 16, 8, 256, 1024, 16, {{1022, 4}, {3000, 8}}, false, 1.0f},
      {"gemma full hd512, verify 4 rows after 6000, page 5", 16, 2, 512, 0, 5, {{6000, 4}, {3, 2}}, false, 1.0f},
  };
  for (const auto& c : cases) run_attention(cpu_, cuda_, rng_, c);
}

// The swap-AB decode kernel's cases (attention_decode_swap.cu: head dims 64, 256 and 512, up to 8 q heads per kv
// head): Gemma's, then batches of 1, 3, 33 and 80 with contexts that cross the 1024-key window and page edges, V
// aliasing K, odd groups, sinks through the split merge, verify rows; gpt-oss's head dim 64 last.
std::vector<AttnCase> swap_decode_cases() {
  auto ctx = [](std::initializer_list<int64_t> lens) {
    std::vector<std::pair<int64_t, int64_t>> spans;
    for (int64_t n : lens) spans.push_back({n - 1, 1});
    return spans;
  };
  auto spread = [](int64_t seqs, int64_t lo, int64_t step) {
    std::vector<std::pair<int64_t, int64_t>> spans;
    for (int64_t i = 0; i < seqs; ++i) spans.push_back({lo + (i * step) % 1500, 1});
    return spans;
  };
  return {
      {"sliding hd256 w1024 b1 ctx 1000", 16, 8, 256, 1024, 16, ctx({1000}), false, 1.0f},
      {"sliding hd256 w1024 b3 ctx 1 / 1024 / 1025, page 5", 16, 8, 256, 1024, 5, ctx({1, 1024, 1025}), false, 1.0f},
      {"sliding hd256 w1024 b33 ctx 1..2100", 16, 8, 256, 1024, 16, spread(33, 0, 67), false, 1.0f},
      {"sliding hd256 w1024 b80 ctx ~1040", 16, 8, 256, 1024, 16, spread(80, 1000, 1), false, 1.0f},
      {"full hd512 K=V b1 ctx 2500", 16, 2, 512, 0, 16, ctx({2500}), false, 1.0f, true},
      {"full hd512 K=V b3 ctx 1 / 33 / 1057, page 7", 16, 2, 512, 0, 7, ctx({1, 33, 1057}), false, 1.0f, true},
      {"full hd512 K=V b33 ctx 1..2100", 16, 2, 512, 0, 16, spread(33, 0, 67), false, 1.0f, true},
      {"full hd512 K=V b80 ctx ~1040", 16, 2, 512, 0, 16, spread(80, 1000, 1), false, 1.0f, true},
      {"hd512 g8 own V, sinks, window 300", 16, 2, 512, 300, 16, ctx({2000, 10, 299, 301})},
      {"hd256 g2 sinks ctx 3001", 16, 8, 256, 0, 16, ctx({3001, 2})},
      {"hd256 g1 (MHA) window 100, page 5", 4, 4, 256, 100, 5, ctx({1000, 5})},
      {"hd512 g3 (odd group) K=V, sinks", 6, 2, 512, 0, 16, ctx({700, 1}), true, 0.0f, true},
      {"hd256 g5 (odd group) w1024", 10, 2, 256, 1024, 16, ctx({1100, 17})},
      {"sliding verify 4 rows after 1022 + 8 after 3000", 16, 8, 256, 1024, 16, {{1022, 4}, {3000, 8}}, false, 1.0f},
      {"full K=V verify 4 rows after 6000 + 2 after 3, page 5", 16, 2, 512, 0, 5, {{6000, 4}, {3, 2}}, false, 1.0f, true},
      // gpt-oss (head dim 64, 64 q / 8 kv heads, sinks): a lane per 16-byte chunk, 4 rows per copy pass.
      {"gpt-oss hd64 g8 b1 ctx 1000", 64, 8, 64, 0, 16, ctx({1000})},
      {"gpt-oss hd64 g8 window 128 b3 ctx 1 / 128 / 129, page 5", 64, 8, 64, 128, 5, ctx({1, 128, 129})},
      {"hd64 g8 b37 ctx 1..2100 (splits)", 16, 2, 64, 0, 16, spread(37, 0, 57)},
      {"hd64 g3 (odd group) window 128 b33, page 7", 6, 2, 64, 128, 7, spread(33, 100, 41)},
      {"hd64 g8 verify 4 rows after 1022 + 8 after 30", 16, 2, 64, 0, 16, {{1022, 4}, {30, 8}}},
  };
}

// The swap-AB decode kernel (one warp per split at head dim 64, a CTA of 4 warps at 256 and 512) on every case
// above, with graph replay equal to eager. Shapes outside it are refused.
TEST_F(KernelTest, AttentionDecodeSwap) {
  auto ctx = [](std::initializer_list<int64_t> lens) {
    std::vector<std::pair<int64_t, int64_t>> spans;
    for (int64_t n : lens) spans.push_back({n - 1, 1});
    return spans;
  };
  const std::vector<AttnCase> cases = swap_decode_cases();
  ASSERT_TRUE(set_cuda_attention_options(cuda_backend(), {CudaAttentionPath::kAuto, CudaAttentionDecode::kSwapAb}).is_ok());
  for (const auto& c : cases)
    run_attention(cpu_, cuda_, rng_, c, " (swap AB)", /*replay=*/&c == &cases[2] || &c == &cases[6] || &c == &cases[17]);
  // Outside its shapes: an error, not a wrong answer.
  for (const AttnCase& c : {AttnCase{"hd32", 16, 2, 32, 0, 16, ctx({10})}, AttnCase{"hd256 g16", 32, 2, 256, 0, 16, ctx({10})}}) {
    PagedSetup s = make_paged(rng_, c.spans, c.page_size);
    auto st = BatchStaging::create(cuda_backend(), {1, 1, s.max_pages, 1});
    ASSERT_TRUE(st.is_ok());
    auto batch = st->stage(s.seqs);
    ASSERT_TRUE(batch.is_ok());
    TensorView kv = cuda_.make(DType::kBF16, {s.num_pages, c.page_size, c.n_kv, c.hd});
    TensorView q = cuda_.make(DType::kBF16, {1, c.n_q * c.hd}), o = cuda_.make(DType::kBF16, {1, c.n_q * c.hd});
    EXPECT_FALSE(cuda_backend().attention({q, {kv, kv, c.page_size}, {}, o, c.n_q, c.n_kv, c.hd, 0, 1.0f}, *batch).is_ok())
        << c.name;
  }
  ASSERT_TRUE(set_cuda_attention_options(cuda_backend(), {}).is_ok());
}

// The same kernel with a token's 16 splits as one CTA cluster that merges them in distributed shared memory
// (head dims 256 and 512, sm_90+): every case of those head dims but the batches of 80, splits without keys
// (contexts under 16 keys a split) and graph replay included; head dim 64 is refused.
TEST_F(KernelTest, AttentionDecodeSwapCluster) {
  const std::vector<AttnCase> cases = swap_decode_cases();
  ASSERT_TRUE(set_cuda_attention_options(cuda_backend(), {CudaAttentionPath::kAuto, CudaAttentionDecode::kSwapAbCluster}).is_ok());
  for (const auto& c : cases)
    if (c.hd != 64 && c.name.find("b80") == std::string::npos)
      run_attention(cpu_, cuda_, rng_, c, " (swap AB, clusters)", /*replay=*/&c == &cases[2] || &c == &cases[6]);
  // One token with short splits (the sliding case) runs a ring of 2 above (CudaAttentionOptions::
  // cluster_stages_one_token); again with the config's ring (4 stages) and with 3.
  for (int stages : {0, 3}) {
    CudaAttentionOptions o{CudaAttentionPath::kAuto, CudaAttentionDecode::kSwapAbCluster};
    o.cluster_stages_one_token = stages;
    ASSERT_TRUE(set_cuda_attention_options(cuda_backend(), o).is_ok());
    const char* label = stages == 0 ? " (swap AB, clusters, the config's ring)" : " (swap AB, clusters, ring of 3)";
    run_attention(cpu_, cuda_, rng_, cases[0], label, /*replay=*/stages == 0);
  }
  PagedSetup s = make_paged(rng_, {{9, 1}}, 16);
  auto st = BatchStaging::create(cuda_backend(), {1, 1, s.max_pages, 1});
  ASSERT_TRUE(st.is_ok());
  auto batch = st->stage(s.seqs);
  ASSERT_TRUE(batch.is_ok());
  TensorView kv = cuda_.make(DType::kBF16, {s.num_pages, 16, 2, 64});
  TensorView q = cuda_.make(DType::kBF16, {1, 16 * 64}), o = cuda_.make(DType::kBF16, {1, 16 * 64});
  EXPECT_FALSE(cuda_backend().attention({q, {kv, kv, 16}, {}, o, 16, 2, 64, 0, 1.0f}, *batch).is_ok()) << "hd64 clusters";
  ASSERT_TRUE(set_cuda_attention_options(cuda_backend(), {}).is_ok());
}

// Gemma-4's decode step as the model runs it: qkv_rope with the q/k/v norms (writing each token's own K/V over stale
// bits), then the decode attention, eager and replayed from a graph, where the attention copies the keys of earlier
// steps before its PDL wait (CudaAttentionOptions::keys_before_wait, the default), also with the config's ring:
// against the CPU twin's two ops, and bit-equal to every copy after the wait. Then both as one op
// (Backend::qkv_rope_attention), the attention norming and rotating q and the new K/V itself
// (CudaAttentionOptions::norm_rope_in_attention): against the CPU twin, and its output and cache within a bf16 step of
// the two ops' (the same arithmetic, compiled apart: equal bits on an H200, session 23); graph replay equal to eager. The contexts put a token's own key in a split's first stage (970:
// key 969 of the split from 960; 1), in its second (977 at head dim 512: a ring of 3) and past the ring's first
// stages (1500, 1026: the L2 prefetch's keys), with splits past the query whose start is within a stage of it (34:
// key 33 and the split from 48; 1026: key 1025 and the split from 1040).
TEST_F(KernelTest, GemmaQkvNormRopeThenDecodeAttention) {
  struct Case {
    std::string name;
    int64_t n_q, n_kv, hd, window, page;
    std::vector<std::pair<int64_t, int64_t>> spans;  // (cached tokens, 1) per sequence
  };
  const Case cases[] = {
      {"sliding hd256 w1024 b1 ctx 970", 16, 8, 256, 1024, 16, {{969, 1}}},
      {"sliding hd256 w1024 b3 ctx 970 / 1 / 1500, page 5", 16, 8, 256, 1024, 5, {{969, 1}, {0, 1}, {1499, 1}}},
      {"full hd512 b3 ctx 977 / 34 / 1026, page 7", 16, 2, 512, 0, 7, {{976, 1}, {33, 1}, {1025, 1}}},
  };
  struct Variant {
    const char* label;
    bool keys_before_wait;
    int stages_one_token;
    bool one_op;  // qkv_rope_attention with the norms and RoPE in the attention
  };
  const Variant variants[] = {{"keys after the wait", false, 2, false},
                              {"keys before the wait", true, 2, false},
                              {"keys before the wait, the config's ring", true, 0, false},
                              {"norms and RoPE in the attention", true, 2, true},
                              {"norms and RoPE in the attention, the config's ring", true, 0, true}};
  for (const Case& c : cases) {
    const StagedPair sp(cpu_, cuda_, rng_, c.spans, c.page);
    ASSERT_TRUE(sp.ok());
    const PagedSetup& s = sp.paged;
    const int64_t T = sp.tokens, width = (c.n_q + 2 * c.n_kv) * c.hd;
    const Shape cache{s.num_pages, c.page, c.n_kv, c.hd};
    const Bf16Data k = quick_random_bf16(rng_, cache.numel(), 1.0f), v = quick_random_bf16(rng_, cache.numel(), 1.0f);
    const Bf16Data qkv = random_bf16(rng_, T * width, 1.0f);
    const Bf16Data qn = random_bf16(rng_, c.hd, 1.0f), kn = random_bf16(rng_, c.hd, 1.0f);
    std::vector<float> freq(static_cast<size_t>(c.hd / 2));
    for (size_t i = 0; i < freq.size(); ++i) freq[i] = std::pow(10000.0f, -2.0f * static_cast<float>(i) / c.hd);
    const Pair px = upload_activation(cpu_, cuda_, qkv, {T, width});
    const Pair pk = upload_activation(cpu_, cuda_, k, cache), pv = upload_activation(cpu_, cuda_, v, cache);
    const TensorView f_c = cpu_.upload(DType::kF32, {c.hd / 2}, freq.data());
    const TensorView f_g = cuda_.upload(DType::kF32, {c.hd / 2}, freq.data());
    const TensorView qn_c = cpu_.upload(DType::kBF16, {c.hd}, qn.bits.data()), kn_c = cpu_.upload(DType::kBF16, {c.hd}, kn.bits.data());
    const TensorView qn_g = cuda_.upload(DType::kBF16, {c.hd}, qn.bits.data()), kn_g = cuda_.upload(DType::kBF16, {c.hd}, kn.bits.data());
    TensorView q_c = cpu_.make(DType::kF32, {T, c.n_q * c.hd}), o_c = cpu_.make(DType::kF32, {T, c.n_q * c.hd});
    const QkvRopeParams r_c{px.cpu, q_c, {pk.cpu, pv.cpu, c.page}, f_c, 1.0f, c.n_q, c.n_kv, c.hd, qn_c, kn_c, 1e-6f, {}};
    ASSERT_TRUE(cpu_backend().qkv_rope(r_c, *sp.cpu_batch).is_ok());
    const AttentionParams a_c{q_c, {pk.cpu, pv.cpu, c.page}, {}, o_c, c.n_q, c.n_kv, c.hd, c.window, 1.0f};
    ASSERT_TRUE(cpu_backend().attention(a_c, *sp.cpu_batch).is_ok());
    const std::vector<float> want = cpu_.download_f32(o_c);
    std::vector<uint8_t> before;
    std::vector<float> before_f32, before_k, before_v;
    for (const Variant& var : variants) {
      CudaAttentionOptions o;
      o.keys_before_wait = var.keys_before_wait;
      o.cluster_stages_one_token = var.stages_one_token;
      o.norm_rope_in_attention = var.one_op;
      ASSERT_TRUE(set_cuda_attention_options(cuda_backend(), o).is_ok());
      // Eager, then a graph captured over fresh caches (the own keys' slots stale again) and replayed once.
      std::vector<uint8_t> eager;
      for (bool replay : {false, true}) {
        const TensorView k_g = cuda_.upload(DType::kBF16, cache, k.bits.data());
        const TensorView v_g = cuda_.upload(DType::kBF16, cache, v.bits.data());
        const TensorView q_g = cuda_.make(DType::kBF16, {T, c.n_q * c.hd}), o_g = cuda_.make(DType::kBF16, {T, c.n_q * c.hd});
        const QkvRopeParams r_g{px.cuda, q_g, {k_g, v_g, c.page}, f_g, 1.0f, c.n_q, c.n_kv, c.hd, qn_g, kn_g, 1e-6f, {}};
        const AttentionParams a_g{q_g, {k_g, v_g, c.page}, {}, o_g, c.n_q, c.n_kv, c.hd, c.window, 1.0f};
        auto both = [&]() -> Status {
          if (var.one_op) return cuda_backend().qkv_rope_attention(r_g, a_g, *sp.cuda_batch);
          MX_RETURN_IF_ERROR(cuda_backend().qkv_rope(r_g, *sp.cuda_batch));
          return cuda_backend().attention(a_g, *sp.cuda_batch);
        };
        const Status st = run_eager_or_replayed(cuda_backend(), replay, both);
        ASSERT_TRUE(st.is_ok()) << st.to_string();
        const std::vector<uint8_t> got = cuda_.download_bytes(o_g);
        const std::string what = c.name + " (" + var.label + (replay ? ", graph replay)" : ")");
        if (replay) {
          EXPECT_EQ(got, eager) << what << ": graph replay != eager";
          continue;
        }
        eager = got;
        const std::vector<float> got_f32 = cuda_.download_f32(o_g);
        check("gemma qkv_rope + decode attention", what, got_f32, want, 1e-2);
        if (before.empty()) {
          before = got, before_f32 = got_f32;
          before_k = cuda_.download_f32(k_g), before_v = cuda_.download_f32(v_g);
        }
        if (!var.one_op) {
          EXPECT_EQ(got, before) << what << ": != every key after the wait";
          continue;
        }
        check("gemma qkv_rope + decode attention, one op vs two", what, got_f32, before_f32, 5e-3);
        check("gemma qkv_rope + decode attention, one op vs two: k cache", what, cuda_.download_f32(k_g), before_k, 5e-3);
        check("gemma qkv_rope + decode attention, one op vs two: v cache", what, cuda_.download_f32(v_g), before_v, 5e-3);
      }
    }
  }
  ASSERT_TRUE(set_cuda_attention_options(cuda_backend(), {}).is_ok());
}

TEST_F(KernelTest, AttentionDecode) {
  const std::vector<AttnCase> cases = {
      {"gpt-oss hd64 g8 full, 1 seq ctx 1000", 64, 8, 64, 0, 16, {{999, 1}}},
      {"hd64 g8 full, 4 seqs ctx 1..5000 (splits)", 16, 2, 64, 0, 16, {{0, 1}, {63, 1}, {64, 1}, {4999, 1}}},
      {"hd64 g8 window 128, ctx 20000", 16, 2, 64, 128, 32, {{19999, 1}, {127, 1}, {128, 1}}},
      {"hd32 g2 window 8, page 4", 6, 3, 32, 8, 4, {{0, 1}, {7, 1}, {8, 1}, {100, 1}}},
      {"hd32 g2 full ctx 3001, odd page 5", 6, 3, 32, 0, 5, {{3000, 1}, {1, 1}}},
      {"hd64 g8 full, 40 seqs ctx 10000", 16, 2, 64, 0, 16, std::vector<std::pair<int64_t, int64_t>>(40, {9999, 1})},
      // Verify rows (a few queries per sequence, causal among them) take the decode kernel too.
      {"hd64 g8 full, verify 4 rows after 1000 + 8 after 20 + 1, page 16", 16, 2, 64, 0, 16, {{1000, 4}, {20, 8}, {5, 1}}},
      {"hd64 g8 window 128, verify rows across the window edge, page 4", 16, 2, 64, 128, 4, {{126, 4}, {3000, 8}, {0, 2}}},
      {"hd32 g2 full, verify 3 rows, odd page 5", 6, 3, 32, 0, 5, {{3000, 3}, {1, 2}}},
  };
  for (const auto& c : cases) run_attention(cpu_, cuda_, rng_, c, "", /*replay=*/&c == &cases[0]);
  // One token at head dim 64 on sm_90 merges 2-16 splits in a CTA cluster: those through the merge kernel too.
  ASSERT_TRUE(set_cuda_attention_options(cuda_backend(), {CudaAttentionPath::kAuto, CudaAttentionDecode::kMmaSyncMerge})
                  .is_ok());
  for (size_t i : {0, 1, 6}) run_attention(cpu_, cuda_, rng_, cases[i], " (merge kernel)");
  ASSERT_TRUE(set_cuda_attention_options(cuda_backend(), {}).is_ok());
}

// gpt-oss's decode step: qkv_rope (writing each token's own K/V over stale bits), then the decode attention at head
// dim 64 with sinks (attention.cu's kernel: a token's splits as a CTA cluster, or through the merge kernel), eager and
// replayed from a graph, where the attention copies the ring's first stages of the keys of earlier steps before its PDL
// wait (CudaAttentionOptions::keys_before_wait, the default): against the CPU twin's two ops, and bit-equal to every
// copy after the wait. The contexts put a token's own key in a split's first tile (34, 61, 1), in its second (970:
// key 969 of the split from 896; the windows at 1501 and 129) and past the ring's two stages (3000: the split from
// 2816 of 256 keys), with splits past the query.
TEST_F(KernelTest, GptOssQkvRopeThenDecodeAttention) {
  const AttnCase cases[] = {
      {"full b1 ctx 970", 64, 8, 64, 0, 16, {{969, 1}}},
      {"full b3 ctx 34 / 1 / 3000, page 7", 64, 8, 64, 0, 7, {{33, 1}, {0, 1}, {2999, 1}}},
      {"window 128 b1 ctx 1501", 64, 8, 64, 128, 16, {{1500, 1}}},
      {"window 128 b2 ctx 61 / 129, page 5", 64, 8, 64, 128, 5, {{60, 1}, {128, 1}}},
  };
  struct Variant {
    const char* label;
    CudaAttentionDecode decode;
    bool keys_before_wait;  // each form's keys-before variant follows its keys-after one
  };
  const Variant variants[] = {{"keys after the wait", CudaAttentionDecode::kAuto, false},
                              {"keys before the wait", CudaAttentionDecode::kAuto, true},
                              {"merge kernel, keys after the wait", CudaAttentionDecode::kMmaSyncMerge, false},
                              {"merge kernel, keys before the wait", CudaAttentionDecode::kMmaSyncMerge, true}};
  for (const AttnCase& c : cases) {
    const StagedPair sp(cpu_, cuda_, rng_, c.spans, c.page_size);
    ASSERT_TRUE(sp.ok());
    const int64_t T = sp.tokens, width = (c.n_q + 2 * c.n_kv) * c.hd;
    const Shape cache{sp.paged.num_pages, c.page_size, c.n_kv, c.hd};
    const Bf16Data k = quick_random_bf16(rng_, cache.numel(), 1.0f), v = quick_random_bf16(rng_, cache.numel(), 1.0f);
    const Bf16Data qkv = random_bf16(rng_, T * width, 1.0f), sinks = random_bf16(rng_, c.n_q, 1.0f);
    std::vector<float> freq(static_cast<size_t>(c.hd / 2));
    for (size_t i = 0; i < freq.size(); ++i) freq[i] = std::pow(150000.0f, -2.0f * static_cast<float>(i) / c.hd);
    const Pair px = upload_activation(cpu_, cuda_, qkv, {T, width});
    const Pair pk = upload_activation(cpu_, cuda_, k, cache), pv = upload_activation(cpu_, cuda_, v, cache);
    const TensorView f_c = cpu_.upload(DType::kF32, {c.hd / 2}, freq.data());
    const TensorView f_g = cuda_.upload(DType::kF32, {c.hd / 2}, freq.data());
    const TensorView sk_c = cpu_.upload(DType::kBF16, {c.n_q}, sinks.bits.data());
    const TensorView sk_g = cuda_.upload(DType::kBF16, {c.n_q}, sinks.bits.data());
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.hd)), rope_scale = 1.25f;
    TensorView q_c = cpu_.make(DType::kF32, {T, c.n_q * c.hd}), o_c = cpu_.make(DType::kF32, {T, c.n_q * c.hd});
    const QkvRopeParams r_c{px.cpu, q_c, {pk.cpu, pv.cpu, c.page_size}, f_c, rope_scale, c.n_q, c.n_kv, c.hd,
                            {}, {}, 0, {}};
    ASSERT_TRUE(cpu_backend().qkv_rope(r_c, *sp.cpu_batch).is_ok());
    const AttentionParams a_c{q_c, {pk.cpu, pv.cpu, c.page_size}, sk_c, o_c, c.n_q, c.n_kv, c.hd, c.window, scale};
    ASSERT_TRUE(cpu_backend().attention(a_c, *sp.cpu_batch).is_ok());
    const std::vector<float> want = cpu_.download_f32(o_c);
    std::vector<uint8_t> after;  // the form's every-key-after-the-wait output
    for (const Variant& var : variants) {
      CudaAttentionOptions o{CudaAttentionPath::kAuto, var.decode};
      o.keys_before_wait = var.keys_before_wait;
      ASSERT_TRUE(set_cuda_attention_options(cuda_backend(), o).is_ok());
      // Eager, then a graph captured over fresh caches (the own keys' slots stale again) and replayed once.
      std::vector<uint8_t> eager;
      for (bool replay : {false, true}) {
        const TensorView k_g = cuda_.upload(DType::kBF16, cache, k.bits.data());
        const TensorView v_g = cuda_.upload(DType::kBF16, cache, v.bits.data());
        const TensorView q_g = cuda_.make(DType::kBF16, {T, c.n_q * c.hd});
        const TensorView o_g = cuda_.make(DType::kBF16, {T, c.n_q * c.hd});
        const QkvRopeParams r_g{px.cuda, q_g, {k_g, v_g, c.page_size}, f_g, rope_scale, c.n_q, c.n_kv, c.hd,
                                {}, {}, 0, {}};
        const AttentionParams a_g{q_g, {k_g, v_g, c.page_size}, sk_g, o_g, c.n_q, c.n_kv, c.hd, c.window, scale};
        auto both = [&]() -> Status {
          MX_RETURN_IF_ERROR(cuda_backend().qkv_rope(r_g, *sp.cuda_batch));
          return cuda_backend().attention(a_g, *sp.cuda_batch);
        };
        const Status st = run_eager_or_replayed(cuda_backend(), replay, both);
        ASSERT_TRUE(st.is_ok()) << st.to_string();
        const std::vector<uint8_t> got = cuda_.download_bytes(o_g);
        const std::string what = c.name + " (" + var.label + (replay ? ", graph replay)" : ")");
        if (replay) {
          EXPECT_EQ(got, eager) << what << ": graph replay != eager";
          continue;
        }
        eager = got;
        check("gpt-oss qkv_rope + decode attention", what, cuda_.download_f32(o_g), want, 1e-2);
        if (!var.keys_before_wait) after = got;
        else EXPECT_EQ(got, after) << what << ": != every key after the wait";
      }
    }
  }
  ASSERT_TRUE(set_cuda_attention_options(cuda_backend(), {}).is_ok());
}

// The kernel spreads (head, run of 4 pairs) work over CTAs of 128 threads: head counts that do not fill the last
// CTA, CTAs that mix q, k and v heads, two heads per CTA (hd 256) and several (hd 32), and a head dim whose half
// is not a multiple of 4 (hd 12: one pair per thread) all meet the CPU twin.
TEST_F(KernelTest, QkvRope) {
  for (const auto& [n_q, n_kv, hd] :
       {std::tuple<int64_t, int64_t, int64_t>{16, 2, 64}, {7, 3, 32}, {5, 1, 256}, {64, 8, 64}, {3, 1, 12}})
    run_qkv_rope(n_q, n_kv, hd);
}

// The many-token form (prefill; forced from one token here) on the same odd shapes, gpt-oss-20b/120b's heads (64 q /
// 8 kv) and a tensor-parallel rank's (32 / 4), in the two default CTA shapes and an odd one: 33 tokens over 4
// sequences at cached prefixes (positions 0, 5, 4095, 100000) leave a partial last CTA at 2 and 5 tokens per CTA;
// items 2, 4 and 8 per thread leave idle threads in the last warp; hd 12 (half not a multiple of 8) falls back to
// the decode form.
TEST_F(KernelTest, QkvRopeStream) {
  for (const auto& [tokens_per_cta, items] : {std::pair{1, 2}, {2, 4}, {5, 8}}) {
    ASSERT_TRUE(set_cuda_rope_options(cuda_backend(), {1, tokens_per_cta, items}).is_ok());
    for (const auto& [n_q, n_kv, hd] :
         {std::tuple<int64_t, int64_t, int64_t>{64, 8, 64}, {32, 4, 64}, {7, 3, 32}, {5, 1, 256}, {3, 1, 12}})
      run_qkv_rope(n_q, n_kv, hd);
  }
  ASSERT_TRUE(set_cuda_rope_options(cuda_backend(), {}).is_ok());
}

// Gemma-4: the sliding layers' default RoPE at head dim 256 and the full layers' proportional RoPE at 512
// (only the first 64 of 256 frequency pairs rotate; the rest must pass through unchanged).
TEST_F(KernelTest, QkvRopeGemma) {
  const Gemma4Rope sliding{10000.0, 1.0}, full{1000000.0, 0.25};
  run_qkv_rope(16, 8, 256, &sliding);
  run_qkv_rope(16, 2, 512, &full);
  run_qkv_rope(3, 1, 136, &full);  // 17 rotated pairs of 68
}

// The same with the per-head q/k/v norms fused in (norm_eps > 0: one kernel at head dims up to 512): CTAs of
// 8 heads that mix q, k and v heads, a last CTA with idle warps, a half (68) that is not a multiple of 8.
TEST_F(KernelTest, QkvNormRopeGemma) {
  const Gemma4Rope sliding{10000.0, 1.0}, full{1000000.0, 0.25};
  run_qkv_rope(16, 8, 256, &sliding, /*norms=*/true);
  run_qkv_rope(16, 2, 512, &full, true);
  run_qkv_rope(3, 1, 136, &full, true);
  run_qkv_rope(5, 2, 64, &sliding, true);
  // With an L2 prefetch of another buffer (3,000,034 bytes: a last chunk cut short, the odd tail dropped) issued by
  // every thread before the wait: a hint that changes nothing.
  run_qkv_rope(16, 8, 256, &sliding, true, /*prefetch=*/true);
  run_qkv_rope(16, 2, 512, &full, true, true);
}

void KernelTest::run_qkv_rope(int64_t n_q, int64_t n_kv, int64_t hd, const Gemma4Rope* gemma_rope, bool norms,
                              bool prefetch) {
  YarnRope rope;
  rope.factor = 32;
  const int64_t page = 16;
  const std::string shape = " (q " + std::to_string(n_q) + ", kv " + std::to_string(n_kv) + ", hd " + std::to_string(hd) +
                            (gemma_rope ? ", gemma partial " + std::to_string(gemma_rope->partial_rotary_factor) : "") +
                            (norms ? ", q/k/v norms" : "") + (prefetch ? ", L2 prefetch" : "") + ")";
  RopeTables tables = compute_yarn_rope(rope, hd);
  if (gemma_rope) {
    tables.inv_freq = gemma4_inv_freq(*gemma_rope, hd);
    tables.attention_scale = 1.0f;
  }
  const StagedPair sp(cpu_, cuda_, rng_, {{0, 20}, {100000, 3}, {5, 1}, {4095, 9}}, page);
  ASSERT_TRUE(sp.ok());
  const PagedSetup& s = sp.paged;
  const int64_t T = sp.tokens, width = (n_q + 2 * n_kv) * hd;
  Bf16Data qkv = random_bf16(rng_, T * width, 1.0f);
  Pair p = upload_activation(cpu_, cuda_, qkv, {T, width});
  const Shape cache{s.num_pages, page, n_kv, hd};
  TensorView k_c = cpu_.make(DType::kF32, cache), v_c = cpu_.make(DType::kF32, cache);
  TensorView k_g = cuda_.make(DType::kBF16, cache), v_g = cuda_.make(DType::kBF16, cache);
  TensorView q_c = cpu_.make(DType::kF32, {T, n_q * hd}), q_g = cuda_.make(DType::kBF16, {T, n_q * hd});
  const int64_t half = hd / 2;
  TensorView f_c = cpu_.upload(DType::kF32, {half}, tables.inv_freq.data()),
             f_g = cuda_.upload(DType::kF32, {half}, tables.inv_freq.data());
  Bf16Data qn = random_bf16(rng_, hd, 1.0f), kn = random_bf16(rng_, hd, 1.0f);
  QkvRopeParams rc{p.cpu, q_c, {k_c, v_c, page}, f_c, tables.attention_scale, n_q, n_kv, hd, {}, {}, 0, {}};
  QkvRopeParams rg{p.cuda, q_g, {k_g, v_g, page}, f_g, tables.attention_scale, n_q, n_kv, hd, {}, {}, 0, {}};
  if (norms) {
    rc.q_norm = cpu_.upload(DType::kBF16, {hd}, qn.bits.data()), rc.k_norm = cpu_.upload(DType::kBF16, {hd}, kn.bits.data());
    rg.q_norm = cuda_.upload(DType::kBF16, {hd}, qn.bits.data()), rg.k_norm = cuda_.upload(DType::kBF16, {hd}, kn.bits.data());
    rc.norm_eps = rg.norm_eps = 1e-6f;
  }
  if (prefetch) {  // the batch's tokens are past the default's decode steps
    rg.prefetch = cuda_.make(DType::kBF16, {1500017});
    ASSERT_TRUE(set_cuda_l2_prefetch_options(cuda_backend(), {24ll << 20, T}).is_ok());
  }
  ASSERT_TRUE(cpu_backend().qkv_rope(rc, *sp.cpu_batch).is_ok());
  ASSERT_TRUE(cuda_backend().qkv_rope(rg, *sp.cuda_batch).is_ok());
  ASSERT_TRUE(set_cuda_l2_prefetch_options(cuda_backend(), {}).is_ok());
  check("qkv_rope q", "4 seqs, positions to 100002" + shape, cuda_.download_f32(q_g), cpu_.download_f32(q_c), 5e-3);
  // Only the written slots of the cache are defined: each token's slot, read from its page alone (the
  // caches span ~6,500 pages for position 100002; downloading them whole took ~14 s per case).
  std::vector<float> wk_c, wk_g, wv_c, wv_g;
  auto append_slot = [&](Arena& a, const TensorView& cache, int64_t pg, int64_t slot, std::vector<float>& out) {
    const std::vector<float> rows = a.download_f32(cache.rows(pg, pg + 1));
    out.insert(out.end(), rows.begin() + slot * n_kv * hd, rows.begin() + (slot + 1) * n_kv * hd);
  };
  for (size_t i = 0; i < s.seqs.size(); ++i)
    for (int64_t j = 0; j < static_cast<int64_t>(s.tokens[i].size()); ++j) {
      const int64_t pos = s.seqs[i].start_position + j, pg = s.pages[i][pos / page], slot = pos % page;
      append_slot(cpu_, k_c, pg, slot, wk_c);
      append_slot(cuda_, k_g, pg, slot, wk_g);
      append_slot(cpu_, v_c, pg, slot, wv_c);
      append_slot(cuda_, v_g, pg, slot, wv_g);
    }
  check("qkv_rope k cache", "rotated keys at token slots" + shape, wk_g, wk_c, 5e-3);
  // Plain values are copied exactly; normed ones are rounded to bf16 once from fp32 (the twin keeps f32).
  check("qkv_rope v cache", "values at token slots" + shape, wv_g, wv_c, norms ? 5e-3 : 0.0);
}

// The RoPE epilogue's rotated values (q, or the k cache's slots) against the two ops', element by element. Both
// forms rotate the same bf16 pair (a, b) with the same fp32 cos and sin (times `scale`), but may round the
// products of a cos - b sin / b cos + a sin differently (the epilogue rounds each; ptxas may fuse one into an
// fma in rope.cu), so their fp32 results differ by at most 2^-24 (|a| + |b|) scale for that product plus each
// one's final rounding, below 2^-22 (|a| + |b|) scale; each is then rounded to bf16 once, which adds at most
// one bf16 step at the larger value (2^-7 of its power of two). `a_b` gives an element's pair; the row records
// the worst element's share of that bound (tol 1) and how many elements differ at all.
void check_rotated(const std::string& test, const std::string& detail, const std::vector<float>& got,
                   const std::vector<float>& want, float scale, const std::function<std::pair<float, float>(size_t)>& a_b) {
  double worst = 0, max_abs = 0;
  int64_t differ = 0, non_finite = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    if (!std::isfinite(got[i]) || !std::isfinite(want[i])) {
      ++non_finite;
      continue;
    }
    if (got[i] == want[i]) continue;
    ++differ;
    const auto [a, b] = a_b(i);
    const double big = std::max(std::fabs(got[i]), std::fabs(want[i]));
    const double step = big > 0 ? std::ldexp(1.0, std::ilogb(big) - 7) : 0.0;
    const double bound = step + std::ldexp(static_cast<double>(std::fabs(a) + std::fabs(b)) * scale, -22);
    const double d = std::fabs(static_cast<double>(got[i]) - want[i]);
    worst = std::max(worst, d / bound);
    max_abs = std::max(max_abs, d);
  }
  if (got.size() != want.size()) ++non_finite;
  const bool pass = non_finite == 0 && worst <= 1.0;
  record(test, detail + ": " + std::to_string(differ) + " of " + std::to_string(got.size()) +
                   " differ, worst at this share of one bf16 step + fp32 rounding" +
                   (non_finite ? " NON-FINITE x" + std::to_string(non_finite) : ""),
         worst, max_abs, 1.0, pass);
  EXPECT_TRUE(pass) << test << " " << detail << ": " << differ << " elements differ, worst at " << worst
                    << " of one bf16 step + fp32 rounding, non-finite " << non_finite;
}

// gpt-oss's q|k|v projection with RoPE and the KV write in the skinny kernel's epilogue (linear_qkv_rope at <= 16
// tokens) against the CPU twin (linear then qkv_rope in f32; every form at the bf16 rounding scale, as the other
// kernels) and against the two ops on CUDA (the skinny linear, then qkv_rope): the same sums, so v bit for bit,
// and q and k within check_rotated's bound (session 18's final call: the bf16 8-token case's q at rel-L2 5.6e-6,
// one small value a bf16 step apart). bf16 and FP8 weights; 20b's shape at 1, 8 and 16 tokens (320 strips: the
// 3-CTA forms on an H200), a small one in one wave, head dim 32 (two strips a head), k % 16 == 8 (FP8's 8-byte
// loads), two token tiles.
TEST_F(KernelTest, LinearQkvRope) {
  struct Case {
    int64_t n_q, n_kv, hd, k;
    std::vector<std::pair<int64_t, int64_t>> spans;  // (start, tokens) per sequence
  };
  auto ones = [](std::initializer_list<int64_t> starts) {
    std::vector<std::pair<int64_t, int64_t>> v;
    for (int64_t s : starts) v.push_back({s, 1});
    return v;
  };
  const std::vector<Case> cases = {{64, 8, 64, 2880, ones({999})},
                                   {64, 8, 64, 2880, ones({0, 5, 17, 1000, 1023, 31, 64, 4095})},
                                   {64, 8, 64, 2880, {{3, 9}, {2000, 7}}},
                                   {16, 2, 64, 328, {{0, 2}, {40, 1}}},
                                   {7, 3, 32, 1000, {{0, 5}, {100, 3}, {7, 1}}}};
  YarnRope yarn;
  yarn.factor = 32;
  const int64_t page = 16;
  for (const Case& c : cases) {
    for (const bool fp8 : {false, true}) {
      const int64_t n = (c.n_q + 2 * c.n_kv) * c.hd, half = c.hd / 2;
      const RopeTables tables = compute_yarn_rope(yarn, c.hd);
      const StagedPair sp(cpu_, cuda_, rng_, c.spans, page);
      ASSERT_TRUE(sp.ok());
      const PagedSetup& s = sp.paged;
      const BatchView &b_c = *sp.cpu_batch, &b_g = *sp.cuda_batch;
      const int64_t T = sp.tokens;
      const std::string what = std::to_string(T) + " tokens, q " + std::to_string(c.n_q) + " kv " +
                               std::to_string(c.n_kv) + " hd " + std::to_string(c.hd) + " k " + std::to_string(c.k) +
                               (fp8 ? " fp8" : " bf16");
      Bf16Data x = random_bf16(rng_, T * c.k, 1.0f), w = random_bf16(rng_, n * c.k, 0.05f), b = random_bf16(rng_, n, 1.0f);
      Pair px = upload_activation(cpu_, cuda_, x, {T, c.k});
      TensorView w_c, w_g, sc_c, sc_g;
      if (fp8) {
        const Fp8Rows q = quantize_rows_fp8(TensorView(w.bits.data(), DType::kBF16, {n, c.k}));
        w_c = cpu_.upload(DType::kF8E4M3, {n, c.k}, q.values.data()), w_g = cuda_.upload(DType::kF8E4M3, {n, c.k}, q.values.data());
        sc_c = cpu_.upload(DType::kF32, {n}, q.scales.data()), sc_g = cuda_.upload(DType::kF32, {n}, q.scales.data());
      } else {
        w_c = cpu_.upload(DType::kBF16, {n, c.k}, w.bits.data()), w_g = cuda_.upload(DType::kBF16, {n, c.k}, w.bits.data());
      }
      TensorView bias_c = cpu_.upload(DType::kBF16, {n}, b.bits.data()), bias_g = cuda_.upload(DType::kBF16, {n}, b.bits.data());
      const Shape cache{s.num_pages, page, c.n_kv, c.hd};
      TensorView f_c = cpu_.upload(DType::kF32, {half}, tables.inv_freq.data()),
                 f_g = cuda_.upload(DType::kF32, {half}, tables.inv_freq.data());
      // CPU twin; CUDA's two ops (skinny linear forced, qkv_rope); CUDA's epilogue.
      TensorView k_c = cpu_.make(DType::kF32, cache), v_c = cpu_.make(DType::kF32, cache);
      TensorView q_c = cpu_.make(DType::kF32, {T, c.n_q * c.hd}), qkv_c = cpu_.make(DType::kF32, {T, n});
      TensorView k_2 = cuda_.make(DType::kBF16, cache), v_2 = cuda_.make(DType::kBF16, cache);
      TensorView q_2 = cuda_.make(DType::kBF16, {T, c.n_q * c.hd}), qkv_g = cuda_.make(DType::kBF16, {T, n});
      const QkvRopeParams r_c{qkv_c, q_c, {k_c, v_c, page}, f_c, tables.attention_scale, c.n_q, c.n_kv, c.hd,
                                {}, {}, 0, {}};
      const QkvRopeParams r_2{qkv_g, q_2, {k_2, v_2, page}, f_g, tables.attention_scale, c.n_q, c.n_kv, c.hd,
                                {}, {}, 0, {}};
      ASSERT_TRUE(cpu_backend().linear_qkv_rope(px.cpu, w_c, sc_c, bias_c, r_c, b_c).is_ok());
      CudaSkinnyLinearOptions two_ops;
      two_ops.max_rows = 16;
      two_ops.rope_epilogue = -1;
      ASSERT_TRUE(set_cuda_skinny_linear_options(cuda_backend(), two_ops).is_ok());
      Status st = cuda_backend().linear_qkv_rope(px.cuda, w_g, sc_g, bias_g, r_2, b_g);
      ASSERT_TRUE(st.is_ok()) << st.to_string();
      // Only the token slots of the caches are defined: each read from its page alone.
      auto slots = [&](Arena& a, const TensorView& t) {
        std::vector<float> out;
        for (size_t i = 0; i < s.seqs.size(); ++i)
          for (int64_t j = 0; j < static_cast<int64_t>(s.tokens[i].size()); ++j) {
            const int64_t pos = s.seqs[i].start_position + j, pg = s.pages[i][pos / page], slot = pos % page;
            const std::vector<float> rows = a.download_f32(t.rows(pg, pg + 1));
            out.insert(out.end(), rows.begin() + slot * c.n_kv * c.hd, rows.begin() + (slot + 1) * c.n_kv * c.hd);
          }
        return out;
      };
      const std::vector<float> q2 = cuda_.download_f32(q_2), k2 = slots(cuda_, k_2), v2 = slots(cuda_, v_2);
      const std::vector<float> qc = cpu_.download_f32(q_c), kc = slots(cpu_, k_c), vc = slots(cpu_, v_c);
      // The pair (a, b) a rotated element came from, in the two ops' bf16 qkv: q's element (token, head, d), or the
      // k slots' (slot, kv head, d) in token order as slots() reads them.
      const std::vector<float> pre = cuda_.download_f32(qkv_g);
      auto pair_at = [&](int64_t token, int64_t col0, int64_t d) {
        const int64_t i = d % half, base = token * n + col0;
        return std::pair<float, float>{pre[base + i], pre[base + i + half]};
      };
      auto q_pair = [&](size_t e) {
        const int64_t per = c.n_q * c.hd, token = static_cast<int64_t>(e) / per, col = static_cast<int64_t>(e) % per;
        return pair_at(token, col / c.hd * c.hd, col % c.hd);
      };
      auto k_pair = [&](size_t e) {
        const int64_t per = c.n_kv * c.hd, token = static_cast<int64_t>(e) / per, col = static_cast<int64_t>(e) % per;
        return pair_at(token, c.n_q * c.hd + col / c.hd * c.hd, col % c.hd);
      };
      // The epilogue with the default strips, then 16 rows (8 pairs) and 10 (5 pairs: strips across heads); each
      // then with its inputs read before the PDL wait (CudaSkinnyLinearOptions::inputs_first, the default), bit for
      // bit against the plain epilogue.
      std::vector<float> plain_q, plain_k, plain_v;
      // Then (FP8 at <= 8 tokens, k % 16 == 0) with the strips staged in shared memory before the wait
      // (CudaSkinnyLinearOptions::fp8_qkv_staged), bit for bit against the plain epilogue.
      for (const auto& [rows, first, staged] : std::initializer_list<std::tuple<int, bool, bool>>{
               {0, false, false}, {0, true, false}, {0, true, true}, {16, false, false}, {16, true, false},
               {16, true, true}, {10, false, false}, {10, true, false}, {10, true, true}}) {
        CudaSkinnyLinearOptions fused;
        fused.rope_epilogue = 1;
        fused.rope_strip_rows = rows;
        fused.inputs_first = first;
        fused.fp8_qkv_staged = staged;
        ASSERT_TRUE(set_cuda_skinny_linear_options(cuda_backend(), fused).is_ok());
        TensorView k_1 = cuda_.make(DType::kBF16, cache), v_1 = cuda_.make(DType::kBF16, cache);
        TensorView q_1 = cuda_.make(DType::kBF16, {T, c.n_q * c.hd});
        const QkvRopeParams r_1{qkv_g, q_1, {k_1, v_1, page}, f_g, tables.attention_scale, c.n_q, c.n_kv, c.hd,
                                {}, {}, 0, {}};
        st = cuda_backend().linear_qkv_rope(px.cuda, w_g, sc_g, bias_g, r_1, b_g);
        ASSERT_TRUE(set_cuda_skinny_linear_options(cuda_backend(), {}).is_ok());
        ASSERT_TRUE(st.is_ok()) << st.to_string();
        const std::string shape = what + (rows ? ", " + std::to_string(rows) + "-row strips" : ", default strips");
        const std::vector<float> q1 = cuda_.download_f32(q_1), k1 = slots(cuda_, k_1), v1 = slots(cuda_, v_1);
        if (first) {
          const std::string named = shape + (staged ? ", inputs first, staged" : ", inputs first");
          check("linear_qkv_rope q vs the plain epilogue", named, q1, plain_q, 0.0);
          check("linear_qkv_rope k cache vs the plain epilogue", named, k1, plain_k, 0.0);
          check("linear_qkv_rope v cache vs the plain epilogue", named, v1, plain_v, 0.0);
          continue;
        }
        plain_q = q1, plain_k = k1, plain_v = v1;
        check_rotated("linear_qkv_rope q vs two ops", shape, q1, q2, tables.attention_scale, q_pair);
        check_rotated("linear_qkv_rope k cache vs two ops", shape, k1, k2, tables.attention_scale, k_pair);
        check("linear_qkv_rope v cache vs two ops", shape, v1, v2, 0.0);
        check("linear_qkv_rope q vs twin", shape, q1, qc, 5e-3);
        check("linear_qkv_rope k cache vs twin", shape, k1, kc, 5e-3);
        check("linear_qkv_rope v cache vs twin", shape, v1, vc, 5e-3);
      }
    }
  }
}

TEST_F(KernelTest, RouterTopK) {
  const int64_t k = 4;
  // hidden 2880: two load groups per lane, the second partial; hidden 64: most lanes idle. 32 experts: a cluster of
  // 4 expert blocks per token; 8: a cluster of one; 128 (120b's) and 200: 16 and 25 blocks, the ticket.
  for (const auto& [t, h, e] : {std::tuple<int64_t, int64_t, int64_t>{1, 2880, 32}, {5, 2880, 32}, {32, 2880, 32},
                                {77, 2880, 32}, {1, 64, 32}, {3, 64, 32}, {1, 2880, 128}, {6, 2880, 128}, {2, 2880, 8},
                                {3, 2880, 200}}) {
    Bf16Data x = random_bf16(rng_, t * h, 1.0f), w = random_bf16(rng_, e * h, 0.05f), b = random_bf16(rng_, e, 0.5f);
    Pair px = upload_activation(cpu_, cuda_, x, {t, h});
    TensorView w_c = cpu_.upload(DType::kBF16, {e, h}, w.bits.data()), w_g = cuda_.upload(DType::kBF16, {e, h}, w.bits.data());
    TensorView b_c = cpu_.upload(DType::kBF16, {e}, b.bits.data()), b_g = cuda_.upload(DType::kBF16, {e}, b.bits.data());
    RouterParams r_c{px.cpu, w_c, b_c, cpu_.make(DType::kF32, {t, e}), cpu_.make(DType::kI32, {t, k}),
                     cpu_.make(DType::kF32, {t, k}), k, TensorView(), 0.0f, TensorView()};
    RouterParams r_g{px.cuda, w_g, b_g, cuda_.make(DType::kF32, {t, e}), cuda_.make(DType::kI32, {t, k}),
                     cuda_.make(DType::kF32, {t, k}), k, TensorView(), 0.0f, TensorView()};
    ASSERT_TRUE(cpu_backend().router_topk(r_c).is_ok());
    ASSERT_TRUE(cuda_backend().router_topk(r_g).is_ok());
    const std::string what = std::to_string(t) + " tokens, hidden " + std::to_string(h) + ", " + std::to_string(e) +
                             " experts, top-4" +
                             (t > 32 ? " (cuBLASLt logits)" : " (fused)");
    check("router logits", what, cuda_.download_f32(r_g.logits), cpu_.download_f32(r_c.logits), 1e-4);
    check("router weights", what, cuda_.download_f32(r_g.topk_weights), cpu_.download_f32(r_c.topk_weights), 1e-4);
    const auto ids_c = cpu_.download_bytes(r_c.topk_ids), ids_g = cuda_.download_bytes(r_g.topk_ids);
    const bool same = ids_c == ids_g;
    record("router ids", what + (same ? " identical" : " DIFFER"), same ? 0 : 1, 0, 0, same);
    EXPECT_TRUE(same);
  }
}

// The post-attention norm and gpt-oss's router in one op: bit for bit the two ops on CUDA (add_rms_norm, then
// router_topk of its out, with their weight and bias read after the PDL wait: the form before), and the CPU twin. 32
// experts: a cluster of 4 expert blocks per token (fused); 24: 3 blocks; 8: one; 128 experts (120b's 16 blocks): fused
// in the ticketed form; 33 tokens (past the fused router): the two ops. Hidden 328: most lanes idle and one norm chunk
// per thread; 8192: the norm's largest row (4 chunks per thread).
TEST_F(KernelTest, AddRmsNormRoute) {
  const int64_t k = 4;
  for (const auto& [t, h, e, f32_residual] :
       {std::tuple<int64_t, int64_t, int64_t, bool>{1, 2880, 32, true}, {5, 2880, 32, true}, {32, 2880, 32, false},
        {3, 328, 24, true}, {2, 2880, 8, false}, {33, 2880, 32, true}, {1, 2880, 128, true}, {4, 8192, 32, true},
        {1, 2880, 32, false}}) {
    Bf16Data x = random_bf16(rng_, t * h, 2.0f), d = random_bf16(rng_, t * h, 1.0f), nw = random_bf16(rng_, h, 1.0f);
    Bf16Data w = random_bf16(rng_, e * h, 0.05f), b = random_bf16(rng_, e, 0.5f);
    if (f32_residual) {
      std::normal_distribution<float> dist(0.0f, 2.0f);
      for (auto& v : x.values) v = dist(rng_);  // not bf16-representable: the f32 path must keep the bits
    }
    const DType res_dtype = f32_residual ? DType::kF32 : DType::kBF16;
    const void* res_host = f32_residual ? static_cast<const void*>(x.values.data()) : x.bits.data();
    // Three residuals with the same start: the CPU twin's, the fused op's and the two CUDA ops'.
    TensorView res_c = f32_residual ? cpu_.upload(DType::kF32, {t, h}, x.values.data())
                                    : upload_activation(cpu_, cuda_, x, {t, h}).cpu;
    TensorView res_f = cuda_.upload(res_dtype, {t, h}, res_host), res_p = cuda_.upload(res_dtype, {t, h}, res_host);
    Pair pd = upload_activation(cpu_, cuda_, d, {t, h});
    TensorView nw_c = cpu_.upload(DType::kBF16, {h}, nw.bits.data()), nw_g = cuda_.upload(DType::kBF16, {h}, nw.bits.data());
    TensorView w_c = cpu_.upload(DType::kBF16, {e, h}, w.bits.data()), w_g = cuda_.upload(DType::kBF16, {e, h}, w.bits.data());
    TensorView b_c = cpu_.upload(DType::kBF16, {e}, b.bits.data()), b_g = cuda_.upload(DType::kBF16, {e}, b.bits.data());
    TensorView out_c = cpu_.make(DType::kF32, {t, h}), out_f = cuda_.make(DType::kBF16, {t, h}),
               out_p = cuda_.make(DType::kBF16, {t, h});
    auto route = [&](Arena& a, const TensorView& out, const TensorView& wt, const TensorView& bias) {
      return RouterParams{out, wt, bias, a.make(DType::kF32, {t, e}), a.make(DType::kI32, {t, k}),
                          a.make(DType::kF32, {t, k}), k, TensorView(), 0.0f, TensorView()};
    };
    const RouterParams r_c = route(cpu_, out_c, w_c, b_c), r_f = route(cuda_, out_f, w_g, b_g),
                       r_p = route(cuda_, out_p, w_g, b_g);
    ASSERT_TRUE(cpu_backend().add_rms_norm_route(res_c, pd.cpu, nw_c, 1e-5f, out_c, r_c).is_ok());
    ASSERT_TRUE(cuda_backend().add_rms_norm_route(res_f, pd.cuda, nw_g, 1e-5f, out_f, r_f).is_ok());
    // The two ops with the norm's weight and the router's bias read after their PDL waits (the form before; the
    // fused op reads them before, the default): the same bits.
    CudaMoeOptions after_wait;
    after_wait.norm_inputs_before_wait = false;
    ASSERT_TRUE(set_cuda_moe_options(cuda_backend(), after_wait).is_ok());
    ASSERT_TRUE(cuda_backend().add_rms_norm(res_p, pd.cuda, nw_g, 1e-5f, out_p).is_ok());
    ASSERT_TRUE(cuda_backend().router_topk(r_p).is_ok());
    ASSERT_TRUE(set_cuda_moe_options(cuda_backend(), {}).is_ok());
    const std::string what = std::to_string(t) + " tokens, hidden " + std::to_string(h) + ", " + std::to_string(e) +
                             " experts" + (f32_residual ? ", f32 residual" : ", bf16 residual");
    const std::pair<const char*, std::pair<TensorView, TensorView>> same[] = {
        {"residual", {res_f, res_p}}, {"normed", {out_f, out_p}}, {"logits", {r_f.logits, r_p.logits}},
        {"ids", {r_f.topk_ids, r_p.topk_ids}}, {"weights", {r_f.topk_weights, r_p.topk_weights}}};
    for (const auto& [name, views] : same) {
      const bool equal = cuda_.download_bytes(views.first) == cuda_.download_bytes(views.second);
      record(std::string("add_rms_norm_route ") + name, what + (equal ? ": the two ops' bits" : ": DIFFER from the two ops"),
             equal ? 0 : 1, 0, 0, equal);
      EXPECT_TRUE(equal) << name << " " << what;
    }
    check("add_rms_norm_route residual", what, cuda_.download_f32(res_f), cpu_.download_f32(res_c),
          f32_residual ? 1e-6 : 5e-3);
    check("add_rms_norm_route normed", what, cuda_.download_f32(out_f), cpu_.download_f32(out_c), 5e-3);
    check("add_rms_norm_route logits", what, cuda_.download_f32(r_f.logits), cpu_.download_f32(r_c.logits), 1e-2);
  }
}

// Random MXFP4 experts in the checkpoint layout: the host copy (the CPU twin's) and CUDA's.
struct SharedExperts {
  std::vector<uint8_t> w1b, w1s, w2b, w2s;
  Bf16Data b1, b2;
  ExpertWeights host;
  std::vector<Buffer> owner;
  ExpertWeights cuda;
};

// n random bytes in [lo, hi], eight from each draw of a 64-bit generator (a byte per mt19937 draw took ~3 s for
// gpt-oss-20b's experts).
std::vector<uint8_t> random_bytes(std::mt19937_64& rng, int64_t n, int lo, int hi) {
  std::vector<uint8_t> v(static_cast<size_t>(n));
  const uint32_t span = static_cast<uint32_t>(hi - lo + 1);
  uint64_t r = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i % 8 == 0) r = rng();
    v[i] = static_cast<uint8_t>(lo + static_cast<int>(((r >> (8 * (i % 8))) & 0xff) % span));
  }
  return v;
}

// The experts of one shape, made and uploaded once per process and shared by every case of that shape; routings and
// activations stay fresh per case. gpt-oss-20b's shape took ~3.5 s a case to make and upload, and about twenty
// cases use it. Seeded by the test seed and the shape, so MX_GPU_TEST_SEED replays them. Never freed (the CUDA
// backend is a function-local static too; the process ends with them).
const SharedExperts& shared_experts(int64_t E, int64_t H, int64_t I) {
  static auto* cache = new std::map<std::tuple<int64_t, int64_t, int64_t>, std::unique_ptr<SharedExperts>>;
  std::unique_ptr<SharedExperts>& slot = (*cache)[std::make_tuple(E, H, I)];
  if (slot) return *slot;
  auto x = std::make_unique<SharedExperts>();
  std::mt19937_64 rng(test_seed() ^ static_cast<uint64_t>((E * 1000003 + H) * 1000003 + I));
  x->w1b = random_bytes(rng, E * 2 * I * H / 2, 0, 255);
  x->w1s = random_bytes(rng, E * 2 * I * H / 32, 118, 128);
  x->w2b = random_bytes(rng, E * H * I / 2, 0, 255);
  x->w2s = random_bytes(rng, E * H * I / 32, 118, 128);
  std::mt19937 bias_rng(static_cast<uint32_t>(rng()));
  x->b1 = random_bf16(bias_rng, E * 2 * I, 0.5f);
  x->b2 = random_bf16(bias_rng, E * H, 0.5f);
  ExpertWeights& w = x->host;
  w.w1_blocks = TensorView(x->w1b.data(), DType::kU8, {E, 2 * I, H / 32, 16});
  w.w1_scales = TensorView(x->w1s.data(), DType::kU8, {E, 2 * I, H / 32});
  w.w1_bias = TensorView(x->b1.bits.data(), DType::kBF16, {E, 2 * I});
  w.w2_blocks = TensorView(x->w2b.data(), DType::kU8, {E, H, I / 32, 16});
  w.w2_scales = TensorView(x->w2s.data(), DType::kU8, {E, H, I / 32});
  w.w2_bias = TensorView(x->b2.bits.data(), DType::kBF16, {E, H});
  w.num_experts = E;
  w.hidden = H;
  w.intermediate = I;
  auto up = cuda_backend().upload_experts(w, &x->owner);
  MX_CHECK(up.is_ok()) << up.status().to_string();
  x->cuda = *up;
  slot = std::move(x);
  return *slot;
}

enum class Routing {
  kUniform,  // k distinct experts per token, uniformly at random
  kSame,     // every token to experts 0..k-1: many full tiles, the other experts get no tokens
  kHalf,     // only the first half of the experts, at random: half of them get no tokens
  kHot,      // expert 0 in every token's top-k, the rest at random: one expert with T tokens
};
const char* routing_name(Routing r) {
  switch (r) {
    case Routing::kUniform: return "uniform";
    case Routing::kSame: return "same experts";
    case Routing::kHalf: return "half the experts";
    case Routing::kHot: return "one hot expert";
  }
  return "?";
}

struct MoeCase {
  int64_t E, H, I, k, T;
  Routing routing;
};

// Routed ids and normalized weights of one case.
void make_routing(std::mt19937& rng, const MoeCase& c, std::vector<int32_t>* ids, std::vector<float>* weights) {
  ids->assign(static_cast<size_t>(c.T * c.k), 0);
  weights->assign(ids->size(), 0.f);
  std::vector<int32_t> order(static_cast<size_t>(c.E));
  std::iota(order.begin(), order.end(), 0);
  const int64_t pool = c.routing == Routing::kHalf ? c.E / 2 : c.E;
  for (int64_t t = 0; t < c.T; ++t) {
    if (c.routing != Routing::kSame) std::shuffle(order.begin(), order.begin() + pool, rng);
    if (c.routing == Routing::kHot) std::swap(order[0], *std::find(order.begin(), order.end(), 0));
    float sum = 0;
    for (int64_t j = 0; j < c.k; ++j) {
      (*ids)[t * c.k + j] = order[j];
      (*weights)[t * c.k + j] = 0.1f + static_cast<float>(rng() % 1000) / 1000.0f;
      sum += (*weights)[t * c.k + j];
    }
    for (int64_t j = 0; j < c.k; ++j) (*weights)[t * c.k + j] /= sum;
  }
}

const char* path_name(CudaMoePath p) {
  switch (p) {
    case CudaMoePath::kDecode: return "decode";
    case CudaMoePath::kDecodeV1: return "decode v1";
    case CudaMoePath::kGrouped: return "grouped";
    case CudaMoePath::kGroupedMmaSync: return "grouped mma.sync";
    case CudaMoePath::kAuto: return "auto";
  }
  return "?";
}

// A case's experts (its shape's shared ones, host and CUDA), and fresh routing and activations on both backends.
struct MoeInputs {
  const SharedExperts* experts = nullptr;
  Pair x;
  TensorView id_c, id_g, w_c, w_g;
};
void make_moe_inputs(Arena& cpu, Arena& cuda, std::mt19937& rng, const MoeCase& c, MoeInputs* in) {
  in->experts = &shared_experts(c.E, c.H, c.I);
  std::vector<int32_t> ids;
  std::vector<float> weights;
  make_routing(rng, c, &ids, &weights);
  Bf16Data x = random_bf16(rng, c.T * c.H, 1.0f);
  in->x = upload_activation(cpu, cuda, x, {c.T, c.H});
  in->id_c = cpu.upload(DType::kI32, {c.T, c.k}, ids.data());
  in->id_g = cuda.upload(DType::kI32, {c.T, c.k}, ids.data());
  in->w_c = cpu.upload(DType::kF32, {c.T, c.k}, weights.data());
  in->w_g = cuda.upload(DType::kF32, {c.T, c.k}, weights.data());
}

// The CPU twin's output for `in` (fp32), the reference every CUDA form of a MoE case is checked against.
void moe_cpu_twin(Arena& cpu, const MoeCase& c, const MoeInputs& in, std::vector<float>* want) {
  TensorView o_c = cpu.make(DType::kF32, {c.T, c.H});
  ASSERT_TRUE(cpu_backend().moe_experts(MoeParams{in.x.cpu, in.id_c, in.w_c, &in.experts->host, o_c, c.k, 7.0f, 1.702f}).is_ok());
  *want = cpu.download_f32(o_c);
}

// One routing of random experts through the CPU twin and through each CUDA path in `paths` (the decode path
// once per k tiles per warp in `decode_k_tiles`, the grouped path once per tile size in `grouped_tiles`, 0 =
// its own choice; `warp_specialized` as CudaMoeOptions::wgmma_warp_specialized). One CPU run for all of them.
void check_moe_case(Arena& cpu, Arena& cuda, std::mt19937& rng, const MoeCase& c,
                    std::initializer_list<CudaMoePath> paths, std::initializer_list<int> decode_k_tiles = {0},
                    bool decode_pdl = true,
                    std::initializer_list<int> grouped_tiles = {0}, int warp_specialized = 0) {
  MoeInputs in;
  make_moe_inputs(cpu, cuda, rng, c, &in);
  const Pair& px = in.x;
  const ExpertWeights* up = &in.experts->cuda;
  const TensorView &id_g = in.id_g, &w_g = in.w_g;
  std::vector<float> want;
  ASSERT_NO_FATAL_FAILURE(moe_cpu_twin(cpu, c, in, &want));
  for (CudaMoePath path : paths)
  for (int k_tiles : decode_k_tiles)
  for (int tile : grouped_tiles)
  // 256-token tiles (wgmma) run on a persistent grid or a CTA per item (the warp-specialized kernel is always
  // persistent), 96-token tiles on the deep ring with both GEMMs programmatic dependents or not.
  for (int persistent : tile == 256 && warp_specialized != 1 ? std::vector<int>{1, -1} : std::vector<int>{0})
  for (int pdl : tile == 96 && warp_specialized != 1 ? std::vector<int>{1, -1} : std::vector<int>{0})
  // 16-token tiles by cp.async and on the copy engine (three forms: a CTA barrier, warps' releases, tiles paired);
  // 32-token tiles by cp.async and on the copy engine.
  for (int bulk : tile == 16 && warp_specialized != 1   ? std::vector<int>{-1, 1, 2, 3}
                  : tile == 32 && warp_specialized != 1 ? std::vector<int>{0, 1}
                                                        : std::vector<int>{0}) {
    TensorView o_g = cuda.make(DType::kBF16, {c.T, c.H});  // poisoned
    MoeParams m_g{px.cuda, id_g, w_g, up, o_g, c.k, 7.0f, 1.702f};
    CudaMoeOptions options{path, tile, k_tiles, decode_pdl};
    options.wgmma_persistent = persistent;
    options.wgmma_warp_specialized = warp_specialized;
    options.wgmma_pdl = pdl;
    options.wgmma_bulk = bulk;
    ASSERT_TRUE(set_cuda_moe_options(cuda_backend(), options).is_ok());
    const Status st = cuda_backend().moe_experts(m_g);
    ASSERT_TRUE(set_cuda_moe_options(cuda_backend(), {}).is_ok());
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    std::string variant;
    if (k_tiles != 0 || !decode_pdl)
      variant = " (" + std::to_string(k_tiles) + " k tiles/warp" + (decode_pdl ? "" : ", no PDL") + ")";
    if (tile != 0) variant += " (" + std::to_string(tile) + "-token tiles)";
    if (persistent != 0) variant += persistent > 0 ? " (persistent)" : " (CTA per item)";
    if (pdl != 0) variant += pdl > 0 ? " (deep ring, PDL)" : " (deep ring, no PDL)";
    if (warp_specialized > 0) variant += " (warp-specialized if wgmma)";
    if (bulk > 0)
      variant += bulk == 2 ? " (copy engine, warps' releases)" : bulk == 3 ? " (copy engine, tiles paired)" : " (copy engine)";
    check("moe_experts", shape_str({c.E, c.H, c.I}) + " top" + std::to_string(c.k) + " T=" + std::to_string(c.T) + " " +
                             routing_name(c.routing) + ", " + path_name(path) + variant,
          cuda.download_f32(o_g), want, 1e-2);
  }
}

TEST_F(KernelTest, MoeExperts) {
  // Small and odd shapes through both expert-GEMM paths: one token, tokens not a multiple of any tile,
  // weight rows not a multiple of the grouped kernel's 128 (H 320, 2I 384), experts without tokens.
  for (const MoeCase& c : {MoeCase{8, 256, 192, 4, 1, Routing::kUniform}, MoeCase{8, 256, 192, 4, 3, Routing::kUniform},
                           MoeCase{8, 320, 192, 2, 17, Routing::kUniform}, MoeCase{8, 256, 256, 4, 64, Routing::kSame},
                           MoeCase{6, 320, 192, 2, 301, Routing::kUniform}, MoeCase{8, 320, 192, 4, 200, Routing::kSame},
                           MoeCase{16, 256, 320, 4, 777, Routing::kHalf}, MoeCase{16, 320, 192, 4, 1000, Routing::kHot}})
    check_moe_case(cpu_, cuda_, rng_, c,
                   {CudaMoePath::kDecode, CudaMoePath::kGrouped, CudaMoePath::kGroupedMmaSync, CudaMoePath::kDecodeV1});
  // Decode shape of the real model.
  check_moe_case(cpu_, cuda_, rng_, MoeCase{32, 2880, 2880, 4, 8, Routing::kUniform}, {CudaMoePath::kAuto});
}

// Expert parallel (a tensor-parallel rank's share of the experts): ids route among all E experts, the
// backend holds [first, first + E/2); slots routed to the other half add nothing. CUDA (local routing, then
// every path) against the CPU twin on the same share, at decode and prefill sizes.
TEST_F(KernelTest, MoeExpertsOfAShare) {
  for (const MoeCase& c : {MoeCase{8, 256, 192, 4, 1, Routing::kUniform}, MoeCase{8, 320, 192, 4, 37, Routing::kUniform},
                           MoeCase{16, 256, 320, 4, 700, Routing::kHot}}) {
    const int64_t first = c.E / 2, count = c.E / 2;
    ExpertWeights share = shared_experts(c.E, c.H, c.I).host;
    for (TensorView* t : {&share.w1_blocks, &share.w1_scales, &share.w1_bias, &share.w2_blocks, &share.w2_scales, &share.w2_bias})
      *t = t->rows(first, first + count);
    share.num_experts = count;
    std::vector<Buffer> owner;
    auto up = cuda_backend().upload_experts(share, &owner);
    ASSERT_TRUE(up.is_ok()) << up.status().to_string();
    std::vector<int32_t> ids;
    std::vector<float> weights;
    make_routing(rng_, c, &ids, &weights);
    Bf16Data x = random_bf16(rng_, c.T * c.H, 1.0f);
    Pair px = upload_activation(cpu_, cuda_, x, {c.T, c.H});
    TensorView id_c = cpu_.upload(DType::kI32, {c.T, c.k}, ids.data()), id_g = cuda_.upload(DType::kI32, {c.T, c.k}, ids.data());
    TensorView w_c = cpu_.upload(DType::kF32, {c.T, c.k}, weights.data()),
               w_g = cuda_.upload(DType::kF32, {c.T, c.k}, weights.data());
    TensorView o_c = cpu_.make(DType::kF32, {c.T, c.H}), o_g = cuda_.make(DType::kBF16, {c.T, c.H});
    MoeParams m_c{px.cpu, id_c, w_c, &share, o_c, c.k, 7.0f, 1.702f, c.E, first};
    MoeParams m_g{px.cuda, id_g, w_g, &*up, o_g, c.k, 7.0f, 1.702f, c.E, first};
    ASSERT_TRUE(cpu_backend().moe_experts(m_c).is_ok());
    const Status st = cuda_backend().moe_experts(m_g);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    check("moe_experts", "expert parallel: experts " + std::to_string(first) + ".." + std::to_string(first + count - 1) +
                             " of " + std::to_string(c.E) + ", " + std::to_string(c.T) + " tokens, " + routing_name(c.routing),
          cuda_.download_f32(o_g), cpu_.download_f32(o_c), 1e-2);
  }
}

// The decode GEMMs (moe_decode.cu) around their switches: each CTA routing itself up to 32 routed tokens
// (one token, 8 tokens = 32 slots, 9 tokens = the routing kernel's metadata), experts with more than one
// 8-token tile (16 tokens to one hot expert, 20 tokens to one expert at top-1), 128 experts, k splits of
// 2 to 8 warps (rings wrapping several times at I = 4160: 65 k tiles; warps whose k range is not a whole
// number of ring rounds), and the second GEMM launched without PDL. kAuto's split at two tokens and more
// (about 23 k tiles per warp) is the 23 here.
TEST_F(KernelTest, MoeExpertsDecode) {
  for (const MoeCase& c : {MoeCase{32, 2880, 2880, 4, 1, Routing::kUniform}, MoeCase{32, 2880, 2880, 4, 8, Routing::kHot},
                           MoeCase{32, 2880, 2880, 4, 9, Routing::kUniform}, MoeCase{8, 256, 4160, 2, 3, Routing::kUniform},
                           MoeCase{8, 320, 192, 4, 8, Routing::kSame}, MoeCase{128, 256, 192, 4, 5, Routing::kUniform},
                           MoeCase{8, 256, 4160, 2, 16, Routing::kHot}, MoeCase{8, 256, 192, 1, 20, Routing::kSame}})
    check_moe_case(cpu_, cuda_, rng_, c, {CudaMoePath::kDecode}, {12, 23, 6});
  check_moe_case(cpu_, cuda_, rng_, MoeCase{32, 2880, 2880, 4, 3, Routing::kUniform}, {CudaMoePath::kDecode}, {0}, false);
}

// The decode GEMMs' scale bytes staged in shared memory (the default) against the form before (in the ring's
// registers): bitwise the same at each k split of either GEMM (12: 4 warps at k = 2880, 16: 3, 8: 6, 23: 2, 6: 8;
// 0: kAuto's, which differs between the forms at <= 8 routed slots: there only against the CPU twin), on odd shapes (k of 3, 5 and 65 tiles: rings that wrap or do not fill; scale areas of 1-33 blocks
// a warp) and 20b's layer at 1, 2 (kAuto staged: 3 warps in both GEMMs), 4 and 16 tokens; both against the CPU twin.
TEST_F(KernelTest, MoeExpertsDecodeStagedScales) {
  const std::pair<int, int> splits[] = {{0, 0}, {12, 12}, {16, 8}, {23, 23}, {6, 6}};
  for (const MoeCase& c : {MoeCase{8, 320, 192, 4, 1, Routing::kUniform}, MoeCase{8, 256, 4160, 2, 2, Routing::kUniform},
                           MoeCase{8, 256, 192, 1, 3, Routing::kSame}, MoeCase{128, 256, 192, 4, 1, Routing::kUniform},
                           MoeCase{32, 2880, 2880, 4, 1, Routing::kUniform}, MoeCase{32, 2880, 2880, 4, 2, Routing::kUniform},
                           MoeCase{32, 2880, 2880, 4, 4, Routing::kUniform}, MoeCase{32, 2880, 2880, 4, 16, Routing::kUniform}}) {
    MoeInputs in;
    make_moe_inputs(cpu_, cuda_, rng_, c, &in);
    std::vector<float> want;
    ASSERT_NO_FATAL_FAILURE(moe_cpu_twin(cpu_, c, in, &want));
    for (const auto& [kt1, kt2] : splits) {
      std::vector<uint8_t> registers;
      for (const bool in_registers : {true, false}) {
        TensorView o = cuda_.make(DType::kBF16, {c.T, c.H});  // poisoned
        CudaMoeOptions options{CudaMoePath::kAuto, 0, kt1};
        options.decode_k_tiles_gemm2 = kt2;
        options.decode_scales_in_registers = in_registers;
        ASSERT_TRUE(set_cuda_moe_options(cuda_backend(), options).is_ok());
        const Status st = cuda_backend().moe_experts(MoeParams{in.x.cuda, in.id_g, in.w_g, &in.experts->cuda, o, c.k, 7.0f, 1.702f});
        ASSERT_TRUE(set_cuda_moe_options(cuda_backend(), {}).is_ok());
        ASSERT_TRUE(st.is_ok()) << st.to_string();
        const std::string name = shape_str({c.E, c.H, c.I}) + " top" + std::to_string(c.k) + " T=" + std::to_string(c.T) +
                                 " " + routing_name(c.routing) + ", auto, k tiles/warp " + std::to_string(kt1) + " and " +
                                 std::to_string(kt2) + (in_registers ? ", scales in registers" : ", scales staged");
        check("moe_experts", name, cuda_.download_f32(o), want, 1e-2);
        if (in_registers) {
          registers = cuda_.download_bytes(o);
          continue;
        }
        const int64_t slots = c.T * c.k;
        const auto split = [&](bool first, bool in_registers) {
          return cuda::moe_fused_auto_k_tiles_per_warp(slots, first, in_registers);
        };
        if (kt1 == 0 && (split(true, false) != split(true, true) || split(false, false) != split(false, true)))
          continue;  // kAuto's splits differ by form there (one token: 3 and 6 warps against 4 and 4; two: 3 and 3 against 2)
        const bool same = cuda_.download_bytes(o) == registers;
        record("moe_experts", name + " vs in registers, bitwise", same ? 0 : 1, 0, 0, same);
        EXPECT_TRUE(same) << name;
      }
    }
  }
}

// The first decode GEMM's tile from a mask of the busy experts (CudaMoeOptions::decode_mask_route, <= 8 routed slots,
// <= 128 experts) against route_tile's pass over the slots: bitwise the same through moe_experts and
// moe_experts_add_rms_norm, and against the CPU twin. 20b at one and two tokens, 128 experts (120b's count) at two,
// tokens on the same experts (tiles of 2 rows), top-1 at 8 tokens (repeated experts: tiles of several rows, idle
// experts between busy ones), top-2 at 3 tokens with a hot expert.
TEST_F(KernelTest, MoeExpertsDecodeMaskRoute) {
  for (const MoeCase& c : {MoeCase{32, 2880, 2880, 4, 1, Routing::kUniform}, MoeCase{32, 2880, 2880, 4, 2, Routing::kUniform},
                           MoeCase{128, 256, 192, 4, 2, Routing::kUniform}, MoeCase{8, 320, 192, 4, 2, Routing::kSame},
                           MoeCase{8, 256, 4160, 1, 8, Routing::kUniform}, MoeCase{16, 320, 256, 2, 3, Routing::kHot}}) {
    MoeInputs in;
    make_moe_inputs(cpu_, cuda_, rng_, c, &in);
    std::vector<float> want;
    ASSERT_NO_FATAL_FAILURE(moe_cpu_twin(cpu_, c, in, &want));
    const std::string name = shape_str({c.E, c.H, c.I}) + " top" + std::to_string(c.k) + " T=" + std::to_string(c.T) +
                             " " + routing_name(c.routing);
    Bf16Data res = random_bf16(rng_, c.T * c.H, 2.0f), nw = random_bf16(rng_, c.H, 1.0f);
    const TensorView nw_g = cuda_.upload(DType::kBF16, {c.H}, nw.bits.data());
    std::vector<uint8_t> slots_out, slots_normed;
    for (const bool mask : {false, true}) {
      CudaMoeOptions options{CudaMoePath::kAuto};
      options.decode_mask_route = mask;
      ASSERT_TRUE(set_cuda_moe_options(cuda_backend(), options).is_ok());
      const std::string form = name + (mask ? ", mask route" : ", slots route");
      TensorView o = cuda_.make(DType::kBF16, {c.T, c.H});  // poisoned
      Status st = cuda_backend().moe_experts(MoeParams{in.x.cuda, in.id_g, in.w_g, &in.experts->cuda, o, c.k, 7.0f, 1.702f});
      ASSERT_TRUE(st.is_ok()) << st.to_string();
      check("moe_experts", form, cuda_.download_f32(o), want, 1e-2);
      TensorView res_g = cuda_.upload(DType::kBF16, {c.T, c.H}, res.bits.data()), normed = cuda_.make(DType::kBF16, {c.T, c.H});
      TensorView o2 = cuda_.make(DType::kBF16, {c.T, c.H});
      st = cuda_backend().moe_experts_add_rms_norm(MoeParams{in.x.cuda, in.id_g, in.w_g, &in.experts->cuda, o2, c.k, 7.0f, 1.702f},
                                                   res_g, nw_g, 1e-5f, normed);
      ASSERT_TRUE(st.is_ok()) << st.to_string();
      if (!mask) {
        slots_out = cuda_.download_bytes(o);
        slots_normed = cuda_.download_bytes(normed);
        continue;
      }
      const bool same = cuda_.download_bytes(o) == slots_out, same_normed = cuda_.download_bytes(normed) == slots_normed;
      record("moe_experts", form + " vs slots route, bitwise", same ? 0 : 1, 0, 0, same);
      record("moe_experts_add_rms_norm", form + " vs slots route, bitwise", same_normed ? 0 : 1, 0, 0, same_normed);
      EXPECT_TRUE(same) << form;
      EXPECT_TRUE(same_normed) << form;
    }
  }
  ASSERT_TRUE(set_cuda_moe_options(cuda_backend(), {}).is_ok());
}

// kAuto's staged decode GEMMs with the fp4 decode's two rotations as left shifts (up to kMoeFusedShiftSlots routed
// slots; CudaMoeOptions::decode_shift_slots) against the rotations (-1), and the first GEMM's ring of 5 weight tiles
// with one activation tile ahead at <= 4 routed slots (decode_ring_gemm1 5): bitwise the same through moe_experts and
// moe_experts_add_rms_norm, and against the CPU twin. 20b at 1, 2, 4 and 16 tokens (shifts to 16 slots, not past),
// 128 experts, k of 3 and 65 tiles (rings that do not fill or wrap), 4 slots at k of 4 and 5 tiles (a ring of 5 that
// does not fill, or fills once), top-1 at 20 tokens (the routing kernel's metadata).
TEST_F(KernelTest, MoeExpertsDecodeShifts) {
  for (const MoeCase& c : {MoeCase{32, 2880, 2880, 4, 1, Routing::kUniform}, MoeCase{32, 2880, 2880, 4, 2, Routing::kUniform},
                           MoeCase{32, 2880, 2880, 4, 4, Routing::kHot}, MoeCase{32, 2880, 2880, 4, 16, Routing::kUniform},
                           MoeCase{128, 256, 192, 4, 2, Routing::kUniform}, MoeCase{8, 256, 4160, 2, 3, Routing::kUniform},
                           MoeCase{8, 256, 192, 1, 20, Routing::kSame}, MoeCase{8, 320, 192, 4, 1, Routing::kUniform},
                           MoeCase{8, 256, 4160, 2, 2, Routing::kUniform}}) {
    MoeInputs in;
    make_moe_inputs(cpu_, cuda_, rng_, c, &in);
    std::vector<float> want;
    ASSERT_NO_FATAL_FAILURE(moe_cpu_twin(cpu_, c, in, &want));
    const std::string name = shape_str({c.E, c.H, c.I}) + " top" + std::to_string(c.k) + " T=" + std::to_string(c.T) +
                             " " + routing_name(c.routing);
    Bf16Data res = random_bf16(rng_, c.T * c.H, 2.0f), nw = random_bf16(rng_, c.H, 1.0f);
    const TensorView nw_g = cuda_.upload(DType::kBF16, {c.H}, nw.bits.data());
    std::vector<uint8_t> base_out, base_normed;
    for (const auto& [shift_slots, ring] : {std::pair{-1, 4}, {0, 0}, {64, 0}, {0, 5}}) {
      CudaMoeOptions options{CudaMoePath::kAuto};
      options.decode_shift_slots = shift_slots;
      options.decode_ring_gemm1 = ring;
      ASSERT_TRUE(set_cuda_moe_options(cuda_backend(), options).is_ok());
      const std::string form = name + (shift_slots < 0    ? ", rotations"
                                       : shift_slots == 0 ? ", shifts to 16 slots"
                                                          : ", shifts to 64 slots") +
                               (ring == 5 ? ", first GEMM ring 5" : "");
      TensorView o = cuda_.make(DType::kBF16, {c.T, c.H});  // poisoned
      Status st = cuda_backend().moe_experts(MoeParams{in.x.cuda, in.id_g, in.w_g, &in.experts->cuda, o, c.k, 7.0f, 1.702f});
      ASSERT_TRUE(st.is_ok()) << st.to_string();
      check("moe_experts", form, cuda_.download_f32(o), want, 1e-2);
      TensorView res_g = cuda_.upload(DType::kBF16, {c.T, c.H}, res.bits.data()), normed = cuda_.make(DType::kBF16, {c.T, c.H});
      TensorView o2 = cuda_.make(DType::kBF16, {c.T, c.H});
      st = cuda_backend().moe_experts_add_rms_norm(MoeParams{in.x.cuda, in.id_g, in.w_g, &in.experts->cuda, o2, c.k, 7.0f, 1.702f},
                                                   res_g, nw_g, 1e-5f, normed);
      ASSERT_TRUE(st.is_ok()) << st.to_string();
      if (shift_slots < 0) {
        base_out = cuda_.download_bytes(o);
        base_normed = cuda_.download_bytes(normed);
        continue;
      }
      const bool same = cuda_.download_bytes(o) == base_out, same_normed = cuda_.download_bytes(normed) == base_normed;
      record("moe_experts", form + " vs rotations, bitwise", same ? 0 : 1, 0, 0, same);
      record("moe_experts_add_rms_norm", form + " vs rotations, bitwise", same_normed ? 0 : 1, 0, 0, same_normed);
      EXPECT_TRUE(same) << form;
      EXPECT_TRUE(same_normed) << form;
    }
  }
  ASSERT_TRUE(set_cuda_moe_options(cuda_backend(), {}).is_ok());
}

// Runs the case's c.T tokens on `path`, then each count in `alone` of its first tokens by themselves, and
// requires those tokens' output bits to equal their bits inside the full batch.
void check_moe_batch_independence(Arena& cuda, std::mt19937& rng, const MoeCase& c, const CudaMoeOptions& options,
                                  const std::string& label, std::initializer_list<int64_t> alone) {
  const ExpertWeights* up = &shared_experts(c.E, c.H, c.I).cuda;
  std::vector<int32_t> ids;
  std::vector<float> weights;
  make_routing(rng, c, &ids, &weights);
  Bf16Data x = random_bf16(rng, c.T * c.H, 1.0f);
  ASSERT_TRUE(set_cuda_moe_options(cuda_backend(), options).is_ok());
  std::vector<uint8_t> full;
  std::vector<int64_t> counts = {c.T};
  counts.insert(counts.end(), alone.begin(), alone.end());
  for (int64_t T : counts) {
    TensorView xg = cuda.upload(DType::kBF16, {T, c.H}, x.bits.data());
    TensorView id = cuda.upload(DType::kI32, {T, c.k}, ids.data()), w = cuda.upload(DType::kF32, {T, c.k}, weights.data());
    TensorView o = cuda.make(DType::kBF16, {T, c.H});
    const Status st = cuda_backend().moe_experts(MoeParams{xg, id, w, up, o, c.k, 7.0f, 1.702f});
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    const std::vector<uint8_t> got = cuda.download_bytes(o);
    if (T == c.T) {
      full = got;
      continue;
    }
    const bool same = std::equal(got.begin(), got.end(), full.begin());
    const std::string what = std::to_string(T) + " tokens alone vs in a batch of " + std::to_string(c.T) + ", bitwise";
    record("moe_experts", label + ": " + what, same ? 0 : 1, 0, 0, same);
    EXPECT_TRUE(same) << T;
  }
  ASSERT_TRUE(set_cuda_moe_options(cuda_backend(), {}).is_ok());
}

// A token's decode output does not depend on the rest of the batch: the k split is fixed by the shape, the
// mma columns are independent and the combine sums in router order, so the first tokens alone (self-routed,
// 1 to 8 tokens) give the bits they get inside a batch of 40 (routing kernel + combine kernel).
TEST_F(KernelTest, MoeDecodeIndependentOfBatch) {
  check_moe_batch_independence(cuda_, rng_, MoeCase{32, 2880, 2880, 4, 40, Routing::kUniform}, {CudaMoePath::kDecode},
                               "decode", {1, 3, 8});
}

// The experts and the norm after them in one op: bit for bit the two ops on CUDA (moe_experts, then add_rms_norm of
// its out; at most 32 routed slots the second decode GEMM leaves its rows and the norm's kernel sums them), and the
// CPU twin.
// 20b's layer at one token; 32 experts at 8 tokens (32 slots) with a narrow intermediate (the CPU twin's time);
// 9 tokens at top-4 (36 slots): past the self-routed decode, the two ops. 8 tokens per expert (120b's 128 experts at
// 256 tokens, 20b's 32 at 64 and 67): the 16-token wgmma tiles, whose rows the norm's kernel sums by slot_pos
// (CudaMoeOptions::wgmma_glue 2), or the combine kernel and the norm (1).
TEST_F(KernelTest, MoeExpertsAddRmsNorm) {
  for (const auto& [c, f32_residual, glue] :
       {std::tuple<MoeCase, bool, int>{MoeCase{32, 2880, 2880, 4, 1, Routing::kUniform}, true, 0},
        {MoeCase{32, 2880, 192, 4, 8, Routing::kHot}, true, 0},
        {MoeCase{32, 320, 256, 4, 3, Routing::kUniform}, false, 0},
        {MoeCase{8, 256, 4160, 2, 3, Routing::kUniform}, true, 0}, {MoeCase{8, 320, 192, 4, 8, Routing::kSame}, false, 0},
        {MoeCase{32, 320, 192, 4, 9, Routing::kUniform}, true, 0},
        {MoeCase{128, 256, 192, 4, 256, Routing::kUniform}, true, 2},
        {MoeCase{32, 2880, 192, 4, 64, Routing::kHot}, true, 2},
        {MoeCase{32, 320, 192, 4, 67, Routing::kUniform}, false, 2},
        {MoeCase{128, 256, 192, 4, 256, Routing::kUniform}, true, 1},
        {MoeCase{32, 320, 192, 4, 67, Routing::kUniform}, false, 1},
        // Prefill's tiles (the combine in the norm since session 20): 96 tokens at ~64 per expert (the 64-column
        // kernel), 96 with a hot expert, 256 at ~1,000 per expert.
        {MoeCase{32, 320, 192, 4, 509, Routing::kUniform}, false, 0},
        {MoeCase{32, 320, 192, 4, 1031, Routing::kHot}, true, 0},
        {MoeCase{8, 256, 192, 2, 4100, Routing::kUniform}, true, 0}}) {
    CudaMoeOptions o;
    o.wgmma_glue = glue;
    ASSERT_TRUE(set_cuda_moe_options(cuda_backend(), o).is_ok());
    MoeInputs in;
    make_moe_inputs(cpu_, cuda_, rng_, c, &in);
    const int64_t T = c.T, H = c.H;
    Bf16Data res = random_bf16(rng_, T * H, 2.0f), nw = random_bf16(rng_, H, 1.0f);
    if (f32_residual) {
      std::normal_distribution<float> dist(0.0f, 2.0f);
      for (auto& v : res.values) v = dist(rng_);
    }
    const DType res_dtype = f32_residual ? DType::kF32 : DType::kBF16;
    const void* res_host = f32_residual ? static_cast<const void*>(res.values.data()) : res.bits.data();
    TensorView res_c = f32_residual ? cpu_.upload(DType::kF32, {T, H}, res.values.data())
                                    : upload_activation(cpu_, cuda_, res, {T, H}).cpu;
    TensorView res_f = cuda_.upload(res_dtype, {T, H}, res_host), res_p = cuda_.upload(res_dtype, {T, H}, res_host);
    TensorView nw_c = cpu_.upload(DType::kBF16, {H}, nw.bits.data()), nw_g = cuda_.upload(DType::kBF16, {H}, nw.bits.data());
    TensorView moe_c = cpu_.make(DType::kF32, {T, H}), moe_f = cuda_.make(DType::kBF16, {T, H}),
               moe_p = cuda_.make(DType::kBF16, {T, H});
    TensorView out_c = cpu_.make(DType::kF32, {T, H}), out_f = cuda_.make(DType::kBF16, {T, H}),
               out_p = cuda_.make(DType::kBF16, {T, H});
    const MoeParams p_c{in.x.cpu, in.id_c, in.w_c, &in.experts->host, moe_c, c.k, 7.0f, 1.702f};
    const MoeParams p_f{in.x.cuda, in.id_g, in.w_g, &in.experts->cuda, moe_f, c.k, 7.0f, 1.702f};
    const MoeParams p_p{in.x.cuda, in.id_g, in.w_g, &in.experts->cuda, moe_p, c.k, 7.0f, 1.702f};
    ASSERT_TRUE(cpu_backend().moe_experts_add_rms_norm(p_c, res_c, nw_c, 1e-5f, out_c).is_ok());
    const Status st = cuda_backend().moe_experts_add_rms_norm(p_f, res_f, nw_g, 1e-5f, out_f);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    ASSERT_TRUE(cuda_backend().moe_experts(p_p).is_ok());
    ASSERT_TRUE(cuda_backend().add_rms_norm(res_p, moe_p, nw_g, 1e-5f, out_p).is_ok());
    const std::string what = std::to_string(c.E) + " experts " + shape_str({H, c.I}) + " top-" + std::to_string(c.k) +
                             ", " + std::to_string(T) + " tokens, " + routing_name(c.routing) +
                             (f32_residual ? ", f32 residual" : ", bf16 residual") +
                             (glue != 0 ? ", wgmma glue " + std::to_string(glue) : "");
    for (const auto& [name, a, b] : {std::tuple<const char*, TensorView, TensorView>{"residual", res_f, res_p},
                                     {"normed", out_f, out_p}}) {
      const bool equal = cuda_.download_bytes(a) == cuda_.download_bytes(b);
      record(std::string("moe_experts_add_rms_norm ") + name,
             what + (equal ? ": the two ops' bits" : ": DIFFER from the two ops"), equal ? 0 : 1, 0, 0, equal);
      EXPECT_TRUE(equal) << name << " " << what;
    }
    check("moe_experts_add_rms_norm residual", what, cuda_.download_f32(res_f), cpu_.download_f32(res_c),
          f32_residual ? 5e-3 : 1e-2);
    check("moe_experts_add_rms_norm normed", what, cuda_.download_f32(out_f), cpu_.download_f32(out_c), 2e-2);
  }
  ASSERT_TRUE(set_cuda_moe_options(cuda_backend(), {}).is_ok());
}

TEST_F(KernelTest, MoeExpertsPrefill) {
  // Many tokens per expert (the grouped kernel's regime), the automatic choice too.
  for (const MoeCase& c : {MoeCase{32, 256, 192, 4, 5000, Routing::kUniform}, MoeCase{32, 320, 256, 4, 4099, Routing::kHot},
                           MoeCase{16, 256, 192, 2, 2500, Routing::kHalf}})
    check_moe_case(cpu_, cuda_, rng_, c, {CudaMoePath::kGrouped, CudaMoePath::kGroupedMmaSync, CudaMoePath::kAuto});
  // gpt-oss-20b layer at a 2048-token prefill, all paths.
  check_moe_case(cpu_, cuda_, rng_, MoeCase{32, 2880, 2880, 4, 2048, Routing::kUniform},
                 {CudaMoePath::kGrouped, CudaMoePath::kGroupedMmaSync, CudaMoePath::kDecode});
}

// The grouped path at odd token counts (1, 7, 129, 4097 tokens: partial tiles everywhere), experts without
// tokens, every token on the same experts, one expert in every token's top-k, each tile size forced; on
// sm_90 this is the wgmma kernel (moe_wgmma.cu) with its k-permuted activations, at every compiled tile width
// (96-token tiles in MoeExpertsGroupedOddShapes96, the narrow ones in ...Narrow; 64-token tiles are the mma.sync
// kernel's everywhere).
const MoeCase kMoeOddShapes[] = {
    MoeCase{32, 2880, 2880, 4, 1, Routing::kUniform}, MoeCase{32, 2880, 2880, 4, 7, Routing::kUniform},
    MoeCase{32, 2880, 2880, 4, 129, Routing::kHalf},  MoeCase{32, 320, 256, 4, 4097, Routing::kUniform},
    MoeCase{8, 320, 192, 4, 129, Routing::kSame},     MoeCase{16, 256, 320, 4, 1000, Routing::kHot},
    MoeCase{8, 1088, 4160, 1, 300, Routing::kSame}};
TEST_F(KernelTest, MoeExpertsGroupedOddShapes) {
  for (const MoeCase& c : kMoeOddShapes) {
    check_moe_case(cpu_, cuda_, rng_, c, {CudaMoePath::kGrouped}, {0}, true, {64, 128, 256}, -1);  // 64: mma.sync
    // The warp-specialized kernel (moe_wgmma_ws.cu): both tile sizes, half- and full-width items.
    check_moe_case(cpu_, cuda_, rng_, c, {CudaMoePath::kGrouped}, {0}, true, {128, 256}, 1);
  }
}

// The same shapes in 96-token tiles, on the deep ring (tiles of <= 48 tokens two strips a warp, 256 weight rows
// a CTA: the 20b second GEMM's 180 strips leave the last CTA's second strips past the matrix, 2I = 384 a third
// CTA of which half is past it), with and without programmatic dependent launches.
TEST_F(KernelTest, MoeExpertsGroupedOddShapes96) {
  for (const MoeCase& c : kMoeOddShapes)
    check_moe_case(cpu_, cuda_, rng_, c, {CudaMoePath::kGrouped}, {0}, true, {96}, -1);
}

// The same shapes in tiles of 16 and 32 tokens (the narrow kernels: every tile two strips a warp at that MMA
// width; 1 and 7 tokens leave most strips' tokens alone in a tile, 4097 over 32 experts fill ~32 tiles each),
// and 128 experts (gpt-oss-120b's count: the routing's scan takes four experts a lane) on every routing tile size.
TEST_F(KernelTest, MoeExpertsGroupedOddShapesNarrow) {
  for (const MoeCase& c : kMoeOddShapes)
    check_moe_case(cpu_, cuda_, rng_, c, {CudaMoePath::kGrouped}, {0}, true, {16, 32}, -1);
  check_moe_case(cpu_, cuda_, rng_, MoeCase{128, 256, 192, 4, 300, Routing::kUniform},
                 {CudaMoePath::kGrouped, CudaMoePath::kDecodeV1, CudaMoePath::kDecode}, {0}, true, {16, 96}, -1);
}

// Top-8 (Gemma-4's k: the combine kernel's wider form) through the narrow tiles and decode v1.
TEST_F(KernelTest, MoeExpertsTopEight) {
  check_moe_case(cpu_, cuda_, rng_, MoeCase{32, 320, 256, 8, 129, Routing::kUniform},
                 {CudaMoePath::kGrouped, CudaMoePath::kDecodeV1}, {0}, true, {16}, -1);
}

// A token's output does not depend on the other tokens of the batch (grouped path: rows are independent,
// the k order is fixed, the combine sums in router order): the first tokens alone give the same bits.
TEST_F(KernelTest, MoeGroupedIndependentOfBatch) {
  check_moe_batch_independence(cuda_, rng_, MoeCase{8, 256, 192, 4, 600, Routing::kUniform}, {CudaMoePath::kGrouped},
                               "grouped", {37});
  // 1025 tokens per expert: 256-token tiles on sm_90 (full and half-width MMAs) against the same tokens alone
  // (96-token tiles at full and half width).
  check_moe_batch_independence(cuda_, rng_, MoeCase{32, 2880, 2880, 4, 8200, Routing::kUniform}, {CudaMoePath::kGrouped},
                               "grouped 20b shape, large tiles", {1, 129, 700});
  check_moe_batch_independence(cuda_, rng_, MoeCase{8, 256, 192, 4, 600, Routing::kUniform},
                               {CudaMoePath::kGroupedMmaSync}, "grouped mma.sync", {37});
  // The warp-specialized wgmma kernel against itself (sm_90; elsewhere the mma.sync grouped GEMM): 256-token
  // tiles at full and half width, and the same tokens alone in partly filled tiles.
  CudaMoeOptions ws{CudaMoePath::kGrouped, 256};
  ws.wgmma_warp_specialized = 1;
  check_moe_batch_independence(cuda_, rng_, MoeCase{32, 2880, 2880, 4, 8200, Routing::kUniform}, ws,
                               "grouped 20b shape, warp-specialized", {1, 129, 700});
}

// One routing and x of a case on the device only, beside the shared experts (MoeInputs holds both backends').
struct MoeCudaInputs {
  const ExpertWeights* up = nullptr;
  TensorView x, ids, weights;
  MoeParams params(const MoeCase& c, TensorView out) const { return MoeParams{x, ids, weights, up, out, c.k, 7.0f, 1.702f}; }
};
MoeCudaInputs upload_moe_cuda_inputs(Arena& cuda, std::mt19937& rng, const MoeCase& c) {
  MoeCudaInputs in;
  in.up = &shared_experts(c.E, c.H, c.I).cuda;
  std::vector<int32_t> ids;
  std::vector<float> weights;
  make_routing(rng, c, &ids, &weights);
  Bf16Data x = random_bf16(rng, c.T * c.H, 1.0f);
  in.x = cuda.upload(DType::kBF16, {c.T, c.H}, x.bits.data());
  in.ids = cuda.upload(DType::kI32, {c.T, c.k}, ids.data());
  in.weights = cuda.upload(DType::kF32, {c.T, c.k}, weights.data());
  return in;
}

void check_moe_graph_replay(Arena& cuda, std::mt19937& rng, const MoeCase& c, const CudaMoeOptions& options,
                            const std::string& label) {
  const MoeCudaInputs in = upload_moe_cuda_inputs(cuda, rng, c);
  TensorView eager = cuda.make(DType::kBF16, {c.T, c.H}), replayed = cuda.make(DType::kBF16, {c.T, c.H});
  ASSERT_TRUE(set_cuda_moe_options(cuda_backend(), options).is_ok());
  ASSERT_TRUE(cuda_backend().moe_experts(in.params(c, eager)).is_ok());
  auto graph = cuda_backend().capture([&] { return cuda_backend().moe_experts(in.params(c, replayed)); });
  ASSERT_TRUE(set_cuda_moe_options(cuda_backend(), {}).is_ok());
  ASSERT_TRUE(graph.is_ok()) << graph.status().to_string();
  ASSERT_TRUE((*graph)->replay().is_ok());
  const std::vector<uint8_t> a = cuda.download_bytes(eager), b = cuda.download_bytes(replayed);
  const bool same = a == b;
  record("moe_experts", label + " " + shape_str({c.E, c.H, c.I}) + " T=" + std::to_string(c.T) + ", graph replay vs eager, bitwise", same ? 0 : 1,
         0, 0, same);
  EXPECT_TRUE(same);
}

// A case as check_moe_forms_bitwise's reports name it: "E x H x I top-k T=T routing".
std::string moe_case_label(const MoeCase& c) {
  return shape_str({c.E, c.H, c.I}) + " top-" + std::to_string(c.k) + " T=" + std::to_string(c.T) + " " +
         routing_name(c.routing);
}

// Two forms of the grouped path give the same bits on one input: `form` eager and replayed from a graph against
// `reference` eager. The report names `what` (the case), `form_name` and `reference_name`.
void check_moe_forms_bitwise(Arena& cuda, std::mt19937& rng, const MoeCase& c, const CudaMoeOptions& reference,
                             const CudaMoeOptions& form, const std::string& what, const std::string& form_name,
                             const std::string& reference_name) {
  const MoeCudaInputs in = upload_moe_cuda_inputs(cuda, rng, c);
  TensorView expected = cuda.make(DType::kBF16, {c.T, c.H}), eager = cuda.make(DType::kBF16, {c.T, c.H}),
             replayed = cuda.make(DType::kBF16, {c.T, c.H});
  ASSERT_TRUE(set_cuda_moe_options(cuda_backend(), reference).is_ok());
  ASSERT_TRUE(cuda_backend().moe_experts(in.params(c, expected)).is_ok());
  ASSERT_TRUE(set_cuda_moe_options(cuda_backend(), form).is_ok());
  const Status st = cuda_backend().moe_experts(in.params(c, eager));
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  auto graph = cuda_backend().capture([&] { return cuda_backend().moe_experts(in.params(c, replayed)); });
  ASSERT_TRUE(set_cuda_moe_options(cuda_backend(), {}).is_ok());
  ASSERT_TRUE(graph.is_ok()) << graph.status().to_string();
  ASSERT_TRUE((*graph)->replay().is_ok());
  const std::vector<uint8_t> a = cuda.download_bytes(expected);
  for (const auto& [name, b] : {std::pair<const char*, TensorView>{"eager", eager}, {"replayed", replayed}}) {
    const bool same = a == cuda.download_bytes(b);
    record("moe_experts", what + ": " + form_name + " (" + name + ") vs " + reference_name + ", bitwise", same ? 0 : 1,
           0, 0, same);
    EXPECT_TRUE(same) << what << " " << name;
  }
}

// The grouped path replayed from a CUDA graph gives the eager bits (fixed grid, metadata read on the device),
// at its own tile choice, with 256-token tiles, and on the warp-specialized kernel.
TEST_F(KernelTest, MoeGroupedGraphReplay) {
  const MoeCase c{32, 2880, 2880, 4, 777, Routing::kHot};
  check_moe_graph_replay(cuda_, rng_, c, {CudaMoePath::kGrouped}, "grouped");
  check_moe_graph_replay(cuda_, rng_, c, {CudaMoePath::kGrouped, 256}, "grouped, 256-token tiles");
  CudaMoeOptions ws{CudaMoePath::kGrouped, 256};
  ws.wgmma_warp_specialized = 1;
  check_moe_graph_replay(cuda_, rng_, c, ws, "grouped, 256-token tiles, warp-specialized");
}

// The deep ring's two forms give the same bits: 150 tokens per expert (tiles of 96 and ~54 tokens, full width,
// one strip a warp) against 1 and 129 tokens alone (tiles of <= 48: half width, two strips a warp).
TEST_F(KernelTest, MoeWgmmaDeepRingIndependentOfBatch) {
  CudaMoeOptions deep{CudaMoePath::kGrouped, 96};
  check_moe_batch_independence(cuda_, rng_, MoeCase{32, 2880, 2880, 4, 1200, Routing::kUniform}, deep,
                               "grouped 20b shape, deep ring", {1, 129});
}

// The narrow kernels (16- and 32-token tiles) likewise: 1 and 129 tokens alone against the same tokens among 1200.
TEST_F(KernelTest, MoeWgmmaNarrowIndependentOfBatch) {
  for (int tile : {16, 32})
    check_moe_batch_independence(cuda_, rng_, MoeCase{32, 2880, 2880, 4, 1200, Routing::kUniform},
                                 CudaMoeOptions{CudaMoePath::kGrouped, tile},
                                 "grouped 20b shape, " + std::to_string(tile) + "-token tiles", {1, 129});
  // (16-token tiles by default on the copy engine, kMoeWgmmaBulk.) The other forms of the 16-token tiles.
  CudaMoeOptions bulk{CudaMoePath::kGrouped, 16};
  bulk.wgmma_bulk = -1;
  check_moe_batch_independence(cuda_, rng_, MoeCase{32, 2880, 2880, 4, 1200, Routing::kUniform}, bulk,
                               "grouped 20b shape, 16-token tiles, cp.async", {1, 129});
  bulk.wgmma_bulk = 2;
  check_moe_batch_independence(cuda_, rng_, MoeCase{32, 2880, 2880, 4, 1200, Routing::kUniform}, bulk,
                               "grouped 20b shape, 16-token tiles, copy engine, warps' releases", {1, 129});
}

// 96-token tiles on the deep ring at batched-decode sizes (32 tokens per expert: two strips a warp) replayed from a
// graph give the eager bits, with the GEMMs launched as programmatic dependents too (inside the graph).
TEST_F(KernelTest, MoeWgmmaDeepRingGraphReplay) {
  const MoeCase c{32, 2880, 2880, 4, 256, Routing::kUniform};
  CudaMoeOptions deep{CudaMoePath::kGrouped, 96};
  deep.wgmma_pdl = -1;
  check_moe_graph_replay(cuda_, rng_, c, deep, "grouped, 96-token tiles, deep ring");
  deep.wgmma_pdl = 1;
  check_moe_graph_replay(cuda_, rng_, c, deep, "grouped, 96-token tiles, deep ring, PDL");
  check_moe_graph_replay(cuda_, rng_, c, {CudaMoePath::kGrouped, 16}, "grouped, 16-token tiles, PDL");
}

// The 16-token tiles' four forms (cp.async, the copy engine with a CTA barrier, with warps' releases or with an
// expert's tiles paired; the copy engine also moving whole tiles' rows) and the 32-token tiles' two (cp.async, the
// copy engine) replayed from a graph give the eager bits, at 8 tokens per expert on a small shape (the second GEMM's
// last CTA half past the matrix) with one hot expert (paired tiles).
TEST_F(KernelTest, MoeWgmmaNarrowGraphReplay) {
  const MoeCase c{32, 320, 256, 4, 64, Routing::kHot};
  for (const auto& [tile, bulk] : {std::pair{16, -1}, std::pair{16, 1}, std::pair{16, 2}, std::pair{16, 3},
                                   std::pair{32, 0}, std::pair{32, 1}}) {
    CudaMoeOptions o{CudaMoePath::kGrouped, tile};
    o.wgmma_bulk = bulk;
    check_moe_graph_replay(cuda_, rng_, c, o,
                           "grouped, " + std::to_string(tile) + "-token tiles, PDL, bulk form " + std::to_string(bulk));
  }
  // The copy engine moving whole padded tiles' rows (session 17's form) instead of the routed tokens' 8-row blocks.
  CudaMoeOptions whole{CudaMoePath::kGrouped, 16};
  whole.wgmma_bulk = 1;
  whole.wgmma_bulk_rows = -1;
  check_moe_graph_replay(cuda_, rng_, c, whole, "grouped, 16-token tiles, PDL, bulk form 1, whole tiles' rows");
}

// The tiled wgmma path's routing and gather in one launch of many CTAs (CudaMoeOptions::wgmma_glue 1 and 2) give the
// bits of the routing kernel and the gather kernel (-1): 120b's 128 experts (a CTA's slots among four
// experts a lane's scan) uniform, hot and all on the same experts, the 20b shape, odd token counts, 4,096 slots
// (the most at 4 slots a CTA) and past them (more slots a CTA, 32 rows a pass), top-1 and top-8, the 32-token tiles on
// the copy engine, the 96-token tiles at 64/96 columns (copy engine: tiled, numbered wide first); eager and replayed.
TEST_F(KernelTest, MoeWgmmaRouteGather) {
  struct Case {
    MoeCase c;
    int tile, bulk;
  };
  for (const Case& t : {Case{MoeCase{128, 256, 192, 4, 256, Routing::kUniform}, 16, 0},
                        Case{MoeCase{128, 256, 192, 4, 257, Routing::kHot}, 16, 0},
                        Case{MoeCase{128, 256, 192, 4, 31, Routing::kSame}, 16, 3},
                        Case{MoeCase{32, 2880, 2880, 4, 64, Routing::kUniform}, 16, 0},
                        Case{MoeCase{32, 320, 256, 4, 1024, Routing::kHalf}, 16, 1},
                        Case{MoeCase{8, 320, 192, 1, 77, Routing::kUniform}, 16, 2},
                        Case{MoeCase{32, 320, 256, 8, 129, Routing::kUniform}, 16, 0},
                        Case{MoeCase{32, 320, 256, 4, 301, Routing::kHot}, 32, 1},
                        Case{MoeCase{32, 320, 256, 4, 1500, Routing::kHot}, 16, 1},
                        Case{MoeCase{128, 320, 256, 4, 2500, Routing::kUniform}, 96, 0},
                        Case{MoeCase{32, 2880, 2880, 4, 513, Routing::kUniform}, 96, 0},
                        // The untiled kernels' routing and k permutation in one launch (launch_moe_route_permute):
                        // 20b's 512 tokens, odd shapes, top-8 and top-1, CTAs of 47 slots (two warps' placements)
                        // and of 256 (at its 65,536-slot bound, every slot on one expert set).
                        Case{MoeCase{32, 2880, 2880, 4, 512, Routing::kUniform}, 96, 0},
                        Case{MoeCase{32, 320, 256, 4, 301, Routing::kHot}, 96, 0},
                        Case{MoeCase{32, 320, 256, 8, 129, Routing::kUniform}, 96, 0},
                        Case{MoeCase{8, 320, 192, 1, 77, Routing::kUniform}, 256, 0},
                        Case{MoeCase{128, 256, 192, 4, 3001, Routing::kUniform}, 128, 0},
                        Case{MoeCase{32, 320, 256, 4, 16384, Routing::kSame}, 96, 0}}) {
    const MoeCase& c = t.c;
    CudaMoeOptions o{CudaMoePath::kGrouped, t.tile};
    o.wgmma_bulk = t.bulk;
    CudaMoeOptions two = o, one = o;
    two.wgmma_glue = -1;
    one.wgmma_glue = 1;
    check_moe_forms_bitwise(cuda_, rng_, c, two, one,
                            moe_case_label(c) + ", " + std::to_string(t.tile) + "-token tiles, bulk form " +
                                std::to_string(t.bulk),
                            "routing and gather or permute in one launch", "two kernels");
  }
}

// The 96-token tiles' kernel whose tiles of at most 64 tokens multiply 64 columns (CudaMoeOptions::wgmma_mid_width)
// gives the bits of the 96- and 48-column kernel (wgmma's columns are independent): ~64 tokens per expert (20b's 512
// tokens), odd shapes, one hot expert (full tiles and a partial last one), half the experts idle (tiles of <= 48
// tokens at 64 columns), top-1; eager and replayed.
TEST_F(KernelTest, MoeWgmmaMidWidth) {
  for (const MoeCase& c : {MoeCase{32, 2880, 2880, 4, 512, Routing::kUniform}, MoeCase{32, 320, 256, 4, 509, Routing::kHot},
                           MoeCase{128, 256, 192, 4, 2000, Routing::kHalf}, MoeCase{8, 320, 192, 1, 500, Routing::kUniform},
                           MoeCase{32, 320, 256, 8, 7, Routing::kUniform}}) {
    CudaMoeOptions full{CudaMoePath::kGrouped, 96}, mid = full;
    full.wgmma_mid_width = -1;
    mid.wgmma_mid_width = 1;
    check_moe_forms_bitwise(cuda_, rng_, c, full, mid, moe_case_label(c), "96-token tiles at 64 columns", "96 and 48");
  }
}

// The 96- and 256-token tiles numbered wide first (CudaMoeOptions::wgmma_wide_first: the tiles whose k loop runs at
// the full width, then an expert's shorter last tiles) give the bits of the expert order: 20b's 512 tokens (64 and 96
// columns), odd shapes with a hot expert (full tiles and a partial last one of either width), half the experts idle,
// top-8, and 256-token tiles with partial tiles of more and of fewer than 128 tokens; eager and replayed.
TEST_F(KernelTest, MoeWgmmaWideFirst) {
  struct Case {
    MoeCase c;
    int tile, mid_width;
  };
  for (const Case& t : {Case{MoeCase{32, 2880, 2880, 4, 512, Routing::kUniform}, 96, 1},
                        Case{MoeCase{32, 320, 256, 4, 509, Routing::kHot}, 96, 1},
                        Case{MoeCase{128, 256, 192, 4, 2000, Routing::kHalf}, 96, 1},
                        Case{MoeCase{32, 320, 256, 8, 301, Routing::kUniform}, 96, 1},
                        Case{MoeCase{8, 320, 192, 2, 1500, Routing::kHot}, 256, 0},
                        Case{MoeCase{8, 320, 192, 4, 1077, Routing::kUniform}, 256, 0}}) {
    const MoeCase& c = t.c;
    CudaMoeOptions order{CudaMoePath::kGrouped, t.tile}, wide;
    order.wgmma_mid_width = t.mid_width;
    wide = order;
    order.wgmma_wide_first = -1;
    wide.wgmma_wide_first = 1;
    check_moe_forms_bitwise(cuda_, rng_, c, order, wide,
                            moe_case_label(c) + ", " + std::to_string(t.tile) + "-token tiles",
                            "wide tiles first", "expert order");
  }
}

// The 96-token tiles' 64/96-column kernel on the copy engine (CudaMoeOptions::wgmma_bulk_mid: rows, fp4 and scales
// by bulk copies from x gathered tiled and h written tiled) gives the bits of its cp.async form: 20b's 512 tokens (64
// and 96 columns), odd shapes with a hot expert (full tiles and a partial last one; the second GEMM's last column
// block half past the matrix; k loops shorter than the ring), half the experts idle, top-1 and top-8; wide first (the
// routing launch's tiled gather numbering the tiles so) and in expert order; eager and replayed.
TEST_F(KernelTest, MoeWgmmaMidBulk) {
  struct Case {
    MoeCase c;
    int wide_first;
  };
  for (const Case& t : {Case{MoeCase{32, 2880, 2880, 4, 512, Routing::kUniform}, 0},
                        Case{MoeCase{32, 2880, 2880, 4, 512, Routing::kUniform}, -1},
                        Case{MoeCase{32, 320, 256, 4, 509, Routing::kHot}, 0},
                        Case{MoeCase{128, 256, 192, 4, 2000, Routing::kHalf}, 0},
                        Case{MoeCase{8, 320, 192, 1, 500, Routing::kUniform}, 0},
                        Case{MoeCase{32, 320, 256, 8, 301, Routing::kUniform}, -1},
                        Case{MoeCase{32, 320, 256, 8, 7, Routing::kUniform}, 0}}) {
    const MoeCase& c = t.c;
    CudaMoeOptions cp_async{CudaMoePath::kGrouped, 96}, bulk;
    cp_async.wgmma_mid_width = 1;
    cp_async.wgmma_wide_first = t.wide_first;
    bulk = cp_async;
    cp_async.wgmma_bulk_mid = -1;
    bulk.wgmma_bulk_mid = 1;
    check_moe_forms_bitwise(cuda_, rng_, c, cp_async, bulk,
                            moe_case_label(c) + (t.wide_first == -1 ? ", expert order" : ", wide first"),
                            "96-token tiles at 64/96 columns, copy engine", "cp.async");
  }
}

// The 256-token tiles on the copy engine (CudaMoeOptions::wgmma_bulk_wide) give the bits of their cp.async form: 20b's
// 2048 tokens (256 per expert: full tiles and half-width ones), odd shapes with a hot expert (partial last tiles of
// more and of fewer than 128 tokens), top-2 and top-8, the second GEMM's last column block half past the matrix,
// 120b's 128 experts with half of them idle, every token on the same four experts at 65,532 slots (the routing
// launch's tiled gather at its bound); wide first and expert order; eager and replayed.
// The 96-token tiles at 96/48 columns on the copy engine (CudaMoeOptions::wgmma_bulk_full) give the bits of their
// cp.async form: 20b's 1024 tokens (128 per expert: full tiles and 32-token ones at 48 columns), odd shapes with a hot
// expert (partial last tiles of more and of fewer than 48 tokens; the second GEMM's last column block half past the
// matrix), 120b's 128 experts with half of them idle, top-1 and top-8, every token on the same four experts at 65,532
// slots; eager and replayed. Both forms of the tiles of at most 48 tokens (CudaMoeOptions::wgmma_bulk_two_strips):
// two strips a warp (the odd column block's CTA exits; the last even one's second strips past the matrix at 320 and
// 192 rows) and one; 20b's 256 tokens (32 per expert: nearly every tile at 48 columns).
TEST_F(KernelTest, MoeWgmmaFullBulk) {
  for (const MoeCase& c : {MoeCase{32, 2880, 2880, 4, 1024, Routing::kUniform}, MoeCase{8, 320, 192, 2, 1501, Routing::kHot},
                           MoeCase{128, 256, 192, 4, 4097, Routing::kHalf}, MoeCase{8, 320, 192, 1, 777, Routing::kUniform},
                           MoeCase{32, 320, 256, 8, 1001, Routing::kUniform},
                           MoeCase{8, 320, 192, 4, 16383, Routing::kSame},
                           MoeCase{32, 2880, 2880, 4, 256, Routing::kUniform}}) {
    for (const int two_strips : {1, -1}) {
      CudaMoeOptions cp_async{CudaMoePath::kGrouped, 96}, bulk;
      cp_async.wgmma_mid_width = -1;
      bulk = cp_async;
      cp_async.wgmma_bulk_full = -1;
      bulk.wgmma_bulk_full = 1;
      bulk.wgmma_bulk_two_strips = two_strips;
      check_moe_forms_bitwise(cuda_, rng_, c, cp_async, bulk, moe_case_label(c),
                              two_strips == 1 ? "96/48-column tiles, copy engine, two strips a warp"
                                              : "96/48-column tiles, copy engine, one strip a warp",
                              "cp.async");
    }
  }
}

TEST_F(KernelTest, MoeWgmmaWideBulk) {
  struct Case {
    MoeCase c;
    int wide_first;
  };
  for (const Case& t : {Case{MoeCase{32, 2880, 2880, 4, 2048, Routing::kUniform}, 0},
                        Case{MoeCase{8, 320, 192, 2, 1500, Routing::kHot}, 0},
                        Case{MoeCase{8, 320, 192, 4, 1077, Routing::kUniform}, -1},
                        Case{MoeCase{32, 320, 256, 8, 1001, Routing::kHalf}, 0},
                        Case{MoeCase{128, 256, 192, 4, 4097, Routing::kHalf}, 1},
                        Case{MoeCase{8, 320, 192, 4, 16383, Routing::kSame}, 0}}) {
    const MoeCase& c = t.c;
    CudaMoeOptions cp_async{CudaMoePath::kGrouped, 256}, bulk;
    cp_async.wgmma_persistent = -1;
    cp_async.wgmma_wide_first = t.wide_first;
    bulk = cp_async;
    cp_async.wgmma_bulk_wide = -1;
    bulk.wgmma_bulk_wide = 1;
    check_moe_forms_bitwise(cuda_, rng_, c, cp_async, bulk,
                            moe_case_label(c) + (t.wide_first == -1 ? ", expert order" : ", wide first"),
                            "256-token tiles, copy engine", "cp.async");
  }
}

// The decode GEMMs replayed from a graph give the eager bits, self-routed (fused combine, tickets reset for
// the next replay) and on the routing kernel's metadata.
TEST_F(KernelTest, MoeDecodeGraphReplay) {
  for (int64_t T : {1, 5, 16})
    check_moe_graph_replay(cuda_, rng_, MoeCase{32, 2880, 2880, 4, T, Routing::kUniform}, {CudaMoePath::kDecode},
                           "decode");
}

}  // namespace
}  // namespace mx::gpu_test
