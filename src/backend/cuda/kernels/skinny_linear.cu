// Dense linears for a few tokens (decode): a bandwidth kernel. Each CTA owns a strip of up to 16 output
// channels (the mma.sync A side; SkinnyLinearConfig::strip_rows, the rest masked) and all M <= 16 tokens (one
// or two 8-wide B tiles); its 8 warps take the K axis in 32-element chunks round-robin, so at any moment the
// CTA reads a contiguous run of every weight row.
//
// Fragments straight from global memory: mma m16n8k16 wants lane (g, t) to hold A[g][2t, 2t+1, 2t+8,
// 2t+9] (and row g + 8) and B[2t, 2t+1, 2t+8, 2t+9][g]. A dot product does not care how k is ordered as
// long as A and B agree, so the kernel renames k inside each chunk: lane t's 16-byte load of a weight row
// (bf16: elements 8t..8t+7 of a 32-element chunk) supplies logical k {2t, 2t+1, 2t+8, 2t+9} of the first
// k16 step with elements 0-3 and of the second step with elements 4-7, and the same 16-byte load of the
// token's activation row supplies B. No shared memory, no shuffles, one 16-byte load per 16 weight bytes.
// With k splits (grid y) each CTA covers a range of chunks and the strip's last CTA adds the fp32 partials
// in split order.
// FP8 weights (e4m3, one scale per row): a lane's 16-byte load holds 16 codes (elements 16t..16t+15 of a
// 64-element chunk), widened to bf16 (exact: every e4m3 value is a bf16 value) eight at a time just before
// their two k16 steps, against two 16-byte activation loads; the row's scale multiplies the fp32 sum in the
// epilogue. A warp so has as many weight bytes in flight per chunk as with bf16: the first FP8 form loaded
// 8 codes per lane (half the bytes per round trip) and ran at 47-56% of the copy rate on an H200 where bf16
// ran at 78-88% (docs/PERF.md). Shapes whose strips do not fit one wave at 2 CTAs per SM run a 3-CTA form
// with fewer chunks in flight (launch_skinny_linear).
// kRope (qkv at decode, SkinnyRope): a strip of 2P rows (P <= 8) holds P of the heads' RoPE pairs, pair i of a head
// being its rows i and i + half: rows i in the mma's rows g < P and rows i + half in g + 8, so a thread's two rows
// are a pair. After the warps' sum every value is rounded to bf16 (what qkv would hold), its partner read back
// from shared memory, and q / k rotated with qkv_rope's arithmetic (cos/sin of the fp32 angle by the precise
// sincosf, times the YaRN scale); q is stored to q_out and k, v to the paged cache: one launch instead of two and
// no qkv round trip.
#include <cuda_fp8.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/head_rows.cuh"
#include "backend/cuda/kernels/kernels.h"
#include "backend/cuda/kernels/mbarrier.cuh"
#include "backend/cuda/kernels/skinny_fp8.cuh"

