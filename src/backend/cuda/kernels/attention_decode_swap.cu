// Decode attention for GQA groups of up to 8 (Gemma-4: head dim 256 with 2 q heads per kv head, 512 with 8;
// gpt-oss: head dim 64 with 8, where a 16-row query tile wastes half of each mma), "swap AB": the keys are the m16n8k16 mma's M side and the group's q heads its 8-wide N side,
// so a group of 2 wastes 3/4 of each mma instead of the 7/8 that 16-row query tiles waste (attention.cu's
// decode kernel). Decode is bandwidth bound: what matters is that every K/V byte is read once and that
// enough bytes are in flight. At head dim 64 (below; 256 and 512 at the end) the CTA is one warp with its own cp.async ring of 16-key stages (no CTA
// barrier anywhere), several CTAs per SM, and the KV range of a (token, kv head) split over CTAs; the
// splits are combined by attention.cu's merge kernel, which also adds the sink.
//
// Per 16-key stage: S^T = K Q^T (A = K [16 keys][16 d] by ldmatrix, B = Q [8 heads][16 d] by ldmatrix from
// shared memory), online softmax per head column (a lane holds keys r, r + 8 of heads 2q, 2q + 1), P^T to
// bf16 and transposed in registers (movmatrix) into the B operand of O^T += V^T P^T (A = V^T by
// ldmatrix.trans). The accumulator O^T [head_dim][8 heads] stays in registers (head_dim / 2 floats a lane).
// Layers whose V aliases K (Gemma-4's full layers) load each key row once and use it for both products.
// The page of each of a stage's 16 keys is looked up once, by one lane, and broadcast by shuffles.
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels/attention_common.cuh"
#include "backend/cuda/kernels/cluster.cuh"
#include "backend/cuda/kernels/cluster_kernels.h"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/head_rows.cuh"
#include "backend/cuda/kernels/kernels.h"

