// Microbenchmarks of the CUDA backend's ops on gpt-oss-20b shapes with random weights: MoE decode
// (1/8/64 tokens), MoE prefill (32..8192 tokens, decode vs grouped expert GEMMs), decode attention
// (1K/8K/32K context), prefill attention (1K/4K/8K, each kernel), qkv/o/lm_head linears at M = 1 and 8192,
// sampling 1/8/64 rows of the 201,088-token vocabulary. Each op is recorded N times into a graph (inputs
// rotated so that weights come from HBM, not L2), the graph replayed after a warm-up; the median replay
// over N is the time per op. Each line gives the fraction of its floor: bytes / this card's measured copy rate
// (measure_copy_rate, as `bench latency` divides its decode floor) or FLOPs / bf16 peak (an H200's, KINDS.md).
// Prints a table; writes JSON to the last
// argument when given (`mx_kernel_bench [--moe-prefill-only[=T,T,...] [--moe-experts=E] [--moe-skew=S,S,...]
// [--moe-rounds=N] [--variants=P,P,...] |
// --sampling-only |
// --moe-decode-variants[=T,T,...] [--moe-experts=E] [--variants=P,P,...] |
// --attention-prefill-only[=T,T,...] | --attention-decode-only[=B,B,...] | --attention-decode-pair[=B,B,...] |
// --attention-gemma | --linear-only |
// --qkv-rope-only[=T,T,...] | --qkv-rope-epilogue-only[=B,B,...] | --attention-window-forms[=T,T,...] |
// --linear-fp8-only | --lm-head-staged[=once] | --gemma-only | --gemma-dense-only |
// --decode-step-only[=B,B,...] [--candidates=N] |
// --gemma-router-only[=T,T,...] | --gemma-experts-only[=T,T,...] | --gemma-ffn-overlap | --attention-gemma-decode[=B,B,...]
// | --attention-gemma-decode-once] [out.json]`).
// --attention-gemma-decode: Gemma-4's decode attention rows only, each decode kernel (-once: batch 1's clustered
// launches once each, untimed, for a profiler).
// --attention-gemma-prefill[=T,T,...] [--variants=P,P,...]: Gemma-4's prefill attention rows only, each prefill
// kernel (or those whose labels start with a prefix).
// --attention-gemma times Gemma-4's attention geometry instead (bench_attention_gemma); --gemma-only its router,
// bf16 experts and small ops (bench_gemma). --variants after --moe-prefill-only runs only the prefill variants
// whose labels start with one of the prefixes (e.g. `wgmma,auto`: the decode paths take most of the time), without
// the sweep's closing bf16 yardstick; after
// --moe-decode-variants it picks decode variants (e.g. `v1,stream`); a prefix ending in '$' is a whole label, and a
// comma inside a prefix is written `\,`. --moe-experts=128 times gpt-oss-120b's MoE
// layer (128 experts, same expert shape) in the prefill sweep or the decode variants instead of 20b's 32; --moe-skew=S
// (after --moe-prefill-only) routes it unevenly (make_routings).
#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <fstream>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <set>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "backend/cuda/attention_wide_config.h"
#include "backend/cuda/cublaslt_linear.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_info.h"
#include "backend/cuda/kernel_configs.h"
#include "backend/kv_cache.h"
#include "core/dtype.h"
#include "runtime/batch_staging.h"
#include "bench_check.h"

