// The CUDA communicator's all-reduce (nccl_communicator.cc): the one-shot kernel over peer memory for small
// messages, NCCL for the rest. Against the CPU communicator's sum (every rank's values added in rank order in
// f32 from zero, rounded once to the tensor's dtype) on random inputs and odd sizes and addresses, the same
// bits on every rank; repeated calls of mixed sizes, graph replay, TP 2 and TP 4 (skipped with a reason on
// fewer GPUs), and an abort that frees a rank waiting for a peer that never comes.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <future>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "backend/communicator.h"
#include "backend/cuda/all_reduce_config.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/nccl_communicator.h"
#include "core/dtype.h"
#include "gpu_test_util.h"

namespace mx {
namespace {

using gpu_test::record;

int visible_devices() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

// `size` CUDA backends on devices 0.., their communicators, and the device buffers the tests made on them.
struct Group {
  std::vector<std::unique_ptr<Backend>> backends;
  std::vector<std::unique_ptr<Communicator>> comms;
  std::vector<std::vector<Buffer>> buffers;  // [rank]

  Group(int size, int64_t one_shot_max_bytes) {
    std::vector<Backend*> raw;
    for (int r = 0; r < size; ++r) {
      auto b = make_backend(BackendOptions{"cuda", 0, r});
      EXPECT_TRUE(b.is_ok()) << b.status().to_string();
      if (!b.is_ok()) return;
      raw.push_back(b->get());
      backends.push_back(std::move(b).value());
    }
    auto c = make_nccl_communicators(raw, AllReduceOptions{one_shot_max_bytes});
    EXPECT_TRUE(c.is_ok()) << c.status().to_string();
    if (c.is_ok()) comms = std::move(c).value();
    buffers.resize(static_cast<size_t>(size));
  }
  bool ok() const { return !comms.empty(); }
  int size() const { return static_cast<int>(backends.size()); }

  // A device tensor of `n` elements on rank r, `offset_elements` past a 256-byte aligned start (odd offsets make
  // the kernel take its element path).
  TensorView make(int r, DType dtype, int64_t n, int64_t offset_elements = 0) {
    Backend& b = *backends[static_cast<size_t>(r)];
    EXPECT_TRUE(b.make_current().is_ok());
    auto buf = b.allocate(dtype_bytes(dtype, n + offset_elements) + 16);
    EXPECT_TRUE(buf.is_ok());
    auto* base = static_cast<uint8_t*>(buf->data()) + dtype_bytes(dtype, offset_elements);
    buffers[static_cast<size_t>(r)].push_back(std::move(buf).value());
    return TensorView(base, dtype, Shape{n}, Device::kCuda);
  }

  // job(r) on every rank at once, each on its own thread with its device current (NCCL needs every rank's call
  // in flight together); the statuses in rank order.
  std::vector<Status> run(const std::function<Status(int)>& job) {
    std::vector<Status> st(static_cast<size_t>(size()));
    std::vector<std::thread> threads;
    for (int r = 0; r < size(); ++r)
      threads.emplace_back([&, r] {
        Status s = backends[static_cast<size_t>(r)]->make_current();
        st[static_cast<size_t>(r)] = s.is_ok() ? job(r) : s;
      });
    for (auto& t : threads) t.join();
    return st;
  }
};

// Random values on every rank (bf16-representable for bf16), and the CPU communicator's sum of them.
struct Inputs {
  std::vector<std::vector<float>> values;  // [rank][n]
  std::vector<float> sum;                  // rounded to the dtype
};
Inputs random_inputs(std::mt19937& rng, int ranks, int64_t n, DType dtype) {
  Inputs in;
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (int r = 0; r < ranks; ++r) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& f : v) f = dtype == DType::kBF16 ? bf16_to_f32(f32_to_bf16(dist(rng))) : dist(rng);
    in.values.push_back(std::move(v));
  }
  in.sum.assign(static_cast<size_t>(n), 0.0f);
  for (const auto& v : in.values)
    for (int64_t i = 0; i < n; ++i) in.sum[static_cast<size_t>(i)] += v[static_cast<size_t>(i)];
  if (dtype == DType::kBF16)
    for (float& f : in.sum) f = bf16_to_f32(f32_to_bf16(f));
  return in;
}

Status upload(Backend& b, const TensorView& t, const std::vector<float>& v) {
  if (t.dtype() == DType::kF32) return b.copy_from_host(t, v.data());
  std::vector<uint16_t> bits(v.size());
  for (size_t i = 0; i < v.size(); ++i) bits[i] = f32_to_bf16(v[i]);
  return b.copy_from_host(t, bits.data());
}