namespace mx::cuda {
namespace {

constexpr int kKeys = 16;   // keys per stage: the mma's M
constexpr int kHeads = 8;   // q heads per CTA: the mma's N (rows past the group are zero)

// 16-byte chunk `c` of row `row` of a [rows][HD] tile, XOR-swizzled so that ldmatrix's 8 rows (same
// logical chunk, consecutive rows) hit 8 different bank groups.
template <int HD>
__device__ __forceinline__ uint16_t* chunk_at(uint16_t* tile, int row, int c) {
  return tile + row * HD + ((c ^ (row & 7)) * 8);
}

__device__ __forceinline__ uint32_t transpose_8x8(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// Where key k0 + lane (lane < 16) of kv head g lives: its element offset in the cache and whether it is
// there (false past `kend` or outside the cache). Looked up a stage ahead of its copies, so the page
// table's latency hides under the math.
struct StageRows {
  long long off = 0;
  int ok = 0;
};
template <int HD>
__device__ __forceinline__ StageRows lookup_stage(const AttentionKernelParams& p, int g, int seq, int k0, int kend) {
  StageRows s;
  const int lane = threadIdx.x, key = k0 + lane;
  if (lane < kKeys && key <= kend) {
    const int64_t logical = key / p.kv.page_size;
    if (logical < p.kv.max_pages) {
      const int64_t page = p.kv.page_table[static_cast<int64_t>(seq) * p.kv.max_pages + logical];
      s.ok = page >= 0 && page < p.kv.num_pages;
      if (s.ok) s.off = ((page * p.kv.page_size + key % p.kv.page_size) * p.n_kv + g) * HD;
    }
  }
  return s;
}

// Issues the copies of a stage's 16 key rows (zero-filled where not there) into sk, and sv unless V
// aliases K; each row's offset comes from the lane that looked it up.
template <int HD>
__device__ __forceinline__ void copy_stage(const AttentionKernelParams& p, const StageRows& rows, bool shared_kv,
                                           uint16_t* sk, uint16_t* sv) {
  constexpr int kChunks = HD / 8;
  const int lane = threadIdx.x;
  if constexpr (kChunks < 32) {
    // Narrow heads (64: 8 chunks a row): 32 / kChunks rows per pass, a lane per chunk, so that every lane
    // copies (one lane per row would leave 3/4 of the warp idle and take 4x the instructions).
    constexpr int kRowsPerPass = 32 / kChunks;
    const int c = lane % kChunks;
#pragma unroll
    for (int row0 = 0; row0 < kKeys; row0 += kRowsPerPass) {
      const int row = row0 + lane / kChunks;
      const long long row_off = __shfl_sync(0xffffffffu, rows.off, row);
      const bool row_ok = __shfl_sync(0xffffffffu, rows.ok, row) != 0;
      cp_async_16(chunk_at<HD>(sk, row, c), p.kv.k + row_off + c * 8, row_ok);
      if (!shared_kv) cp_async_16(chunk_at<HD>(sv, row, c), p.kv.v + row_off + c * 8, row_ok);
    }
  } else {
#pragma unroll
    for (int row = 0; row < kKeys; ++row) {
      const long long row_off = __shfl_sync(0xffffffffu, rows.off, row);
      const bool row_ok = __shfl_sync(0xffffffffu, rows.ok, row) != 0;
#pragma unroll
      for (int c = lane; c < kChunks; c += 32) {
        cp_async_16(chunk_at<HD>(sk, row, c), p.kv.k + row_off + c * 8, row_ok);
        if (!shared_kv) cp_async_16(chunk_at<HD>(sv, row, c), p.kv.v + row_off + c * 8, row_ok);
      }
    }
  }
}

// Waits until at most `pending` of this thread's copy groups are still in flight (cp.async.wait_group takes
// an immediate; the ring depth is a runtime choice).
__device__ __forceinline__ void wait_groups(int pending) {
  switch (pending) {
    case 0: cp_async_wait<0>(); break;
    case 1: cp_async_wait<1>(); break;
    case 2: cp_async_wait<2>(); break;
    default: cp_async_wait<3>(); break;
  }
}

// One 16-key stage's online softmax per head column, shared by both kernels: the max over the 16 keys (this
// lane's 2, then the 8 lanes of the same q), the running state (m, l, O^T) rescaled, P = 2^(s - m); returns P^T's
// 8 x 8 blocks (keys r / r + 8, heads 2q, 2q + 1) transposed: lane (r, q) then holds P of head r at keys 2q,
// 2q + 1 (and + 8), the B fragment of the P.V mma.
template <int kDt>
__device__ __forceinline__ void softmax_stage_to_p(float (&s)[4], float (&m)[2], float (&l)[2], float (&o)[kDt][4],
                                                   uint32_t& pb0, uint32_t& pb1) {
  float corr[2];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    float mx = fmaxf(s[j], s[2 + j]);
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
    const float m_new = fmaxf(m[j], mx);
    const float base = m_new == -INFINITY ? 0.f : m_new;  // nothing visible yet: stays at zero weight
    corr[j] = exp2f(m[j] - base);
    m[j] = m_new;
    s[j] = exp2f(s[j] - base);
    s[2 + j] = exp2f(s[2 + j] - base);
    l[j] = l[j] * corr[j] + s[j] + s[2 + j];
  }
#pragma unroll
  for (int dt = 0; dt < kDt; ++dt) {
    o[dt][0] *= corr[0];
    o[dt][1] *= corr[1];
    o[dt][2] *= corr[0];
    o[dt][3] *= corr[1];
  }
  pb0 = transpose_8x8(pack_bf16x2(s[0], s[1]));
  pb1 = transpose_8x8(pack_bf16x2(s[2], s[3]));
}

template <int HD>
__global__ void __launch_bounds__(32) attention_decode_swap_kernel(AttentionKernelParams p, int stages, int splits,
                                                                   int min_split_keys) {
  constexpr int kChunks = HD / 8, kDt = HD / 16;
  extern __shared__ __align__(128) uint8_t smem_raw[];
  uint16_t* sq = reinterpret_cast<uint16_t*>(smem_raw);  // [8 heads][HD]
  uint16_t* ring = sq + kHeads * HD;                      // stages x {K, V unless shared} [16 keys][HD]
  const bool shared_kv = p.kv.v == p.kv.k;
  const int stage_elems = (shared_kv ? 1 : 2) * kKeys * HD;
  const int group = static_cast<int>(p.n_q / p.n_kv);
  const int64_t t = blockIdx.x;
  const int g = blockIdx.y, split = blockIdx.z;
  const int lane = threadIdx.x, r = lane / 4, q = lane % 4;

  pdl_wait();  // launched as a programmatic dependent: q and the new K/V come from qkv_rope
  pdl_launch_dependents();  // after the wait: a dependent may rely on what our predecessors wrote

  for (int idx = lane; idx < kHeads * kChunks; idx += 32) {
    const int row = idx / kChunks, c = idx % kChunks;
    const bool ok = row < group;
    const uint16_t* src = ok ? p.q + (t * p.n_q + g * group + row) * HD + c * 8 : p.q;
    cp_async_16(chunk_at<HD>(sq, row, c), src, ok);
  }
  cp_async_commit();

  const int pos = p.kv.positions[t];
  const int first = p.window > 0 ? max(0, pos - static_cast<int>(p.window) + 1) : 0;
  const int len = pos - first + 1;
  const int chunk = max(min_split_keys, ((len + splits - 1) / splits + kKeys - 1) / kKeys * kKeys);
  const int kstart = first + split * chunk;
  const int kend = min(pos, kstart + chunk - 1);
  const int n_tiles = kend >= kstart ? (kend - kstart + kKeys) / kKeys : 0;
  const int seq = p.kv.token_seq[t];
  auto lookup = [&](int i) { return lookup_stage<HD>(p, g, seq, kstart + i * kKeys, kend); };
  auto issue = [&](int i, const StageRows& rows) {
    if (i < n_tiles) {
      uint16_t* sk = ring + (i % stages) * stage_elems;
      copy_stage<HD>(p, rows, shared_kv, sk, sk + kKeys * HD);
    }
    cp_async_commit();  // empty groups too: the wait below counts groups
  };
  for (int i = 0; i < stages - 1; ++i) issue(i, lookup(i));
  StageRows next = lookup(stages - 1);

  float m[2] = {-INFINITY, -INFINITY};  // heads 2q, 2q + 1
  float l[2] = {0.f, 0.f};              // this lane's keys only; summed over the 8 lanes of a head at the end
  float o[kDt][4];                      // O^T: d 16 dt + r (+ 8 for [2], [3]), heads 2q, 2q + 1
#pragma unroll
  for (int dt = 0; dt < kDt; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.f;

  for (int i = 0; i < n_tiles; ++i) {
    issue(i + stages - 1, next);
    next = lookup(i + stages);  // consumed by the next iteration's copies
    wait_groups(stages - 1);
    __syncwarp();
    uint16_t* sk = ring + (i % stages) * stage_elems;
    uint16_t* sv = shared_kv ? sk : sk + kKeys * HD;

    // S^T [16 keys][8 heads], two accumulator chains over d.
    float s[4] = {0.f, 0.f, 0.f, 0.f}, s2[4] = {0.f, 0.f, 0.f, 0.f};
    const int mi = lane / 8;
#pragma unroll
    for (int dt = 0; dt < kDt; dt += 2) {
      uint32_t qb[4], ka[4], kb[4];
      ldmatrix_x4(qb, chunk_at<HD>(sq, lane % 8, 2 * dt + mi));
      ldmatrix_x4(ka, chunk_at<HD>(sk, (mi % 2) * 8 + lane % 8, 2 * dt + mi / 2));
      ldmatrix_x4(kb, chunk_at<HD>(sk, (mi % 2) * 8 + lane % 8, 2 * dt + 2 + mi / 2));
      mma_bf16_16816(s, ka, qb[0], qb[1]);
      mma_bf16_16816(s2, kb, qb[2], qb[3]);
    }
    const int key_lo = kstart + i * kKeys + r;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = key_lo + (e >= 2 ? 8 : 0);
      s[e] = key <= kend ? (s[e] + s2[e]) * p.scale_log2 : -INFINITY;
    }

    uint32_t pb0, pb1;
    softmax_stage_to_p(s, m, l, o, pb0, pb1);
#pragma unroll
    for (int dt = 0; dt < kDt; ++dt) {
      uint32_t va[4];
      ldmatrix_x4_trans(va, chunk_at<HD>(sv, (mi / 2) * 8 + lane % 8, 2 * dt + mi % 2));
      mma_bf16_16816(o[dt], va, pb0, pb1);
    }
    __syncwarp();  // every lane's reads of this stage are done before it is refilled
  }
  cp_async_wait<0>();

#pragma unroll
  for (int j = 0; j < 2; ++j) {
    l[j] += __shfl_xor_sync(0xffffffffu, l[j], 4);
    l[j] += __shfl_xor_sync(0xffffffffu, l[j], 8);
    l[j] += __shfl_xor_sync(0xffffffffu, l[j], 16);
  }
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int h = 2 * q + j;
    if (h >= group) continue;
    const int64_t head = static_cast<int64_t>(g) * group + h;
    if (splits == 1) {
      const float factor = attention_final_factor(m[j], l[j], attention_sink_log2(p.sinks, head));
      uint16_t* out = p.out + (t * p.n_q + head) * HD;
#pragma unroll
      for (int dt = 0; dt < kDt; ++dt) {
        out[dt * 16 + r] = f32_to_bf16_bits(o[dt][j] * factor);
        out[dt * 16 + r + 8] = f32_to_bf16_bits(o[dt][2 + j] * factor);
      }
    } else {
      float* part = p.partials + ((t * p.n_q + head) * splits + split) * (HD + 2);
      if (n_tiles > 0) {  // an empty split's m = -inf tells the merge to skip its accumulators
#pragma unroll
        for (int dt = 0; dt < kDt; ++dt) {
          part[dt * 16 + r] = o[dt][j];
          part[dt * 16 + r + 8] = o[dt][2 + j];
        }
      }
      if (r == 0) {
        part[HD] = m[j];
        part[HD + 1] = l[j];
      }
    }
  }
}

// ---- Head dims 256 and 512 (Gemma-4): a CTA is 4 warps on one (kv head, split, token) that share a cp.async
// ring of 16-key stages (16 KB at head dim 256) and split each stage's head dims 4 ways, so a stage's math is
// short and several CTAs fit an SM (the one-warp form above ran a stage in ~4 us at these widths and reached
// 1.4 TB/s on an H100: one warp per SM sub-partition hid no latency; this form 4.0 TB/s on an H200).
//
// Per stage, warp w (head dims [w HD/4, (w + 1) HD/4)): partial S^T = K Q^T over its head dims (A = K
// [16 keys][16 d] by ldmatrix, B = its slice of Q, in registers), summed over the 4 warps through shared
// memory in warp order (every warp then holds the same scores), online softmax per head column, P^T to
// bf16 and transposed in registers (movmatrix) into the B operand of O^T += V^T P^T for its head dims (A =
// V^T by ldmatrix.trans). Each warp looks up the pages of a stage's 16 keys (one lane per key) a stage ahead
// and broadcasts them by shuffles.
constexpr int kWarps = 4;   // head-dim slices of a stage

// Where key `key` of kv head g lives (any thread; the page table is read by every caller).
template <int HD>
__device__ __forceinline__ StageRows lookup_key(const AttentionKernelParams& p, int g, int seq, int key) {
  StageRows s;
  const int page_size = static_cast<int>(p.kv.page_size);
  const int logical = key / page_size;
  if (logical < p.kv.max_pages) {
    const int64_t page = p.kv.page_table[static_cast<int64_t>(seq) * p.kv.max_pages + logical];
    s.ok = page >= 0 && page < p.kv.num_pages;
    if (s.ok) s.off = ((page * page_size + key - logical * page_size) * p.n_kv + g) * HD;
  }
  return s;
}

// As lookup_stage, for any warp of a CTA (lane = threadIdx.x % 32): lane i looks up the stage's key k0 + i.
template <int HD>
__device__ __forceinline__ StageRows lookup_stage_cta(const AttentionKernelParams& p, int g, int seq, int k0, int kend) {
  const int lane = threadIdx.x % 32, key = k0 + lane;
  return lane < kKeys && key <= kend ? lookup_key<HD>(p, g, seq, key) : StageRows{};
}

// Issues this thread's share of a stage's copies (16 key rows, zero-filled where not there) into sk, and
// sv unless V aliases K; a row's offset comes from the lane of this warp that looked it up. Row `skip` (the
// query's own key, before the PDL wait) is left alone: copy_row_cta copies it after the wait.
template <int HD>
__device__ __forceinline__ void copy_stage_cta(const AttentionKernelParams& p, const StageRows& rows, bool shared_kv,
                                               uint16_t* sk, uint16_t* sv, int skip = -1) {
  constexpr int kChunks = HD / 8, kPerThread = kKeys * kChunks / (32 * kWarps);
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const int idx = threadIdx.x + 32 * kWarps * j;
    const int row = idx / kChunks, c = idx % kChunks;  // row is the same across a warp
    const long long row_off = __shfl_sync(0xffffffffu, rows.off, row);
    const bool row_ok = __shfl_sync(0xffffffffu, rows.ok, row) != 0;
    if (row == skip) continue;
    cp_async_16(chunk_at<HD>(sk, row, c), p.kv.k + row_off + c * 8, row_ok);
    if (!shared_kv) cp_async_16(chunk_at<HD>(sv, row, c), p.kv.v + row_off + c * 8, row_ok);
  }
}