namespace mx {
namespace {

double g_hbm_bytes_per_s = 0;  // measure_copy_rate's, set first thing in main
constexpr double kBf16FlopsPerSecond = 790e12;      // H200, cuBLAS 8192^3 bf16 on random data (KINDS.md)

struct Row {
  std::string name;
  double us = 0, floor_us = 0;
  std::string floor_kind, note;
};
std::vector<Row> g_rows;

Backend* g_b = nullptr;
std::vector<Buffer> g_keep;
std::mt19937 g_rng(1234);
std::vector<int64_t> bench_only_prefill_sizes;
std::vector<int64_t> bench_only_decode_sizes;          // empty: the default sizes
std::vector<std::string> bench_variant_prefixes;       // empty: every variant

// The non-empty items of "=a,b,c" (a flag's tail; "" gives none), each converted by `item`.
template <typename T, typename F>
std::vector<T> parse_list(const std::string& tail, F item) {
  std::vector<T> out;
  for (size_t i = tail.empty() ? std::string::npos : 1; i < tail.size();) {
    const size_t end = std::min(tail.find(',', i), tail.size());
    if (end > i) out.push_back(item(tail.substr(i, end - i)));
    i = end + 1;
  }
  return out;
}

// The integer list of `arg` when it is `flag` or `flag=N,N,...` (bare `flag`: an empty list); nullopt when `arg`
// does not start with `flag`.
std::optional<std::vector<int64_t>> int_list_flag(const char* arg, const std::string& flag) {
  const std::string a(arg);
  if (a.rfind(flag, 0) != 0) return std::nullopt;
  return parse_list<int64_t>(a.substr(flag.size()), [](const std::string& t) { return std::stoll(t); });
}

// `--variants=P,P,...` at argv[arg], if there: its prefixes go to bench_variant_prefixes and arg moves past it.
// A comma inside a prefix is written `\,` (labels such as " (bulk copies, 2 tiles per CTA)" have commas): quoted,
// '--variants=(bulk copies\, 2 tiles per CTA)$' selects that label alone. Empty prefixes are dropped.
void take_variant_prefixes(int argc, char** argv, int& arg) {
  const std::string flag = "--variants=";
  if (argc <= arg || std::string(argv[arg]).rfind(flag, 0) != 0) return;
  const std::string value = std::string(argv[arg]).substr(flag.size());
  std::vector<std::string> prefixes(1);
  for (size_t i = 0; i < value.size(); ++i) {
    if (value[i] == '\\' && i + 1 < value.size() && value[i + 1] == ',') prefixes.back() += value[++i];
    else if (value[i] == ',') prefixes.emplace_back();
    else prefixes.back() += value[i];
  }
  std::erase_if(prefixes, [](const std::string& p) { return p.empty(); });
  bench_variant_prefixes = std::move(prefixes);
  ++arg;
}

// Whether a variant's label (leading spaces ignored) starts with one of --variants' prefixes (or, for a prefix
// ending in '$', is that label).
bool variant_selected(const std::string& label) {
  const std::string l = label.substr(std::min(label.find_first_not_of(' '), label.size()));
  return bench_variant_prefixes.empty() ||
         std::any_of(bench_variant_prefixes.begin(), bench_variant_prefixes.end(), [&](const std::string& prefix) {
           return !prefix.empty() && prefix.back() == '$' ? l == prefix.substr(0, prefix.size() - 1)
                                                          : l.rfind(prefix, 0) == 0;
         });
}

TensorView make(DType dtype, Shape shape) {
  auto buf = g_b->allocate(dtype_bytes(dtype, shape.numel()));
  CHECK_OK(buf.status().is_ok() ? Status::ok() : buf.status());
  TensorView v = buf->view(dtype, shape);
  g_keep.push_back(std::move(*buf));
  return v;
}

TensorView random_bf16(Shape shape, float stddev) {
  std::vector<uint16_t> host(static_cast<size_t>(shape.numel()));
  std::normal_distribution<float> d(0.0f, stddev);
  for (auto& h : host) h = f32_to_bf16(d(g_rng));
  TensorView v = make(DType::kBF16, shape);
  CHECK_OK(g_b->copy_from_host(v, host.data()));
  return v;
}

// random_bf16 for large weights whose values do not matter to a timing: one block of 1M random values repeated at
// rotating offsets (drawing a 201088 x 2880 lm_head value by value takes seconds).
TensorView repeated_random_bf16(Shape shape, float stddev) {
  const size_t count = static_cast<size_t>(shape.numel()), block = std::min<size_t>(count, (size_t{1} << 20) + 7);
  std::vector<uint16_t> host(count);
  std::normal_distribution<float> d(0.0f, stddev);
  for (size_t i = 0; i < block; ++i) host[i] = f32_to_bf16(d(g_rng));
  for (size_t i = block; i < count; ++i) host[i] = host[(i + i / block) % block];
  TensorView v = make(DType::kBF16, shape);
  CHECK_OK(g_b->copy_from_host(v, host.data()));
  return v;
}

// Median microseconds per op of `op(i)` for i in [0, n), recorded as one graph.
double time_graph(int n, const std::function<Status(int)>& op) {
  auto graph = g_b->capture([&]() -> Status {
    for (int i = 0; i < n; ++i) MX_RETURN_IF_ERROR(op(i));
    return Status::ok();
  });
  CHECK_OK(graph.is_ok() ? Status::ok() : graph.status());
  CHECK_OK((*graph)->replay());
  CHECK_OK(g_b->synchronize());
  std::vector<double> us;
  for (int r = 0; r < 15; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    CHECK_OK((*graph)->replay());
    CHECK_OK(g_b->synchronize());
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / n);
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

void report(const std::string& name, double us, double bytes, double flops, const std::string& note = "") {
  const double bw_floor = bytes / g_hbm_bytes_per_s * 1e6, fl_floor = flops / kBf16FlopsPerSecond * 1e6;
  Row r{name, us, std::max(bw_floor, fl_floor), bw_floor >= fl_floor ? "HBM" : "bf16", note};
  std::printf("%-44s %10.2f us  floor %9.2f us (%s)  %5.1f%% of floor  %s\n", name.c_str(), us, r.floor_us,
              r.floor_kind.c_str(), 100 * r.floor_us / us, note.c_str());
  std::fflush(stdout);
  g_rows.push_back(r);
}

// The bytes floor's divisor: (read + written bytes) / time of a 1 GiB device-to-device copy between device
// events (median of 10), the yardstick of `bench latency`'s decode floor (tools/bench_probes.cc), so the two
// tools' fractions agree on any card (a fixed H200 figure read the H100's fractions ~27% low; the same copies
// as graph memcpy nodes measured 2.42 instead of 2.96 TB/s on an H100). The source is written first.
double measure_copy_rate() {
  const int64_t bytes = 1ll << 30;
  const TensorView src = make(DType::kU8, {bytes}), dst = make(DType::kU8, {bytes});
  std::vector<uint8_t> host(static_cast<size_t>(bytes));
  std::mt19937 rng(7);  // not g_rng: the benchmarks' weights and routings stay the same whatever this probe draws
  for (size_t i = 0; i < host.size(); i += 64) host[i] = static_cast<uint8_t>(rng());
  CHECK_OK(g_b->copy_from_host(src, host.data()));
  auto timer = g_b->make_timer(2);
  CHECK_OK(timer.is_ok() ? Status::ok() : timer.status());
  std::vector<double> ms;
  CHECK_OK(g_b->copy(dst, src));
  for (int i = 0; i < 10; ++i) {
    CHECK_OK((*timer)->mark(0));
    CHECK_OK(g_b->copy(dst, src));
    CHECK_OK((*timer)->mark(1));
    auto t = (*timer)->read(2);
    CHECK_OK(t.is_ok() ? Status::ok() : t.status());
    ms.push_back((*t)[1]);
  }
  std::sort(ms.begin(), ms.end());
  return 2.0 * static_cast<double>(bytes) / (ms[ms.size() / 2] * 1e-3);
}

constexpr int64_t kMoeH = 2880, kMoeI = 2880, kMoeK = 4;
// Experts of the MoE layer the MoE prefill sweep times: gpt-oss-20b's 32 (default) or, with --moe-experts=128,
// gpt-oss-120b's (same expert shape and top-4; at 256 sequences a decode step routes ~8 tokens per expert).
int64_t g_moe_experts = 32;
// Copies of the experts rotated through: 3 x 425 MB defeat the 60 MB L2; one 1.7 GB copy of 120b's does alone.
int expert_copies() { return g_moe_experts > 32 ? 1 : 3; }

// Random experts of g_moe_experts (H = I = 2880).
std::vector<ExpertWeights> upload_bench_experts() {
  const int64_t E = g_moe_experts, H = kMoeH, I = kMoeI;
  const int copies = expert_copies();
  std::vector<ExpertWeights> experts;
  // Four random bytes per draw: 120b's 1.6 GB of fp4 a byte at a time took most of a run's start-up.
  auto fill_random = [](std::vector<uint8_t>& v) {
    for (size_t i = 0; i < v.size(); i += 4) {
      const uint32_t r = static_cast<uint32_t>(g_rng());
      for (size_t j = 0; j < 4 && i + j < v.size(); ++j) v[i + j] = static_cast<uint8_t>(r >> (8 * j));
    }
  };
  for (int c = 0; c < copies; ++c) {
    std::vector<uint8_t> w1b(E * 2 * I * H / 2), w1s(E * 2 * I * H / 32), w2b(E * H * I / 2), w2s(E * H * I / 32);
    fill_random(w1b);
    fill_random(w2b);
    for (auto& b : w1s) b = static_cast<uint8_t>(118 + g_rng() % 8);
    for (auto& b : w2s) b = static_cast<uint8_t>(118 + g_rng() % 8);
    std::vector<uint16_t> b1(E * 2 * I), b2(E * H);
    for (auto& b : b1) b = f32_to_bf16(0.01f * static_cast<float>(g_rng() % 100));
    for (auto& b : b2) b = f32_to_bf16(0.01f * static_cast<float>(g_rng() % 100));
    ExpertWeights host;
    host.w1_blocks = TensorView(w1b.data(), DType::kU8, {E, 2 * I, H / 32, 16});
    host.w1_scales = TensorView(w1s.data(), DType::kU8, {E, 2 * I, H / 32});
    host.w1_bias = TensorView(b1.data(), DType::kBF16, {E, 2 * I});
    host.w2_blocks = TensorView(w2b.data(), DType::kU8, {E, H, I / 32, 16});
    host.w2_scales = TensorView(w2s.data(), DType::kU8, {E, H, I / 32});
    host.w2_bias = TensorView(b2.data(), DType::kBF16, {E, H});
    host.num_experts = E;
    host.hidden = H;
    host.intermediate = I;
    auto up = g_b->upload_experts(host, &g_keep);
    CHECK_OK(up.is_ok() ? Status::ok() : up.status());
    experts.push_back(*up);
  }
  return experts;
}

// Uploaded once, shared by the MoE benchmarks.
const std::vector<ExpertWeights>& bench_experts() {
  static const std::vector<ExpertWeights> experts = upload_bench_experts();
  return experts;
}

// `--moe-skew=S,S,...`: the MoE prefill sweep's experts drawn with weight 1 / (rank + 1)^S (ranks a random
// permutation of the experts), k distinct a token (the Gumbel top-k), as a router's uneven load; 0 (default)
// uniformly. Each size is timed at each S; g_moe_skew is the one being timed.
std::vector<double> g_moe_skews{0};
double g_moe_skew = 0;
// `--moe-rounds=N` (after --moe-skew): the MoE prefill sweep's interleaved rounds (3 by default; the median of each).
int g_moe_rounds = 3;

// Top-k routings of T tokens, k distinct experts each, uniformly at random (or skewed, g_moe_skew); returns the
// mean number of distinct experts touched.
double make_routings(int64_t T, int count, std::vector<TensorView>* ids, std::vector<TensorView>* weights) {
  double touched = 0;
  std::vector<double> log_weight(g_moe_experts);
  std::vector<int32_t> rank(g_moe_experts);
  std::iota(rank.begin(), rank.end(), 0);
  std::shuffle(rank.begin(), rank.end(), g_rng);
  for (int64_t e = 0; e < g_moe_experts; ++e) log_weight[e] = -g_moe_skew * std::log(1.0 + rank[e]);
  std::uniform_real_distribution<double> uniform(1e-12, 1.0);
  for (int r = 0; r < count; ++r) {
    std::vector<int32_t> h_ids(T * kMoeK);
    std::vector<float> h_w(T * kMoeK, 1.0f / kMoeK);
    std::set<int32_t> distinct;
    std::vector<int32_t> order(g_moe_experts);
    std::vector<double> key(g_moe_experts);
    std::iota(order.begin(), order.end(), 0);
    for (int64_t t = 0; t < T; ++t) {
      if (g_moe_skew > 0) {
        for (int64_t e = 0; e < g_moe_experts; ++e) key[e] = log_weight[e] - std::log(-std::log(uniform(g_rng)));
        std::partial_sort(order.begin(), order.begin() + kMoeK, order.end(),
                          [&](int32_t a, int32_t b) { return key[a] > key[b]; });
      } else {
        std::shuffle(order.begin(), order.end(), g_rng);
      }
      for (int64_t j = 0; j < kMoeK; ++j) {
        h_ids[t * kMoeK + j] = order[j];
        distinct.insert(order[j]);
      }
    }
    touched += static_cast<double>(distinct.size()) / count;
    TensorView iv = make(DType::kI32, {T, kMoeK}), wv = make(DType::kF32, {T, kMoeK});
    CHECK_OK(g_b->copy_from_host(iv, h_ids.data()));
    CHECK_OK(g_b->copy_from_host(wv, h_w.data()));
    ids->push_back(iv);
    weights->push_back(wv);
  }
  return touched;
}

// ---- MoE decode: 20b layer (32 experts, H = I = 2880, top-4). The default path at 1/8/64 tokens, then
// (`--moe-decode-variants`) the decode kernels' variants side by side: v1 (routing + 2 GEMMs + combine,
// moe.cu), the ring GEMMs (moe_decode.cu) at their default, at other k splits ("ktN": about N k tiles per warp;
// 6, 12, 16, 23 are 8, 4, 3, 2 warps at k = 2880) and without PDL, and each GEMM alone (kAuto's and the ring's),
// kAuto with the scales in the ring's registers (the form before session 20), session 20's kAuto (main20: 2 warps
// from 5 routed slots on), session 21's kAuto (main21: the first GEMM routed by a pass over the slots at <= 8 slots
// too), session 23's (main23: the fp4 decode's rotations at every size) and kAuto with other k tiles per warp in each
// GEMM ("auto ktA ktB"), in interleaved rounds.
void bench_moe(bool variants) {
  const int64_t E = g_moe_experts, H = kMoeH, I = kMoeI, k = kMoeK;
  const int copies = expert_copies();
  const std::vector<ExpertWeights>& experts = bench_experts();
  const double w1_bytes = 2.0 * I * H / 2 + 2.0 * I * H / 32 + 2.0 * I * 2, w2_bytes = 1.0 * H * I / 2 + 1.0 * H * I / 32 + H * 2.0;
  const double expert_bytes = w1_bytes + w2_bytes;
  struct Variant {
    CudaMoePath path;
    int k_tiles;
    bool pdl;
    int only_gemm;
    std::string label;
    bool registers = false;  // CudaMoeOptions::decode_scales_in_registers (the form before session 20)
    int k_tiles2 = 0;         // CudaMoeOptions::decode_k_tiles_gemm2
    bool main20 = false;      // session 20's kAuto: 2 warps from 5 routed slots on (decode_three_warp_slots 4)
    bool slots_route = false; // the first GEMM routed by a pass over the slots (decode_mask_route false: before s22)
    int shift_slots = 0;      // CudaMoeOptions::decode_shift_slots (-1: session 23's form, no shifts)
    int ring1 = 0;            // CudaMoeOptions::decode_ring_gemm1 (4 or 5 forces that ring)
  };
  std::vector<Variant> list{{CudaMoePath::kAuto, 0, true, 0, ""}};
  if (variants)
    list = {{CudaMoePath::kAuto, 0, true, 0, " auto"},
            {CudaMoePath::kAuto, 0, true, 0, " auto registers", true},
            {CudaMoePath::kAuto, 0, true, 1, " auto registers gemm1 only", true},
            {CudaMoePath::kAuto, 0, true, 2, " auto registers gemm2 only", true},
            {CudaMoePath::kDecodeV1, 0, true, 0, " v1"},
            {CudaMoePath::kDecode, 12, true, 0, " ring kt12"},
            {CudaMoePath::kDecode, 16, true, 0, " ring kt16"},
            {CudaMoePath::kDecode, 23, true, 0, " ring kt23"},
            {CudaMoePath::kDecode, 12, false, 0, " ring no-pdl"},
            {CudaMoePath::kDecode, 12, true, 1, " ring gemm1 only"},
            {CudaMoePath::kDecode, 12, true, 2, " ring gemm2 only"},
            {CudaMoePath::kDecode, 6, true, 1, " ring kt6 gemm1 only"},
            {CudaMoePath::kDecode, 6, true, 2, " ring kt6 gemm2 only"},
            {CudaMoePath::kDecode, 23, true, 1, " ring kt23 gemm1 only"},
            {CudaMoePath::kDecode, 23, true, 2, " ring kt23 gemm2 only"},
            {CudaMoePath::kAuto, 0, true, 1, " auto gemm1 only"},
            {CudaMoePath::kAuto, 0, true, 2, " auto gemm2 only"},
            {CudaMoePath::kAuto, 0, true, 0, " main20", false, 0, true},
            {CudaMoePath::kAuto, 23, true, 0, " auto kt23 kt16", false, 16},
            {CudaMoePath::kAuto, 16, true, 0, " auto kt16 kt23", false, 23},
            {CudaMoePath::kAuto, 0, true, 0, " main21", false, 0, false, true},
            {CudaMoePath::kAuto, 0, true, 1, " main21 gemm1 only", false, 0, false, true},
            {CudaMoePath::kAuto, 0, true, 0, " main23", false, 0, false, false, -1, 4},
            {CudaMoePath::kAuto, 0, true, 1, " main23 gemm1 only", false, 0, false, false, -1, 4},
            {CudaMoePath::kAuto, 0, true, 2, " main23 gemm2 only", false, 0, false, false, -1, 4},
            {CudaMoePath::kAuto, 0, true, 0, " auto ring4", false, 0, false, false, 0, 4},
            {CudaMoePath::kAuto, 0, true, 0, " auto ring5", false, 0, false, false, 0, 5},
            {CudaMoePath::kAuto, 0, true, 1, " auto ring5 gemm1 only", false, 0, false, false, 0, 5}};
  const std::vector<int64_t> sizes = !variants                         ? std::vector<int64_t>{1, 8, 64}
                                     : !bench_only_decode_sizes.empty() ? bench_only_decode_sizes
                                                                        : std::vector<int64_t>{1, 2, 4, 8, 16, 32};
  for (int64_t T : sizes) {
    CHECK_OK(g_b->prepare(WorkspaceSpec{T, H, I, E, k, 64, 8, 64}));
    const int routings = 6;
    std::vector<TensorView> ids, weights;
    const double touched = make_routings(T, routings, &ids, &weights);
    TensorView x = random_bf16({T, H}, 1.0f), out = make(DType::kBF16, {T, H});
    // The variants in interleaved rounds (3 with --moe-decode-variants), the median of each.
    std::vector<const Variant*> timed;
    for (const Variant& v : list)
      if (variant_selected(v.label)) timed.push_back(&v);
    const int rounds = variants ? 3 : 1;
    std::vector<std::vector<double>> us(timed.size());
    for (int round = 0; round < rounds; ++round)
      for (size_t i = 0; i < timed.size(); ++i) {
        const Variant& v = *timed[i];
        CudaMoeOptions o{v.path, 0, v.k_tiles, v.pdl, v.only_gemm};
        o.decode_scales_in_registers = v.registers;
        o.decode_k_tiles_gemm2 = v.k_tiles2;
        if (v.main20) o.decode_three_warp_slots = 4;
        o.decode_mask_route = !v.slots_route;
        o.decode_shift_slots = v.shift_slots;
        o.decode_ring_gemm1 = v.ring1;
        CHECK_OK(set_cuda_moe_options(*g_b, o));
        us[i].push_back(time_graph(24, [&](int j) {
          MoeParams p{x, ids[j % routings], weights[j % routings], &experts[j % copies], out, k, 7.0f, 1.702f};
          return g_b->moe_experts(p);
        }));
      }
    for (size_t i = 0; i < timed.size(); ++i) {
      const Variant& v = *timed[i];
      const int only = v.only_gemm;
      std::sort(us[i].begin(), us[i].end());
      const double bytes = touched * (only == 1 ? w1_bytes : only == 2 ? w2_bytes : expert_bytes);
      char spread[64];
      std::snprintf(spread, sizeof spread, ", rounds %.2f..%.2f us", us[i].front(), us[i].back());
      report("moe decode T=" + std::to_string(T) + v.label, us[i][rounds / 2], bytes, 0,
             std::to_string(static_cast<int>(touched + 0.5)) + " experts touched, " +
                 std::to_string(static_cast<int>(bytes / 1e6)) + " MB" + (rounds > 1 ? spread : ""));
    }
    CHECK_OK(set_cuda_moe_options(*g_b, {}));
    // " trace" (<= 4 routed slots): the last graph replay of kAuto with each CTA's SM and global-timer events
    // (MoeFusedParams::trace), against the first GEMM's first CTA entry; the first GEMM's SMs by their count of its
    // CTAs, and each second-GEMM CTA's entry against its SM's last first-GEMM end.
    if (variants && T * k <= 4 && variant_selected(" trace")) {
      const int64_t tiles = cuda::moe_fused_max_tiles(T * k, E), ctas1 = (2 * I / 16) * tiles, ctas2 = (H / 16) * tiles;
      const int64_t words = 8 * (ctas1 + ctas2);
      const TensorView tr = make(DType::kI64, {words});
      CHECK_OK(g_b->copy_from_host(tr, std::vector<int64_t>(static_cast<size_t>(words), 0).data()));
      CudaMoeOptions o{CudaMoePath::kAuto};
      o.decode_trace = tr.ptr<uint64_t>();
      CHECK_OK(set_cuda_moe_options(*g_b, o));
      time_graph(24, [&](int j) {
        MoeParams p{x, ids[j % routings], weights[j % routings], &experts[j % copies], out, k, 7.0f, 1.702f};
        return g_b->moe_experts(p);
      });
      CHECK_OK(set_cuda_moe_options(*g_b, {}));
      std::vector<uint64_t> h(static_cast<size_t>(words));
      CHECK_OK(g_b->copy_to_host(h.data(), tr));
      uint64_t t0 = UINT64_MAX, g1_end = 0;
      std::map<int, int> per_sm;       // first-GEMM CTAs an SM
      std::map<int, uint64_t> sm_end;  // its last first-GEMM CTA's end
      for (int64_t c = 0; c < ctas1; ++c) {
        const uint64_t* e = &h[8 * c];
        if (e[6] == 0) continue;  // CTAs past the busy tiles
        t0 = std::min(t0, e[1]);
        g1_end = std::max(g1_end, e[6]);
        ++per_sm[static_cast<int>(e[0])];
        sm_end[static_cast<int>(e[0])] = std::max(sm_end[static_cast<int>(e[0])], e[6]);
      }
      const auto at = [&](uint64_t t) { return (static_cast<double>(t) - static_cast<double>(t0)) / 1e3; };
      const auto us_between = [](uint64_t a, uint64_t b) {
        return (static_cast<double>(b) - static_cast<double>(a)) / 1e3;
      };
      const auto summary = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        char b[160];
        std::snprintf(b, sizeof b, "min %7.2f  p10 %7.2f  median %7.2f  p90 %7.2f  max %7.2f (%zu)", v.front(),
                      v[v.size() / 10], v[v.size() / 2], v[v.size() * 9 / 10], v.back(), v.size());
        return std::string(b);
      };
      const std::string tag = "trace T=" + std::to_string(T);
      std::printf("%s: first GEMM %.2f us (first entry to last end)\n", tag.c_str(), at(g1_end));
      std::map<int, std::vector<double>> end_by_count, loop_by_count;  // by the SM's first-GEMM CTAs
      for (const auto& [sm, n] : per_sm) end_by_count[n].push_back(at(sm_end[sm]));
      for (int64_t c = 0; c < ctas1; ++c) {
        const uint64_t* e = &h[8 * c];
        if (e[6] != 0)
          loop_by_count[per_sm[static_cast<int>(e[0])]].push_back(us_between(e[2], e[4]));
      }
      for (const auto& [n, v] : end_by_count)
        std::printf("%s gemm1 SMs of %2d CTAs: their last end us: %s; a CTA's routed to k loop done us: %s\n",
                    tag.c_str(), n, summary(v).c_str(), summary(loop_by_count[n]).c_str());
      const char* names[] = {"entry", "routed", "wait returned", "k loop done", "reduced", "end"};
      for (int gemm = 1; gemm <= 2; ++gemm) {
        const int64_t begin = gemm == 1 ? 0 : ctas1, end = gemm == 1 ? ctas1 : ctas1 + ctas2;
        std::vector<std::vector<double>> ev(7);
        for (int64_t c = begin; c < end; ++c) {
          const uint64_t* e = &h[8 * c];
          if (e[6] == 0) continue;
          for (int i = 1; i < 7; ++i)
            if (e[i] != 0) ev[i - 1].push_back(at(e[i]));
          if (gemm == 2) ev[6].push_back(-us_between(e[1], sm_end[static_cast<int>(e[0])]));
        }
        for (int i = 0; i < 7; ++i)
          if (!ev[i].empty())
            std::printf("%s gemm%d %-38s us: %s\n", tag.c_str(), gemm,
                        i < 6 ? names[i] : "entry - its SM's last first-GEMM end", summary(ev[i]).c_str());
      }
      std::fflush(stdout);
    }
    // " norm": the experts and the add_rms_norm after them (kAuto), as two ops and as moe_experts_add_rms_norm,
    // interleaved twice.
    if (!variants || !variant_selected(" norm")) continue;
    const TensorView residual = make(DType::kF32, {T, H}), norm_w = random_bf16({H}, 1.0f), normed = make(DType::kBF16, {T, H});
    std::vector<float> zeros(static_cast<size_t>(T * H), 0.0f);
    CHECK_OK(g_b->copy_from_host(residual, zeros.data()));
    const double bytes = touched * expert_bytes;
    for (int round = 0; round < 2; ++round)
      for (const bool fused : {false, true}) {
        const double us = time_graph(24, [&](int i) {
          MoeParams p{x, ids[i % routings], weights[i % routings], &experts[i % copies], out, k, 7.0f, 1.702f};
          if (fused) return g_b->moe_experts_add_rms_norm(p, residual, norm_w, 1e-5f, normed);
          MX_RETURN_IF_ERROR(g_b->moe_experts(p));
          return g_b->add_rms_norm(residual, out, norm_w, 1e-5f, normed);
        });
        report("moe decode T=" + std::to_string(T) + (fused ? " norm: moe_experts_add_rms_norm" : " norm: moe, add_rms_norm"),
               us, bytes, 0, std::to_string(static_cast<int>(bytes / 1e6)) + " MB");
      }
  }
}

// ---- MoE prefill: the same layer at T tokens through each expert-GEMM path: decode = swap-AB kernels
// with 8-token tiles, grouped = tokens as the mma M side in tiles of 64 or 128, wgmma = the sm_90 grouped
// GEMM in tiles of 16, 32 (narrow: two strips a warp at that MMA width), 96, 128 or 256 (falls back to
// grouped elsewhere), wgmma-ws = its warp-specialized form in
// tiles of 128 or 256, auto = what moe_experts picks. Then
// the measured bf16 rate: one dense cuBLASLt GEMM with the first expert GEMM's shape at 8192 tokens, the
// yardstick of issue 12.
void bench_moe_prefill() {
  const int64_t E = g_moe_experts, H = kMoeH, I = kMoeI, k = kMoeK;
  const std::vector<ExpertWeights>& experts = bench_experts();
  const std::vector<int64_t> sizes = bench_only_prefill_sizes.empty()
                                         ? std::vector<int64_t>{32, 64, 96, 128, 192, 256, 384, 512, 1024, 2048, 8192}
                                         : bench_only_prefill_sizes;
  std::vector<std::pair<int64_t, double>> cases;  // each size at each --moe-skew
  for (int64_t T : sizes)
    for (double skew : g_moe_skews) cases.emplace_back(T, skew);
  for (const auto& [T, skew] : cases) {
    g_moe_skew = skew;
    CHECK_OK(g_b->prepare(WorkspaceSpec{T, H, I, E, k, 64, 8, 64}));
    const int routings = 2;
    std::vector<TensorView> ids, weights;
    const double touched = make_routings(T, routings, &ids, &weights);
    TensorView x = random_bf16({T, H}, 1.0f), out = make(DType::kBF16, {T, H});
    // " +norm" variants: the next add_rms_norm's residual (f32, as the models' residual stream), weight and output.
    TensorView residual = make(DType::kF32, {T, H}), norm_w = random_bf16({H}, 1.0f), normed = make(DType::kBF16, {T, H});
    CHECK_OK(g_b->copy_from_host(residual, std::vector<float>(static_cast<size_t>(T * H), 0.0f).data()));
    const double flops = 2.0 * T * k * 3.0 * H * I;
    // The experts' bytes (fp4, scales, biases) every path reads at least once: at batched-decode sizes (16-64
    // tokens per expert) this floor is above the FLOP floor.
    const double bytes = touched * (3.0 * I * H / 2 + 3.0 * I * H / 32 + 2.0 * (2 * I + H));
    struct Variant {
      CudaMoePath path;
      int tile;
      const char* label;
      int persistent = 0;  // wgmma, 256-token tiles: 1 a persistent grid, -1 a CTA per item
      int warp_specialized = -1;  // wgmma: 1 the warp-specialized kernel (moe_wgmma_ws.cu), 0 auto's choice
      int pdl = 0;                // wgmma, the deep ring's kernel: 1 programmatic dependent launches, -1 not
      int bulk = 0;               // wgmma, 16-token tiles: 1 every k tile by the copy engine, 2 and warps' releases,
                                  // 3 and an expert's tiles paired, -1 cp.async
      int bulk_rows = 0;          // the copy engine's row copies: 0 the routed tokens' 8-row blocks, -1 whole tiles
      int glue = 0;               // tiled wgmma: 1 routing + gather in one launch, 2 and the combine in the norm, -1
                                  // neither (CudaMoeOptions::wgmma_glue; 0 its default)
      bool norm = false;          // the layer and the next add_rms_norm: moe_experts_add_rms_norm (glue 0: the
                                  // combine in the norm's kernel; -1: moe_experts, then add_rms_norm)
      int glue_only = 0;          // the glue alone, GEMMs skipped (CudaMoeOptions::wgmma_glue_only)
      int mid_width = 0;          // 96-token tiles: -1 the kernel of 96 and 48 columns (CudaMoeOptions::wgmma_mid_width)
      int wide_first = 0;         // 1 the full-width tiles numbered first, -1 expert order (CudaMoeOptions::wgmma_wide_first)
      int bulk_mid = 0;           // 96-token tiles at 64/96 columns: 1 by the copy engine, -1 cp.async (wgmma_bulk_mid)
      int bulk_wide = 0;          // 256-token tiles: 1 by the copy engine, -1 cp.async (wgmma_bulk_wide)
      int bulk_full = 0;          // 96-token tiles at 96/48 columns: 1 by the copy engine, -1 cp.async (wgmma_bulk_full)
      int two_strips = 0;         // and their tiles of <= 48 tokens: 1 two strips a warp, -1 one (wgmma_bulk_two_strips)
    };
    const Variant all[] = {
        Variant{CudaMoePath::kDecode, 0, "decode"}, Variant{CudaMoePath::kDecodeV1, 0, "decode v1"},
        Variant{CudaMoePath::kGroupedMmaSync, 64, "grouped/64"}, Variant{CudaMoePath::kGroupedMmaSync, 128, "grouped/128"},
        Variant{CudaMoePath::kGrouped, 96, "wgmma/96x2wg deep", 0, -1, -1},
        Variant{CudaMoePath::kGrouped, 96, "wgmma/96x2wg deep pdl", 0, -1, 1},
        Variant{CudaMoePath::kGrouped, 96, "wgmma/96x2wg deep pdl two-kernel routing", 0, -1, 1, 0, 0, -1},
        Variant{CudaMoePath::kGrouped, 96, "wgmma/96x2wg deep pdl full width", 0, -1, 1, 0, 0, 0, false, 0, -1},
        Variant{CudaMoePath::kGrouped, 96, "wgmma/96x2wg deep pdl +norm, combine in norm", 0, -1, 1, 0, 0, 2, true},
        Variant{CudaMoePath::kGrouped, 96, "wgmma/96x2wg deep pdl +norm, combine kernel", 0, -1, 1, 0, 0, 1, true},
        Variant{CudaMoePath::kGrouped, 96, "wgmma/96x2wg glue: routing, permute", 0, -1, 1, 0, 0, 1, false, 1},
        Variant{CudaMoePath::kGrouped, 96, "wgmma/96x2wg glue: routing, permute two-kernel", 0, -1, 1, 0, 0, -1, false,
                1},
        Variant{CudaMoePath::kGrouped, 96, "wgmma/96x2wg mid glue: routing, tiled gather", 0, -1, 1, 0, 0, 1, false, 1, 1,
                0, 1},
        Variant{CudaMoePath::kGrouped, 96, "wgmma/96x2wg mid glue: routing, permute", 0, -1, 1, 0, 0, 1, false, 1, 1, 0,
                -1},
        Variant{CudaMoePath::kGrouped, 16, "wgmma/16x2wg narrow pdl", 0, -1, 1, -1},
        Variant{CudaMoePath::kGrouped, 16, "wgmma/16x2wg narrow pdl bulk", 0, -1, 1, 1},
        Variant{CudaMoePath::kGrouped, 16, "wgmma/16x2wg narrow pdl bulk release", 0, -1, 1, 2},
        Variant{CudaMoePath::kGrouped, 16, "wgmma/16x2wg narrow pdl bulk pairs", 0, -1, 1, 3},
        Variant{CudaMoePath::kGrouped, 16, "wgmma/16x2wg narrow pdl bulk whole tiles", 0, -1, 1, 1, -1},
        Variant{CudaMoePath::kGrouped, 16, "wgmma/16x2wg narrow pdl bulk pairs two-kernel routing", 0, -1, 1, 3, 0, -1},
        Variant{CudaMoePath::kGrouped, 16, "wgmma/16x2wg narrow pdl bulk pairs +norm, combine in norm", 0, -1, 1, 3, 0, 2,
                true},
        Variant{CudaMoePath::kGrouped, 16, "wgmma/16x2wg narrow pdl bulk pairs +norm, combine kernel", 0, -1, 1, 3, 0, 1,
                true},
        Variant{CudaMoePath::kGrouped, 16, "wgmma/16x2wg narrow pdl bulk pairs two-kernel routing +norm", 0, -1, 1, 3, 0,
                -1, true},
        Variant{CudaMoePath::kGrouped, 16, "wgmma/16x2wg narrow glue: routing, gather", 0, -1, 1, 3, 0, 1, false, 1},
        Variant{CudaMoePath::kGrouped, 16, "wgmma/16x2wg narrow glue: routing, gather two-kernel", 0, -1, 1, 3, 0, -1, false,
                1},
        Variant{CudaMoePath::kGrouped, 16, "wgmma/16x2wg narrow glue: routing, gather, combine in norm", 0, -1, 1, 3, 0, 2,
                true, 2},
        Variant{CudaMoePath::kGrouped, 16, "wgmma/16x2wg narrow glue: routing, gather, combine kernel, norm", 0, -1, 1, 3, 0,
                1, true, 2},
        Variant{CudaMoePath::kGrouped, 16, "wgmma/16x2wg narrow glue: routing, gather, combine kernel, norm two-kernel", 0,
                -1, 1, 3, 0, -1, true, 2},
        Variant{CudaMoePath::kGrouped, 32, "wgmma/32x2wg narrow pdl", 0, -1, 1},
        Variant{CudaMoePath::kGrouped, 32, "wgmma/32x2wg narrow pdl bulk", 0, -1, 1, 1},
        Variant{CudaMoePath::kGrouped, 128, "wgmma/128x2wg"}, Variant{CudaMoePath::kGrouped, 256, "wgmma/256x2wg", -1},
        Variant{CudaMoePath::kGrouped, 256, "wgmma/256x2wg persistent", 1},
        Variant{CudaMoePath::kGrouped, 128, "wgmma-ws/128", 0, 1}, Variant{CudaMoePath::kGrouped, 256, "wgmma-ws/256", 0, 1},
        Variant{CudaMoePath::kAuto, 0, "auto", 0, 0},
        Variant{CudaMoePath::kAuto, 0, "auto wide first", 0, 0, 0, 0, 0, 0, false, 0, 0, 1},
        Variant{CudaMoePath::kAuto, 0, "auto expert order", 0, 0, 0, 0, 0, 0, false, 0, 0, -1},
        Variant{CudaMoePath::kAuto, 0, "auto bulk mid", 0, 0, 0, 0, 0, 0, false, 0, 0, 0, 1},
        Variant{CudaMoePath::kAuto, 0, "auto cp.async mid", 0, 0, 0, 0, 0, 0, false, 0, 0, 0, -1},
        Variant{CudaMoePath::kAuto, 0, "auto bulk mid expert order", 0, 0, 0, 0, 0, 0, false, 0, 0, -1, 1},
        Variant{CudaMoePath::kAuto, 0, "auto bulk wide", 0, 0, 0, 0, 0, 0, false, 0, 0, 0, 0, 1},
        Variant{CudaMoePath::kAuto, 0, "auto cp.async wide", 0, 0, 0, 0, 0, 0, false, 0, 0, 0, 0, -1},
        Variant{CudaMoePath::kAuto, 0, "auto bulk full", 0, 0, 0, 0, 0, 0, false, 0, 0, 0, 0, 0, 1},
        Variant{CudaMoePath::kAuto, 0, "auto cp.async full", 0, 0, 0, 0, 0, 0, false, 0, 0, 0, 0, 0, -1},
        Variant{CudaMoePath::kAuto, 0, "auto bulk full expert order", 0, 0, 0, 0, 0, 0, false, 0, 0, -1, 0, 0, 1},
        // The 96/48-column tiles on the copy engine where auto would run the 64/96-column ones (<= 96 per expert).
        Variant{CudaMoePath::kAuto, 0, "auto full width bulk", 0, 0, 0, 0, 0, 0, false, 0, -1, 0, 0, 0, 1},
        Variant{CudaMoePath::kAuto, 0, "auto one strip", 0, 0, 0, 0, 0, 0, false, 0, 0, 0, 0, 0, 0, -1},
        Variant{CudaMoePath::kAuto, 0, "auto bulk full one strip", 0, 0, 0, 0, 0, 0, false, 0, 0, 0, 0, 0, 1, -1},
        Variant{CudaMoePath::kAuto, 0, "auto full width bulk one strip", 0, 0, 0, 0, 0, 0, false, 0, -1, 0, 0, 0, 1, -1}};
    std::vector<const Variant*> timed;
    for (const Variant& v : all)
      if (variant_selected(v.label)) timed.push_back(&v);
    // About 20 ms of work per graph.
    const int n = static_cast<int>(std::clamp<int64_t>(static_cast<int64_t>(20e-3 * 300e12 / flops), 2, 24));
    // Timed in interleaved rounds (3, or --moe-rounds), the median: in one H200 window (session 15 W1) single
    // timings of the same kernel in one process spread over +-6% (218.7, 236.1 and 246.8 us for the 20b layer at
    // T=256), more than the differences measured between variants.
    const int rounds = g_moe_rounds;
    std::vector<std::vector<double>> us(timed.size());
    for (int round = 0; round < rounds; ++round)
      for (size_t i = 0; i < timed.size(); ++i) {
        const Variant& v = *timed[i];
        CudaMoeOptions o{v.path, v.tile};
        o.wgmma_persistent = v.persistent;
        o.wgmma_warp_specialized = v.warp_specialized;
        o.wgmma_pdl = v.pdl;
        o.wgmma_bulk = v.bulk;
        o.wgmma_bulk_rows = v.bulk_rows;
        o.wgmma_glue = v.glue;
        o.wgmma_glue_only = v.glue_only;
        o.wgmma_mid_width = v.mid_width;
        o.wgmma_wide_first = v.wide_first;
        o.wgmma_bulk_mid = v.bulk_mid;
        o.wgmma_bulk_wide = v.bulk_wide;
        o.wgmma_bulk_full = v.bulk_full;
        o.wgmma_bulk_two_strips = v.two_strips;
        CHECK_OK(set_cuda_moe_options(*g_b, o));
        CHECK_OK(g_b->prepare(WorkspaceSpec{T, H, I, E, k, 64, 8, 64}));  // the variant's scratch, before capture
        us[i].push_back(time_graph(n, [&](int j) {
          MoeParams p{x, ids[j % routings], weights[j % routings], &experts[j % expert_copies()], out, k, 7.0f, 1.702f};
          if (v.norm) return g_b->moe_experts_add_rms_norm(p, residual, norm_w, 1e-5f, normed);
          return g_b->moe_experts(p);
        }));
      }
    for (size_t i = 0; i < timed.size(); ++i) {
      std::sort(us[i].begin(), us[i].end());
      const double median = us[i][rounds / 2];
      char note[128];
      std::snprintf(note, sizeof note, "%.0f TFLOP/s, %.0f tokens/expert, rounds %.1f..%.1f us", flops / median / 1e6,
                    static_cast<double>(T * k) / E, us[i].front(), us[i].back());
      char skew[32] = "";
      if (g_moe_skew > 0) std::snprintf(skew, sizeof skew, "skew %.2g ", g_moe_skew);
      const std::string layer = (E == 32 ? "" : "E=" + std::to_string(E) + " ") + skew;  // 120b's layer
      report("moe prefill T=" + std::to_string(T) + " " + layer + timed[i]->label, median, bytes, flops, note);
    }
    CHECK_OK(set_cuda_moe_options(*g_b, {}));
  }
  // The bf16 yardstick for the whole sweep, or with --variants only when asked for ("bf16"): a comparison of
  // chosen variants (a device window's short run) does not need it.
  if (!variant_selected("bf16 dense")) return;
  std::vector<TensorView> w;
  for (int c = 0; c < 4; ++c) w.push_back(random_bf16({2 * I, H}, 0.02f));
  TensorView x = random_bf16({8192, H}, 1.0f), bias = random_bf16({2 * I}, 0.1f), out = make(DType::kBF16, {8192, 2 * I});
  const double us = time_graph(8, [&](int i) { return g_b->linear(x, w[i % 4], bias, out); });
  const double flops = 2.0 * 8192 * 2 * I * H;
  char note[64];
  std::snprintf(note, sizeof note, "%.0f TFLOP/s (measured bf16 rate)", flops / us / 1e6);
  report("bf16 dense 2880->5760 M=8192", us, 0, flops, note);
}

// gpt-oss's RoPE inverse frequencies (head dim 64, base 150000; no YaRN: the timing does not depend on them).
TensorView rope_inv_freq() {
  std::vector<float> freq(32);
  for (int i = 0; i < 32; ++i) freq[static_cast<size_t>(i)] = std::pow(150000.0f, -static_cast<float>(i) / 32);
  const TensorView inv_freq = make(DType::kF32, {32});
  CHECK_OK(g_b->copy_from_host(inv_freq, freq.data()));
  return inv_freq;
}

// ---- Attention: gpt-oss (64 q heads, 8 kv heads, head_dim 64) unless told otherwise, page 16.
struct AttnGeometry {
  int64_t n_q = 64, n_kv = 8, head_dim = 64;
  int64_t layers = 1;  // KV layers to rotate through (so that decode reads come from HBM, not L2)
  bool shared_kv = false;  // V is K's storage (Gemma-4's full layers)
};

struct AttnSetup {
  KvCache kv;
  BatchStaging staging;
  BatchView batch;
  TensorView q, out, sinks;
};

AttnSetup make_attention(int64_t seqs, int64_t ctx, int64_t new_tokens, const AttnGeometry& geo = {}) {
  const int64_t page = 16, pages_per_seq = (ctx + page - 1) / page;
  const std::vector<KvLayerSpec> specs(static_cast<size_t>(geo.layers), KvLayerSpec{geo.n_kv, geo.head_dim, 0, geo.shared_kv});
  const KvCacheShape shape = KvCacheShape::uniform(KvLayout::from_layers(specs), seqs * pages_per_seq, page);
  auto kv = KvCache::allocate(*g_b, shape);
  CHECK_OK(kv.is_ok() ? Status::ok() : kv.status());
  // Random K/V (never zeros). Caches past 16M values repeat one random block at rotating offsets (batch-80
  // decode caches hold ~300M values; drawing each took seconds of every run, and the timing depends on
  // addresses, not values).
  std::vector<uint16_t> host(static_cast<size_t>(kv->layer(0).k.numel()));
  std::normal_distribution<float> d(0.0f, 1.0f);
  const size_t block = std::min<size_t>(host.size(), (size_t{1} << 24) + 7);
  for (size_t i = 0; i < block; ++i) host[i] = f32_to_bf16(d(g_rng));
  for (size_t i = block; i < host.size(); ++i) host[i] = host[(i + i / block) % block];
  for (int64_t l = 0; l < geo.layers; ++l) {
    CHECK_OK(g_b->copy_from_host(kv->layer(static_cast<int>(l)).k, host.data()));
    CHECK_OK(g_b->copy_from_host(kv->layer(static_cast<int>(l)).v, host.data()));
  }
  auto staging = BatchStaging::create(*g_b, {seqs * new_tokens, seqs, pages_per_seq, seqs});
  CHECK_OK(staging.is_ok() ? Status::ok() : staging.status());
  std::vector<std::vector<int32_t>> pages(seqs), tokens(seqs, std::vector<int32_t>(new_tokens, 0));
  std::vector<BatchSequence> list;
  for (int64_t s = 0; s < seqs; ++s) {
    pages[s].resize(pages_per_seq);
    std::iota(pages[s].begin(), pages[s].end(), static_cast<int32_t>(s * pages_per_seq));
    list.push_back({tokens[s], ctx - new_tokens, pages[s], false, false});
  }
  auto batch = staging->stage(list);
  CHECK_OK(batch.is_ok() ? Status::ok() : batch.status());
  const int64_t T = seqs * new_tokens, width = geo.n_q * geo.head_dim;
  AttnSetup a{std::move(*kv), std::move(*staging), *batch, random_bf16({T, width}, 1.0f), make(DType::kBF16, {T, width}),
              random_bf16({geo.n_q}, 1.0f)};
  return a;
}

// Prefill attention, one prompt of T tokens, causal or window 128, through each prefill kernel and shape (auto
// on sm_90: the window kernel for the window, the wgmma-ws kernel's 128-key tiles causal). FLOPs count the visible (query, key) pairs only: 4 * heads * head_dim per pair.
// Bytes: Q read and O written once, K and V read once. The floor is the larger of the two: a window-128 layer's
// is its bytes (151 MB at 8K: 36 us on an H200, not its FLOPs' 22 us); a causal layer's, its FLOPs.
// "behind qkv_rope": auto's kernel as the model runs it, after the qkv_rope launch that writes its Q and K/V
// (the window kernel is its programmatic dependent): the pair's time less qkv_rope's alone.
void bench_attention_prefill(const std::vector<int64_t>& lengths) {
  CHECK_OK(g_b->prepare(WorkspaceSpec{8192, 2880, 2880, 32, 4, 64, 8, 64}));
  auto placement = cuda_placement(*g_b);
  CHECK_OK(placement.is_ok() ? Status::ok() : placement.status());
  auto dev = cuda::query_device_info(placement->device);
  CHECK_OK(dev.is_ok() ? Status::ok() : dev.status());
  const bool sm90 = cuda::choose_attention_prefill_wgmma_ws_config(*dev, 64, cuda::kAttnWsWide).enabled;
  struct Path {
    CudaAttentionPath path;
    const char* label;
  };
  const TensorView inv_freq = rope_inv_freq();
  for (int64_t T : lengths) {
    AttnSetup a = make_attention(1, T, T);
    const double bytes = 2.0 * T * 64 * 64 * 2 + 2.0 * T * 8 * 64 * 2;  // Q + O (64 heads), K + V (8 kv heads)
    const QkvRopeParams rope{.qkv = random_bf16({T, 80 * 64}, 1.0f), .q_out = a.q, .kv = a.kv.layer(0),
                             .inv_freq = inv_freq, .n_q = 64, .n_kv = 8, .head_dim = 64, .q_norm = {},
                             .k_norm = {}, .prefetch = {}};
    const double rope_us = time_graph(16, [&](int) { return g_b->qkv_rope(rope, a.batch); });
    QkvRopeParams kv_rope = rope;
    kv_rope.q_out = {};  // K and V alone: the attention rotates Q
    for (int64_t window : {0, 128}) {
      double keys = 0;
      for (int64_t t = 0; t < T; ++t) keys += static_cast<double>(window ? std::min(t + 1, window) : t + 1);
      const double flops = 4.0 * 64 * 64 * keys;
      for (const Path& path : {Path{CudaAttentionPath::kMmaSync, "mma.sync"}, Path{CudaAttentionPath::kWgmmaWs, "wgmma-ws"},
                               Path{CudaAttentionPath::kWgmmaWs64, "wgmma-ws64"}, Path{CudaAttentionPath::kAuto, "auto"},
                               Path{CudaAttentionPath::kWgmmaWindow, "wgmma-window"}}) {
        if (path.path != CudaAttentionPath::kMmaSync && path.path != CudaAttentionPath::kAuto && !sm90) continue;
        if (path.path == CudaAttentionPath::kWgmmaWindow && window == 0) continue;  // it takes window layers only
        CHECK_OK(set_cuda_attention_options(*g_b, {path.path}));
        const int n = static_cast<int>(std::clamp<double>(20e-3 * 200e12 / flops, 2, 64));  // ~20 ms per graph
        const double us = time_graph(n, [&](int) {
          AttentionParams p{a.q, a.kv.layer(0), a.sinks, a.out, 64, 8, 64, window, 0.125f};
          return g_b->attention(p, a.batch);
        });
        char note[64];
        std::snprintf(note, sizeof note, "%.0f TFLOP/s", flops / us / 1e6);
        report("prefill attention " + std::to_string(T / 1024) + "K " + (window ? "window 128 " : "causal ") + path.label,
               us, bytes, flops, note);
        if (path.path != CudaAttentionPath::kAuto) continue;
        const double pair_us = time_graph(n, [&](int) -> Status {
          MX_RETURN_IF_ERROR(g_b->qkv_rope(rope, a.batch));
          AttentionParams p{a.q, a.kv.layer(0), a.sinks, a.out, 64, 8, 64, window, 0.125f};
          return g_b->attention(p, a.batch);
        });
        std::snprintf(note, sizeof note, "pair %.2f us, qkv_rope alone %.2f us", pair_us, rope_us);
        report("prefill attention " + std::to_string(T / 1024) + "K " + (window ? "window 128 " : "causal ") +
                   "auto behind qkv_rope",
               pair_us - rope_us, bytes, flops, note);
        // RoPE for Q in the attention (q the q|k|v projection; qkv_rope writes K and V alone): alone.
        AttentionParams pr{rope.qkv, a.kv.layer(0), a.sinks, a.out, 64, 8, 64, window, 0.125f, inv_freq, 1.0f};
        const double rq_us = time_graph(n, [&](int) { return g_b->attention(pr, a.batch); });
        report("prefill attention " + std::to_string(T / 1024) + "K " + (window ? "window 128 " : "causal ") +
                   "auto rope-q",
               rq_us, bytes, flops);
        // The pairs as the model runs them, qkv_rope then the attention: Q written and read back, or K and V
        // alone and Q rotated in the attention's load; 3 interleaved rounds (a causal pair takes ~1.3 ms, and the
        // clocks drift over a run).
        const std::string pair_label =
            "prefill attention " + std::to_string(T / 1024) + "K " + (window ? "window 128 " : "causal ") + "pair ";
        for (int round = 0; round < 3; ++round) {
          const double two_us = time_graph(n, [&](int) -> Status {
            MX_RETURN_IF_ERROR(g_b->qkv_rope(rope, a.batch));
            AttentionParams p{a.q, a.kv.layer(0), a.sinks, a.out, 64, 8, 64, window, 0.125f};
            return g_b->attention(p, a.batch);
          });
          const double fused_us = time_graph(n, [&](int) -> Status {
            MX_RETURN_IF_ERROR(g_b->qkv_rope(kv_rope, a.batch));
            return g_b->attention(pr, a.batch);
          });
          report(pair_label + "q written r" + std::to_string(round), two_us, bytes, flops);
          report(pair_label + "rope-q r" + std::to_string(round), fused_us, bytes, flops);
        }
      }
    }
  }
  CHECK_OK(set_cuda_attention_options(*g_b, {}));
}

// `--attention-window-forms[=T,T,...]` (8K if none): the RoPE-for-Q rows as the model runs them, one prompt of T
// tokens, for each kernel form of MX_BENCH_WINDOW_FORMS (comma-separated forms, each environment settings
// joined by '+', e.g. MX_ATTN_WINDOW_ROPE=consumer+MX_ATTN_WINDOW_STAGGER=2000; "-" sets none; every variable a
// form names is unset before the next form's settings, which apply to the graphs captured after them) in
// MX_BENCH_ROUNDS (3) interleaved rounds: the window-128 kernel rotating Q alone, its pair behind the K/V-only
// qkv_rope, the causal pair likewise (not with MX_BENCH_NO_CAUSAL set), and the window kernel reading a written Q
// (a control). For comparing kernel forms within one binary and between two.
void bench_attention_window_forms(const std::vector<int64_t>& lengths) {
  CHECK_OK(g_b->prepare(WorkspaceSpec{8192, 2880, 2880, 32, 4, 64, 8, 64}));
  auto split = [](const std::string& text, char sep) {
    std::vector<std::string> parts;
    for (size_t at = 0; at <= text.size();) {
      const size_t next = std::min(text.find(sep, at), text.size());
      parts.push_back(text.substr(at, next - at));
      at = next + 1;
    }
    return parts;
  };
  const char* forms_env = std::getenv("MX_BENCH_WINDOW_FORMS");
  const std::vector<std::string> forms = split(forms_env != nullptr ? forms_env : "-", ',');
  std::set<std::string> names;
  for (const std::string& form : forms)
    for (const std::string& set : split(form, '+'))
      if (set.find('=') != std::string::npos) names.insert(set.substr(0, set.find('=')));
  auto apply = [&](const std::string& form) {
    for (const std::string& name : names) unsetenv(name.c_str());
    for (const std::string& set : split(form, '+'))
      if (set.find('=') != std::string::npos)
        setenv(set.substr(0, set.find('=')).c_str(), set.substr(set.find('=') + 1).c_str(), 1);
  };
  const char* rounds_env = std::getenv("MX_BENCH_ROUNDS");
  const int rounds = rounds_env != nullptr ? std::max(1, std::atoi(rounds_env)) : 3;
  const TensorView inv_freq = rope_inv_freq();
  for (int64_t T : lengths) {
    AttnSetup a = make_attention(1, T, T);
    const double bytes = 2.0 * T * 64 * 64 * 2 + 2.0 * T * 8 * 64 * 2;
    const QkvRopeParams rope{.qkv = random_bf16({T, 80 * 64}, 1.0f), .q_out = a.q, .kv = a.kv.layer(0),
                             .inv_freq = inv_freq, .n_q = 64, .n_kv = 8, .head_dim = 64, .q_norm = {},
                             .k_norm = {}, .prefetch = {}};
    QkvRopeParams kv_rope = rope;
    kv_rope.q_out = {};
    CHECK_OK(g_b->qkv_rope(rope, a.batch));  // Q, K and V written once (the control reads this Q)
    const std::string len = std::to_string(T / 1024) + "K ";
    for (int round = 0; round < rounds; ++round)
      for (const std::string& form : forms) {
        apply(form);
        const std::string tag = " " + form + " r" + std::to_string(round);
        for (int64_t window : {int64_t{128}, int64_t{0}}) {
          if (window == 0 && std::getenv("MX_BENCH_NO_CAUSAL") != nullptr) continue;
          double keys = 0;
          for (int64_t t = 0; t < T; ++t) keys += static_cast<double>(window ? std::min(t + 1, window) : t + 1);
          const double flops = 4.0 * 64 * 64 * keys;
          const int n = static_cast<int>(std::clamp<double>(20e-3 * 200e12 / flops, 2, 64));
          const std::string kind = window ? "window 128 " : "causal ";
          AttentionParams pr{rope.qkv, a.kv.layer(0), a.sinks, a.out, 64, 8, 64, window, 0.125f, inv_freq, 1.0f};
          if (window) {
            const double alone = time_graph(n, [&](int) { return g_b->attention(pr, a.batch); });
            report("attention " + len + kind + "rope-q alone" + tag, alone, bytes, flops);
            AttentionParams pw{a.q, a.kv.layer(0), a.sinks, a.out, 64, 8, 64, window, 0.125f};
            const double written = time_graph(n, [&](int) { return g_b->attention(pw, a.batch); });
            report("attention " + len + kind + "q written alone" + tag, written, bytes, flops);
          }
          const double pair = time_graph(n, [&](int) -> Status {
            MX_RETURN_IF_ERROR(g_b->qkv_rope(kv_rope, a.batch));
            return g_b->attention(pr, a.batch);
          });
          report("attention " + len + kind + "rope-q pair" + tag, pair, bytes, flops);
        }
      }
    apply("-");
  }
}

// qkv_rope (`--qkv-rope-only[=T,T,...]`): one prompt of T tokens of gpt-oss (64 q / 8 kv heads, head dim 64) into a
// paged cache, the decode form (per-(token, head group) CTAs), the many-token form in CTA shapes (tokens per CTA x
// 16-byte runs per thread) and the default; bytes = qkv read + q, k, v written. Each also with the window-128
// attention behind it, its programmatic dependent, as the model runs them (the row: the pair less qkv_rope alone).
// 3 interleaved rounds.
void bench_qkv_rope(const std::vector<int64_t>& lengths) {
  CHECK_OK(g_b->prepare(WorkspaceSpec{8192, 2880, 2880, 32, 4, 64, 8, 64}));
  struct Form {
    CudaRopeOptions options;
    const char* label;
  };
  const Form forms[] = {{{INT64_MAX}, "decode form"}, {{1, 1, 2}, "stream 1 tok x 2"}, {{1, 2, 4}, "stream 2 tok x 4"},
                        {{}, "default"}};
  const TensorView inv_freq = rope_inv_freq();
  for (int64_t T : lengths) {
    AttnSetup a = make_attention(1, T, T);
    const QkvRopeParams rope{.qkv = random_bf16({T, 80 * 64}, 1.0f), .q_out = a.q, .kv = a.kv.layer(0),
                             .inv_freq = inv_freq, .n_q = 64, .n_kv = 8, .head_dim = 64, .q_norm = {},
                             .k_norm = {}, .prefetch = {}};
    const int n = static_cast<int>(std::clamp<int64_t>(8 * 8192 / T, 8, 64));
    for (int round = 0; round < 3; ++round)
      for (const Form& f : forms) {
        CHECK_OK(set_cuda_rope_options(*g_b, f.options));
        const double us = time_graph(n, [&](int) { return g_b->qkv_rope(rope, a.batch); });
        const std::string label = std::to_string(T) + " " + f.label + " r" + std::to_string(round);
        report("qkv_rope " + label, us, 2.0 * T * 80 * 64 * 2, 0);
        const double pair_us = time_graph(n, [&](int) -> Status {
          MX_RETURN_IF_ERROR(g_b->qkv_rope(rope, a.batch));
          AttentionParams p{a.q, a.kv.layer(0), a.sinks, a.out, 64, 8, 64, 128, 0.125f};
          return g_b->attention(p, a.batch);
        });
        char note[128];
        std::snprintf(note, sizeof note, "pair %.2f us, qkv_rope alone %.2f us", pair_us, us);
        report("window 128 behind qkv_rope " + label, pair_us - us, 2.0 * T * 64 * 64 * 2 + 2.0 * T * 8 * 64 * 2, 0,
               note);
        if (&f != &forms[std::size(forms) - 1]) continue;
        // The default form writing K and V alone, the window attention rotating Q in its Q load: the pair
        // against the pair above (bytes: qkv's K and V read, K and V written).
        QkvRopeParams kv_rope = rope;
        kv_rope.q_out = {};
        const double kv_us = time_graph(n, [&](int) { return g_b->qkv_rope(kv_rope, a.batch); });
        report("qkv_rope " + std::to_string(T) + " kv-only r" + std::to_string(round), kv_us, 4.0 * T * 8 * 64 * 2, 0);
        AttentionParams pr{rope.qkv, a.kv.layer(0), a.sinks, a.out, 64, 8, 64, 128, 0.125f, inv_freq, 1.0f};
        const double kv_pair_us = time_graph(n, [&](int) -> Status {
          MX_RETURN_IF_ERROR(g_b->qkv_rope(kv_rope, a.batch));
          return g_b->attention(pr, a.batch);
        });
        std::snprintf(note, sizeof note, "pair %.2f us (two-op pair %.2f), kv-only qkv_rope alone %.2f us", kv_pair_us,
                      pair_us, kv_us);
        report("window 128 rope-q behind kv-only qkv_rope " + std::to_string(T) + " r" + std::to_string(round),
               kv_pair_us - kv_us, 2.0 * T * 64 * 64 * 2 + 2.0 * T * 8 * 64 * 2, 0, note);
      }
  }
  CHECK_OK(set_cuda_rope_options(*g_b, {}));
}

// gpt-oss decode attention (64 q / 8 kv heads, head dim 64, sinks), each decode kernel (attention.cu's split-KV
// mma.sync kernel and the swap-AB one): batch x context on a full layer, and the serving batch on a window-128
// layer; rotating over KV layers worth >= 150 MB so reads come from HBM. Bytes = the K and V a step reads.
// `only_batches`: just the rows of these batch sizes (empty: every row).
void bench_attention_decode(const std::vector<int64_t>& only_batches = {}) {
  CHECK_OK(g_b->prepare(WorkspaceSpec{8192, 2880, 2880, 32, 4, 64, 8, 64}));
  struct Shape {
    int64_t ctx, seqs, window;
  };
  const std::pair<CudaAttentionDecode, const char*> paths[] = {{CudaAttentionDecode::kMmaSync, "mma.sync"},
                                                               {CudaAttentionDecode::kSwapAb, "swap AB"}};
  for (const Shape& sh : {Shape{1024, 1, 0}, Shape{8192, 1, 0}, Shape{32768, 1, 0}, Shape{1024, 32, 0}, Shape{8192, 8, 0},
                          Shape{32768, 2, 0}, Shape{1024, 64, 0}, Shape{1536, 128, 0}, Shape{1536, 256, 0},
                          Shape{1536, 256, 128}}) {
    if (!only_batches.empty() && std::find(only_batches.begin(), only_batches.end(), sh.seqs) == only_batches.end()) continue;
    AttnGeometry geo;
    const double layer_bytes = static_cast<double>(sh.seqs) * sh.ctx * geo.n_kv * geo.head_dim * 2 * 2;
    geo.layers = std::clamp<int64_t>(static_cast<int64_t>(std::ceil(150e6 / layer_bytes)), 1, 16);
    AttnSetup a = make_attention(sh.seqs, sh.ctx, 1, geo);
    const int64_t keys = sh.window ? std::min(sh.ctx, sh.window) : sh.ctx;
    const double bytes = static_cast<double>(sh.seqs) * keys * geo.n_kv * geo.head_dim * 2 * 2;
    for (const auto& [path, label] : paths) {
      CHECK_OK(set_cuda_attention_options(*g_b, {CudaAttentionPath::kAuto, path}));
      const double us = time_graph(48, [&](int i) {
        AttentionParams p{a.q, a.kv.layer(i % static_cast<int>(geo.layers)), a.sinks, a.out, 64, 8, 64, sh.window, 0.125f};
        return g_b->attention(p, a.batch);
      });
      char note[96];
      std::snprintf(note, sizeof note, "%d MB KV, %.0f GB/s", static_cast<int>(bytes / 1e6), bytes / us / 1e3);
      report("decode attention ctx=" + std::to_string(sh.ctx) + " batch=" + std::to_string(sh.seqs) +
                 (sh.window ? " window " + std::to_string(sh.window) : std::string()) + " " + label,
             us, bytes, 0, note);
    }
  }
  CHECK_OK(set_cuda_attention_options(*g_b, {}));
}

// gpt-oss's decode attention behind its producer (`--attention-decode-pair[=B,B,...]`, batches 1 and 8 if none):
// qkv_rope (one token a sequence) then attention.cu's decode kernel on a full and a window-128 layer at 1K context,
// its keys of earlier steps copied before its PDL wait (AttentionKernelParams::keys_before_wait) or every copy after
// it; rotating over 16 KV layers so reads come from HBM. Rows: the attention alone (48 launches in a graph) and
// behind qkv_rope (the pair less qkv_rope alone), 3 interleaved rounds.
void bench_attention_decode_pair(const std::vector<int64_t>& batches) {
  CHECK_OK(g_b->prepare(WorkspaceSpec{8192, 2880, 2880, 32, 4, 64, 8, 64}));
  const TensorView inv_freq = rope_inv_freq();
  for (int64_t seqs : batches) {
    AttnGeometry geo;
    geo.layers = 16;
    AttnSetup a = make_attention(seqs, 1024, 1, geo);
    const QkvRopeParams rope{.qkv = random_bf16({seqs, 80 * 64}, 1.0f), .q_out = a.q, .kv = a.kv.layer(0),
                             .inv_freq = inv_freq, .n_q = 64, .n_kv = 8, .head_dim = 64, .q_norm = {},
                             .k_norm = {}, .prefetch = {}};
    auto layer = [&](int i) { return a.kv.layer(i % static_cast<int>(geo.layers)); };
    const double qkv_us = time_graph(48, [&](int i) {
      QkvRopeParams r = rope;
      r.kv = layer(i);
      return g_b->qkv_rope(r, a.batch);
    });
    for (int round = 0; round < 3; ++round)
      for (int64_t window : {int64_t{0}, int64_t{128}})
        for (bool before : {false, true}) {
          CudaAttentionOptions o;
          o.keys_before_wait = before;
          CHECK_OK(set_cuda_attention_options(*g_b, o));
          auto attention = [&](int i) {
            AttentionParams p{a.q, layer(i), a.sinks, a.out, 64, 8, 64, window, 0.125f};
            return g_b->attention(p, a.batch);
          };
          const double alone = time_graph(48, attention);
          const double pair = time_graph(48, [&](int i) -> Status {
            QkvRopeParams r = rope;
            r.kv = layer(i);
            MX_RETURN_IF_ERROR(g_b->qkv_rope(r, a.batch));
            return attention(i);
          });
          const std::string label = "decode attention batch=" + std::to_string(seqs) +
                                    (window ? " window 128" : " full 1K") +
                                    (before ? " keys before wait" : " keys after wait") + " r" + std::to_string(round);
          const double bytes = static_cast<double>(seqs) * (window ? 128 : 1024) * 8 * 64 * 2 * 2;
          report(label + " alone", alone, bytes, 0);
          char note[96];
          std::snprintf(note, sizeof note, "pair %.2f us, qkv_rope alone %.2f us", pair, qkv_us);
          report(label + " behind qkv_rope", pair - qkv_us, bytes, 0, note);
        }
  }
  CHECK_OK(set_cuda_attention_options(*g_b, {}));
}

void bench_attention() {
  bench_attention_decode();
  bench_attention_prefill({1024, 4096, 8192});
}

// Gemma-4 26B-A4B attention (issue 15): sliding layers (16 q / 8 kv heads, head dim 256, window 1024) and
// full layers (16 q / 2 kv heads, head dim 512, V in K's storage), no sinks, scale 1.0. Prefill: one prompt of
// 1K/4K/8K tokens (FLOPs of the visible pairs), through attention.cu's mma.sync kernel and (sm_90) the
// wide-head wgmma kernel, timed in interleaved rounds (the median of 3). Decode: batch x context, rotating over
// KV layers worth >= 150 MB so reads come from HBM; bytes = the K and V a step must read (the window's at most
// on sliding layers).
void bench_attention_gemma_decode(const std::vector<int64_t>& only_batches = {}, bool once = false);
void bench_attention_gemma_prefill(const std::vector<int64_t>& lengths) {
  CHECK_OK(g_b->prepare(WorkspaceSpec{8192, 2816, 704, 128, 8, 16, 8, 512}));
  auto placement = cuda_placement(*g_b);
  CHECK_OK(placement.is_ok() ? Status::ok() : placement.status());
  auto dev = cuda::query_device_info(placement->device);
  CHECK_OK(dev.is_ok() ? Status::ok() : dev.status());
  const bool sm90 = cuda::choose_attention_wide_wgmma_config(*dev, 256, false).enabled;
  struct Layer {
    const char* name;
    AttnGeometry geo;
    int64_t window;
  };
  // Full layers with V apart too: the wide-head kernel's other 512 shape (32-key tiles of K and V).
  const Layer kinds[] = {{"sliding hd256 w1024", {16, 8, 256, 1}, 1024},
                         {"full hd512", {16, 2, 512, 1, true}, 0},
                         {"full hd512 V apart", {16, 2, 512, 1, false}, 0}};
  std::vector<std::pair<CudaAttentionPath, const char*>> paths;
  for (const auto& path : {std::pair{CudaAttentionPath::kMmaSync, " mma.sync"}, std::pair{CudaAttentionPath::kWgmmaWide, " wgmma-wide"}})
    if ((sm90 || path.first == CudaAttentionPath::kMmaSync) && variant_selected(path.second)) paths.push_back(path);
  const size_t n_paths = paths.size();
  for (int64_t T : lengths)
    for (const Layer& k : kinds) {
      AttnSetup a = make_attention(1, T, T, k.geo);
      double keys = 0;
      for (int64_t t = 0; t < T; ++t) keys += static_cast<double>(k.window ? std::min(t + 1, k.window) : t + 1);
      const double flops = 4.0 * k.geo.n_q * k.geo.head_dim * keys;
      const int n = static_cast<int>(std::clamp<double>(20e-3 * 200e12 / flops, 2, 64));  // ~20 ms per graph
      constexpr int kRounds = 3;
      std::vector<std::vector<double>> us(n_paths);
      for (int round = 0; round < kRounds; ++round)
        for (size_t i = 0; i < n_paths; ++i) {
          CHECK_OK(set_cuda_attention_options(*g_b, {paths[i].first}));
          us[i].push_back(time_graph(n, [&](int) {
            AttentionParams p{a.q, a.kv.layer(0), TensorView{}, a.out, k.geo.n_q, k.geo.n_kv, k.geo.head_dim, k.window, 1.0f};
            return g_b->attention(p, a.batch);
          }));
        }
      for (size_t i = 0; i < n_paths; ++i) {
        std::sort(us[i].begin(), us[i].end());
        const double median = us[i][kRounds / 2];
        char note[96];
        std::snprintf(note, sizeof note, "%.0f TFLOP/s, rounds %.1f..%.1f us", flops / median / 1e6, us[i].front(),
                      us[i].back());
        report("gemma prefill " + std::to_string(T / 1024) + "K " + k.name + paths[i].second, median, 0, flops, note);
      }
    }
  CHECK_OK(set_cuda_attention_options(*g_b, {}));
}
void bench_attention_gemma() {
  bench_attention_gemma_prefill({1024, 4096, 8192});
  bench_attention_gemma_decode();
}

// Gemma-4 decode attention, each kernel (attention.cu's split-KV mma.sync kernel and the swap-AB one):
// batch x context, rotating over KV layers worth >= 150 MB so reads come from HBM; full layers store V as
// K (one read). Bytes = the K and V a step must read (the window's at most on sliding layers).
// `once`: the clustered rows only (keys before and after the PDL wait), one eager launch each, nothing timed: for a
// profiler's kernel filter (sliding, then full layers).
void bench_attention_gemma_decode(const std::vector<int64_t>& only_batches, bool once) {
  CHECK_OK(g_b->prepare(WorkspaceSpec{8192, 2816, 704, 128, 8, 16, 8, 512}));
  struct Layer {
    const char* name;
    AttnGeometry geo;
    int64_t window;
  };
  // The model stores a full layer's V beside its K (V is the k projection under a weightless norm, K the
  // normed and rotated one), as the memory plan's 225,280 bytes per token count: no layer reads V from K's bytes.
  const Layer kinds[] = {{"sliding hd256 w1024", {16, 8, 256, 1, false}, 1024}, {"full hd512", {16, 2, 512, 1, false}, 0}};
  // The clustered kernel also with every key copy after its PDL wait (CudaAttentionOptions::keys_before_wait off).
  struct Path {
    CudaAttentionDecode decode;
    bool keys_before_wait;
    const char* label;
  };
  const Path paths[] = {{CudaAttentionDecode::kMmaSync, true, "mma.sync"},
                        {CudaAttentionDecode::kSwapAb, true, "swap AB"},
                        {CudaAttentionDecode::kSwapAbCluster, true, "swap AB cluster"},
                        {CudaAttentionDecode::kSwapAbCluster, false, "swap AB cluster keys late"}};
  for (auto [ctx, seqs] : std::vector<std::pair<int64_t, int64_t>>{
           {1024, 1}, {1024, 2}, {1024, 4}, {1024, 8}, {1024, 16}, {1024, 64}, {1024, 80}, {1024, 100}, {2048, 80}, {8192, 1},
           {8192, 8}}) {
    if (!only_batches.empty() && (ctx != 1024 || std::find(only_batches.begin(), only_batches.end(), seqs) == only_batches.end()))
      continue;
    for (Layer k : kinds) {
      const int64_t keys = k.window ? std::min(ctx, k.window) : ctx;
      const double stored = k.geo.shared_kv ? 1 : 2;
      const double layer_bytes = static_cast<double>(seqs) * ctx * k.geo.n_kv * k.geo.head_dim * 2 * stored;
      k.geo.layers = std::clamp<int64_t>(static_cast<int64_t>(std::ceil(150e6 / layer_bytes)), 1, 16);
      AttnSetup a = make_attention(seqs, ctx, 1, k.geo);
      const double bytes = static_cast<double>(seqs) * keys * k.geo.n_kv * k.geo.head_dim * 2 * stored;
      for (const Path& path : paths) {
        CudaAttentionOptions o{CudaAttentionPath::kAuto, path.decode};
        o.keys_before_wait = path.keys_before_wait;
        CHECK_OK(set_cuda_attention_options(*g_b, o));
        auto op = [&](int i) {
          AttentionParams p{a.q, a.kv.layer(i % static_cast<int>(k.geo.layers)), TensorView{}, a.out, k.geo.n_q, k.geo.n_kv,
                            k.geo.head_dim, k.window, 1.0f};
          return g_b->attention(p, a.batch);
        };
        if (once) {
          if (path.decode != CudaAttentionDecode::kSwapAbCluster) continue;
          CHECK_OK(op(0));
          CHECK_OK(g_b->synchronize());
          continue;
        }
        const std::string label = path.label;
        const double us = time_graph(48, op);
        char note[96];
        std::snprintf(note, sizeof note, "%d MB KV, %.0f GB/s", static_cast<int>(bytes / 1e6), bytes / us / 1e3);
        report("gemma decode " + std::string(k.name) + " ctx=" + std::to_string(ctx) + " b=" + std::to_string(seqs) + " " +
                   label,
               us, bytes, 0, note);
      }
    }
  }
  CHECK_OK(set_cuda_attention_options(*g_b, {}));
}

// ---- Dense linears at decode sizes: the skinny kernel (M <= 16) against cuBLASLt on the same shapes, then the
// skinny kernel on FP8 weights (`fp8_only`: just those rows).
void bench_linear_skinny(bool fp8_only) {
  struct Shape3 {
    const char* name;
    int64_t n, k;
    int copies;
  };
  // The EAGLE-3 draft's qkv reads the [embedding, hidden] pair: K = 2 x 2880.
  for (const Shape3& s : {Shape3{"qkv 2880->5120", 5120, 2880, 8}, Shape3{"o_proj 4096->2880", 2880, 4096, 8},
                          Shape3{"eagle3 qkv 5760->5120", 5120, 5760, 4}, Shape3{"lm_head 2880->201088", 201088, 2880, 1}}) {
    std::vector<TensorView> w;
    for (int c = 0; c < s.copies && !fp8_only; ++c) w.push_back(random_bf16({s.n, s.k}, 0.02f));
    const bool head = s.n == 201088;
    TensorView bias = head ? TensorView() : random_bf16({s.n}, 0.1f);
    for (int64_t m : fp8_only ? std::vector<int64_t>{} : std::vector<int64_t>{1, 2, 4, 8, 16}) {
      TensorView x = random_bf16({m, s.k}, 1.0f);
      TensorView out = make(head ? DType::kF32 : DType::kBF16, {m, s.n});
      // (max rows, k splits, chunks in flight): linear()'s choice, the skinny kernel forced, cuBLASLt, and
      // at one row the skinny kernel's variants.
      struct Variant {
        const char* name;
        int max_rows, k_splits, chunks;
      };
      std::vector<Variant> variants = {{" auto", -1, 0, 0}, {" skinny", 16, 0, 0}, {" cublaslt", 0, 0, 0}};
      if (m == 1 && !head) {
        variants.push_back({" skinny 8-chunk", 16, 0, 8});
        variants.push_back({" skinny k/2", 16, 2, 0});
        variants.push_back({" skinny k/4", 16, 4, 0});
      }
      for (const Variant& v : variants) {
        CHECK_OK(set_cuda_skinny_linear_options(*g_b, {v.max_rows, v.k_splits, v.chunks}));
        auto op = [&](int i) { return g_b->linear(x, w[i % s.copies], bias, out); };
        CHECK_OK(op(0));  // sizes the k-split scratch outside the graph
        const double us = time_graph(head ? 10 : 40, op);
        const double bytes = 2.0 * s.n * s.k + 2.0 * m * s.k + (head ? 4.0 : 2.0) * m * s.n;
        char note[64];
        std::snprintf(note, sizeof note, "%.0f GB/s", bytes / us / 1e3);
        report(std::string(s.name) + " M=" + std::to_string(m) + v.name, us, bytes, 2.0 * m * s.n * s.k, note);
      }
      CHECK_OK(set_cuda_skinny_linear_options(*g_b, {}));
    }
    // --dense-dtype fp8's weights (random e4m3 codes with the lowest bit clear: no NaN, 0x7f / 0xff; one f32
    // scale per row): the skinny kernel at decode sizes, half the weight bytes of the rows above.
    std::vector<TensorView> w8;
    std::vector<uint32_t> codes(static_cast<size_t>(s.n * s.k / 4));
    for (int c = 0; c < s.copies; ++c) {
      for (auto& v : codes) v = static_cast<uint32_t>(g_rng()) & 0xfefefefeu;
      w8.push_back(make(DType::kF8E4M3, {s.n, s.k}));
      CHECK_OK(g_b->copy_from_host(w8.back(), codes.data()));
    }
    std::vector<float> host_scale(static_cast<size_t>(s.n), 1.0f / 448);
    TensorView scale = make(DType::kF32, {s.n});
    CHECK_OK(g_b->copy_from_host(scale, host_scale.data()));
    // 16-row strips against 11-row ones (bf16's choice at o_proj's 2880 rows; FP8's since fp8_even_strips), interleaved.
    for (int64_t m : {1, 8, 16}) {
      TensorView x = random_bf16({m, s.k}, 1.0f);
      TensorView out = make(head ? DType::kF32 : DType::kBF16, {m, s.n});
      auto op = [&](int i) { return g_b->linear_fp8(x, w8[i % s.copies], scale, bias, out); };
      for (int round = 0; round < (head ? 1 : 2); ++round)
        for (const int rows : {16, 11}) {
          CudaSkinnyLinearOptions so;
          so.strip_rows = rows;
          CHECK_OK(set_cuda_skinny_linear_options(*g_b, so));
          CHECK_OK(op(0));
          const double us = time_graph(head ? 10 : 40, op);
          const double bytes = 1.0 * s.n * s.k + 4.0 * s.n + 2.0 * m * s.k + (head ? 4.0 : 2.0) * m * s.n;
          char note[64];
          std::snprintf(note, sizeof note, "%.0f GB/s", bytes / us / 1e3);
          report(std::string(s.name) + " M=" + std::to_string(m) + " fp8" + (rows == 11 ? " 11-row strips" : ""), us, bytes,
                 2.0 * m * s.n * s.k, note);
        }
      CHECK_OK(set_cuda_skinny_linear_options(*g_b, {}));
    }
  }
}

// ---- Gemma-4 26B-A4B's dense linears at one token (issue 15, batch-1 TPOT): linear()'s choice against the
// skinny kernel forced, its k splits and cuBLASLt, weights from HBM (copies rotated past the L2). Sliding
// layers' q|k|v is 512 strips of 16 rows, full layers' 640: between one wave of skinny CTAs (264 on an H200)
// and kSkinnyLinearManyWaves, so linear() gives them to cuBLASLt.
void bench_gemma_dense() {
  struct Shape3 {
    const char* name;
    int64_t n, k;
  };
  for (const Shape3& s : {Shape3{"gemma qkv sliding 2816->8192", 8192, 2816}, Shape3{"gemma qkv full 2816->10240", 10240, 2816},
                          Shape3{"gemma o sliding 4096->2816", 2816, 4096}, Shape3{"gemma o full 8192->2816", 2816, 8192},
                          Shape3{"gemma mlp gate|up 2816->4224", 4224, 2816}, Shape3{"gemma mlp down 2112->2816", 2816, 2112},
                          Shape3{"gemma lm_head 2816->262144", 262144, 2816},
                          Shape3{"gpt-oss o_proj 4096->2880", 2880, 4096}}) {
    if (!variant_selected(s.name)) continue;
    const bool head = s.n == 262144;
    const double weight_bytes = 2.0 * s.n * s.k;
    const int copies = head ? 1 : static_cast<int>(std::max(2.0, std::ceil(128e6 / weight_bytes)));
    std::vector<TensorView> w;
    for (int c = 0; c < copies; ++c) w.push_back(random_bf16({s.n, s.k}, 0.02f));
    TensorView x = random_bf16({1, s.k}, 1.0f), out = make(head ? DType::kF32 : DType::kBF16, {1, s.n});
    struct Variant {
      const char* name;
      int max_rows, k_splits, strip_rows;
    };
    // skinny: the default's strips (skinny_linear_strip_rows); then 16-row strips (the default before it) and 12.
    for (const Variant& v : {Variant{" auto", -1, 0, 0}, Variant{" skinny", 16, 0, 0},
                             Variant{" skinny 16-row strips", 16, 0, 16}, Variant{" skinny 12-row strips", 16, 0, 12},
                             Variant{" skinny k/2", 16, 2, 0}, Variant{" cublaslt", 0, 0, 0}}) {
      if (head && (v.k_splits > 0 || v.strip_rows > 0)) continue;
      CHECK_OK(set_cuda_skinny_linear_options(*g_b, {v.max_rows, v.k_splits, 0, v.strip_rows}));
      auto op = [&](int i) { return g_b->linear(x, w[i % copies], TensorView(), out); };
      CHECK_OK(op(0));  // sizes the k-split scratch outside the graph
      const double us = time_graph(head ? 10 : 40, op);
      char note[64];
      std::snprintf(note, sizeof note, "%.0f GB/s", weight_bytes / us / 1e3);
      report(std::string(s.name) + " M=1" + v.name, us, weight_bytes, 2.0 * s.n * s.k, note);
    }
    CHECK_OK(set_cuda_skinny_linear_options(*g_b, {}));
  }
}

// ---- The FP8 lm_head (201088 x 2880) at 1 to 8 tokens, the skinny kernel against the staged one
// (CudaSkinnyLinearOptions::fp8_staged_head_rows), interleaved twice. `once`: one eager call per form at one token
// (under Nsight Compute: the skinny kernel's launch, then the staged one).
void bench_lm_head_staged(bool once) {
  const int64_t n = 201088, k = 2880;
  std::vector<uint32_t> codes(static_cast<size_t>(n * k / 4));
  for (auto& v : codes) v = static_cast<uint32_t>(g_rng()) & 0xfefefefeu;  // no NaN (0x7f / 0xff)
  TensorView w8 = make(DType::kF8E4M3, {n, k});
  CHECK_OK(g_b->copy_from_host(w8, codes.data()));
  std::vector<float> host_scale(static_cast<size_t>(n), 1.0f / 448);
  TensorView scale = make(DType::kF32, {n});
  CHECK_OK(g_b->copy_from_host(scale, host_scale.data()));
  for (int64_t m : once ? std::vector<int64_t>{1} : std::vector<int64_t>{1, 2, 4, 8}) {
    TensorView x = random_bf16({m, k}, 1.0f);
    TensorView out = make(DType::kF32, {m, n});
    auto op = [&](int) { return g_b->linear_fp8(x, w8, scale, TensorView(), out); };
    for (int round = 0; round < (once ? 1 : 2); ++round)
      for (const bool staged : {false, true}) {
        CudaSkinnyLinearOptions so;
        so.fp8_staged_head_rows = staged ? 8 : 0;
        CHECK_OK(set_cuda_skinny_linear_options(*g_b, so));
        CHECK_OK(op(0));
        if (once) continue;
        const double us = time_graph(10, op);
        const double bytes = 1.0 * n * k + 4.0 * n + 2.0 * m * k + 4.0 * m * n;
        char note[64];
        std::snprintf(note, sizeof note, "%.0f GB/s", bytes / us / 1e3);
        report("lm_head 2880->201088 M=" + std::to_string(m) + " fp8" + (staged ? " staged" : " skinny"), us, bytes,
               2.0 * m * n * k, note);
      }
    CHECK_OK(g_b->synchronize());
  }
  CHECK_OK(set_cuda_skinny_linear_options(*g_b, {}));
}

// ---- Dense linears through cuBLASLt (the skinny kernel at M = 1).
void bench_linear() {
  struct Shape3 {
    const char* name;
    int64_t n, k;
    int copies;
  };
  for (const Shape3& s : {Shape3{"qkv 2880->5120", 5120, 2880, 4}, Shape3{"o_proj 4096->2880", 2880, 4096, 4},
                          Shape3{"lm_head 2880->201088", 201088, 2880, 1}}) {
    std::vector<TensorView> w;
    for (int c = 0; c < s.copies; ++c) w.push_back(random_bf16({s.n, s.k}, 0.02f));
    TensorView bias = s.n == 201088 ? TensorView() : random_bf16({s.n}, 0.1f);
    for (int64_t m : {1, 8192}) {
      if (s.n == 201088 && m == 8192) continue;  // logits are only computed for sampled rows
      TensorView x = random_bf16({m, s.k}, 1.0f);
      TensorView out = make(s.n == 201088 ? DType::kF32 : DType::kBF16, {m, s.n});
      const int n = m == 1 ? 40 : 6;
      const double us = time_graph(n, [&](int i) { return g_b->linear(x, w[i % s.copies], bias, out); });
      const double bytes = 2.0 * s.n * s.k + 2.0 * m * s.k + (s.n == 201088 ? 4.0 : 2.0) * m * s.n;
      const double flops = 2.0 * m * s.n * s.k;
      char note[64];
      std::snprintf(note, sizeof note, "%.0f GB/s, %.0f TFLOP/s", bytes / us / 1e3, flops / us / 1e6);
      report(std::string(s.name) + " M=" + std::to_string(m), us, bytes, flops, note);
    }
  }
  // lm_head for a batch of sampled rows.
  TensorView w = random_bf16({201088, 2880}, 0.02f);
  TensorView x = random_bf16({64, 2880}, 1.0f), out = make(DType::kF32, {64, 201088});
  const double us = time_graph(10, [&](int) { return g_b->linear(x, w, TensorView(), out); });
  report("lm_head 2880->201088 M=64", us, 2.0 * 201088 * 2880 + 4.0 * 64 * 201088, 2.0 * 64 * 201088 * 2880);
}

// ---- Neighbours of the decode chain as they run there, one after the other in a graph (each launch a programmatic
// dependent of the one before), interleaved twice: the post-attention norm and 20b's router as two ops and as
// add_rms_norm_route; and the input norm followed by qkv on cuBLASLt and on the skinny kernel. us per pair.
void bench_decode_pairs(const std::vector<int64_t>& batches) {
  const int64_t H = 2880, E = 32, copies = 128;
  std::vector<TensorView> rw, qkv_w;
  for (int64_t c = 0; c < copies; ++c) rw.push_back(random_bf16({E, H}, 0.02f));
  for (int c = 0; c < 8; ++c) qkv_w.push_back(repeated_random_bf16({5120, H}, 0.02f));
  const TensorView rbias = random_bf16({E}, 0.1f), qkv_bias = random_bf16({5120}, 0.1f);
  const TensorView norm_w = random_bf16({H}, 1.0f);
  for (const int64_t m : batches) {
    const TensorView residual = make(DType::kF32, {m, H}), delta = random_bf16({m, H}, 1.0f);
    const TensorView normed = make(DType::kBF16, {m, H}), qkv = make(DType::kBF16, {m, 5120});
    std::vector<float> zeros(static_cast<size_t>(m * H), 0.0f);
    CHECK_OK(g_b->copy_from_host(residual, zeros.data()));
    // The weight is set per timed call; no expert scale, no x scale (gpt-oss).
    RouterParams r{.x = normed, .weight = {}, .bias = rbias, .logits = make(DType::kF32, {m, E}),
                   .topk_ids = make(DType::kI32, {m, 4}), .topk_weights = make(DType::kF32, {m, 4}), .top_k = 4,
                   .expert_scale = {}, .x_scale = {}};
    const std::string ms = " M=" + std::to_string(m);
    const double norm_bytes = m * H * (4.0 * 2 + 2.0 * 2), route_bytes = 2.0 * E * H;
    const double qkv_bytes = 2.0 * 5120 * H + 2.0 * m * 5120;
    for (int round = 0; round < 2; ++round) {
      report("add_rms_norm, router_topk E=32" + ms, time_graph(40, [&](int i) {
               r.weight = rw[static_cast<size_t>(i) % rw.size()];
               MX_RETURN_IF_ERROR(g_b->add_rms_norm(residual, delta, norm_w, 1e-5f, normed));
               return g_b->router_topk(r);
             }), norm_bytes + route_bytes, 0);
      report("add_rms_norm_route E=32" + ms, time_graph(40, [&](int i) {
               r.weight = rw[static_cast<size_t>(i) % rw.size()];
               return g_b->add_rms_norm_route(residual, delta, norm_w, 1e-5f, normed, r);
             }), norm_bytes + route_bytes, 0);
      for (const int skinny_rows : {0, 16}) {
        CHECK_OK(set_cuda_skinny_linear_options(*g_b, {skinny_rows, 0, 0}));
        report(std::string("add_rms_norm, qkv ") + (skinny_rows ? "skinny" : "cuBLASLt") + ms, time_graph(40, [&](int i) {
                 MX_RETURN_IF_ERROR(g_b->add_rms_norm(residual, delta, norm_w, 1e-5f, normed));
                 return g_b->linear(normed, qkv_w[static_cast<size_t>(i) % qkv_w.size()], qkv_bias, qkv);
               }), norm_bytes + qkv_bytes, 2.0 * m * 5120 * H);
      }
      CHECK_OK(set_cuda_skinny_linear_options(*g_b, {}));
    }
  }
}

// ---- gpt-oss's qkv, then RoPE and the KV write at ~1K context (64 q / 8 kv heads, head dim 64), after the input
// norm (`--qkv-rope-epilogue-only[=B,...]`, default 1 and 8 tokens; also in --decode-step-only): the two ops
// (linear(), then qkv_rope) against linear_qkv_rope's skinny epilogue on 16-row strips and on
// skinny_rope_strip_rows' strips; bf16 weights and FP8 (random e4m3 codes, lowest bit clear: no NaN). Interleaved
// twice.
void bench_qkv_rope_pairs(const std::vector<int64_t>& batches) {
  const int64_t H = 2880;
  std::vector<TensorView> qkv_w, qkv_w8;
  for (int c = 0; c < 8; ++c) qkv_w.push_back(repeated_random_bf16({5120, H}, 0.02f));
  std::vector<uint32_t> codes(static_cast<size_t>(5120 * H / 4));
  for (int c = 0; c < 8; ++c) {
    for (auto& v : codes) v = static_cast<uint32_t>(g_rng()) & 0xfefefefeu;
    qkv_w8.push_back(make(DType::kF8E4M3, {5120, H}));
    CHECK_OK(g_b->copy_from_host(qkv_w8.back(), codes.data()));
  }
  const std::vector<float> host_scale(5120, 1.0f / 448);
  const TensorView qkv_scale = make(DType::kF32, {5120});
  CHECK_OK(g_b->copy_from_host(qkv_scale, host_scale.data()));
  const TensorView qkv_bias = random_bf16({5120}, 0.1f), norm_w = random_bf16({H}, 1.0f);
  const TensorView inv_freq = rope_inv_freq();
  for (const int64_t m : batches) {
    const TensorView residual = make(DType::kF32, {m, H}), delta = random_bf16({m, H}, 1.0f);
    const TensorView normed = make(DType::kBF16, {m, H}), qkv = make(DType::kBF16, {m, 5120});
    std::vector<float> zeros(static_cast<size_t>(m * H), 0.0f);
    CHECK_OK(g_b->copy_from_host(residual, zeros.data()));
    const std::string ms = " M=" + std::to_string(m);
    const double norm_bytes = m * H * (4.0 * 2 + 2.0 * 2), qkv_bytes = 2.0 * 5120 * H + 2.0 * m * 5120;
    AttnSetup a = make_attention(m, 1024, 1);
    const QkvRopeParams rope{.qkv = qkv, .q_out = a.q, .kv = a.kv.layer(0), .inv_freq = inv_freq, .n_q = 64,
                             .n_kv = 8, .head_dim = 64, .q_norm = {}, .k_norm = {}, .prefetch = {}};
    const double rope_bytes = 2.0 * m * 80 * 64 * 2;
    struct Form {
      const char* name;
      bool epilogue;
      int rows;
    };
    for (int round = 0; round < 2; ++round) {
      for (const bool fp8 : {false, true}) {
        for (const Form& f : {Form{", qkv_rope", false, 0}, Form{" + rope epilogue 16-row strips", true, 16},
                              Form{" + rope epilogue", true, 0}}) {
          CudaSkinnyLinearOptions so;
          so.rope_epilogue = f.epilogue ? 1 : -1;
          so.rope_strip_rows = f.rows;
          CHECK_OK(set_cuda_skinny_linear_options(*g_b, so));
          const TensorView scale = fp8 ? qkv_scale : TensorView();
          const std::vector<TensorView>& w = fp8 ? qkv_w8 : qkv_w;
          report(std::string("add_rms_norm, qkv") + (fp8 ? " fp8" : "") + f.name + ms, time_graph(40, [&](int i) {
                   MX_RETURN_IF_ERROR(g_b->add_rms_norm(residual, delta, norm_w, 1e-5f, normed));
                   return g_b->linear_qkv_rope(normed, w[static_cast<size_t>(i) % w.size()], scale, qkv_bias, rope,
                                               a.batch);
                 }), norm_bytes + (fp8 ? qkv_bytes / 2 : qkv_bytes) + rope_bytes, 2.0 * m * 5120 * H);
        }
      }
    }
    CHECK_OK(set_cuda_skinny_linear_options(*g_b, {}));
  }
}

// ---- The non-MoE, non-attention ops of a gpt-oss decode step at serving batches (`--decode-step-only[=B,...]`,
// default 64, 128, 256 sequences): the dense linears through linear() (cuBLASLt's first heuristic choice at these
// sizes) and each of the heuristic's first `candidate_count` algorithms (`--candidates=N`, default 12; 0 = none),
// the router, qkv_rope, add_rms_norm and the lm_head; the sample op's rows are bench_sampling's. Weights rotate over copies past the L2, as a step's ~13 GB do.
void bench_decode_step(const std::vector<int64_t>& batches, int candidate_count) {
  CHECK_OK(g_b->prepare(WorkspaceSpec{512, 2880, 2880, 128, 4, 64, 8, 64, 256, 201088}));
  auto placement = cuda_placement(*g_b);
  CHECK_OK(placement.is_ok() ? Status::ok() : placement.status());
  auto stream = static_cast<cudaStream_t>(placement->stream);
  auto lt = cuda::LtLinear::create(32ll << 20);
  CHECK_OK(lt.is_ok() ? Status::ok() : lt.status());
  struct Dense {
    const char* name;
    int64_t n, k;
    int copies;
    bool bias, out_f32;
  };
  const Dense shapes[] = {{"qkv 2880->5120", 5120, 2880, 8, true, false},
                          {"o_proj 4096->2880", 2880, 4096, 8, true, false},
                          {"router 2880->128", 128, 2880, 128, false, true},
                          {"lm_head 2880->201088", 201088, 2880, 1, false, true}};
  for (const Dense& s : shapes) {
    std::vector<TensorView> w;
    for (int c = 0; c < s.copies; ++c) w.push_back(repeated_random_bf16({s.n, s.k}, 0.02f));
    const TensorView bias = s.bias ? random_bf16({s.n}, 0.1f) : TensorView();
    for (const int64_t m : batches) {
      const TensorView x = random_bf16({m, s.k}, 1.0f);
      const TensorView out = make(s.out_f32 ? DType::kF32 : DType::kBF16, {m, s.n});
      const int n = s.n > 100000 ? 8 : 40;
      const double bytes = 2.0 * s.n * s.k + 2.0 * m * s.k + (s.out_f32 ? 4.0 : 2.0) * m * s.n;
      const double flops = 2.0 * m * s.n * s.k;
      const std::string row = std::string(s.name) + " M=" + std::to_string(m);
      report(row + " linear()", time_graph(n, [&](int i) { return g_b->linear(x, w[i % s.copies], bias, out); }), bytes,
             flops);
      if (candidate_count == 0) continue;
      auto candidates = lt->candidates(m, s.n, s.k, s.out_f32, s.bias, candidate_count);
      CHECK_OK(candidates.is_ok() ? Status::ok() : candidates.status());
      for (size_t c = 0; c < candidates->size(); ++c) {
        const cublasLtMatmulAlgo_t* algo = &(*candidates)[c].algo;
        auto op = [&](int i) {
          return lt->run(x.data(), w[i % s.copies].data(), s.bias ? bias.data() : nullptr, out.data(), m, s.n, s.k,
                         s.out_f32, stream, 0, algo);
        };
        if (const Status st = op(0); !st.is_ok()) {
          std::printf("%s candidate %zu skipped: %s\n", row.c_str(), c, st.to_string().c_str());
          continue;
        }
        report(row + " #" + std::to_string(c), time_graph(n, op), bytes, flops, (*candidates)[c].config);
      }
    }
  }
  // The router op at 20b's 32 and 120b's 128 experts (top 4): its GEMM above plus the top-k softmax.
  for (const int64_t E : {32, 128}) {
    const int64_t H = 2880, copies = 128;
    std::vector<TensorView> w;
    for (int64_t c = 0; c < copies; ++c) w.push_back(random_bf16({E, H}, 0.02f));
    const TensorView bias = random_bf16({E}, 0.1f);
    for (const int64_t m : batches) {
      const TensorView x = random_bf16({m, H}, 1.0f), logits = make(DType::kF32, {m, E});
      const TensorView ids = make(DType::kI32, {m, 4}), weights = make(DType::kF32, {m, 4});
      RouterParams p{.x = x, .weight = {}, .bias = bias, .logits = logits, .topk_ids = ids, .topk_weights = weights,
                     .top_k = 4, .expert_scale = {}, .x_scale = {}};  // the weight: per timed call
      const double us = time_graph(40, [&](int i) {
        p.weight = w[i % copies];
        return g_b->router_topk(p);
      });
      report("router_topk E=" + std::to_string(E) + " M=" + std::to_string(m), us, 2.0 * E * H + 2.0 * m * H,
             2.0 * m * E * H);
    }
  }
  // qkv_rope (64 q / 8 kv heads, head dim 64) writing K and V into a paged cache at ~1K context, and the
  // residual add + RMSNorm after o_proj and after the experts (f32 residual, bf16 out).
  const TensorView inv_freq = rope_inv_freq();
  for (const int64_t m : batches) {
    AttnSetup a = make_attention(m, 1024, 1);
    const TensorView qkv = random_bf16({m, 80 * 64}, 1.0f);
    const QkvRopeParams p{.qkv = qkv, .q_out = a.q, .kv = a.kv.layer(0), .inv_freq = inv_freq, .n_q = 64, .n_kv = 8,
                          .head_dim = 64, .q_norm = {}, .k_norm = {}, .prefetch = {}};
    const double us = time_graph(40, [&](int) { return g_b->qkv_rope(p, a.batch); });
    report("qkv_rope M=" + std::to_string(m), us, 2.0 * m * 80 * 64 * 2, 0);
    const TensorView residual = make(DType::kF32, {m, 2880}), delta = random_bf16({m, 2880}, 1.0f);
    const TensorView norm_w = random_bf16({2880}, 1.0f), normed = make(DType::kBF16, {m, 2880});
    std::vector<float> zeros(static_cast<size_t>(m * 2880), 0.0f);
    CHECK_OK(g_b->copy_from_host(residual, zeros.data()));
    const double norm_us = time_graph(40, [&](int) { return g_b->add_rms_norm(residual, delta, norm_w, 1e-5f, normed); });
    report("add_rms_norm M=" + std::to_string(m), norm_us, m * 2880 * (4.0 * 2 + 2.0 * 2), 0);
  }
  bench_decode_pairs(batches);
  bench_qkv_rope_pairs(batches);
}

// ---- Sampling: rows of gpt-oss's 201,088-token vocabulary; floor = reading the f32 logits once.
void bench_sampling(const std::vector<int64_t>& row_counts = {1, 8, 64}) {
  const int64_t V = 201088;
  struct Mode {
    const char* name;
    float temperature, top_p;
    int32_t top_k;
  };
  const Mode modes[] = {{"greedy", 0.0f, 1.0f, 0},
                        {"temp 1.0", 1.0f, 1.0f, 0},
                        {"temp 0.7 top-k 50 top-p 0.9", 0.7f, 0.9f, 50},
                        {"temp 1.0 top-p 0.9", 1.0f, 0.9f, 0}};
  for (const int64_t R : row_counts) {
    // Rotated so that the logits come from HBM, as after the lm_head (one copy of 100+ MB is past the L2).
    const int copies = R * V * 4 > 100e6 ? 1 : 4;
    std::vector<TensorView> logits;
    std::normal_distribution<float> d(0.0f, 2.0f);
    std::vector<float> host(static_cast<size_t>(R * V));
    for (int c = 0; c < copies; ++c) {
      for (auto& f : host) f = d(g_rng);
      for (int64_t r = 0; r < R; ++r)  // a peaked head, as language models have
        for (int j = 0; j < 20; ++j) host[static_cast<size_t>(r * V + g_rng() % V)] += 12.0f;
      TensorView t = make(DType::kF32, {R, V});
      CHECK_OK(g_b->copy_from_host(t, host.data()));
      logits.push_back(t);
    }
    TensorView tokens = make(DType::kI32, {R}), logprobs = make(DType::kF32, {R});
    for (const Mode& m : modes) {
      std::vector<SampleRowParams> rows(static_cast<size_t>(R));
      for (int64_t r = 0; r < R; ++r) {
        rows[static_cast<size_t>(r)].temperature = m.temperature;
        rows[static_cast<size_t>(r)].top_p = m.top_p;
        rows[static_cast<size_t>(r)].top_k = m.top_k;
        rows[static_cast<size_t>(r)].seed = static_cast<uint64_t>(r);
      }
      TensorView params = make(DType::kU8, {R, static_cast<int64_t>(sizeof(SampleRowParams))});
      CHECK_OK(g_b->copy_from_host(params, rows.data()));
      auto op = [&](int i) { return g_b->sample({logits[i % copies], params, tokens, logprobs, {}, {}}); };
      CHECK_OK(op(0));  // sizes the scratch outside the graph
      const double us = time_graph(20, op);
      report("sample " + std::string(m.name) + " R=" + std::to_string(R), us, 4.0 * R * V, 0,
             std::to_string(R * V * 4 / 1000000) + " MB logits");
    }
  }
}

void write_json(const char* path) {
  nlohmann::json j;
  j["floors"] = {{"copy_bytes_per_s_read_plus_write", g_hbm_bytes_per_s}, {"bf16_flops_per_s", kBf16FlopsPerSecond}};
  for (const auto& r : g_rows)
    j["results"].push_back({{"op", r.name}, {"us", r.us}, {"floor_us", r.floor_us}, {"floor", r.floor_kind},
                            {"fraction_of_floor", r.floor_us / r.us}, {"note", r.note}});
  std::ofstream(path) << j.dump(2) << "\n";
}

// ---- Gemma-4 26B-A4B (`--gemma-only`): the fused router (norm + logits + top-8 of 128 + softmax + expert
// scales; 30 layers' bf16 weights rotated, as in a decode step), the bf16 GeGLU experts (128 x 704, top-8;
// routings rotated over random experts), and the small and fused row ops at decode and prefill sizes.
// `--gemma-router-only`: the router alone.
constexpr int64_t kGemmaE = 128, kGemmaH = 2816, kGemmaI = 704, kGemmaK = 8;

TensorView gemma_random_f32(Shape shape, float stddev) {
  std::normal_distribution<float> d(0.0f, stddev);
  std::vector<float> host(static_cast<size_t>(shape.numel()));
  for (auto& h : host) h = d(g_rng);
  TensorView v = make(DType::kF32, shape);
  CHECK_OK(g_b->copy_from_host(v, host.data()));
  return v;
}

// Every size: the ticket kernel first (4-token tiles, no clusters; the logits the others are checked against), up to
// CudaGemmaRouterOptions::kClusterMaxTokens tokens the cluster kernel on clusters of 16 and of 8 CTAs
// (weights by loads and by bulk copies), the split kernel on clusters of 16 and of 8 (a form the device does
// not run is skipped), then the default's choice. The checkpoint's bf16 weights (30 layers rotated)
// beside an f32 x_scale; every form's logits are checked against the first form's (max |diff| in the note;
// past 1e-4 of the largest logit the run ends).
const std::vector<int64_t> kGemmaRouterSizes{1, 2, 4, 8, 16, 32, 64, 100, 128, 256, 512, 2048, 8192};
void bench_gemma_router(const std::vector<int64_t>& sizes) {
  const int64_t E = kGemmaE, H = kGemmaH, k = kGemmaK;
  CHECK_OK(g_b->prepare(WorkspaceSpec{8192, H, kGemmaI, E, k, 16, 8, 512}));
  // The calls rotate over 256 copies of the weight (184 MB, past the L2 of any card we run), so that each
  // streams its weight from HBM as a decode step's router does: the step's other ~7.6 GB evict a layer's
  // router weight before its next use. (Rotating 30 layers' weights, as before session 12, kept all of them
  // in the 50 MB L2.) The copies hold the same values: the time depends on addresses, not on the values.
  constexpr int64_t kCopies = 256;
  std::vector<uint16_t> one(static_cast<size_t>(E * H));
  CHECK_OK(g_b->copy_to_host(one.data(), random_bf16({E, H}, 0.05f)));
  const TensorView all_w = make(DType::kBF16, {kCopies * E, H});
  std::vector<TensorView> router_w;
  for (int64_t c = 0; c < kCopies; ++c) {
    router_w.push_back(all_w.rows(c * E, (c + 1) * E));
    CHECK_OK(g_b->copy_from_host(router_w.back(), one.data()));
  }
  const auto copies = static_cast<int>(kCopies);
  std::uniform_real_distribution<float> u(0.5f, 1.5f);
  std::vector<float> x_scale_host(static_cast<size_t>(H));
  for (auto& v : x_scale_host) v = u(g_rng);
  TensorView x_scale = make(DType::kF32, {H});
  CHECK_OK(g_b->copy_from_host(x_scale, x_scale_host.data()));
  TensorView scale = random_bf16({E}, 1.0f);
  for (const int64_t T : sizes) {
    TensorView x = gemma_random_f32({T, H}, 2.0f), logits = make(DType::kF32, {T, E});
    TensorView ids = make(DType::kI32, {T, k}), weights = make(DType::kF32, {T, k});
    auto op = [&](int i) {
      return g_b->router_topk(RouterParams{x, router_w[i % copies], TensorView(), logits, ids, weights, k, scale,
                                           1e-6f, x_scale});
    };
    using Variant = std::pair<CudaGemmaRouterOptions, std::string>;
    std::vector<Variant> variants{{{CudaGemmaRouterDecode::kTicket}, " (ticket)"}};
    if (T <= CudaGemmaRouterOptions::kClusterMaxTokens)
      variants.insert(variants.end(), {{{CudaGemmaRouterDecode::kCluster, 16, -1}, " (cluster of 16, loads)"},
                                       {{CudaGemmaRouterDecode::kCluster, 8, -1}, " (cluster of 8, loads)"},
                                       {{CudaGemmaRouterDecode::kCluster, 16, 1}, " (cluster of 16, bulk copies)"},
                                       {{CudaGemmaRouterDecode::kCluster, 8, 1}, " (cluster of 8, bulk copies)"}});
    variants.insert(variants.end(), {{{CudaGemmaRouterDecode::kSplit, 16}, " (split of 16)"},
                                     {{CudaGemmaRouterDecode::kSplit, 8}, " (split of 8)"},
                                     {{}, ""}});
    std::vector<float> first_logits;
    for (const auto& [options, name] : variants) {
      CHECK_OK(set_cuda_gemma_router_options(*g_b, options));
      if (const Status st = op(0); !st.is_ok()) {
        std::printf("gemma router T=%lld%s skipped: %s\n", static_cast<long long>(T), name.c_str(), st.to_string().c_str());
        continue;
      }
      std::vector<float> got(static_cast<size_t>(T * E));
      CHECK_OK(g_b->copy_to_host(got.data(), logits));
      if (first_logits.empty()) first_logits = got;
      double diff = 0, top = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        diff = std::max(diff, static_cast<double>(std::abs(got[i] - first_logits[i])));
        top = std::max(top, static_cast<double>(std::abs(first_logits[i])));
      }
      if (!(diff <= 1e-4 * std::max(top, 1.0))) {
        std::fprintf(stderr, "gemma router T=%lld%s: logits differ by %g\n", static_cast<long long>(T), name.c_str(), diff);
        std::exit(1);
      }
      const double us = time_graph(T >= 512 ? 30 : copies, op);  // one graph's calls use every copy
      char note[96];
      std::snprintf(note, sizeof(note), "1 launch, weight from HBM; logits max |diff| %.2g of max %.2g", diff, top);
      report("gemma router T=" + std::to_string(T) + name, us, E * H * 2.0 + T * H * 4.0, 2.0 * T * E * H, note);
    }
    CHECK_OK(set_cuda_gemma_router_options(*g_b, {}));
    if (T > CudaGemmaRouterOptions::kClusterMaxTokens) continue;
    // The attention end, then the router of its residual as the model calls them (kAuto): two launches, or one
    // (GemmaAttentionEndParams::route, gemma_attention_end_route.cu); and the attention end alone (what the
    // router adds to it). The residual grows by the normed attention output every call; its norm keeps the
    // values in range.
    TensorView attn = random_bf16({T, H}, 1.0f), norm_w = random_bf16({H}, 1.0f);
    TensorView mlp_in = make(DType::kBF16, {T, H}), moe_in = make(DType::kBF16, {T, H});
    enum class Form { kAlone, kTwoLaunches, kOneLaunch };
    for (const auto& [form, label] : {std::pair{Form::kAlone, " (attention end alone)"},
                                      std::pair{Form::kTwoLaunches, " (two launches)"},
                                      std::pair{Form::kOneLaunch, " (one launch)"}}) {
      auto end_op = [&, form = form](int i) {
        RouterParams r{x, router_w[i % copies], TensorView(), logits, ids, weights, k, scale, 1e-6f, x_scale};
        GemmaAttentionEndParams end{attn, x, norm_w, norm_w, norm_w, mlp_in, moe_in, 1e-6f};
        if (form == Form::kOneLaunch) end.route = &r;
        MX_RETURN_IF_ERROR(g_b->gemma_attention_end(end));
        return form == Form::kTwoLaunches ? g_b->router_topk(r) : Status::ok();
      };
      CHECK_OK(end_op(0));
      const double us = time_graph(copies, end_op);
      report("gemma attention end + router T=" + std::to_string(T) + label, us,
             (form == Form::kAlone ? 0 : E * H * 2.0) + T * H * 10.0, 2.0 * T * E * H, "router weights from HBM");
    }
  }
}

void bench_gemma_experts_dense_stand_in();

// The bf16 GeGLU experts at `sizes` tokens (`--gemma-experts-only=T,...`: one size to profile).
void bench_gemma_experts(const std::vector<int64_t>& sizes) {
  const int64_t E = kGemmaE, H = kGemmaH, I = kGemmaI, k = kGemmaK;
  // Experts: one copy (1.5 GB, far past L2); each routing touches other experts. The tables repeat one
  // random block at rotating offsets: 761M normal draws took ~20 s of every run, and the timing depends on
  // addresses, not on which random values sit there.
  auto tiled_bf16 = [&](Shape shape) {
    const std::vector<uint16_t> block = [&] {
      std::vector<uint16_t> b((1 << 20) + 7);
      std::normal_distribution<float> nd(0.0f, 0.05f);
      for (auto& v : b) v = f32_to_bf16(nd(g_rng));
      return b;
    }();
    std::vector<uint16_t> host(static_cast<size_t>(shape.numel()));
    for (size_t i = 0; i < host.size(); ++i) host[i] = block[(i + i / block.size()) % block.size()];
    TensorView v = make(DType::kBF16, shape);
    CHECK_OK(g_b->copy_from_host(v, host.data()));
    return v;
  };
  TensorView gate_up = tiled_bf16({E, 2 * I, H}), down = tiled_bf16({E, H, I});
  const double expert_bytes = 3.0 * I * H * 2;
  for (int64_t T : sizes) {
    const int routings = T >= 1024 ? 2 : 6;
    std::vector<TensorView> ids, wts;
    double touched = 0;
    for (int r = 0; r < routings; ++r) {
      std::vector<int32_t> h_ids(T * k);
      std::vector<float> h_w(T * k, 1.0f / k);
      std::vector<int32_t> order(E);
      std::iota(order.begin(), order.end(), 0);
      std::set<int32_t> distinct;
      for (int64_t t = 0; t < T; ++t) {
        std::shuffle(order.begin(), order.end(), g_rng);
        for (int64_t j = 0; j < k; ++j) distinct.insert(h_ids[t * k + j] = order[j]);
      }
      touched += static_cast<double>(distinct.size()) / routings;
      ids.push_back(make(DType::kI32, {T, k}));
      wts.push_back(make(DType::kF32, {T, k}));
      CHECK_OK(g_b->copy_from_host(ids.back(), h_ids.data()));
      CHECK_OK(g_b->copy_from_host(wts.back(), h_w.data()));
    }
    TensorView x = random_bf16({T, H}, 1.0f), out = make(DType::kBF16, {T, H});
    bool routing_ready = false;
    auto op = [&](int i) {
      GegluMoeParams p{x, ids[i % routings], wts[i % routings], gate_up, down, out, k};
      p.routing_ready = routing_ready;
      return g_b->moe_geglu_experts(p);
    };
    // 8-token tiles below 32 routed tokens per expert: both decode kernels, register loads first; up to 32
    // routed slots the bulk kernel also with 1 to 4 tiles per CTA in its second GEMM (the default runs 1 where
    // the experts route themselves, else 3) and with the routing ready before its PDL wait (as the Gemma-4
    // model calls it: the next call's first weights go out while the previous call finishes).
    // Above 32 routed slots also the streamed kernel (persistent CTAs, one ring through all their items) by
    // tokens per tile and ring slots.
    struct Variant {
      CudaBf16ExpertsDecode path;
      int tiles_per_cta;  // 0: the default
      bool routing_ready;
      std::string label;
      int stream_tile_tokens = 0, stream_ring_slots = 0;
      CudaBf16ExpertsPrefill prefill = CudaBf16ExpertsPrefill::kAuto;  // from 32 routed tokens per expert
      int prefill_tile_tokens = 0;
      int fused_ring_slots = 0;
      int bulk_up_stage_k = 0, bulk_down_stage_k = 0;  // bulk copies: k per ring stage (0: 256)
      CudaBulkCopyForm bulk_copy_form = CudaBulkCopyForm::kRows;
      int up_rows = 0, up_stages = 0, down_rows = 0, down_stages = 0;  // wgmma, 128-token tiles (0: 128, 4)
      int warp_specialized = -1;  // wgmma, 128-token tiles: 1 the warp-specialized kernel, -1 a CTA per item, 0 auto
    };
    auto options_of = [](const Variant& v) {
      CudaBf16ExpertsOptions o{v.path, v.tiles_per_cta};
      o.bulk_up_stage_k = v.bulk_up_stage_k;
      o.bulk_down_stage_k = v.bulk_down_stage_k;
      o.bulk_copy_form = v.bulk_copy_form;
      o.stream_tile_tokens = v.stream_tile_tokens;
      o.stream_ring_slots = v.stream_ring_slots;
      o.prefill = v.prefill;
      o.prefill_tile_tokens = v.prefill_tile_tokens;
      o.fused_ring_slots = v.fused_ring_slots;
      o.prefill_up_rows = v.up_rows;
      o.prefill_up_stages = v.up_stages;
      o.prefill_down_rows = v.down_rows;
      o.prefill_down_stages = v.down_stages;
      o.prefill_warp_specialized = v.warp_specialized;
      return o;
    };
    using D = CudaBf16ExpertsDecode;
    using P = CudaBf16ExpertsPrefill;
    using B = CudaBulkCopyForm;
    // The bulk kernel's rows: weight rows by bulk copies or tensor boxes, tiles per CTA (0: the default), the
    // routing ready early, k per ring stage of each GEMM (named for boxes always, for rows where not 256 and 256).
    auto bulk = [](B form, int tiles, bool ready, int up_k, int down_k) {
      std::string label = form == B::kBoxes ? " (tensor boxes" : " (bulk copies";
      if (form == B::kBoxes || up_k != 256 || down_k != 256)
        label += " in stages of " + std::to_string(up_k) + " and " + std::to_string(down_k);
      if (tiles > 0) label += ", " + std::to_string(tiles) + (tiles == 1 ? " tile" : " tiles") + " per CTA";
      label += ready ? ", routing ready)" : ")";
      return Variant{D::kBulkCopies, tiles, ready, label, 0, 0, P::kAuto, 0, 0, up_k, down_k, form};
    };
    const B R = B::kRows, X = B::kBoxes;
    // The wgmma kernel on 128-token tiles by weight rows a CTA and ring stages of each GEMM (no commas in the labels:
    // --variants takes comma-separated prefixes).
    auto wide = [](int up_rows, int up_stages, int down_rows, int down_stages, bool ws = false) {
      Variant v{D::kAuto, 0, false, std::string(" (prefill wgmma 128-token tiles") + (ws ? " ws" : "") + " up " +
                                        std::to_string(up_rows) + "x" +
                                        std::to_string(up_stages) + " down " + std::to_string(down_rows) + "x" +
                                        std::to_string(down_stages) + ")",
                0, 0, P::kWgmma, 128};
      v.up_rows = up_rows;
      v.up_stages = up_stages;
      v.down_rows = down_rows;
      v.down_stages = down_stages;
      v.warp_specialized = ws ? 1 : -1;
      return v;
    };
    const std::vector<Variant> variants{{D::kRegisterLoads, 0, false, " (register loads)"},
                                        bulk(R, 1, false, 256, 256), bulk(R, 2, false, 256, 256),
                                        bulk(R, 3, false, 256, 256), bulk(R, 4, false, 256, 256),
                                        bulk(R, 0, false, 256, 256), bulk(R, 0, true, 256, 256),
                                        bulk(R, 0, true, 512, 768), bulk(R, 0, true, 768, 768),
                                        bulk(R, 0, true, 512, 256), bulk(R, 0, true, 256, 768),
                                        bulk(R, 0, true, 256, 512), bulk(R, 0, false, 512, 768),
                                        bulk(X, 0, true, 256, 256), bulk(X, 0, true, 512, 256),
                                        bulk(X, 0, true, 512, 512), bulk(X, 0, true, 512, 768),
                                        bulk(X, 0, true, 768, 768), bulk(X, 0, true, 256, 768),
                                        bulk(X, 0, false, 512, 256), bulk(X, 2, true, 512, 256),
                                        bulk(X, 2, true, 512, 768),
                                        {D::kStreamed, 0, false, " (streamed 16-token tiles 4 slots)", 16, 4},
                                        {D::kStreamed, 0, false, " (streamed 8-token tiles 4 slots)", 8, 4},
                                        {D::kStreamed, 0, false, " (streamed 32-token tiles 4 slots)", 32, 4},
                                        {D::kStreamed, 0, false, " (streamed 16-token tiles 3 slots)", 16, 3},
                                        {D::kStreamed, 0, false, " (streamed boxes 16-token tiles 4 slots)", 16, 4,
                                         P::kAuto, 0, 0, 0, 0, X},
                                        {D::kStreamed, 0, false, " (streamed boxes 16-token tiles 5 slots)", 16, 5,
                                         P::kAuto, 0, 0, 0, 0, X},
                                        {D::kStreamed, 0, false, " (streamed boxes 32-token tiles 4 slots)", 32, 4,
                                         P::kAuto, 0, 0, 0, 0, X},
                                        {D::kAuto, 0, false, " (prefill mma.sync)", 0, 0, P::kMmaSync},
                                        {D::kAuto, 0, false, " (prefill wgmma)", 0, 0, P::kWgmma},
                                        {D::kAuto, 0, false, " (prefill wgmma 128-token tiles)", 0, 0, P::kWgmma, 128},
                                        wide(176, 5, 256, 4), wide(128, 6, 128, 6), wide(256, 4, 256, 4),
                                        wide(128, 4, 128, 3), wide(176, 5, 128, 3), wide(176, 5, 256, 4, true),
                                        wide(128, 6, 128, 6, true), wide(176, 5, 128, 6, true),
                                        [&] {  // the default (kAuto) at 128-token tiles
                                          Variant v{D::kAuto, 0, false, " (prefill wgmma 128-token tiles auto)", 0, 0,
                                                    P::kWgmma, 128};
                                          v.warp_specialized = 0;
                                          return v;
                                        }(),
                                        {D::kFused, 0, true, " (fused 4 slots, routing ready)", 0, 0, P::kAuto, 0, 4},
                                        {D::kFused, 0, true, " (fused 3 slots, routing ready)", 0, 0, P::kAuto, 0, 3},
                                        {D::kFused, 0, true, " (fused 6 slots, routing ready)", 0, 0, P::kAuto, 0, 6},
                                        {D::kAuto, 0, false, ""}};
    const bool decode = T * k < 32 * E;
    // The streamed and fused kernels' outputs must equal the bulk kernel's bit for bit (same sums in the same order):
    // checked on the first routing, so that a fast wrong kernel cannot pass unnoticed. (Also the bulk kernel
    // on one tile per CTA against its default three, above 32 slots.)
    std::vector<uint16_t> bulk_out, mma_sync_out, wgmma_out, got_out(static_cast<size_t>(T * H));
    std::vector<const Variant*> timed;
    std::vector<std::string> notes;
    for (const Variant& v : variants) {
      if (decode == (v.path == D::kAuto) || !variant_selected(v.label)) continue;
      if (v.path == D::kStreamed && T * k <= 32) continue;  // self-routed steps keep the bulk kernels
      if (v.path == D::kFused && T * k > 32) continue;     // larger steps run as kStreamed
      // Tiles per CTA and the early routing were measured where the bulk kernels route themselves (<= 32 slots).
      if (v.path == D::kBulkCopies && ((v.tiles_per_cta > 1) || v.routing_ready) && T * k > 32) continue;
      routing_ready = v.routing_ready;
      CHECK_OK(set_cuda_bf16_experts_options(*g_b, options_of(v)));
      if (const Status st = op(0); !st.is_ok()) {  // the wgmma kernel off sm_90
        std::printf("gemma moe geglu T=%lld%s skipped: %s\n", static_cast<long long>(T), v.label.c_str(),
                    st.to_string().c_str());
        continue;
      }
      std::string same;
      const bool wide = v.bulk_up_stage_k > 256 || v.bulk_down_stage_k > 256 || v.bulk_copy_form == B::kBoxes;
      if (v.path == D::kBulkCopies && v.tiles_per_cta == 0 && !v.routing_ready && !wide) {
        bulk_out.resize(got_out.size());
        CHECK_OK(g_b->copy_to_host(bulk_out.data(), out));
      } else if (v.path == D::kStreamed || v.path == D::kFused || (v.path == D::kBulkCopies && T * k > 32) ||
                 wide) {
        CHECK_OK(g_b->copy_to_host(got_out.data(), out));
        same = bulk_out.empty() ? "" : got_out == bulk_out ? ", = bulk bit for bit" : ", DIFFERS from bulk";
      } else if (v.prefill == P::kMmaSync) {
        mma_sync_out.resize(got_out.size());
        CHECK_OK(g_b->copy_to_host(mma_sync_out.data(), out));
      } else if (v.prefill == P::kWgmma) {
        // Both tile sizes: the same sums in the same order (a token's row alone), so the first one's bits;
        // against mma.sync the largest difference, beside the largest value.
        CHECK_OK(g_b->copy_to_host(got_out.data(), out));
        if (wgmma_out.empty()) wgmma_out = got_out;
        same = got_out == wgmma_out ? ", = wgmma bit for bit" : ", DIFFERS from wgmma";
        float diff = 0.f, top = 0.f;
        for (size_t j = 0; j < mma_sync_out.size(); ++j) {  // when the mma.sync row ran
          diff = std::max(diff, std::fabs(bf16_to_f32(got_out[j]) - bf16_to_f32(mma_sync_out[j])));
          top = std::max(top, std::fabs(bf16_to_f32(mma_sync_out[j])));
        }
        char text[96];
        std::snprintf(text, sizeof text, ", max |wgmma - mma.sync| %.3g of max |y| %.3g", diff, top);
        if (!mma_sync_out.empty()) same += text;
      }
      timed.push_back(&v);
      notes.push_back(same);
    }
    // Timed in interleaved rounds (one H200 window moved single timings by +-5%): the median of 3.
    constexpr int kRounds = 3;
    std::vector<std::vector<double>> us(timed.size());
    for (int round = 0; round < kRounds; ++round)
      for (size_t i = 0; i < timed.size(); ++i) {
        const Variant& v = *timed[i];
        routing_ready = v.routing_ready;
        CHECK_OK(set_cuda_bf16_experts_options(*g_b, options_of(v)));
        us[i].push_back(time_graph(T >= 1024 ? 4 : 24, op));
      }
    for (size_t i = 0; i < timed.size(); ++i) {
      std::sort(us[i].begin(), us[i].end());
      char spread[64];
      std::snprintf(spread, sizeof spread, ", rounds %.1f..%.1f us", us[i].front(), us[i].back());
      report("gemma moe geglu T=" + std::to_string(T) + timed[i]->label, us[i][kRounds / 2], touched * expert_bytes,
             2.0 * T * k * 3 * I * H,
             std::to_string(static_cast<int>(touched + 0.5)) + " experts touched" + notes[i] + spread);
    }
    CHECK_OK(set_cuda_bf16_experts_options(*g_b, {}));
    if (T == 1) bench_gemma_experts_dense_stand_in();
  }
}

// What the dense skinny kernel (skinny_linear.cu) reads at one token from matrices of the bytes of one token's 8
// experts: their gate|up rows as one [8 x 1408, 2816] matrix and their down rows as one [8 x 2816, 704]
// (4 copies each, rotated: from HBM). The bound a GEMV-shaped experts kernel could reach at one token.
void bench_gemma_experts_dense_stand_in() {
  const int64_t H = kGemmaH, I = kGemmaI, k = kGemmaK;
  struct Gemm {
    const char* name;
    int64_t n, kk;
  };
  for (const Gemm& g : {Gemm{"gate|up", k * 2 * I, H}, Gemm{"down", k * H, I}}) {
    std::vector<TensorView> w;
    for (int c = 0; c < 4; ++c) w.push_back(make(DType::kBF16, {g.n, g.kk}));
    TensorView x = random_bf16({1, g.kk}, 1.0f), out = make(DType::kBF16, {1, g.n});
    for (const auto& [label, chunks, splits] : {std::tuple<const char*, int, int>{"", 0, 0}, {" 8-chunk", 8, 0}, {" k/2", 0, 2}}) {
      CHECK_OK(set_cuda_skinny_linear_options(*g_b, {16, splits, chunks}));
      auto op = [&](int i) { return g_b->linear(x, w[i % 4], TensorView(), out); };
      CHECK_OK(op(0));
      const double us = time_graph(24, op);
      const double bytes = 2.0 * g.n * g.kk;
      char note[64];
      std::snprintf(note, sizeof note, "%.0f GB/s", bytes / us / 1e3);
      report(std::string("gemma experts T=1 dense stand-in ") + g.name + " skinny" + label, us, bytes, 2.0 * g.n * g.kk,
             note);
    }
  }
  CHECK_OK(set_cuda_skinny_linear_options(*g_b, {}));
}

// ---- Gemma-4's dense MLP beside its experts at one token (`--gemma-ffn-overlap`; issue 15, batch-1 TPOT). The two
// read the same layer's normed rows and nothing of each other: the MLP (gate|up on the skinny kernel, geglu, down)
// and the experts (routing ready, as the model calls them) one after the other in a graph, as the model runs
// them, against the MLP's three launches on a second stream forked from the first by an event and joined back
// by another, so that its kernels can fill the experts' ramp and tail (and the experts the MLP's). A second CUDA
// backend owns the second stream. Weights rotate past the L2 (8 dense copies, experts over 6 routings); rounds
// interleaved, medians of 5. Each form's outputs are checked against the serial form's, bit for bit.
void bench_gemma_ffn_overlap() {
  const int64_t E = kGemmaE, H = kGemmaH, I = kGemmaI, k = kGemmaK, inter = 2112;
  CHECK_OK(g_b->prepare(WorkspaceSpec{64, H, I, E, k, 16, 8, 512}));
  auto side_owner = make_backend(BackendOptions{"cuda", 0, 0});
  CHECK_OK(side_owner.is_ok() ? Status::ok() : side_owner.status());
  Backend& side = **side_owner;
  CHECK_OK(side.prepare(WorkspaceSpec{64, H, I, E, k, 16, 8, 512}));
  auto main_place = cuda_placement(*g_b), side_place = cuda_placement(side);
  CHECK_OK(main_place.is_ok() ? Status::ok() : main_place.status());
  CHECK_OK(side_place.is_ok() ? Status::ok() : side_place.status());
  auto main_stream = static_cast<cudaStream_t>(main_place->stream), side_stream = static_cast<cudaStream_t>(side_place->stream);
  constexpr int kCopies = 8, kRoutings = 6, kEvents = 64;
  std::vector<TensorView> gate_up_w, down_w;
  for (int c = 0; c < kCopies; ++c) {
    gate_up_w.push_back(repeated_random_bf16({2 * inter, H}, 0.02f));
    down_w.push_back(repeated_random_bf16({H, inter}, 0.02f));
  }
  const TensorView experts_gate_up = repeated_random_bf16({E, 2 * I, H}, 0.05f);
  const TensorView experts_down = repeated_random_bf16({E, H, I}, 0.05f);
  std::vector<TensorView> ids, wts;
  for (int r = 0; r < kRoutings; ++r) {
    std::vector<int32_t> h_ids(static_cast<size_t>(k)), order(static_cast<size_t>(E));
    std::vector<float> h_w(static_cast<size_t>(k), 1.0f / static_cast<float>(k));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), g_rng);
    for (int64_t j = 0; j < k; ++j) h_ids[static_cast<size_t>(j)] = order[static_cast<size_t>(j)];
    ids.push_back(make(DType::kI32, {1, k}));
    wts.push_back(make(DType::kF32, {1, k}));
    CHECK_OK(g_b->copy_from_host(ids.back(), h_ids.data()));
    CHECK_OK(g_b->copy_from_host(wts.back(), h_w.data()));
  }
  const TensorView normed = random_bf16({1, H}, 1.0f), normed_moe = random_bf16({1, H}, 1.0f);
  const TensorView gate_up = make(DType::kBF16, {1, 2 * inter}), act = make(DType::kBF16, {1, inter});
  const TensorView proj = make(DType::kBF16, {1, H}), moe_out = make(DType::kBF16, {1, H});
  std::vector<cudaEvent_t> events(2 * kEvents);
  for (auto& e : events) CHECK_OK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess ? Status::ok() : internal_error("event"));
  auto mlp = [&](Backend& b, int i) -> Status {
    MX_RETURN_IF_ERROR(b.linear(normed, gate_up_w[static_cast<size_t>(i % kCopies)], TensorView(), gate_up));
    MX_RETURN_IF_ERROR(b.geglu(gate_up, act));
    return b.linear(act, down_w[static_cast<size_t>(i % kCopies)], TensorView(), proj);
  };
  auto experts = [&](int i) {
    GegluMoeParams p{normed_moe, ids[static_cast<size_t>(i % kRoutings)], wts[static_cast<size_t>(i % kRoutings)],
                     experts_gate_up, experts_down, moe_out, k};
    p.routing_ready = true;
    return g_b->moe_geglu_experts(p);
  };
  auto cuda = [](cudaError_t e, const char* what) { return e == cudaSuccess ? Status::ok() : internal_error(std::string(what) + ": " + cudaGetErrorString(e)); };
  // 0: MLP then experts (the model's order); 1: experts then MLP; 2: MLP on the side stream beside the experts;
  // 3: the experts on the side stream beside the MLP; 4: the MLP alone; 5: the experts alone.
  auto step = [&](int form, int i) -> Status {
    switch (form) {
      case 0: MX_RETURN_IF_ERROR(mlp(*g_b, i)); return experts(i);
      case 1: MX_RETURN_IF_ERROR(experts(i)); return mlp(*g_b, i);
      case 4: return mlp(*g_b, i);
      case 5: case 7: return experts(i);
      default: break;
    }
    cudaEvent_t fork = events[static_cast<size_t>(2 * (i % kEvents))], join = events[static_cast<size_t>(2 * (i % kEvents) + 1)];
    MX_RETURN_IF_ERROR(cuda(cudaEventRecord(fork, main_stream), "fork record"));
    MX_RETURN_IF_ERROR(cuda(cudaStreamWaitEvent(side_stream, fork, 0), "fork wait"));
    if (form == 2 || form >= 6) {
      MX_RETURN_IF_ERROR(mlp(side, i));
      MX_RETURN_IF_ERROR(experts(i));
    } else {
      // The experts through the main backend's kernels but on the side stream: swap which stream launches what
      // by running the MLP on the main stream and the experts after a fork on the side backend.
      GegluMoeParams p{normed_moe, ids[static_cast<size_t>(i % kRoutings)], wts[static_cast<size_t>(i % kRoutings)],
                       experts_gate_up, experts_down, moe_out, k};
      p.routing_ready = true;
      MX_RETURN_IF_ERROR(side.moe_geglu_experts(p));
      MX_RETURN_IF_ERROR(mlp(*g_b, i));
    }
    MX_RETURN_IF_ERROR(cuda(cudaEventRecord(join, side_stream), "join record"));
    return cuda(cudaStreamWaitEvent(main_stream, join, 0), "join wait");
  };
  const char* names[] = {"MLP then experts (serial, model order)", "experts then MLP (serial)",
                         "MLP on a side stream beside the experts", "experts on a side stream beside the MLP",
                         "MLP alone (3 launches)", "experts alone",
                         "MLP on a side stream beside the experts (tensor boxes)", "experts alone (tensor boxes)"};
  // The experts' copies: a bulk copy per weight row in forms 0-5 (the before), TMA tensor boxes (the default) in 6
  // and 7. Options are read at capture, so each form's graph keeps its own.
  auto form_options = [&](int f) {
    CudaBf16ExpertsOptions o;
    o.bulk_copy_form = f >= 6 ? CudaBulkCopyForm::kBoxes : CudaBulkCopyForm::kRows;
    CHECK_OK(set_cuda_bf16_experts_options(*g_b, o));
  };
  constexpr int kForms = 8, kRounds = 5, kSteps = 30;
  // Outputs of each form against the serial one's (same kernels, same inputs: identical bits expected).
  std::vector<uint16_t> ref_proj(static_cast<size_t>(H)), ref_moe(static_cast<size_t>(H)), got(static_cast<size_t>(H));
  std::vector<std::string> notes(kForms);
  std::vector<std::unique_ptr<ReplayGraph>> graphs(kForms);
  for (int f = 0; f < kForms; ++f) {
    form_options(f);
    if (const Status st = step(f, 0); !st.is_ok()) {  // eagerly first: lazy set-up outside the capture
      std::printf("gemma ffn overlap: %s: eager step failed: %s\n", names[f], st.to_string().c_str());
      continue;
    }
    CHECK_OK(g_b->synchronize());
    CHECK_OK(side.synchronize());
    auto graph = g_b->capture([&]() -> Status {
      for (int i = 0; i < kSteps; ++i) MX_RETURN_IF_ERROR(step(f, i));
      return Status::ok();
    });
    if (!graph.is_ok()) {
      std::printf("gemma ffn overlap: %s: capture failed: %s\n", names[f], graph.status().to_string().c_str());
      continue;
    }
    graphs[static_cast<size_t>(f)] = std::move(*graph);
    CHECK_OK(graphs[static_cast<size_t>(f)]->replay());
    CHECK_OK(g_b->synchronize());
    CHECK_OK(side.synchronize());
    if (f == 0) {
      CHECK_OK(g_b->copy_to_host(ref_proj.data(), proj));
      CHECK_OK(g_b->copy_to_host(ref_moe.data(), moe_out));
    } else if (f < 4 || f >= 6) {
      CHECK_OK(g_b->copy_to_host(got.data(), proj));
      const bool same_proj = got == ref_proj || f == 7;  // the experts alone write no MLP output
      CHECK_OK(g_b->copy_to_host(got.data(), moe_out));
      notes[static_cast<size_t>(f)] = same_proj && got == ref_moe ? ", outputs = serial bit for bit" : ", outputs DIFFER from serial";
    }
  }
  std::vector<std::vector<double>> us(kForms);
  for (int round = 0; round < kRounds; ++round)
    for (int f = 0; f < kForms; ++f) {
      if (!graphs[static_cast<size_t>(f)]) continue;
      std::vector<double> r;
      for (int rep = 0; rep < 9; ++rep) {
        const auto t0 = std::chrono::steady_clock::now();
        CHECK_OK(graphs[static_cast<size_t>(f)]->replay());
        CHECK_OK(g_b->synchronize());
        r.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / kSteps);
      }
      std::sort(r.begin(), r.end());
      us[static_cast<size_t>(f)].push_back(r[r.size() / 2]);
    }
  const double bytes = 2.0 * (3.0 * inter * H) + 8 * 3.0 * I * H * 2;
  for (int f = 0; f < kForms; ++f) {
    auto& u = us[static_cast<size_t>(f)];
    if (u.empty()) continue;
    std::sort(u.begin(), u.end());
    char spread[64];
    std::snprintf(spread, sizeof spread, "rounds %.2f..%.2f us", u.front(), u.back());
    const double b = f == 4 ? 2.0 * 3.0 * inter * H : f == 5 || f == 7 ? 8 * 3.0 * I * H * 2 : bytes;
    report(std::string("gemma ffn T=1 ") + names[f], u[u.size() / 2], b, 0, spread + notes[static_cast<size_t>(f)]);
  }
  CHECK_OK(set_cuda_bf16_experts_options(*g_b, {}));
  for (auto& e : events) cudaEventDestroy(e);
}