namespace mx::cuda {
namespace {

__device__ __forceinline__ uint4 ldg_cached(const void* p) { return __ldg(static_cast<const uint4*>(p)); }

__device__ __forceinline__ uint2 ldg_stream8(const void* p) {
  uint2 v;
  asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}

// A lane's registers for one weight row and chunk: kLaneK elements from one 16-byte load, handed to the
// mmas as kLaneK / 8 groups of 8 bf16 (group h against the lane's activations 8h..8h+7 of the chunk).
// `offset`: the first element; `ok`: row and chunk in range; `whole`: all kLaneK elements lie before k.
struct Bf16Weights {
  static constexpr bool kFp8 = false;
  static constexpr int kLaneK = 8;
  uint4 raw;
  __device__ __forceinline__ void load(const SkinnyLinearParams& p, int64_t offset, bool ok, bool /*whole*/) {
    raw = ok ? ldg_stream(p.w + offset) : make_uint4(0, 0, 0, 0);  // k % 8 == 0: always whole
  }
  __device__ __forceinline__ uint4 bf16(int /*group*/) const { return raw; }
  __device__ __forceinline__ void load_shared(const uint8_t* at, bool ok) {
    raw = ok ? *reinterpret_cast<const uint4*>(at) : make_uint4(0, 0, 0, 0);
  }
};
struct Fp8Weights {
  static constexpr bool kFp8 = true;  // the row's scale multiplies the sum
  static constexpr int kLaneK = 16;
  uint4 raw;
  // Rows are 16-byte aligned when k % 16 == 0; otherwise (k % 16 == 8) two 8-byte loads, the second only
  // when the lane's 16 codes are all before k.
  __device__ __forceinline__ void load(const SkinnyLinearParams& p, int64_t offset, bool ok, bool whole) {
    if (!ok) {
      raw = make_uint4(0, 0, 0, 0);
    } else if (p.k % 16 == 0) {
      raw = ldg_stream(p.w_fp8 + offset);
    } else {
      const uint2 a = ldg_stream8(p.w_fp8 + offset), b = whole ? ldg_stream8(p.w_fp8 + offset + 8) : make_uint2(0, 0);
      raw = make_uint4(a.x, a.y, b.x, b.y);
    }
  }
  __device__ __forceinline__ uint4 bf16(int group) const {
    return group == 0 ? widen_fp8x8(raw.x, raw.y) : widen_fp8x8(raw.z, raw.w);
  }
  __device__ __forceinline__ void load_shared(const uint8_t* at, bool ok) {  // a staged row (k % 16 == 0)
    raw = ok ? *reinterpret_cast<const uint4*>(at) : make_uint4(0, 0, 0, 0);
  }
};

// Row of the strip's in-strip row r: row0 + r, or with kRope, of pair strip * strip_rows / 2 + r % 8 of the heads'
// RoPE pairs (row i of a head and i + half), its row i for r < 8 and i + half from 8 on (above).
template <bool kRope>
__device__ __forceinline__ int64_t strip_row(const SkinnyLinearParams& p, int64_t strip, int strip_rows, int r) {
  if constexpr (kRope) {
    const int64_t half = p.rope.head_dim / 2, pair = strip * (strip_rows / 2) + r % 8;
    return pair / half * p.rope.head_dim + (r < 8 ? 0 : half) + pair % half;
  } else {
    return strip * strip_rows + r;
  }
}
// Whether in-strip row r belongs to the strip (kRope: strip_rows / 2 pairs, rows 0.. and 8..).
template <bool kRope>
__device__ __forceinline__ bool strip_has(int strip_rows, int r) {
  return kRope ? r % 8 < strip_rows / 2 : r < strip_rows;
}

// Thread v's output value: fragment slot v / 32 (tile j, element e) of lane v % 32, its row and token, and whether
// it is one (v < kValues, in the strip, row < n, token < m).
struct ValueAt {
  int64_t row, token;
  bool live;
};
template <bool kRope, int kValues>
__device__ __forceinline__ ValueAt value_at(const SkinnyLinearParams& p, int64_t strip, int strip_rows, int v) {
  const int slot = v / 32, l = v % 32, j = slot / 4, e = slot % 4;
  const int in_strip = l / 4 + (e >= 2 ? 8 : 0);
  const int64_t row = strip_row<kRope>(p, strip, strip_rows, in_strip);
  const int64_t token = 8 * j + 2 * (l % 4) + (e & 1);
  return {row, token, v < kValues && token < p.m && strip_has<kRope>(strip_rows, in_strip) && row < p.n};
}

// What a live value's epilogue reads besides its sum, none of it written by the kernels before this one: its row's
// FP8 scale and bias, and with kRope cos / sin of its pair (q and k heads) and where its bf16 result goes (q_out or
// the paged cache; null: nowhere). With SkinnyLinearParams::inputs_first read before the PDL wait and kept in shared
// memory over the k loop, so the epilogue has no global loads left (the RoPE one had position -> page table -> store
// after the sums, on the kernel's tail); otherwise read there, as before.
template <bool kRope>
struct EpilogueIn {
  float scale, bias;
};
template <>
struct EpilogueIn<true> {
  float scale, bias, cos_i, sin_i;
  uint16_t* out;
};
template <bool kFp8, bool kRope>
__device__ __forceinline__ EpilogueIn<kRope> epilogue_in(const SkinnyLinearParams& p, const ValueAt& at) {
  EpilogueIn<kRope> in{};
  if constexpr (kFp8) in.scale = p.w_scale[at.row];
  if (p.bias) in.bias = bf16_bits_to_f32(p.bias[at.row]);
  if constexpr (kRope) {
    const SkinnyRope& r = p.rope;
    const int64_t hd = r.head_dim, half = hd / 2, head = at.row / hd, d = at.row % hd;
    const int32_t pos = r.kv.positions[at.token];
    const int64_t cache = head < r.n_q ? 0 : kv_row(r.kv, at.token, pos, r.n_kv);
    if (head < r.n_q + r.n_kv) {  // qkv_rope's table entry (rope.cu)
      float sn, cs;
      sincosf(static_cast<float>(pos) * r.inv_freq[d % half], &sn, &cs);
      in.cos_i = cs * r.scale, in.sin_i = sn * r.scale;
    }
    if (head < r.n_q) {
      in.out = r.q_out + (at.token * r.n_q + head) * hd + d;
    } else if (cache >= 0) {
      in.out = head < r.n_q + r.n_kv ? r.kv.k + (cache + head - r.n_q) * hd + d
                                     : r.kv.v + (cache + head - r.n_q - r.n_kv) * hd + d;
    }
  }
  return in;
}

// A row's sum times its FP8 scale, plus its bias: rounded step by step (never one fma), so that the plain and the
// RoPE epilogues of every instantiation agree bit for bit.
template <bool kFp8, bool kRope>
__device__ __forceinline__ float scale_and_bias(const SkinnyLinearParams& p, const EpilogueIn<kRope>& in, float s) {
  if constexpr (kFp8) s = __fmul_rn(s, in.scale);
  return p.bias ? __fadd_rn(s, in.bias) : s;
}

// kRope's epilogue (no k split): thread v < kValues holds the warps' sum `s` of its value (value_at); element e ^ 2
// of the same lane is the other half of its RoPE pair.
template <int kValues, bool kFp8>
__device__ __forceinline__ void rope_epilogue(const SkinnyLinearParams& p, const ValueAt& at, const EpilogueIn<true>& in,
                                              float s, float* rounded) {
  const int v = threadIdx.x;
  if (at.live) rounded[v] = bf16_bits_to_f32(f32_to_bf16_bits(scale_and_bias<kFp8, true>(p, in, s)));  // qkv's bf16 value
  __syncthreads();
  if (!at.live || !in.out) return;
  const SkinnyRope& r = p.rope;
  const int64_t hd = r.head_dim, half = hd / 2, head = at.row / hd, d = at.row % hd;
  const float own = rounded[v];
  if (head >= r.n_q + r.n_kv) {  // v: copied
    *in.out = f32_to_bf16_bits(own);
    return;
  }
  // qkv_rope's rotation (rope.cu): a = x[i], b = x[i + half].
  const float other = rounded[v ^ 64];  // slot e ^ 2: the pair's other row
  const float a = d < half ? own : other, b = d < half ? other : own;
  // Rounded step by step as rope.cu's 4-wide form reads in PTX (a cos - b sin not contracted, b cos + a sin one fma);
  // ptxas may still fuse a product of the former there, so a value near zero can differ by a bf16 step.
  const float y = d < half ? __fsub_rn(__fmul_rn(a, in.cos_i), __fmul_rn(b, in.sin_i))
                           : __fmaf_rn(b, in.cos_i, __fmul_rn(a, in.sin_i));
  *in.out = f32_to_bf16_bits(y);
}

// kPersistent (SkinnyLinearConfig::persistent, the plain linear without k splits): a CTA takes strips blockIdx.x,
// + gridDim.x, ... below `strips`, issuing the next strip's first chunks in its last k step, so they are in flight
// during the strip's sums; else one strip a CTA (gridDim.x = strips).
// kStaged (SkinnyLinearConfig::staged, no k split, not persistent; FP8 rows with k % 16 == 0): the strip's rows are
// copied whole into shared memory before the PDL wait (one bulk copy a row, in-strip row r at r * `pitch` bytes, on
// one mbarrier) instead of the first round of register loads; the fragments are then read from there in the same
// chunk order: the same bits.
template <int kTiles, int kChunks, typename Weights, int kCtasPerSm, bool kRope, bool kPersistent, bool kStaged = false>
__global__ void __launch_bounds__(kSkinnyLinearWarps * 32, kCtasPerSm)
    skinny_linear_kernel(SkinnyLinearParams p, int64_t chunks_per_split, int strip_rows, int64_t strips, int64_t pitch) {
  static_assert(!kStaged || !kPersistent, "a staged CTA takes one strip");
  constexpr int kLaneK = Weights::kLaneK, kGroups = kLaneK / 8, kChunk = 4 * kLaneK;  // k per chunk: 4 lanes
  constexpr int kValues = kTiles * 4 * 32;
  __shared__ float red[kSkinnyLinearWarps][kTiles * 4][32];
  __shared__ float rounded[kRope ? kValues : 1];  // kRope: the strip's values as bf16, for the pair partners
  __shared__ EpilogueIn<kRope> inputs[kValues];   // inputs_first: each value's, read before the wait
  __shared__ bool last_of_strip;
  extern __shared__ __align__(128) uint8_t staged[];  // kStaged: the strip's rows
  __shared__ __align__(8) uint64_t staged_full;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  int64_t strip = blockIdx.x;
  const int64_t first = blockIdx.y * chunks_per_split;
  const int64_t end = min((p.k + kChunk - 1) / kChunk, first + chunks_per_split);
  // Rows past the strip or n and tokens past m read row 0 / token 0 (always valid) and are masked to zero.
  bool lo_ok, hi_ok;
  int64_t w_lo, w_hi;  // element offsets of this lane's weights
  auto strip_rows_at = [&](int64_t s) {
    const int64_t row_lo = strip_row<kRope>(p, s, strip_rows, g), row_hi = strip_row<kRope>(p, s, strip_rows, g + 8);
    lo_ok = strip_has<kRope>(strip_rows, g) && row_lo < p.n, hi_ok = strip_has<kRope>(strip_rows, g + 8) && row_hi < p.n;
    w_lo = (lo_ok ? row_lo : 0) * p.k + kLaneK * t;
    w_hi = (hi_ok ? row_hi : 0) * p.k + kLaneK * t;
  };
  strip_rows_at(strip);
  const uint16_t* x_row[kTiles];
  bool x_ok[kTiles];
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
    x_ok[j] = g + 8 * j < p.m;
    x_row[j] = p.x + (x_ok[j] ? g + 8 * j : 0) * p.k + kLaneK * t;
  }
  const uint4 zero = make_uint4(0, 0, 0, 0);
  Weights a_lo[kChunks], a_hi[kChunks];
  uint4 b[kChunks][kTiles][kGroups];
  auto in_range = [&](int64_t c) { return c < end && c * kChunk + kLaneK * t < p.k; };
  auto whole = [&](int64_t c) { return c * kChunk + kLaneK * (t + 1) <= p.k; };
  auto load_weights = [&](int64_t c0) {
#pragma unroll
    for (int u = 0; u < kChunks; ++u) {
      const int64_t c = c0 + static_cast<int64_t>(u) * kSkinnyLinearWarps;
      const bool in = in_range(c), all = whole(c);
      if constexpr (kStaged) {  // a chunk is 64 bytes of a row for either dtype
        a_lo[u].load_shared(staged + g * pitch + c * 64 + 16 * t, in && lo_ok);
        a_hi[u].load_shared(staged + (g + 8) * pitch + c * 64 + 16 * t, in && hi_ok);
      } else {
        a_lo[u].load(p, w_lo + c * kChunk, in && lo_ok, all);
        a_hi[u].load(p, w_hi + c * kChunk, in && hi_ok, all);
      }
    }
  };
  auto load_activations = [&](int64_t c0) {
#pragma unroll
    for (int u = 0; u < kChunks; ++u) {
      const int64_t c = c0 + static_cast<int64_t>(u) * kSkinnyLinearWarps;
      const bool in = in_range(c), all = whole(c);
#pragma unroll
      for (int j = 0; j < kTiles; ++j)
#pragma unroll
        for (int h = 0; h < kGroups; ++h)
          b[u][j][h] = in && x_ok[j] && (h == 0 || all) ? ldg_cached(x_row[j] + c * kChunk + 8 * h) : zero;
    }
  };