// This thread's share of one key row's copies (row `row` of a stage; zero-filled where not there).
template <int HD>
__device__ __forceinline__ void copy_row_cta(const AttentionKernelParams& p, const StageRows& key, bool shared_kv,
                                             uint16_t* sk, uint16_t* sv, int row) {
  constexpr int kChunks = HD / 8;
  for (int c = threadIdx.x; c < kChunks; c += 32 * kWarps) {
    cp_async_16(chunk_at<HD>(sk, row, c), p.kv.k + key.off + c * 8, key.ok != 0);
    if (!shared_kv) cp_async_16(chunk_at<HD>(sv, row, c), p.kv.v + key.off + c * 8, key.ok != 0);
  }
}

// Bytes into the L2 (a bulk prefetch: fire and forget; sm_90+; 16-byte aligned, a multiple of 16 bytes).
__device__ __forceinline__ void prefetch_l2(const void* p, int bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#else
  (void)p, (void)bytes;
#endif
}

// Gemma-4's qkv_rope inside the decode attention (AttentionKernelParams::norm_rope): one warp norms a q|k|v head row
// of token t (raw: this lane's 16-byte chunks lane + 32 c, loaded by the caller) as launch_gemma_qkv_norm_rope does
// (load_head_row's fp32 sum of squares, rsqrt, times the weight) and, for q and k, rotates its NeoX halves with the
// cos / sin of this lane's dims (cs, sn: dims (8 lane + j) % (HD / 2)); the bf16 result's chunk c goes to out[c]. At
// head dim 256 a lane's partner dims sit 16 lanes away, at 512 in its own second chunk.
// is_q / is_k: the row is a q head (weight qw) / the k head (kw); else the v head (no weight, not rotated).
template <int HD>
__device__ __forceinline__ void norm_rope_row(const uint4 (&raw)[HD / 256], const uint4 (&qw)[HD / 256],
                                              const uint4 (&kw)[HD / 256], bool is_q, bool is_k, float eps,
                                              const float (&cs)[8], const float (&sn)[8], uint4 (&out)[HD / 256]) {
  constexpr int kC = HD / 256;
  const int lane = threadIdx.x % 32;
  float v[kC][8];
  float sum_sq = 0.f;
#pragma unroll
  for (int c = 0; c < kC; ++c) {
    const uint16_t* as = reinterpret_cast<const uint16_t*>(&raw[c]);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      v[c][j] = bf16_bits_to_f32(as[j]);
      sum_sq += v[c][j] * v[c][j];
    }
  }
  const float inv = rsqrtf(warp_sum(sum_sq) / static_cast<float>(HD) + eps);