// Gemma-4's fused row kernels (the attention end without its router, the layer end with experts and a layer
// scalar, as the 26B model runs them) at `sizes` rows, in each CudaGemmaRowForm: interleaved rounds, the median of 3.
void bench_gemma_rows(const std::vector<int64_t>& sizes) {
  const int64_t H = kGemmaH;
  using F = CudaGemmaRowForm;
  const std::vector<std::pair<F, std::string>> forms{{F::kFourChunks, " (4 chunks: before)"},
                                                     {F::kTwoChunks, " (2 chunks)"},
                                                     {F::kTwoChunksBounded, " (2 chunks, bounded)"}};
  for (int64_t T : sizes) {
    TensorView res = gemma_random_f32({T, H}, 1.0f), scalar = random_bf16({1}, 1.0f);
    TensorView a = random_bf16({T, H}, 1.0f), m = random_bf16({T, H}, 1.0f), w = random_bf16({H}, 1.0f);
    TensorView o1 = make(DType::kBF16, {T, H}), o2 = make(DType::kBF16, {T, H});
    auto end = [&](int) { return g_b->gemma_attention_end({a, res, w, w, w, o1, o2, 1e-6f}); };
    auto layer = [&](int) { return g_b->gemma_layer_end({a, m, w, w, w, scalar, res, w, o1, 1e-6f}); };
    constexpr int kRounds = 3;
    std::vector<std::vector<double>> us(2 * forms.size());
    for (int round = 0; round < kRounds; ++round)
      for (size_t f = 0; f < forms.size(); ++f) {
        CHECK_OK(set_cuda_gemma_row_options(*g_b, {forms[f].first}));
        us[2 * f].push_back(time_graph(20, end));
        us[2 * f + 1].push_back(time_graph(20, layer));
      }
    for (size_t i = 0; i < us.size(); ++i) {
      std::sort(us[i].begin(), us[i].end());
      const bool is_end = i % 2 == 0;
      report(std::string(is_end ? "gemma attention_end norms" : "gemma layer_end norms") + " T=" + std::to_string(T) +
                 forms[i / 2].second,
             us[i][kRounds / 2], T * H * (is_end ? 2.0 + 8 + 4 : 4.0 + 8 + 2), 0,
             "rounds " + std::to_string(us[i].front()) + ".." + std::to_string(us[i].back()) + " us");
    }
  }
  CHECK_OK(set_cuda_gemma_row_options(*g_b, {}));
}