std::vector<float> download(Backend& b, const TensorView& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  if (t.dtype() == DType::kF32) {
    EXPECT_TRUE(b.copy_to_host(out.data(), t).is_ok());
  } else {
    std::vector<uint16_t> bits(out.size());
    EXPECT_TRUE(b.copy_to_host(bits.data(), t).is_ok());
    for (size_t i = 0; i < bits.size(); ++i) out[i] = bf16_to_f32(bits[i]);
  }
  return out;
}

int64_t differing_bits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return static_cast<int64_t>(std::max(a.size(), b.size()));
  int64_t d = 0;
  for (size_t i = 0; i < a.size(); ++i) d += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return d;
}

// Checks every rank's result: the same bits everywhere; equal to the CPU sum bit for bit on the one-shot path
// (NCCL rounds bf16 partial sums on the way past 2 ranks and adds in its own order: within rounding there).
void check_results(const std::string& test, const std::string& detail, Group& g, const std::vector<TensorView>& xs,
                   const Inputs& in, bool one_shot) {
  const std::vector<float> first = download(*g.backends[0], xs[0]);
  int64_t across = 0;
  for (int r = 1; r < g.size(); ++r) across += differing_bits(first, download(*g.backends[static_cast<size_t>(r)], xs[static_cast<size_t>(r)]));
  const gpu_test::Errors e = gpu_test::compare(first, in.sum);
  const int64_t vs_cpu = differing_bits(first, in.sum);
  const double tol = xs[0].dtype() == DType::kBF16 ? 8e-3 : 1e-6;
  const bool pass = across == 0 && e.non_finite == 0 && (one_shot ? vs_cpu == 0 : e.rel_l2 <= tol);
  record(test, detail + (one_shot ? " one-shot" : " nccl") + ": " + std::to_string(vs_cpu) + " differ from the CPU sum, " +
                   std::to_string(across) + " across ranks",
         e.rel_l2, e.max_abs, one_shot ? 0 : tol, pass);
  EXPECT_EQ(across, 0) << test << " " << detail;
  EXPECT_EQ(e.non_finite, 0) << test << " " << detail;
  if (one_shot) EXPECT_EQ(vs_cpu, 0) << test << " " << detail << " (max abs " << e.max_abs << ")";
  else EXPECT_LE(e.rel_l2, tol) << test << " " << detail;
}

class AllReduceTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    const int devices = visible_devices();
    if (devices < GetParam())
      GTEST_SKIP() << "an all-reduce over " << GetParam() << " GPUs needs " << GetParam() << " devices; " << devices
                   << " visible";
  }
};

struct Case {
  DType dtype;
  int64_t n, offset;
};
std::string describe(const Case& c) {
  return std::string(dtype_name(c.dtype)) + " n=" + std::to_string(c.n) + (c.offset ? " offset " + std::to_string(c.offset) : "");
}