#pragma unroll
  for (int c = 0; c < kC; ++c) {
    const uint4 w = is_k ? kw[c] : qw[c];
    const uint16_t* ws = reinterpret_cast<const uint16_t*>(&w);
#pragma unroll
    for (int j = 0; j < 8; ++j) v[c][j] = (is_q || is_k ? bf16_bits_to_f32(ws[j]) : 1.f) * (v[c][j] * inv);
  }
  const bool rotate = is_q || is_k;
  float y[kC][8];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    if constexpr (kC == 1) {
      const float partner = __shfl_xor_sync(0xffffffffu, v[0][j], 16);
      y[0][j] = !rotate ? v[0][j] : lane < 16 ? v[0][j] * cs[j] - partner * sn[j] : v[0][j] * cs[j] + partner * sn[j];
    } else {
      y[0][j] = rotate ? v[0][j] * cs[j] - v[1][j] * sn[j] : v[0][j];
      y[1][j] = rotate ? v[1][j] * cs[j] + v[0][j] * sn[j] : v[1][j];
    }
  }
#pragma unroll
  for (int c = 0; c < kC; ++c) {
    uint16_t o[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) o[j] = f32_to_bf16_bits(y[c][j]);
    out[c] = *reinterpret_cast<const uint4*>(o);
  }
}

// This thread's share of [base, base + bytes) as bulk L2 prefetches of 16 KB, chunk i to thread i % threads (as
// gemma_rope.cu's o_proj prefetch: fire and forget).
__device__ __forceinline__ void prefetch_l2_share(const void* base, int64_t bytes, int64_t thread, int64_t threads) {
  constexpr int64_t kChunk = 16 << 10;
  const auto* b = static_cast<const char*>(base);
  for (int64_t off = thread * kChunk; off < bytes; off += threads * kChunk)
    prefetch_l2(b + off, static_cast<int>(bytes - off < kChunk ? bytes - off : kChunk));
}