  // The weights are constant: the first loads go out before waiting on the kernel that writes x (kStaged: all of the
  // strip's rows, by the copy engine).
  if constexpr (kStaged) {
    const uint32_t bar = smem_addr(&staged_full);
    if (threadIdx.x == 0) {
      mbarrier_init(bar, 1);
      mbarrier_init_fence();
    }
    __syncthreads();
    if (warp == 0) {
      const auto row_bytes = static_cast<uint32_t>(Weights::kFp8 ? p.k : 2 * p.k);
      const int64_t row = strip_row<kRope>(p, strip, strip_rows, lane % 16);
      const bool copies = lane < 16 && strip_has<kRope>(strip_rows, lane) && row < p.n;
      const unsigned rows = __popc(__ballot_sync(0xffffffffu, copies));
      if (lane == 0) mbarrier_arrive_expect_tx(bar, row_bytes * rows);
      __syncwarp();
      const uint8_t* w = Weights::kFp8 ? p.w_fp8 : reinterpret_cast<const uint8_t*>(p.w);
      if (copies) bulk_copy(smem_addr(staged) + static_cast<uint32_t>(lane * pitch), w + row * row_bytes, row_bytes, bar);
    }
  } else {
    load_weights(first + warp);
  }
  if (p.inputs_first) {  // into shared memory at once (no registers held over the wait); the same thread reads it back
    const ValueAt early = value_at<kRope, kValues>(p, strip, strip_rows, threadIdx.x);
    if (early.live) inputs[threadIdx.x] = epilogue_in<Weights::kFp8, kRope>(p, early);
  }
  pdl_wait();
  pdl_launch_dependents();  // after the wait: a dependent may rely on what our predecessors wrote
  load_activations(first + warp);
  if constexpr (kStaged) {
    mbarrier_wait(smem_addr(&staged_full), 0);
    load_weights(first + warp);
  }
  const int64_t step = static_cast<int64_t>(kChunks) * kSkinnyLinearWarps;
  for (;;) {  // this CTA's strips
  const int64_t next_strip = strip + gridDim.x;
  float acc[kTiles][4] = {};
  for (int64_t c0 = first + warp; c0 < end; c0 += step) {
#pragma unroll
    for (int u = 0; u < kChunks; ++u) {
#pragma unroll
      for (int h = 0; h < kGroups; ++h) {
        const uint4 lo = a_lo[u].bf16(h), hi = a_hi[u].bf16(h);
        const uint32_t a0[4] = {lo.x, hi.x, lo.y, hi.y};
        const uint32_t a1[4] = {lo.z, hi.z, lo.w, hi.w};
#pragma unroll
        for (int j = 0; j < kTiles; ++j) {
          mma_bf16_16816(acc[j], a0, b[u][j][h].x, b[u][j][h].y);
          mma_bf16_16816(acc[j], a1, b[u][j][h].z, b[u][j][h].w);
        }
      }
    }
    // Past the end these are all masked (no memory traffic), unless the CTA has a next strip: then its first chunks,
    // in flight during this strip's sums.
    int64_t next = c0 + step;
    if (kPersistent && next >= end && next_strip < strips) {
      strip_rows_at(next_strip);
      next = first + warp;
    }
    load_weights(next);
    load_activations(next);
  }

#pragma unroll
  for (int j = 0; j < kTiles; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) red[warp][j * 4 + e][lane] = acc[j][e];
  __syncthreads();
  // One value per thread: fragment slot (tile j, element e) of lane l, summed over the warps in order. The thread
  // index read again (a volatile read): its value's row and token are not kept over the k loop, where the 80-register
  // forms would spill them.
  int v;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(v));
  float s = 0;
  if (v < kValues) {
#pragma unroll
    for (int w = 0; w < kSkinnyLinearWarps; ++w) s += red[w][v / 32][v % 32];
  }
  if (gridDim.y > 1) {
    // Partials of this split, then the strip's last CTA sums every split in order.
    float* mine = p.partials + (strip * gridDim.y + blockIdx.y) * kValues;
    if (v < kValues) mine[v] = s;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
      const uint32_t done = atomicAdd(&p.tickets[strip], 1u);
      last_of_strip = done == gridDim.y - 1;
      if (last_of_strip) p.tickets[strip] = 0;  // every split has arrived: ready for the next launch
    }
    __syncthreads();
    if (!last_of_strip) return;
    __threadfence();
    if (v < kValues) {
      s = 0;
      for (unsigned y = 0; y < gridDim.y; ++y) s += __ldcg(p.partials + (strip * gridDim.y + y) * kValues + v);
    }
  }
  const ValueAt at = value_at<kRope, kValues>(p, strip, strip_rows, v);
  EpilogueIn<kRope> in{};
  if (at.live) in = p.inputs_first && strip == blockIdx.x ? inputs[v] : epilogue_in<Weights::kFp8, kRope>(p, at);
  if constexpr (kRope) {
    rope_epilogue<kValues, Weights::kFp8>(p, at, in, s, rounded);
    return;
  }
  if (at.live) {
    s = scale_and_bias<Weights::kFp8, kRope>(p, in, s);
    if (p.out_f32) {
      static_cast<float*>(p.out)[at.token * p.n + at.row] = s;
    } else {
      static_cast<uint16_t*>(p.out)[at.token * p.n + at.row] = f32_to_bf16_bits(s);
    }
  }
  if (!kPersistent || next_strip >= strips) return;
  strip = next_strip;
  __syncthreads();  // every warp has read red: the next strip's sums may overwrite it
  }
}