// Odd sizes, one, eight and 64 20b rows, a misaligned start, the largest messages the slot holds (where up to
// 4 ranks go one-shot by default: the CTAs loop over the message) and a size past the slot: under the automatic
// choice, with one-shot as far as the slot goes, and with NCCL only. One group per choice; its calls run back
// to back with sizes (and so grid sizes) changing between them.
TEST_P(AllReduceTest, MatchesTheCpuSumOnEveryRank) {
  const int ranks = GetParam();
  const int64_t slot_bf16 = cuda::kOneShotSlotBytes / 2, slot_f32 = cuda::kOneShotSlotBytes / 4;  // elements
  const int64_t past_slot = slot_bf16 + 1001;                                                     // bf16 elements
  const std::vector<Case> cases = {{DType::kF32, 1, 0},    {DType::kBF16, 1, 0},    {DType::kF32, 7, 0},
                                   {DType::kBF16, 7, 0},   {DType::kBF16, 2880, 0}, {DType::kF32, 2880, 0},
                                   {DType::kBF16, 2880 * 8, 0}, {DType::kF32, 2880 * 8, 0}, {DType::kBF16, 2880, 1},
                                   {DType::kF32, 2883, 3}, {DType::kBF16, 2880 * 64, 0}, {DType::kBF16, slot_bf16, 0},
                                   {DType::kF32, slot_f32 - 3, 0}, {DType::kBF16, slot_bf16 - 5, 1},
                                   {DType::kBF16, past_slot, 0}, {DType::kF32, past_slot / 2, 0}};
  std::mt19937 rng(gpu_test::test_seed());
  for (const int64_t max_bytes : {cuda::kOneShotAutoMaxBytes, cuda::kOneShotSlotBytes, int64_t{0}}) {
    Group g(ranks, max_bytes);
    ASSERT_TRUE(g.ok());
    const std::string test = "all-reduce TP " + std::to_string(ranks) +
                             (max_bytes == 0 ? " nccl only" : max_bytes < 0 ? " auto" : " one-shot to the slot");
    for (int repeat = 0; repeat < 2; ++repeat) {
      for (const Case& c : cases) {
        const Inputs in = random_inputs(rng, ranks, c.n, c.dtype);
        std::vector<TensorView> xs;
        for (int r = 0; r < ranks; ++r) {
          xs.push_back(g.make(r, c.dtype, c.n, c.offset));
          ASSERT_TRUE(upload(*g.backends[static_cast<size_t>(r)], xs.back(), in.values[static_cast<size_t>(r)]).is_ok());
        }
        const std::vector<Status> st = g.run([&](int r) -> Status {
          MX_RETURN_IF_ERROR(g.comms[static_cast<size_t>(r)]->all_reduce_sum(xs[static_cast<size_t>(r)]));
          return g.backends[static_cast<size_t>(r)]->synchronize();
        });
        for (const Status& s : st) ASSERT_TRUE(s.is_ok()) << describe(c) << ": " << s.to_string();
        const bool one_shot = cuda::use_one_shot_all_reduce(dtype_bytes(c.dtype, c.n), ranks, true, max_bytes);
        check_results(test, describe(c) + (repeat ? " (again)" : ""), g, xs, in, one_shot);
      }
    }
  }
}

// Each rank captures four all-reduces (one, eight and 64 rows, and one past the slot: one-shot up to the slot at
// 2-4 ranks, then NCCL) in one graph; 100 replays on fresh inputs each give the CPU sum every time.
TEST_P(AllReduceTest, GraphReplayGivesTheSumEveryTime) {
  const int ranks = GetParam();
  Group g(ranks, cuda::kOneShotAutoMaxBytes);
  ASSERT_TRUE(g.ok());
  const std::vector<Case> cases = {{DType::kBF16, 2880, 0}, {DType::kBF16, 2880 * 8, 0}, {DType::kBF16, 2880 * 64, 0},
                                   {DType::kF32, cuda::kOneShotSlotBytes / 4 + 5, 0}};
  std::vector<std::vector<TensorView>> xs(cases.size());  // [case][rank]
  for (size_t c = 0; c < cases.size(); ++c)
    for (int r = 0; r < ranks; ++r) xs[c].push_back(g.make(r, cases[c].dtype, cases[c].n));
  // NCCL sets up its connections on a group's first collective, which a capture cannot hold: one eager pass first
  // (as the engine's warm-up pass does before it captures).
  const std::vector<Status> warm = g.run([&](int r) -> Status {
    for (size_t c = 0; c < cases.size(); ++c) MX_RETURN_IF_ERROR(g.comms[static_cast<size_t>(r)]->all_reduce_sum(xs[c][static_cast<size_t>(r)]));
    return g.backends[static_cast<size_t>(r)]->synchronize();
  });
  for (const Status& s : warm) ASSERT_TRUE(s.is_ok()) << s.to_string();
  std::vector<std::unique_ptr<ReplayGraph>> graphs(static_cast<size_t>(ranks));
  const std::vector<Status> captured = g.run([&](int r) -> Status {
    const auto i = static_cast<size_t>(r);
    auto graph = g.backends[i]->capture([&]() -> Status {
      for (size_t c = 0; c < cases.size(); ++c) MX_RETURN_IF_ERROR(g.comms[i]->all_reduce_sum(xs[c][i]));
      return Status::ok();
    });
    if (graph.is_ok()) graphs[i] = std::move(graph).value();
    return graph.status();
  });
  for (const Status& s : captured) ASSERT_TRUE(s.is_ok()) << s.to_string();
  std::mt19937 rng(gpu_test::test_seed());
  int64_t wrong = 0, across = 0;
  for (int replay = 0; replay < 100; ++replay) {
    std::vector<Inputs> in;
    for (size_t c = 0; c < cases.size(); ++c) {
      in.push_back(random_inputs(rng, ranks, cases[c].n, cases[c].dtype));
      for (int r = 0; r < ranks; ++r)
        ASSERT_TRUE(upload(*g.backends[static_cast<size_t>(r)], xs[c][static_cast<size_t>(r)], in[c].values[static_cast<size_t>(r)]).is_ok());
    }
    // As the tensor-parallel model replays: every rank's graph launched from one thread, then all waited for.
    for (int r = 0; r < ranks; ++r) {
      ASSERT_TRUE(g.backends[static_cast<size_t>(r)]->make_current().is_ok());
      ASSERT_TRUE(graphs[static_cast<size_t>(r)]->replay().is_ok());
    }
    for (int r = 0; r < ranks; ++r) {
      ASSERT_TRUE(g.backends[static_cast<size_t>(r)]->make_current().is_ok());
      ASSERT_TRUE(g.backends[static_cast<size_t>(r)]->synchronize().is_ok());
    }
    for (size_t c = 0; c < cases.size(); ++c) {
      const bool one_shot = cuda::use_one_shot_all_reduce(dtype_bytes(cases[c].dtype, cases[c].n), ranks, true,
                                                         cuda::kOneShotAutoMaxBytes);
      const std::vector<float> first = download(*g.backends[0], xs[c][0]);
      for (int r = 1; r < ranks; ++r) across += differing_bits(first, download(*g.backends[static_cast<size_t>(r)], xs[c][static_cast<size_t>(r)]));
      const gpu_test::Errors e = gpu_test::compare(first, in[c].sum);
      wrong += one_shot ? differing_bits(first, in[c].sum) : (e.rel_l2 <= 1e-6 && e.non_finite == 0 ? 0 : 1);
    }
  }
  record("all-reduce graph replay", "TP " + std::to_string(ranks) + ": " + std::to_string(cases.size()) + " calls x 100 replays: " + std::to_string(wrong) +
                                        " wrong, " + std::to_string(across) + " differ across ranks",
         static_cast<double>(wrong + across), 0, 0, wrong == 0 && across == 0);
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(across, 0);
}