// The clustered kernel's end (see kCluster below). Called by every thread after the key loop, with this warp's
// O^T slice (head dims d0 + 16 dt + r (+ 8), heads 2q, 2q + 1), its running maxima and the heads' full sums.
// `ring` (at least kHeads x (HD + 2) floats) takes this split's state; `xbuf` the splits' (m, l) pairs.
template <int HD>
__device__ __forceinline__ void cluster_merge(const AttentionKernelParams& p, int64_t t, int g, int group, int d0,
                                              const float (&m)[2], const float (&l)[2], const float (&o)[HD / 64][4],
                                              uint16_t* ring, float* xbuf) {
  constexpr int kC = kAttnSwapClusterSplits, kCols = HD / kC, kDt = HD / 64;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, r = lane / 4, q = lane % 4;
  float* state_o = reinterpret_cast<float*>(ring);  // [kHeads][HD]
  float* state_ml = state_o + kHeads * HD;          // [kHeads][2]
  __syncthreads();  // every warp is done with the ring (and the partial scores)
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int h = 2 * q + j;
#pragma unroll
    for (int dt = 0; dt < kDt; ++dt) {
      state_o[h * HD + d0 + dt * 16 + r] = o[dt][j];
      state_o[h * HD + d0 + dt * 16 + r + 8] = o[dt][2 + j];
    }
    if (warp == 0 && r == 0) {
      state_ml[2 * h] = m[j];
      state_ml[2 * h + 1] = l[j];
    }
  }
  cluster_arrive_release();  // every split's state is in its CTA's shared memory
  cluster_wait_acquire();
  // Every split's (m, l) of the group's heads, once per CTA: split_ml[s][h][2].
  for (int i = threadIdx.x; i < kC * group * 2; i += blockDim.x) {
    const int s = i / (group * 2), hm = i % (group * 2);
    xbuf[s * kHeads * 2 + hm] = load_from_cluster_rank(state_ml + hm, static_cast<unsigned>(s));
  }
  __syncthreads();
  const unsigned rank = cluster_cta_rank();
  for (int i = threadIdx.x; i < group * kCols; i += blockDim.x) {
    const int h = i / kCols, d = static_cast<int>(rank) * kCols + i % kCols;
    float acc[kC];
#pragma unroll
    for (int s = 0; s < kC; ++s) acc[s] = load_from_cluster_rank(state_o + h * HD + d, static_cast<unsigned>(s));
    float mx = -INFINITY;
#pragma unroll
    for (int s = 0; s < kC; ++s) mx = fmaxf(mx, xbuf[(s * kHeads + h) * 2]);
    const float base = mx == -INFINITY ? 0.f : mx;
    float sum = 0.f, out = 0.f;
#pragma unroll
    for (int s = 0; s < kC; ++s) {
      const float ms = xbuf[(s * kHeads + h) * 2];
      if (ms == -INFINITY) continue;  // a split that saw no key
      const float c = exp2f(ms - base);
      sum += xbuf[(s * kHeads + h) * 2 + 1] * c;
      out += acc[s] * c;
    }
    const int64_t head = static_cast<int64_t>(g) * group + h;
    p.out[(t * p.n_q + head) * HD + d] =
        f32_to_bf16_bits(out * attention_final_factor(mx, sum, attention_sink_log2(p.sinks, head)));
  }
  cluster_arrive_relaxed();  // no CTA leaves while another still reads its shared memory
  cluster_wait_acquire();
}