// `sms`: the device's, for SkinnyLinearConfig::persistent (that many CTAs a form's kCtasPerSm times, at most).
template <int kTiles, int kChunks, typename Weights, int kCtasPerSm = kSkinnyLinearCtasPerSm, bool kRope = false,
          bool kPersistent = false, bool kStaged = false>
Status launch(const SkinnyLinearParams& p, const SkinnyLinearConfig& c, cudaStream_t stream, int sms = 0) {
  auto* kernel = skinny_linear_kernel<kTiles, kChunks, Weights, kCtasPerSm, kRope, kPersistent, kStaged>;
  const int64_t pitch = kStaged ? skinny_linear_staged_pitch(p.k, Weights::kFp8 ? 1 : 2) : 0;
  const auto smem = static_cast<size_t>(16 * pitch);  // a slot per in-strip row (kRope's rows 0-7 and 8-15)
  if constexpr (kStaged)
    MX_RETURN_IF_ERROR(cuda_status(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
        "cudaFuncSetAttribute(skinny_linear staged smem)"));
  cudaLaunchConfig_t cfg = {};
  const int64_t strips = ceil_div64(p.n, c.strip_rows);
  const int64_t ctas = kPersistent ? std::min<int64_t>(strips, static_cast<int64_t>(sms) * kCtasPerSm) : strips;
  cfg.gridDim = dim3(static_cast<unsigned>(ctas), static_cast<unsigned>(c.k_splits));
  cfg.blockDim = dim3(static_cast<unsigned>(c.threads));
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr = {};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = c.pdl ? 1 : 0;
  // The config counts 32-element chunks per split; an FP8 chunk is 64 elements (two of them, rounded up: an
  // empty last split adds zeros).
  const int64_t chunks_per_split = Weights::kFp8 ? (c.chunks_per_split + 1) / 2 : c.chunks_per_split;
  return cuda_status(cudaLaunchKernelEx(&cfg, kernel, p, chunks_per_split, c.strip_rows, strips, pitch),
                     "skinny_linear_kernel");
}