void bench_gemma() {
  const int64_t H = kGemmaH;
  bench_gemma_router(kGemmaRouterSizes);
  bench_gemma_experts({1, 8, 64, 1024, 8192});
  for (int64_t T : {1, 8192}) {
    TensorView g = random_bf16({T, 2112}, 1.0f), u = random_bf16({T, 2112}, 1.0f);
    report("gemma gelu_tanh_mul T=" + std::to_string(T), time_graph(20, [&](int) { return g_b->gelu_tanh_mul(g, u, g); }),
           3.0 * T * 2112 * 2, 0);
    TensorView qkv = random_bf16({T, 32 * 256}, 1.0f), qn = random_bf16({256}, 1.0f);
    report("gemma qkv_norms T=" + std::to_string(T) + " (16+8+8 x 256)",
           time_graph(20, [&](int) { return g_b->qkv_norms(QkvNormParams{qkv, qn, qn, 16, 8, 256, 1e-6f}); }),
           2.0 * T * 32 * 256 * 2, 0);
    TensorView res = gemma_random_f32({T, H}, 1.0f), f = random_bf16({1}, 1.0f);
    report("gemma scale_by T=" + std::to_string(T), time_graph(20, [&](int) { return g_b->scale_by(res, f); }),
           2.0 * T * H * 4, 0);
    TensorView gu = random_bf16({T, 2 * 2112}, 1.0f), act = make(DType::kBF16, {T, 2112});
    report("gemma geglu T=" + std::to_string(T) + " (fused gate|up 2 x 2112)",
           time_graph(20, [&](int) { return g_b->geglu(gu, act); }), 3.0 * T * 2112 * 2, 0);
    // The fused norms between a layer's blocks (the residual stays O(1): no layer scalar).
    TensorView a = random_bf16({T, H}, 1.0f), m = random_bf16({T, H}, 1.0f), w = random_bf16({H}, 1.0f);
    TensorView o1 = make(DType::kBF16, {T, H}), o2 = make(DType::kBF16, {T, H});
    report("gemma attention_end norms T=" + std::to_string(T),
           time_graph(20, [&](int) { return g_b->gemma_attention_end({a, res, w, w, w, o1, o2, 1e-6f}); }),
           T * H * (2.0 + 8 + 4), 0, "post-attn norm + residual add + pre-mlp / pre-moe norms, 1 launch");
    report("gemma layer_end norms T=" + std::to_string(T),
           time_graph(20, [&](int) { return g_b->gemma_layer_end({a, m, w, w, w, TensorView(), res, w, o1, 1e-6f}); }),
           T * H * (4.0 + 8 + 2), 0, "3 branch norms + residual add + next input norm, 1 launch");
  }
  TensorView lg = gemma_random_f32({1, 262144}, 10.0f);
  report("gemma soft_cap 1 x 262144", time_graph(20, [&](int) { return g_b->soft_cap(lg, 30.0f); }), 2.0 * 262144 * 4, 0);
}

}  // namespace
}  // namespace mx