// kCluster: the splits of a (kv head, token) are one CTA cluster of kAttnSwapClusterSplits; each CTA leaves its
// softmax state (m, l, O per head) in its shared memory and, after a cluster barrier, merges the columns
// [rank HD / C, (rank + 1) HD / C) of every head across the splits through distributed shared memory, in the
// merge kernel's order and arithmetic (the same bits as the unclustered kernel with the same splits), and
// writes the output: no partials through global memory and no merge kernel behind it.
// kNormRope (clustered, one query per sequence): qkv_rope in the kernel (AttentionKernelParams::norm_rope): each
// CTA norms and rotates its group's q heads from the q|k|v projection into its Q tile after the PDL wait, and the
// split that holds the query's own key norms and rotates that k head, norms the v head, writes both into the cache
// and (when the key's stage is one of the ring's first, copied before the wait) into its ring slot; a later stage
// copies it from the cache after the CTA's barrier. The cos / sin, the norm weights and the L2 prefetch come before
// the wait.
template <int HD, bool kCluster, bool kNormRope = false>
__global__ void __launch_bounds__(32 * kWarps) attention_decode_swap_cta_kernel(AttentionKernelParams p, int stages,
                                                                            int splits, int min_split_keys) {
  constexpr int kChunks = HD / 8, kDs = HD / kWarps, kDt = kDs / 16;  // a warp's head dims, in 16-wide tiles
  extern __shared__ __align__(128) uint8_t smem_raw[];
  uint16_t* sq = reinterpret_cast<uint16_t*>(smem_raw);              // [8 heads][HD]
  float* xbuf = reinterpret_cast<float*>(sq + kHeads * HD);          // [2][warps][4][32] partial scores
  uint16_t* ring = reinterpret_cast<uint16_t*>(xbuf + 2 * kWarps * 4 * 32);  // stages x {K, V unless shared}
  const bool shared_kv = p.kv.v == p.kv.k;
  const int stage_elems = (shared_kv ? 1 : 2) * kKeys * HD;
  const int group = static_cast<int>(p.n_q / p.n_kv);
  const int g = blockIdx.x, split = blockIdx.y;  // a token's kv heads run side by side: nearby key rows
  const int64_t t = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, r = lane / 4, q = lane % 4, mi = lane / 8;
  const int d0 = warp * kDs;

  auto copy_q = [&] {
    for (int idx = threadIdx.x; idx < kHeads * kChunks; idx += 32 * kWarps) {
      const int row = idx / kChunks, c = idx % kChunks;
      const bool ok = row < group;
      const uint16_t* src = ok ? p.q + (t * p.n_q + g * group + row) * HD + c * 8 : p.q;
      cp_async_16(chunk_at<HD>(sq, row, c), src, ok);
    }
  };
  // The position, the page table and the keys of earlier steps come before the kernel before (the step's staging
  // and earlier steps): with keys_before_wait they are read before the PDL wait.
  const bool early = kNormRope || p.keys_before_wait;
  if (!early) {
    pdl_wait();  // launched as a programmatic dependent: q and the new K/V come from qkv_rope
    pdl_launch_dependents();  // after the wait: a dependent may rely on what our predecessors wrote
    copy_q();
    cp_async_commit();
  }

  const int pos = p.kv.positions[t];
  const int first = p.window > 0 ? max(0, pos - static_cast<int>(p.window) + 1) : 0;
  const int len = pos - first + 1;
  const int chunk = max(min_split_keys, ((len + splits - 1) / splits + kKeys - 1) / kKeys * kKeys);
  const int kstart = first + split * chunk;
  const int kend = min(pos, kstart + chunk - 1);
  const int n_tiles = kend >= kstart ? (kend - kstart + kKeys) / kKeys : 0;
  const int seq = p.kv.token_seq[t];
  auto lookup = [&](int i) { return lookup_stage_cta<HD>(p, g, seq, kstart + i * kKeys, kend); };
  // Early, the query's own key (in this split's last tile when that tile is in the ring's first stages) is left
  // out of the first copies and copied with Q after the wait. (A split past the query, kstart > pos, has kend = pos
  // too, and no keys.)
  const bool holds_own = n_tiles > 0 && pos == kend;
  const int own_tile = early && holds_own && (pos - kstart) / kKeys < stages - 1 ? (pos - kstart) / kKeys : -1;
  auto issue = [&](int i, const StageRows& rows) {
    if (i < n_tiles) {
      uint16_t* sk = ring + (i % stages) * stage_elems;
      copy_stage_cta<HD>(p, rows, shared_kv, sk, sk + kKeys * HD, i == own_tile ? (pos - kstart) % kKeys : -1);
    }
    cp_async_commit();  // empty groups too: the waits count groups
  };
  for (int i = 0; i < stages - 1; ++i) issue(i, lookup(i));
  StageRows next = lookup(stages - 1);
  if (early) {
    // Then the wait, Q and the own key (as one group after the first stages': the loop's waits count the same).
    // (Also putting the split's next 48 keys into the L2 here, by bulk prefetches, was slower: an H200, session 23:
    // 12.1 against 10.9 us for a sliding layer alone, and no faster in the chain.)
    if constexpr (kNormRope) {
      // Before the wait: this lane's cos / sin (dims (8 lane + j) % (HD / 2)), the norm weights, the cache slot of
      // the query's own key (where this split holds it) and the L2 prefetch of the weight read after the attention.
      constexpr int kC = HD / 256;
      const AttentionNormRope& nr = p.norm_rope;
      float cs[8], sn[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) rope_cos_sin(pos, nr.inv_freq[(8 * lane + j) % (HD / 2)], nr.rope_scale, cs[j], sn[j]);
      uint4 qw[kC], kw[kC];
#pragma unroll
      for (int c = 0; c < kC; ++c) {
        qw[c] = reinterpret_cast<const uint4*>(nr.q_norm)[lane + 32 * c];
        kw[c] = reinterpret_cast<const uint4*>(nr.k_norm)[lane + 32 * c];
      }
      const int64_t slot = holds_own ? kv_row(p.kv, t, pos, p.n_kv) : -1;
      if (nr.prefetch_bytes > 0) {
        const int64_t threads = static_cast<int64_t>(gridDim.x) * gridDim.y * gridDim.z * blockDim.x;
        const int64_t block = (static_cast<int64_t>(blockIdx.z) * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
        prefetch_l2_share(nr.prefetch, nr.prefetch_bytes, block * blockDim.x + threadIdx.x, threads);
      }
      pdl_wait();  // the q|k|v projection comes from the kernel before
      pdl_launch_dependents();
      // The group's q heads into the Q tile, and the owner's k and v heads into the cache (and its ring slot when
      // the key's stage was copied before the wait), a row a warp.
      // Every row's loads first (at most 3 rows a warp: 8 q heads, k and v), then the math.
      constexpr int kMaxRows = (kHeads + 2 + kWarps - 1) / kWarps;
      const int64_t heads = p.n_q + 2 * p.n_kv;
      const int rows = group + (holds_own ? 2 : 0);
      auto head_of = [&](int row) { return row < group ? g * group + row : row == group ? p.n_q + g : p.n_q + p.n_kv + g; };
      uint4 raw[kMaxRows][kC];
#pragma unroll
      for (int k = 0; k < kMaxRows; ++k) {
        const int row = warp + k * kWarps;
        if (row >= rows) break;
#pragma unroll
        for (int c = 0; c < kC; ++c)
          raw[k][c] = reinterpret_cast<const uint4*>(nr.qkv + (t * heads + head_of(row)) * HD)[lane + 32 * c];
      }
#pragma unroll
      for (int k = 0; k < kMaxRows; ++k) {
        const int row = warp + k * kWarps;
        if (row >= rows) break;
        const bool is_q = row < group, is_k = row == group;
        uint4 out[kC];
        norm_rope_row<HD>(raw[k], qw, kw, is_q, is_k, nr.eps, cs, sn, out);
#pragma unroll
        for (int c = 0; c < kC; ++c) {
          const int i = lane + 32 * c;
          if (is_q) {
            *reinterpret_cast<uint4*>(chunk_at<HD>(sq, row, i)) = out[c];
            continue;
          }
          if (slot >= 0) *reinterpret_cast<uint4*>((is_k ? p.kv.k : p.kv.v) + (slot + g) * HD + 8 * i) = out[c];
          if (own_tile >= 0) {  // a token without a cache slot reads zeros, as the copies' zero fill
            uint16_t* sk = ring + own_tile * stage_elems;
            *reinterpret_cast<uint4*>(chunk_at<HD>(is_k ? sk : sk + kKeys * HD, (pos - kstart) % kKeys, i)) =
                slot >= 0 ? out[c] : make_uint4(0, 0, 0, 0);
          }
        }
      }
      for (int idx = threadIdx.x; idx < (kHeads - group) * kChunks; idx += 32 * kWarps)
        *reinterpret_cast<uint4*>(chunk_at<HD>(sq, group + idx / kChunks, idx % kChunks)) = make_uint4(0, 0, 0, 0);
    } else {
      const StageRows own = own_tile >= 0 ? lookup_key<HD>(p, g, seq, pos) : StageRows{};
      pdl_wait();  // q and the query's own K/V come from qkv_rope
      pdl_launch_dependents();
      copy_q();
      if (own_tile >= 0) {
        uint16_t* sk = ring + own_tile * stage_elems;
        copy_row_cta<HD>(p, own, shared_kv, sk, sk + kKeys * HD, (pos - kstart) % kKeys);
      }
    }
    cp_async_commit();  // (empty with kNormRope: the loop's waits count the same groups)
  }

  // This warp's slice of Q as B fragments: kc 2j in qb[j][0..1], 2j + 1 in qb[j][2..3].
  if (early) {
    cp_async_wait<0>();  // Q and the first stages, copied before the wait
  } else {
    wait_groups(stages - 1);  // the Q group (the first stages may still fly)
  }
  __syncthreads();
  uint32_t qb[kDt / 2][4];
#pragma unroll
  for (int j = 0; j < kDt / 2; ++j) ldmatrix_x4(qb[j], chunk_at<HD>(sq, lane % 8, d0 / 8 + 4 * j + mi));

  float m[2] = {-INFINITY, -INFINITY};  // heads 2q, 2q + 1
  float l[2] = {0.f, 0.f};              // this lane's keys only; summed over the 8 lanes of a head at the end
  float o[kDt][4];                      // O^T: d d0 + 16 dt + r (+ 8 for [2], [3]), heads 2q, 2q + 1
#pragma unroll
  for (int dt = 0; dt < kDt; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.f;

  for (int i = 0; i < n_tiles; ++i) {
    wait_groups(stages - 2);  // tile i landed (this thread's copies); i + 1 .. i + stages - 2 may fly
    __syncthreads();          // everyone's copies of tile i are visible; every warp is done with tile i - 1
    issue(i + stages - 1, next);  // into the slot tile i - 1 used
    next = lookup(i + stages);    // consumed by the next iteration's copies
    uint16_t* sk = ring + (i % stages) * stage_elems;
    uint16_t* sv = shared_kv ? sk : sk + kKeys * HD;

    // Partial S^T [16 keys][8 heads] over this warp's head dims, two accumulator chains.
    float s[4] = {0.f, 0.f, 0.f, 0.f}, s2[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int j = 0; j < kDt / 2; ++j) {
      uint32_t ka[4], kb[4];
      ldmatrix_x4(ka, chunk_at<HD>(sk, (mi % 2) * 8 + lane % 8, d0 / 8 + 4 * j + mi / 2));
      ldmatrix_x4(kb, chunk_at<HD>(sk, (mi % 2) * 8 + lane % 8, d0 / 8 + 4 * j + 2 + mi / 2));
      mma_bf16_16816(s, ka, qb[j][0], qb[j][1]);
      mma_bf16_16816(s2, kb, qb[j][2], qb[j][3]);
    }
    float* mine = xbuf + ((i & 1) * kWarps + warp) * 4 * 32 + lane;
#pragma unroll
    for (int e = 0; e < 4; ++e) mine[e * 32] = s[e] + s2[e];
    __syncthreads();
    const float* all = xbuf + (i & 1) * kWarps * 4 * 32 + lane;
    const int key_lo = kstart + i * kKeys + r;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float sum = all[e * 32];
#pragma unroll
      for (int w = 1; w < kWarps; ++w) sum += all[(w * 4 + e) * 32];
      const int key = key_lo + (e >= 2 ? 8 : 0);
      s[e] = key <= kend ? sum * p.scale_log2 : -INFINITY;
    }

    uint32_t pb0, pb1;
    softmax_stage_to_p(s, m, l, o, pb0, pb1);
#pragma unroll
    for (int dt = 0; dt < kDt; ++dt) {
      uint32_t va[4];
      ldmatrix_x4_trans(va, chunk_at<HD>(sv, (mi / 2) * 8 + lane % 8, d0 / 8 + 2 * dt + mi % 2));
      mma_bf16_16816(o[dt], va, pb0, pb1);
    }
  }
  cp_async_wait<0>();

#pragma unroll
  for (int j = 0; j < 2; ++j) {
    l[j] += __shfl_xor_sync(0xffffffffu, l[j], 4);
    l[j] += __shfl_xor_sync(0xffffffffu, l[j], 8);
    l[j] += __shfl_xor_sync(0xffffffffu, l[j], 16);
  }
  if constexpr (kCluster) {
    cluster_merge<HD>(p, t, g, group, d0, m, l, o, ring, xbuf);
  } else {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int h = 2 * q + j;
      if (h >= group) continue;
      const int64_t head = static_cast<int64_t>(g) * group + h;
      if (splits == 1) {
        const float factor = attention_final_factor(m[j], l[j], attention_sink_log2(p.sinks, head));
        uint16_t* out = p.out + (t * p.n_q + head) * HD + d0;
#pragma unroll
        for (int dt = 0; dt < kDt; ++dt) {
          out[dt * 16 + r] = f32_to_bf16_bits(o[dt][j] * factor);
          out[dt * 16 + r + 8] = f32_to_bf16_bits(o[dt][2 + j] * factor);
        }
      } else {
        float* part = p.partials + ((t * p.n_q + head) * splits + split) * (HD + 2);
        if (n_tiles > 0) {  // an empty split's m = -inf tells the merge to skip its accumulators
#pragma unroll
          for (int dt = 0; dt < kDt; ++dt) {
            part[d0 + dt * 16 + r] = o[dt][j];
            part[d0 + dt * 16 + r + 8] = o[dt][2 + j];
          }
        }
        if (warp == 0 && r == 0) {
          part[HD] = m[j];
          part[HD + 1] = l[j];
        }
      }
    }
  }
}