// One thread per 8 weights: an 8-byte load, 8 bf16 out in one 16-byte store.
__global__ void dequant_fp8_rows_kernel(const uint8_t* w, const float* scale, uint16_t* out, int64_t rows, int64_t k) {
  const int64_t groups = rows * (k / 8);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < groups;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float s = scale[i / (k / 8)];
    const uint2 v = ldg_stream8(w + 8 * i);
    const uint32_t words[2] = {v.x, v.y};
    uint32_t packed[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(
          static_cast<__nv_fp8x2_storage_t>((words[j / 2] >> (16 * (j % 2))) & 0xffffu), __NV_E4M3);
      const float2 f = __half22float2(__half2(h));
      const __nv_bfloat162 b = __float22bfloat162_rn(make_float2(f.x * s, f.y * s));
      packed[j] = *reinterpret_cast<const uint32_t*>(&b);
    }
    *reinterpret_cast<uint4*>(out + 8 * i) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
  }
}

}  // namespace

Status launch_skinny_linear(const SkinnyLinearParams& p, const SkinnyLinearConfig& c, cudaStream_t stream) {
  if (p.k % 8 != 0 || p.k <= 0) return unimplemented("skinny linear: k must be a positive multiple of 8");
  if ((p.w_fp8 != nullptr) == (p.w != nullptr) || (p.w_fp8 && !p.w_scale))
    return internal_error("skinny linear: give bf16 weights or fp8 weights with their scales");
  if (p.m < 1 || p.m > 8 * c.n_tiles || c.threads != 32 * kSkinnyLinearWarps)
    return internal_error("skinny linear: config does not match the batch");
  if (p.n == 0) return Status::ok();
  if (c.k_splits < 1 || c.k_splits > kSkinnyLinearMaxKSplits || c.k_splits * c.chunks_per_split < ceil_div64(p.k, 32))
    return internal_error("skinny linear: k splits do not cover k");
  if (c.strip_rows < 8 || c.strip_rows > 16) return internal_error("skinny linear: strips of 8 to 16 rows");
  if (c.k_splits > 1 && (!p.partials || !p.tickets || ceil_div64(p.n, c.strip_rows) > kSkinnyLinearMaxSplitStrips))
    return internal_error("skinny linear: k splits need the partials and tickets scratch");
  // A chunk in flight is one 16-byte load per weight row and lane for either dtype, but an FP8 chunk takes two
  // activation loads per token tile. FP8 has two forms per tile count: when the strips fit one wave at 2 CTAs
  // per SM, 2 CTAs with 4 chunks in flight (3 with two tiles: 124 registers, 4 would spill); otherwise 3 CTAs
  // per SM with 3 chunks (2 with two tiles; <= 80 registers), so that e.g. qkv's 320 strips on 132 SMs run in
  // one wave. Measured on an H200 at one token (docs/PERF.md, session 14 W1): o_proj's 180 strips 6.42 us at 2
  // per SM vs 7.47 at 3, qkv's 320 strips 9.75 vs 6.56, the lm_head 230.4 vs 179.5. No 8-chunk FP8 variant
  // (bf16's benchmark knob at one token; it would spill).
  // kRope (qkv at decode) takes the same two forms for bf16 weights as for FP8 (its 320 strips at gpt-oss's
  // shape are 1.2 waves at 2 CTAs per SM; session 16 measured the 3-CTA form at one token 12.30 us against
  // cuBLASLt's 12.16 and the register kernel's 13.27, before the qkv_rope launch it saves).
  int device = 0, sms = 0;
  auto one_wave = [&]() -> Result<bool> {
    MX_RETURN_IF_ERROR(cuda_status(cudaGetDevice(&device), "cudaGetDevice"));
    MX_RETURN_IF_ERROR(
        cuda_status(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute"));
    return ceil_div64(p.n, c.strip_rows) <= static_cast<int64_t>(sms) * kSkinnyLinearCtasPerSm;
  };
  if (p.rope.q_out) {
    const SkinnyRope& r = p.rope;
    if (c.strip_rows % 2 != 0 || c.k_splits != 1 || p.out_f32 || r.head_dim % 2 != 0 || r.n_q < 1 || r.n_kv < 1 ||
        p.n != (r.n_q + 2 * r.n_kv) * r.head_dim || !r.inv_freq)
      return internal_error("skinny linear: RoPE epilogue needs strips of whole pairs, no k split, bf16 out");
    MX_ASSIGN_OR_RETURN(const bool one, one_wave());
    constexpr int kNarrow = kSkinnyLinearNarrowCtasPerSm;
    // Staged (FP8, one token tile, k % 16 == 0): the 3-CTA form whatever the waves (16 slots of ~3 KB rows at 2880).
    if (c.staged && p.w_fp8 && c.n_tiles == 1 && p.k % 16 == 0)
      return launch<1, 3, Fp8Weights, kNarrow, true, false, true>(p, c, stream);
    if (p.w_fp8 && c.n_tiles == 1)
      return one ? launch<1, 4, Fp8Weights, 2, true>(p, c, stream) : launch<1, 3, Fp8Weights, kNarrow, true>(p, c, stream);
    if (p.w_fp8)
      return one ? launch<2, 3, Fp8Weights, 2, true>(p, c, stream) : launch<2, 2, Fp8Weights, kNarrow, true>(p, c, stream);
    if (c.n_tiles == 1)
      return one ? launch<1, 4, Bf16Weights, 2, true>(p, c, stream) : launch<1, 3, Bf16Weights, kNarrow, true>(p, c, stream);
    return one ? launch<2, 4, Bf16Weights, 2, true>(p, c, stream) : launch<2, 2, Bf16Weights, kNarrow, true>(p, c, stream);
  }
  if (p.w_fp8) {
    if (c.chunks_in_flight != 4) return internal_error("skinny linear: no compiled FP8 variant for this config");
    MX_ASSIGN_OR_RETURN(const bool one_wave_fp8, one_wave());
    constexpr int kNarrow = kSkinnyLinearNarrowCtasPerSm;
    // Persistent CTAs only past one wave (the lm_head), without k splits: the 3-CTA forms.
    const bool persist = c.persistent && c.k_splits == 1 && !one_wave_fp8;
    if (c.n_tiles == 1 && persist) return launch<1, 3, Fp8Weights, kNarrow, false, true>(p, c, stream, sms);
    if (persist) return launch<2, 2, Fp8Weights, kNarrow, false, true>(p, c, stream, sms);
    if (c.n_tiles == 1)
      return one_wave_fp8 ? launch<1, 4, Fp8Weights>(p, c, stream) : launch<1, 3, Fp8Weights, kNarrow>(p, c, stream);
    return one_wave_fp8 ? launch<2, 3, Fp8Weights>(p, c, stream) : launch<2, 2, Fp8Weights, kNarrow>(p, c, stream);
  }
  if (c.persistent && c.k_splits == 1 && c.chunks_in_flight == 4) {  // bf16 past one wave: the 4-chunk forms
    MX_ASSIGN_OR_RETURN(const bool one, one_wave());
    if (!one && c.n_tiles == 1) return launch<1, 4, Bf16Weights, kSkinnyLinearCtasPerSm, false, true>(p, c, stream, sms);
    if (!one) return launch<2, 4, Bf16Weights, kSkinnyLinearCtasPerSm, false, true>(p, c, stream, sms);
  }
  if (c.n_tiles == 1 && c.chunks_in_flight == 8) return launch<1, 8, Bf16Weights>(p, c, stream);
  if (c.n_tiles == 1 && c.chunks_in_flight == 4) return launch<1, 4, Bf16Weights>(p, c, stream);
  if (c.n_tiles == 2 && c.chunks_in_flight == 4) return launch<2, 4, Bf16Weights>(p, c, stream);
  return internal_error("skinny linear: no compiled variant for this config");
}

Status launch_dequant_fp8_rows(const uint8_t* w, const float* scale, uint16_t* out, int64_t rows, int64_t k,
                               cudaStream_t stream) {
  if (k % 8 != 0) return unimplemented("fp8 dequant: k must be a multiple of 8");
  const int64_t groups = rows * (k / 8);
  if (groups == 0) return Status::ok();
  const auto blocks = static_cast<unsigned>(std::min<int64_t>(ceil_div64(groups, 256), 65535));
  dequant_fp8_rows_kernel<<<blocks, 256, 0, stream>>>(w, scale, out, rows, k);
  return cuda_status(cudaGetLastError(), "dequant_fp8_rows_kernel");
}

}  // namespace mx::cuda