int main(int argc, char** argv) {
  using namespace mx;
  auto backend = make_backend(BackendOptions{"cuda", 0, 0});
  if (!backend.is_ok()) {
    std::fprintf(stderr, "%s\n", backend.status().to_string().c_str());
    return 1;
  }
  g_b = backend->get();
  g_hbm_bytes_per_s = measure_copy_rate();
  std::printf("bytes floor: %.2f TB/s (device-to-device copy, read + write)\n", g_hbm_bytes_per_s / 1e12);
  std::printf("%-44s %13s  %26s  %s\n", "op (gpt-oss-20b shapes)", "time", "floor", "fraction");
  // `--moe-prefill-only[=T,T,...]`: just the MoE prefill sweep (quick comparisons of the two paths).
  // `--sampling-only`: just the sampling rows.
  int arg = 1;
  // `--moe-experts=E` (after --moe-prefill-only or --moe-decode-variants): the layer's experts, 32 (gpt-oss-20b,
  // default) or 128 (gpt-oss-120b).
  auto take_moe_experts = [&]() {
    const std::string experts = "--moe-experts=";
    if (argc > arg && std::string(argv[arg]).rfind(experts, 0) == 0) {
      g_moe_experts = std::atoi(argv[arg] + experts.size());
      if (g_moe_experts != 32 && g_moe_experts != 128) {
        std::fprintf(stderr, "--moe-experts: 32 (gpt-oss-20b) or 128 (gpt-oss-120b), not %s\n", argv[arg] + experts.size());
        return false;
      }
      ++arg;
    }
    return true;
  };
  // `--moe-decode-variants[=T,T,...] [--moe-experts=E] [--variants=P,P,...]`: only the MoE decode variants (kernel
  // comparisons in one device run), at those token counts, those whose labels start with one of the prefixes.
  const std::string decode_flag = "--moe-decode-variants";
  if (const auto sizes = argc > arg ? int_list_flag(argv[arg], decode_flag) : std::nullopt) {
    bench_only_decode_sizes = *sizes;
    ++arg;
    if (!take_moe_experts()) return 1;
    take_variant_prefixes(argc, argv, arg);
    bench_moe(/*variants=*/true);
    if (argc > arg) write_json(argv[arg]);
    return 0;
  }
  // `--attention-prefill-only[=T,T,...]`: prefill attention at 1K/4K/8K (or the given prompt lengths),
  // causal and window 128, each kernel.
  const std::string attn_flag = "--attention-prefill-only";
  if (const auto lengths = argc > arg ? int_list_flag(argv[arg], attn_flag) : std::nullopt) {
    bench_attention_prefill(lengths->empty() ? std::vector<int64_t>{1024, 4096, 8192} : *lengths);
    ++arg;
    if (argc > arg) write_json(argv[arg]);
    return 0;
  }
  if (const auto lengths = argc > arg ? int_list_flag(argv[arg], "--attention-window-forms") : std::nullopt) {
    bench_attention_window_forms(lengths->empty() ? std::vector<int64_t>{8192} : *lengths);
    ++arg;
    if (argc > arg) write_json(argv[arg]);
    return 0;
  }
  if (const auto lengths = argc > arg ? int_list_flag(argv[arg], "--qkv-rope-only") : std::nullopt) {
    bench_qkv_rope(lengths->empty() ? std::vector<int64_t>{1024, 8192} : *lengths);
    ++arg;
    if (argc > arg) write_json(argv[arg]);
    return 0;
  }
  // `--attention-gemma`: Gemma-4 26B-A4B attention, prefill 1K/4K/8K and decode, both layer kinds;
  // `--attention-decode-only[=B,B,...]`: gpt-oss's decode attention rows (or only those of batches B).
  // `--attention-gemma-decode[=B,B,...]`: only the Gemma-4 decode rows, each kernel (or only batches B at 1K
  // context: one kernel launch each to profile).
  // `--attention-gemma-decode-once`: batch 1's clustered launches once each, untimed (for ncu).
  if (argc > arg && std::string(argv[arg]) == "--attention-gemma-decode-once") {
    bench_attention_gemma_decode({1}, /*once=*/true);
    return 0;
  }
  const std::string gemma_decode_flag = "--attention-gemma-decode";
  if (const auto batches = argc > arg ? int_list_flag(argv[arg], gemma_decode_flag) : std::nullopt) {
    bench_attention_gemma_decode(*batches);
    ++arg;
    if (argc > arg) write_json(argv[arg]);
    return 0;
  }
  // `--attention-decode-pair[=B,B,...]`: gpt-oss's decode attention behind qkv_rope, keys before / after its wait.
  if (const auto batches = argc > arg ? int_list_flag(argv[arg], "--attention-decode-pair") : std::nullopt) {
    bench_attention_decode_pair(batches->empty() ? std::vector<int64_t>{1, 8} : *batches);
    ++arg;
    if (argc > arg) write_json(argv[arg]);
    return 0;
  }
  if (const auto batches = argc > arg ? int_list_flag(argv[arg], "--attention-decode-only") : std::nullopt) {
    bench_attention_decode(*batches);
    ++arg;
    if (argc > arg) write_json(argv[arg]);
    return 0;
  }
  // `--decode-step-only[=B,B,...] [--candidates=N]`: the rest of a gpt-oss decode step at serving batches
  // (bench_decode_step), then the sample op at those rows.
  if (const auto batches = argc > arg ? int_list_flag(argv[arg], "--decode-step-only") : std::nullopt) {
    const std::vector<int64_t> b = batches->empty() ? std::vector<int64_t>{64, 128, 256} : *batches;
    ++arg;
    int candidates = 12;
    const std::string candidates_flag = "--candidates=";
    if (argc > arg && std::string(argv[arg]).rfind(candidates_flag, 0) == 0)
      candidates = std::atoi(argv[arg++] + candidates_flag.size());
    bench_decode_step(b, candidates);
    bench_sampling(b);
    if (argc > arg) write_json(argv[arg]);
    return 0;
  }
  // `--attention-gemma-prefill[=T,T,...] [--variants=P,P,...]`: only the Gemma-4 prefill rows (default 1K, 4K,
  // 8K), each kernel (or those whose labels start with a prefix: `wgmma` to profile one).
  if (const auto lengths = argc > arg ? int_list_flag(argv[arg], "--attention-gemma-prefill") : std::nullopt) {
    ++arg;
    take_variant_prefixes(argc, argv, arg);
    bench_attention_gemma_prefill(lengths->empty() ? std::vector<int64_t>{1024, 4096, 8192} : *lengths);
    if (argc > arg) write_json(argv[arg]);
    return 0;
  }
  if (argc > arg && std::string(argv[arg]) == "--attention-gemma") {
    bench_attention_gemma();
    ++arg;
    if (argc > arg) write_json(argv[arg]);
    return 0;
  }
  // `--gemma-experts-only[=T,T,...]`: Gemma-4's bf16 experts alone (default 1, 8, 64 tokens).
  const std::string experts_flag = "--gemma-experts-only";
  if (const auto sizes = argc > arg ? int_list_flag(argv[arg], experts_flag) : std::nullopt) {
    ++arg;
    // `--variants=P,P,...`: only the variants whose labels start with one of the prefixes (one to profile).
    take_variant_prefixes(argc, argv, arg);
    bench_gemma_experts(sizes->empty() ? std::vector<int64_t>{1, 8, 64} : *sizes);
    if (argc > arg) write_json(argv[arg]);
    return 0;
  }
  // `--qkv-rope-epilogue-only[=B,B,...]`: gpt-oss's qkv and RoPE at decode, the two ops against the skinny epilogue.
  if (const auto sizes = argc > arg ? int_list_flag(argv[arg], "--qkv-rope-epilogue-only") : std::nullopt) {
    CHECK_OK(g_b->prepare(WorkspaceSpec{512, 2880, 2880, 128, 4, 64, 8, 64, 256, 201088}));
    bench_qkv_rope_pairs(sizes->empty() ? std::vector<int64_t>{1, 8} : *sizes);
    ++arg;
    if (argc > arg) write_json(argv[arg]);
    return 0;
  }
  // `--gemma-norms-only[=T,T,...]`: the fused row kernels in each form (default 100, 1024, 8192, 16384 rows).
  if (const auto sizes = argc > arg ? int_list_flag(argv[arg], "--gemma-norms-only") : std::nullopt) {
    bench_gemma_rows(sizes->empty() ? std::vector<int64_t>{100, 1024, 8192, 16384} : *sizes);
    ++arg;
    if (argc > arg) write_json(argv[arg]);
    return 0;
  }
  // `--gemma-router-only[=T,T,...]`: the router alone (default: every size of bench_gemma_router).
  if (const auto sizes = argc > arg ? int_list_flag(argv[arg], "--gemma-router-only") : std::nullopt) {
    bench_gemma_router(sizes->empty() ? kGemmaRouterSizes : *sizes);
    ++arg;
    if (argc > arg) write_json(argv[arg]);
    return 0;
  }
  // `--gemma-only`: Gemma-4 26B-A4B's router, bf16 experts and small ops.
  if (argc > arg && std::string(argv[arg]) == "--gemma-only") {
    bench_gemma();
    ++arg;
    if (argc > arg) write_json(argv[arg]);
    return 0;
  }
  // `--gemma-ffn-overlap`: Gemma-4's dense MLP and experts at one token, serial against on two streams.
  if (argc > arg && std::string(argv[arg]) == "--gemma-ffn-overlap") {
    bench_gemma_ffn_overlap();
    ++arg;
    if (argc > arg) write_json(argv[arg]);
    return 0;
  }
  // `--gemma-dense-only`: Gemma-4's dense linears at one token (bench_gemma_dense).
  if (argc > arg && std::string(argv[arg]) == "--gemma-dense-only") {
    ++arg;
    take_variant_prefixes(argc, argv, arg);  // --variants=P,P,...: only the shapes whose names start so
    bench_gemma_dense();
    if (argc > arg) write_json(argv[arg]);
    return 0;
  }
  // `--lm-head-staged[=once]`: the FP8 lm_head, skinny against staged (bench_lm_head_staged).
  if (argc > arg && std::string(argv[arg]).rfind("--lm-head-staged", 0) == 0) {
    bench_lm_head_staged(/*once=*/std::string(argv[arg]) == "--lm-head-staged=once");
    ++arg;
    if (argc > arg) write_json(argv[arg]);
    return 0;
  }
  // `--linear-only`: the skinny linear kernel against cuBLASLt at 1-16 rows, then on FP8 weights;
  // `--linear-fp8-only`: just the FP8 rows.
  if (argc > arg && (std::string(argv[arg]) == "--linear-only" || std::string(argv[arg]) == "--linear-fp8-only")) {
    bench_linear_skinny(/*fp8_only=*/std::string(argv[arg]) == "--linear-fp8-only");
    ++arg;
    if (argc > arg) write_json(argv[arg]);
    return 0;
  }
  bool prefill_only = false, sampling_only = false;
  const std::string flag = "--moe-prefill-only";
  if (argc > arg && std::string(argv[arg]) == "--sampling-only") {
    sampling_only = true;
    ++arg;
  } else if (const auto sizes = argc > arg ? int_list_flag(argv[arg], flag) : std::nullopt) {
    prefill_only = true;
    bench_only_prefill_sizes = *sizes;
    ++arg;
    if (!take_moe_experts()) return 1;
    const std::string skew = "--moe-skew=";
    if (argc > arg && std::string(argv[arg]).rfind(skew, 0) == 0) {
      g_moe_skews = parse_list<double>(std::string(argv[arg]).substr(skew.size() - 1),
                                       [](const std::string& t) { return std::stod(t); });
      if (g_moe_skews.empty()) g_moe_skews = {0};
      ++arg;
    }
    const std::string rounds = "--moe-rounds=";
    if (argc > arg && std::string(argv[arg]).rfind(rounds, 0) == 0) {
      g_moe_rounds = std::clamp(std::atoi(argv[arg] + rounds.size()), 1, 15);
      ++arg;
    }
    take_variant_prefixes(argc, argv, arg);
  }
  if (sampling_only) {
    bench_sampling();
  } else {
    if (!prefill_only) bench_moe(/*variants=*/false);
    bench_moe_prefill();
    if (!prefill_only) {
      bench_attention();
      bench_linear();
      bench_sampling();
    }
  }
  if (argc > arg) write_json(argv[arg]);
  return 0;
}