template <int HD>
Status launch_cta(const AttentionKernelParams& p, const AttentionDecodeSwapConfig& c, cudaStream_t stream) {
  MX_RETURN_IF_ERROR(cuda_status(cudaFuncSetAttribute(attention_decode_swap_cta_kernel<HD, false>,
                                                      cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                      static_cast<int>(c.smem_bytes)),
                                 "cudaFuncSetAttribute(attention decode swap, 4 warps)"));
  const dim3 grid(static_cast<unsigned>(p.n_kv), static_cast<unsigned>(c.num_splits), static_cast<unsigned>(p.tokens));
  return cuda_status(launch_pdl(attention_decode_swap_cta_kernel<HD, false>, grid, dim3(32 * kWarps), c.smem_bytes, stream,
                                p, c.stages, c.num_splits, c.min_split_keys),
                     "attention_decode_swap_cta_kernel");
}

// The splits as one cluster of kAttnSwapClusterSplits CTAs (non-portable above 8: opted in here).
template <int HD>
Status launch_cta_cluster(const AttentionKernelParams& p, const AttentionDecodeSwapConfig& c, cudaStream_t stream) {
  static_assert(kHeads * (HD + 2) * 4 <= 2 * 16 * HD * 2, "a split's state fits the smallest ring");
  static_assert(kAttnSwapClusterSplits * kHeads * 2 <= 2 * kWarps * 4 * 32, "the splits' (m, l) fit the score buffer");
  if (c.num_splits != kAttnSwapClusterSplits) return internal_error("attention decode swap: a cluster takes 16 splits");
  auto kernel = p.norm_rope.qkv ? attention_decode_swap_cta_kernel<HD, true, true> : attention_decode_swap_cta_kernel<HD, true>;
  MX_RETURN_IF_ERROR(cuda_status(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1),
                                 "cudaFuncSetAttribute(attention decode swap, clusters of 16)"));
  MX_RETURN_IF_ERROR(cuda_status(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                      static_cast<int>(c.smem_bytes)),
                                 "cudaFuncSetAttribute(attention decode swap, clusters)"));
  const dim3 grid(static_cast<unsigned>(p.n_kv), static_cast<unsigned>(c.num_splits), static_cast<unsigned>(p.tokens));
  return cuda_status(launch_pdl_clusters(kernel, grid, dim3(32 * kWarps), dim3(1, static_cast<unsigned>(c.num_splits)),
                                         static_cast<size_t>(c.smem_bytes), stream, p, c.stages, c.num_splits,
                                         c.min_split_keys),
                     "attention_decode_swap_cta_kernel (clusters)");
}