// Rank 0 starts a one-shot all-reduce that rank 1 never joins (as when rank 1's forward pass failed): abort()
// must free rank 0's GPU, and every later collective of the group fails with the abort's error.
TEST_P(AllReduceTest, AbortFreesARankWaitingForAPeer) {
  const int ranks = GetParam();
  Group g(ranks, cuda::kOneShotAutoMaxBytes);
  ASSERT_TRUE(g.ok());
  const TensorView x = g.make(0, DType::kBF16, 2880);
  ASSERT_TRUE(g.backends[0]->make_current().is_ok());
  ASSERT_TRUE(g.comms[0]->all_reduce_sum(x).is_ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  auto where = cuda_placement(*g.backends[0]);
  ASSERT_TRUE(where.is_ok());
  EXPECT_EQ(cudaStreamQuery(static_cast<cudaStream_t>(where->stream)), cudaErrorNotReady)
      << "rank 0 should still be waiting for its peers";
  g.comms[0]->abort();
  auto waited = std::async(std::launch::async, [&] {
    (void)g.backends[0]->make_current();
    return g.backends[0]->synchronize();
  });
  if (waited.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    std::fprintf(stderr, "AbortFreesARankWaitingForAPeer: rank 0 still waits 20 s after abort()\n");
    std::abort();  // a hung GPU cannot be left behind for the next test
  }
  const Status st = waited.get();
  record("all-reduce abort", "TP " + std::to_string(ranks) + ": waiting rank freed (" + (st.is_ok() ? "ok" : st.to_string()) + ")", 0,
         0, 0, true);
  for (int r = 0; r < ranks; ++r) {
    const Status later = g.comms[static_cast<size_t>(r)]->all_reduce_sum(x);
    EXPECT_EQ(later.message(), kTensorParallelAborted) << later.to_string();
  }
}

// all_reduce_add_rms_norm (the step after gpt-oss's o_proj and experts): one kernel up to
// kOneShotMaxNormRows rows, the pair (all_reduce_sum, then the backend's add_rms_norm) past them. Both give the
// pair's bits on every rank (f32 and bf16 residuals, odd row counts, 20b's width and a narrow one), and the CPU
// twin's values within bf16 rounding.
TEST_P(AllReduceTest, AddRmsNormAfterTheSumEqualsThePairBitForBit) {
  const int ranks = GetParam();
  Group g(ranks, cuda::kOneShotAutoMaxBytes);
  ASSERT_TRUE(g.ok());
  std::mt19937 rng(gpu_test::test_seed());
  const float eps = 1e-5f;
  for (const DType res_dtype : {DType::kF32, DType::kBF16})
    for (const int64_t hidden : {int64_t{2880}, int64_t{64}})
      for (const int64_t rows : {int64_t{1}, int64_t{3}, int64_t{8}, int64_t{9}}) {
        const int64_t n = rows * hidden;
        const Inputs in = random_inputs(rng, ranks, n, DType::kBF16);
        const Inputs residual = random_inputs(rng, 1, n, res_dtype), weight = random_inputs(rng, 1, hidden, DType::kBF16);
        // [path][rank]: 0 fused, 1 the pair
        std::vector<TensorView> x[2], res[2], out[2], w;
        for (int r = 0; r < ranks; ++r) {
          Backend& b = *g.backends[static_cast<size_t>(r)];
          w.push_back(g.make(r, DType::kBF16, hidden));
          ASSERT_TRUE(upload(b, w.back(), weight.values[0]).is_ok());
          for (int path = 0; path < 2; ++path) {
            x[path].push_back(g.make(r, DType::kBF16, n).reshaped({rows, hidden}));
            res[path].push_back(g.make(r, res_dtype, n).reshaped({rows, hidden}));
            out[path].push_back(g.make(r, DType::kBF16, n).reshaped({rows, hidden}));
            ASSERT_TRUE(upload(b, x[path].back(), in.values[static_cast<size_t>(r)]).is_ok());
            ASSERT_TRUE(upload(b, res[path].back(), residual.values[0]).is_ok());
          }
        }
        const std::vector<Status> st = g.run([&](int r) -> Status {
          const auto i = static_cast<size_t>(r);
          Backend& b = *g.backends[i];
          MX_RETURN_IF_ERROR(g.comms[i]->all_reduce_add_rms_norm(x[0][i], b, res[0][i], w[i], eps, out[0][i]));
          MX_RETURN_IF_ERROR(g.comms[i]->all_reduce_sum(x[1][i]));
          MX_RETURN_IF_ERROR(b.add_rms_norm(res[1][i], x[1][i], w[i], eps, out[1][i]));
          return b.synchronize();
        });
        for (const Status& s : st) ASSERT_TRUE(s.is_ok()) << s.to_string();
        // The CPU twin: the residual plus the (bf16) sum, normed in f32.
        Backend& cpu = gpu_test::cpu_backend();
        std::vector<float> cpu_res = residual.values[0], cpu_out(static_cast<size_t>(n));
        const TensorView cres(cpu_res.data(), DType::kF32, Shape{rows, hidden});
        std::vector<float> delta = in.sum, cpu_w = weight.values[0];
        ASSERT_TRUE(cpu.add_rms_norm(cres, TensorView(delta.data(), DType::kF32, Shape{rows, hidden}),
                                     TensorView(cpu_w.data(), DType::kF32, Shape{hidden}), eps,
                                     TensorView(cpu_out.data(), DType::kF32, Shape{rows, hidden}))
                        .is_ok());
        int64_t vs_pair = 0;
        for (int r = 0; r < ranks; ++r) {
          Backend& b = *g.backends[static_cast<size_t>(r)];
          const auto i = static_cast<size_t>(r);
          vs_pair += differing_bits(download(b, out[0][i]), download(b, out[1][i]));
          vs_pair += differing_bits(download(b, res[0][i]), download(b, res[1][i]));
          vs_pair += differing_bits(download(b, out[0][i]), download(*g.backends[0], out[0][0]));
        }
        const gpu_test::Errors e = gpu_test::compare(download(*g.backends[0], out[0][0]), cpu_out);
        const bool fused = rows <= cuda::kOneShotMaxNormRows;
        const bool pass = vs_pair == 0 && e.non_finite == 0 && e.rel_l2 <= 1e-2;
        record("all-reduce + add_rms_norm TP " + std::to_string(ranks),
               std::string(dtype_name(res_dtype)) + " residual [" + std::to_string(rows) + ", " + std::to_string(hidden) +
                   "] " + (fused ? "fused" : "pair") + ": " + std::to_string(vs_pair) + " bits differ from the pair / rank 0",
               e.rel_l2, e.max_abs, 1e-2, pass);
        EXPECT_EQ(vs_pair, 0) << rows << " x " << hidden;
        EXPECT_EQ(e.non_finite, 0);
        EXPECT_LE(e.rel_l2, 1e-2);
      }
}

INSTANTIATE_TEST_SUITE_P(Ranks, AllReduceTest, ::testing::Values(2, 4),
                         [](const ::testing::TestParamInfo<int>& p) { return "Tp" + std::to_string(p.param); });

}  // namespace
}  // namespace mx