template <int HD>
Status launch(const AttentionKernelParams& p, const AttentionDecodeSwapConfig& c, cudaStream_t stream) {
  MX_RETURN_IF_ERROR(cuda_status(cudaFuncSetAttribute(attention_decode_swap_kernel<HD>,
                                                      cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                      static_cast<int>(c.smem_bytes)),
                                 "cudaFuncSetAttribute(attention decode swap)"));
  const dim3 grid(static_cast<unsigned>(p.tokens), static_cast<unsigned>(p.n_kv), static_cast<unsigned>(c.num_splits));
  return cuda_status(launch_pdl(attention_decode_swap_kernel<HD>, grid, dim3(32), c.smem_bytes, stream, p, c.stages,
                                c.num_splits, c.min_split_keys),
                     "attention_decode_swap_kernel");
}

}  // namespace

Status launch_attention_decode_swap(const AttentionKernelParams& p, const AttentionDecodeSwapConfig& c,
                                    cudaStream_t stream) {
  if (!c.enabled) return internal_error("attention decode swap: no config for this shape");
  if (p.head_dim != 64 && p.head_dim != 256 && p.head_dim != 512)
    return unimplemented("attention decode swap: head dim 64, 256 or 512");
  if (p.n_kv <= 0 || p.n_q % p.n_kv != 0 || p.n_q / p.n_kv > kAttnSwapMaxGroup)
    return unimplemented("attention decode swap: 1 to 8 q heads per kv head");
  if (c.stages < 2 || c.stages > 4) return internal_error("attention decode swap: ring of 2 to 4 stages");
  if (c.num_splits > 1 && !p.partials) return internal_error("attention decode swap: split-KV without scratch");
  if (p.tokens == 0) return Status::ok();
  if (p.head_dim != 64 && p.tokens > 65535) return unimplemented("attention decode swap: more than 65535 tokens in one call");
  switch (p.head_dim) {
    case 64: MX_RETURN_IF_ERROR(launch<64>(p, c, stream)); break;
    case 256: MX_RETURN_IF_ERROR(launch_cta<256>(p, c, stream)); break;
    default: MX_RETURN_IF_ERROR(launch_cta<512>(p, c, stream)); break;
  }
  if (c.num_splits == 1) return Status::ok();
  return launch_attention_split_merge(p, c.num_splits, stream);
}

Status launch_attention_decode_swap_cluster(const AttentionKernelParams& p, const AttentionDecodeSwapConfig& c,
                                            cudaStream_t stream) {
  if (!c.enabled) return internal_error("attention decode swap (clusters): no config for this shape");
  if (p.head_dim != 256 && p.head_dim != 512) return unimplemented("attention decode swap (clusters): head dim 256 or 512");
  if (p.n_kv <= 0 || p.n_q % p.n_kv != 0 || p.n_q / p.n_kv > kAttnSwapMaxGroup)
    return unimplemented("attention decode swap (clusters): 1 to 8 q heads per kv head");
  if (c.stages < 2 || c.stages > 4) return internal_error("attention decode swap (clusters): ring of 2 to 4 stages");
  if (p.tokens == 0) return Status::ok();
  if (p.tokens > 65535) return unimplemented("attention decode swap (clusters): more than 65535 tokens in one call");
  if (p.norm_rope.qkv) {
    const AttentionNormRope& nr = p.norm_rope;
    if (!nr.inv_freq || !nr.q_norm || !nr.k_norm || p.kv.v == p.kv.k)
      return invalid_argument("attention decode swap (clusters), q/k/v norms and RoPE: inv_freq, both norm weights and V "
                              "apart from K");
    if (nr.prefetch_bytes < 0 || nr.prefetch_bytes % 16 != 0 || reinterpret_cast<uintptr_t>(nr.prefetch) % 16 != 0)
      return invalid_argument("attention decode swap (clusters): the L2 prefetch needs 16-byte alignment and a multiple "
                              "of 16 bytes");
  }
  return p.head_dim == 256 ? launch_cta_cluster<256>(p, c, stream) : launch_cta_cluster<512>(p, c, stream);
}

}  // namespace mx::cuda
