// Paged attention with GQA, optional learned sinks and sliding windows, on mma.sync (m16n8k16, bf16 in,
// fp32 out), for head dims 32, 64, 128, 256 and 512 (tile shapes in kernel_configs.h).
//
// Prefill (FlashAttention-2 style): a CTA takes up to attention_prefill_rows query rows that pack
// (token, q head) pairs of one kv head (rows / group tokens), so each K/V tile loaded to shared memory
// serves every head of the group. A warp owns 16 rows and a slice of at most 128 head dims: at head dim
// 256 and 512 the warps of a row block each compute Q K^T over their slice and sum the partial scores
// through shared memory (in a fixed order, so all of them hold the same scores), then each runs the same
// online softmax and P.V for its own output columns. Online softmax in fp32 in the exp2 domain; P goes to
// bf16 for the P.V mma. A CTA whose tokens span sequences runs one pass per sequence (tokens of a sequence
// are contiguous in a BatchView), masking the rows of the others.
// Decode: one CTA per (token, kv head, block of 16 heads, KV split); its warps split every key tile into
// key groups (each group with all d slices), whose states merge through shared memory; with several
// splits a merge kernel combines them, or (one token at head dim 64, 2-16 splits, sm_90:
// AttentionDecodeConfig::clusters) the splits of a (token, kv head) run as one CTA cluster and merge through
// distributed shared memory in the merge kernel's order and arithmetic.
// The sink (optional) enters once, at the very end (attention_common.cuh).
// K/V tiles: [keys][head_dim] bf16 in shared memory, 16-byte chunks XOR-swizzled by row so that ldmatrix
// reads of 8 rows hit 8 different bank groups.
#include <cfloat>
#include <climits>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels/attention_common.cuh"
#include "backend/cuda/kernels/cluster.cuh"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/kernels.h"

namespace mx::cuda {
namespace {

// A head dim's tile shape (kernel_configs.h).
template <int HD>
struct Tile {
  static constexpr int kKeys = attention_keys_per_tile(HD);  // keys per K/V tile
  static constexpr int kDs = attention_d_slice(HD);          // head dims per warp
  static constexpr int kWpr = attention_warps_per_rows(HD);  // warps sharing 16 rows
  static constexpr int kKc = kDs / 16;                        // 16-wide k chunks of a warp's slice
};

template <int HD>
__device__ __forceinline__ int swizzle(int row, int chunk) {
  if constexpr (HD >= 64) return chunk ^ (row & 7);
  else return chunk ^ ((row >> 1) & 3);
}

template <int HD>
__device__ __forceinline__ uint16_t* tile_at(uint16_t* tile, int row, int col) {
  return tile + row * HD + swizzle<HD>(row, col / 8) * 8 + (col % 8);
}

// Loads keys [k0, k0 + kKeys) of kv head g of sequence seq (zero-filled past k_last or outside the cache). Key
// `skip` (if in the tile) is not copied at all: the decode kernel copies a query's own key after its PDL wait.
template <int HD>
__device__ __forceinline__ void load_kv_tile(const PagedKv& kv, int64_t n_kv, int g, int seq, int k0, int k_last,
                                             uint16_t* sk, uint16_t* sv, int skip = -1) {
  constexpr int kChunks = HD / 8;
  for (int idx = threadIdx.x; idx < Tile<HD>::kKeys * kChunks; idx += blockDim.x) {
    const int row = idx / kChunks, c = idx % kChunks;
    const int key = k0 + row;
    if (key == skip) continue;
    int64_t page = -1;
    if (key >= 0 && key <= k_last) {
      const int64_t logical = key / kv.page_size;
      if (logical < kv.max_pages) page = kv.page_table[static_cast<int64_t>(seq) * kv.max_pages + logical];
    }
    const bool ok = page >= 0 && page < kv.num_pages;
    const int64_t off = ok ? (((page * kv.page_size + key % kv.page_size) * n_kv + g) * HD + c * 8) : 0;
    const int dst = row * HD + swizzle<HD>(row, c) * 8;
    cp_async_16(sk + dst, kv.k + off, ok);
    cp_async_16(sv + dst, kv.v + off, ok);
  }
}

// One pass over keys [k_first, k_last] of a sequence for one kv head, in n_tiles tiles of kKeys keys.
struct KvPass {
  int seq, k_first, k_last, n_tiles;
};

// Issues the copies of tile i of the pass into the stage at `stage` ({K, V}, [kKeys][HD] each).
template <int HD>
__device__ __forceinline__ void load_pass_tile(const AttentionKernelParams& p, int g, const KvPass& pass, int i,
                                               uint16_t* stage, int skip = -1) {
  constexpr int kKeys = Tile<HD>::kKeys;
  load_kv_tile<HD>(p.kv, p.n_kv, g, pass.seq, pass.k_first + i * kKeys, pass.k_last, stage, stage + kKeys * HD, skip);
}

// The K/V ring shared by prefill and decode: `stages` (1 or 2) stages at skv, tiles [0, issued) issued into
// their stages before the loop (tile 0 by prefill; up to `stages` tiles by the decode kernel's early copies).
// Waits until this thread's copies of tile i landed and returns its stage; the caller syncs the CTA before
// reading it and after its last read. Two stages: tile i + 1 is issued into the other stage first, so its copy
// overlaps the math of tile i. One stage (when two do not fit): tile i is issued only now, into the stage the
// previous iteration has released.
template <int HD>
__device__ __forceinline__ int wait_kv_tile(const AttentionKernelParams& p, int g, const KvPass& pass, int i,
                                            int stages, uint16_t* skv, int issued = 1) {
  if (stages == 1) {
    if (i >= issued) {
      load_pass_tile<HD>(p, g, pass, i, skv);
      cp_async_commit();
    }
    cp_async_wait<0>();
    return 0;
  }
  const int stage = i & 1;
  if (i + 1 < pass.n_tiles && i + 1 >= issued) {
    load_pass_tile<HD>(p, g, pass, i + 1, skv + ((i + 1) & 1) * 2 * Tile<HD>::kKeys * HD);
    cp_async_commit();
    cp_async_wait<1>();
  } else {
    cp_async_wait<0>();
  }
  return stage;
}

// A-operand fragments of 16 query rows starting at `row0` of a [rows][HD] swizzled tile, head dims
// [col0, col0 + 16 KC).
template <int HD, int KC>
__device__ __forceinline__ void load_q_fragments(uint16_t* sq, int row0, int col0, uint32_t (&qf)[KC][4]) {
  const int lane = threadIdx.x % 32, m = lane / 8;
#pragma unroll
  for (int kc = 0; kc < KC; ++kc)
    ldmatrix_x4(qf[kc], tile_at<HD>(sq, row0 + (m % 2) * 8 + lane % 8, col0 + kc * 16 + (m / 2) * 8));
}

// Online-softmax state of the two rows (r, r + 8) a lane holds, over a warp's DS output columns.
template <int DS>
struct RowState {
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.f, 0.f};  // this lane's partial sums; reduced over the 4 lanes of a row at the end
  float o[DS / 8][4] = {};
};

// Scores of 16 rows x (8 * NT) keys: S = Q K^T for the NT key n-tiles starting at key row `key0` of sk,
// over head dims [col0, col0 + 16 KC) (the whole head dim, or this warp's slice of it).
template <int HD, int NT, int KC>
__device__ __forceinline__ void qk_scores(const uint32_t (&qf)[KC][4], uint16_t* sk, int key0, int col0,
                                          float (&s)[NT][4]) {
  const int lane = threadIdx.x % 32, m = lane / 8;
#pragma unroll
  for (int n = 0; n < NT; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
  for (int kc = 0; kc < KC; ++kc) {
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      uint32_t kb[4];
      ldmatrix_x4(kb, tile_at<HD>(sk, key0 + np * 16 + (m / 2) * 8 + lane % 8, col0 + kc * 16 + (m % 2) * 8));
      mma_bf16_16816(s[2 * np], qf[kc], kb[0], kb[1]);
      mma_bf16_16816(s[2 * np + 1], qf[kc], kb[2], kb[3]);
    }
  }
}

// Head dims split over WPR warps: each holds the partial scores of its slice; after this every warp of the
// row block (warps first_warp .. + WPR) holds their sum, added in warp order so all get the same floats.
// `xbuf`: [warps][NT * 4][32] fp32. The row block syncs on its own named barrier (1 + first_warp / WPR;
// 0 is __syncthreads'); the caller syncs the CTA before the next call overwrites xbuf.
template <int WPR, int NT>
__device__ __forceinline__ void sum_partial_scores(float (&s)[NT][4], float* xbuf, int first_warp) {
  if constexpr (WPR > 1) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float* mine = xbuf + warp * NT * 4 * 32 + lane;
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) mine[(n * 4 + e) * 32] = s[n][e];
    asm volatile("bar.sync %0, %1;\n" ::"r"(1 + first_warp / WPR), "n"(32 * WPR) : "memory");
    const float* rows = xbuf + first_warp * NT * 4 * 32 + lane;
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float sum = rows[(n * 4 + e) * 32];
#pragma unroll
        for (int j = 1; j < WPR; ++j) sum += rows[(j * NT * 4 + n * 4 + e) * 32];
        s[n][e] = sum;
      }
  }
}

// Folds masked, log2-scaled scores into the state and accumulates P.V for the same keys, output columns
// [col0, col0 + DS).
template <int HD, int NT, int DS>
__device__ __forceinline__ void softmax_pv(RowState<DS>& st, float (&s)[NT][4], uint16_t* sv, int key0, int col0) {
  const int lane = threadIdx.x % 32, m = lane / 8;
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    mx[0] = fmaxf(mx[0], fmaxf(s[n][0], s[n][1]));
    mx[1] = fmaxf(mx[1], fmaxf(s[n][2], s[n][3]));
  }
  float corr[2], base[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
    const float m_new = fmaxf(st.m[h], mx[h]);
    base[h] = m_new == -INFINITY ? 0.f : m_new;  // a row with nothing visible yet stays at zero weight
    corr[h] = exp2f(st.m[h] - base[h]);
    st.m[h] = m_new;
    st.l[h] *= corr[h];
  }
#pragma unroll
  for (int d = 0; d < DS / 8; ++d) {
    st.o[d][0] *= corr[0];
    st.o[d][1] *= corr[0];
    st.o[d][2] *= corr[1];
    st.o[d][3] *= corr[1];
  }
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    s[n][0] = exp2f(s[n][0] - base[0]);
    s[n][1] = exp2f(s[n][1] - base[0]);
    s[n][2] = exp2f(s[n][2] - base[1]);
    s[n][3] = exp2f(s[n][3] - base[1]);
    st.l[0] += s[n][0] + s[n][1];
    st.l[1] += s[n][2] + s[n][3];
  }
#pragma unroll
  for (int kc = 0; kc < NT / 2; ++kc) {
    const uint32_t a[4] = {pack_bf16x2(s[2 * kc][0], s[2 * kc][1]), pack_bf16x2(s[2 * kc][2], s[2 * kc][3]),
                           pack_bf16x2(s[2 * kc + 1][0], s[2 * kc + 1][1]),
                           pack_bf16x2(s[2 * kc + 1][2], s[2 * kc + 1][3])};
#pragma unroll
    for (int dp = 0; dp < DS / 16; ++dp) {
      uint32_t vb[4];
      ldmatrix_x4_trans(vb, tile_at<HD>(sv, key0 + kc * 16 + (m % 2) * 8 + lane % 8, col0 + dp * 16 + (m / 2) * 8));
      mma_bf16_16816(st.o[2 * dp], a, vb[0], vb[1]);
      mma_bf16_16816(st.o[2 * dp + 1], a, vb[2], vb[3]);
    }
  }
}

template <int HD>
__global__ void __launch_bounds__(32 * attention_prefill_warps(HD))
    attention_prefill_kernel(AttentionKernelParams p, int stages) {
  using T = Tile<HD>;
  constexpr int kWarps = attention_prefill_warps(HD), kRows = attention_prefill_rows(HD);
  constexpr int kNt = T::kKeys / 8;
  constexpr int kExchangeFloats = T::kWpr > 1 ? kWarps * kNt * 4 * 32 : 0;
  extern __shared__ __align__(128) uint8_t smem_raw[];
  float* xbuf = reinterpret_cast<float*>(smem_raw);           // [warps][kNt * 4][32] partial scores
  uint16_t* skv = reinterpret_cast<uint16_t*>(xbuf + kExchangeFloats);  // stages x {K, V} [kKeys][HD]
  uint16_t* sq = skv;  // [kRows][HD], until the fragments are in registers
  __shared__ int row_first[kRows], row_last[kRows];
  __shared__ int pass_seq, pass_end, pass_kmin, pass_kmax;

  const int group = static_cast<int>(p.n_q / p.n_kv);
  const int tpc = max(1, kRows / group);  // tokens per CTA
  const int g = blockIdx.y;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * tpc;
  const int n_tok = static_cast<int>(p.tokens - t0 < tpc ? p.tokens - t0 : tpc);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row_block = warp / T::kWpr, col0 = (warp % T::kWpr) * T::kDs;

  auto row_valid = [&](int row) { return row / group < n_tok && row < tpc * group; };
  auto row_head = [&](int row) { return g * group + row % group; };

  // Q rows -> shared memory -> this warp's fragments.
  for (int idx = threadIdx.x; idx < kRows * (HD / 8); idx += blockDim.x) {
    const int row = idx / (HD / 8), c = idx % (HD / 8);
    const bool ok = row_valid(row);
    const int64_t t = t0 + row / group;
    const uint16_t* src = ok ? p.q + (t * p.n_q + row_head(row)) * HD + c * 8 : p.q;
    cp_async_16(sq + row * HD + swizzle<HD>(row, c) * 8, src, ok);
  }
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  uint32_t qf[T::kKc][4];
  load_q_fragments<HD, T::kKc>(sq, row_block * 16, col0, qf);
  __syncthreads();  // Q's shared memory is the K/V ring from here on

  RowState<T::kDs> st;
  const int r0 = row_block * 16 + lane / 4, r1 = r0 + 8;
  for (int start = 0; start < n_tok;) {
    if (threadIdx.x == 0) attention_pass_bounds(p, t0, start, n_tok, &pass_seq, &pass_end, &pass_kmin, &pass_kmax);
    __syncthreads();
    if (threadIdx.x < kRows) {
      const int row = threadIdx.x, tl = row / group;
      int f = 1, l = 0;  // empty range: the row is not in this pass
      if (row_valid(row) && tl >= start && tl < pass_end) attn_key_range(p, t0 + tl, &f, &l);
      row_first[row] = f;
      row_last[row] = l;
    }
    const int seq = pass_seq, kmin = pass_kmin, kmax = pass_kmax;
    const int end = pass_end;
    __syncthreads();

    const KvPass pass{seq, kmin, kmax, kmax >= kmin ? (kmax - kmin + T::kKeys) / T::kKeys : 0};
    const int f0 = row_first[r0], l0 = row_last[r0], f1 = row_first[r1], l1 = row_last[r1];
    if (pass.n_tiles > 0) {
      load_pass_tile<HD>(p, g, pass, 0, skv);
      cp_async_commit();
    }
    for (int i = 0; i < pass.n_tiles; ++i) {
      const int stage = wait_kv_tile<HD>(p, g, pass, i, stages, skv);
      __syncthreads();
      uint16_t* sk = skv + stage * 2 * T::kKeys * HD;
      uint16_t* sv = sk + T::kKeys * HD;
      const int k0 = kmin + i * T::kKeys;
      float s[kNt][4];
      qk_scores<HD, kNt, T::kKc>(qf, sk, 0, col0, s);
      sum_partial_scores<T::kWpr, kNt>(s, xbuf, row_block * T::kWpr);
#pragma unroll
      for (int n = 0; n < kNt; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = k0 + n * 8 + 2 * (lane % 4) + (e & 1);
          const bool ok = e < 2 ? (key >= f0 && key <= l0) : (key >= f1 && key <= l1);
          s[n][e] = ok ? s[n][e] * p.scale_log2 : -INFINITY;
        }
      }
      softmax_pv<HD, kNt, T::kDs>(st, s, sv, 0, col0);
      __syncthreads();
    }
    start = end;
  }

  // Finalize: each warp writes its head-dim slice of its rows.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = h == 0 ? r0 : r1;
    float l = st.l[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if (!row_valid(row)) continue;
    const int head = row_head(row);
    const float factor = attention_final_factor(st.m[h], l, attention_sink_log2(p.sinks, head));
    uint16_t* out = p.out + ((t0 + row / group) * p.n_q + head) * HD + col0;
#pragma unroll
    for (int d = 0; d < T::kDs / 8; ++d)
      *reinterpret_cast<uint32_t*>(out + d * 8 + 2 * (lane % 4)) =
          pack_bf16x2(st.o[d][2 * h] * factor, st.o[d][2 * h + 1] * factor);
  }
}

// The clustered decode's merge: this CTA's share of the 16 x HD (row, head dim) pairs, each combined over the
// cluster's splits (rank s = split s) exactly as attention_merge_kernel combines the partials; `cst` holds each CTA's
// split state ([16 rows][HD + 2]: o, then m and l). Rows from `rows` on are not heads of this block; `sinks_log2`: each
// row's sink (attention_sink_log2).
template <int HD, int kMaxSplits>
__device__ __forceinline__ void cluster_merge_splits(const AttentionKernelParams& p, float* cst, int splits, int64_t t,
                                                     int head0, int rows, const float* sinks_log2) {
  constexpr int kStride = HD + 2, kPairs = 16 * HD;
  cluster_arrive_release();  // every split's state written
  cluster_wait_acquire();
  const int rank = static_cast<int>(cluster_cta_rank()), share = (kPairs + splits - 1) / splits;
  const int end = min(kPairs, (rank + 1) * share);
  for (int idx = rank * share + static_cast<int>(threadIdx.x); idx < end; idx += blockDim.x) {
    const int row = idx / HD, d = idx % HD;
    if (row >= rows) continue;
    float sm[kMaxSplits], sl[kMaxSplits], so[kMaxSplits];  // every split's loads in flight at once
#pragma unroll
    for (int s = 0; s < kMaxSplits; ++s) {
      if (s >= splits) break;
      sm[s] = load_from_cluster_rank(cst + row * kStride + HD, static_cast<unsigned>(s));
      sl[s] = load_from_cluster_rank(cst + row * kStride + HD + 1, static_cast<unsigned>(s));
      so[s] = load_from_cluster_rank(cst + row * kStride + d, static_cast<unsigned>(s));
    }
    float m = -INFINITY;
#pragma unroll
    for (int s = 0; s < kMaxSplits; ++s)
      if (s < splits) m = fmaxf(m, sm[s]);
    const float base = m == -INFINITY ? 0.f : m;
    float l = 0.f, o = 0.f;
#pragma unroll
    for (int s = 0; s < kMaxSplits; ++s) {
      if (s >= splits || sm[s] == -INFINITY) continue;  // past the splits, or a split that saw no key
      const float c = exp2f(sm[s] - base);
      l += sl[s] * c;
      o += so[s] * c;
    }
    const int head = head0 + row;
    p.out[(t * p.n_q + head) * HD + d] = f32_to_bf16_bits(o * attention_final_factor(m, l, sinks_log2[row]));
  }
  cluster_arrive_relaxed();  // no CTA leaves while another reads its state
  cluster_wait_acquire();
}

// `kCluster`: the grid's splits are one CTA cluster per (token, kv head, head block) (cluster rank = split);
// each CTA leaves its split's state in `cst` and merges a 1/splits share of the (row, head dim) pairs of all splits.
template <int HD, bool kCluster = false>
__global__ void __launch_bounds__(32 * attention_decode_warps(HD))
    attention_decode_kernel(AttentionKernelParams p, int stages, int splits) {
  using T = Tile<HD>;
  constexpr int kGroups = attention_decode_key_groups(HD), kWarps = attention_decode_warps(HD);
  constexpr int kKeysPerWarp = T::kKeys / kGroups, kNt = kKeysPerWarp / 8;
  constexpr int kExchangeFloats = T::kWpr > 1 ? kWarps * kNt * 4 * 32 : 0;
  extern __shared__ __align__(128) uint8_t smem_raw[];
  uint16_t* sq = reinterpret_cast<uint16_t*>(smem_raw);   // [16][HD]
  float* xbuf = reinterpret_cast<float*>(sq + 16 * HD);   // [warps][kNt * 4][32] partial scores
  uint16_t* skv = reinterpret_cast<uint16_t*>(xbuf + kExchangeFloats);  // stages x {K, V} [kKeys][HD]
  float* merge = reinterpret_cast<float*>(skv);  // after the last tile: [kGroups][16 rows][HD + 2]
  __shared__ float cst[kCluster ? 16 * (HD + 2) : 1];  // kCluster: this split's state, [16 rows][HD + 2]
  __shared__ float sinks_log2[16];  // the block's heads' sinks (attention_sink_log2), read with the keys

  const int group = static_cast<int>(p.n_q / p.n_kv);
  const int head_blocks = (group + 15) / 16;
  const int64_t t = blockIdx.x;
  const int g = blockIdx.y / head_blocks, hb = blockIdx.y % head_blocks;
  const int split = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int key_group = warp / T::kWpr, col0 = (warp % T::kWpr) * T::kDs;
  auto row_valid = [&](int row) { return hb * 16 + row < group; };
  auto row_head = [&](int row) { return g * group + hb * 16 + row; };

  auto read_sinks = [&] {
    const int row = static_cast<int>(threadIdx.x);
    if (row < 16) sinks_log2[row] = row_valid(row) ? attention_sink_log2(p.sinks, row_head(row)) : 0.f;
  };
  auto copy_q = [&] {
    for (int idx = threadIdx.x; idx < 16 * (HD / 8); idx += blockDim.x) {
      const int row = idx / (HD / 8), c = idx % (HD / 8);
      const bool ok = row_valid(row);
      const uint16_t* src = ok ? p.q + (t * p.n_q + row_head(row)) * HD + c * 8 : p.q;
      cp_async_16(sq + row * HD + swizzle<HD>(row, c) * 8, src, ok);
    }
  };
  // The position, the page table and the keys of earlier steps come before the kernel before (the step's staging
  // and earlier steps): with keys_before_wait (one query per sequence) the ring's first stages are copied before
  // the PDL wait, without the query's own key, which qkv_rope writes; it and Q are copied after the wait.
  const bool early = p.keys_before_wait;
  if (!early) {
    pdl_wait();  // launched as a programmatic dependent: q and the new K/V come from qkv_rope
    pdl_launch_dependents();  // after the wait: a dependent may rely on what our predecessors wrote
    copy_q();
    cp_async_commit();
  }
  read_sinks();  // early: before the wait (the CTA syncs before the merge reads them)

  int first, last;
  attn_key_range(p, t, &first, &last);
  const int seq = p.kv.token_seq[t];
  const int len = last - first + 1;
  const int chunk = ((len + splits - 1) / splits + T::kKeys - 1) / T::kKeys * T::kKeys;
  const int kstart = first + split * chunk;
  const int kend = min(last, kstart + chunk - 1);
  const KvPass pass{seq, kstart, kend, kend >= kstart ? (kend - kstart + T::kKeys) / T::kKeys : 0};

  int issued = min(1, pass.n_tiles);
  if (early) {
    // The query's own key (the last one, pos = last) is in this split's last tile when the split holds it.
    issued = min(stages, pass.n_tiles);
    const int own_tile = pass.n_tiles > 0 && kend == last ? (last - kstart) / T::kKeys : -1;
    for (int i = 0; i < issued; ++i) {
      load_pass_tile<HD>(p, g, pass, i, skv + i * 2 * T::kKeys * HD, own_tile == i ? last : -1);
      cp_async_commit();
    }
    // The own key's cache offset (a thread a 16-byte chunk of its K and V row), -1 outside the cache: zeros, as the
    // tiles' zero fill.
    int64_t own_off = -1;
    if (own_tile >= 0 && own_tile < issued && threadIdx.x < 2 * (HD / 8)) {
      const int64_t logical = last / p.kv.page_size;
      const int64_t page =
          logical < p.kv.max_pages ? p.kv.page_table[static_cast<int64_t>(seq) * p.kv.max_pages + logical] : -1;
      if (page >= 0 && page < p.kv.num_pages)
        own_off = ((page * p.kv.page_size + last % p.kv.page_size) * p.n_kv + g) * HD + (threadIdx.x % (HD / 8)) * 8;
    }
    pdl_wait();  // q and the query's own K/V come from qkv_rope
    pdl_launch_dependents();
    copy_q();
    if (own_tile >= 0 && own_tile < issued && threadIdx.x < 2 * (HD / 8)) {  // its row of the stage, K and V
      const int row = (last - kstart) % T::kKeys, c = threadIdx.x % (HD / 8);
      const bool is_v = threadIdx.x >= HD / 8;
      uint16_t* dst = skv + own_tile * 2 * T::kKeys * HD + (is_v ? T::kKeys * HD : 0);
      cp_async_16(dst + row * HD + swizzle<HD>(row, c) * 8, (is_v ? p.kv.v : p.kv.k) + (own_off >= 0 ? own_off : 0),
                  own_off >= 0);
    }
    cp_async_commit();
    cp_async_wait<0>();  // Q, the own key and the early stages
  } else {
    if (pass.n_tiles > 0) load_pass_tile<HD>(p, g, pass, 0, skv);
    cp_async_commit();
    cp_async_wait<1>();  // the Q group
  }
  __syncthreads();
  uint32_t qf[T::kKc][4];
  load_q_fragments<HD, T::kKc>(sq, 0, col0, qf);

  RowState<T::kDs> st;
  for (int i = 0; i < pass.n_tiles; ++i) {
    const int stage = wait_kv_tile<HD>(p, g, pass, i, stages, skv, issued);
    __syncthreads();
    uint16_t* sk = skv + stage * 2 * T::kKeys * HD;
    uint16_t* sv = sk + T::kKeys * HD;
    const int key0 = key_group * kKeysPerWarp;  // this warp's keys in the tile
    const int k0 = kstart + i * T::kKeys + key0;
    float s[kNt][4];
    qk_scores<HD, kNt, T::kKc>(qf, sk, key0, col0, s);
    sum_partial_scores<T::kWpr, kNt>(s, xbuf, key_group * T::kWpr);
#pragma unroll
    for (int n = 0; n < kNt; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = k0 + n * 8 + 2 * (lane % 4) + (e & 1);
        s[n][e] = key <= kend ? s[n][e] * p.scale_log2 : -INFINITY;
      }
    softmax_pv<HD, kNt, T::kDs>(st, s, sv, key0, col0);
    __syncthreads();
  }
  cp_async_wait<0>();
  __syncthreads();  // the merge overwrites the ring

  // Merge the key groups' states (the d-slice warps of a group hold the same m and l).
  constexpr int kStride = HD + 2;
  const int r0 = lane / 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = st.l[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    float* row = merge + (key_group * 16 + r0 + 8 * h) * kStride;
    if (col0 == 0 && lane % 4 == 0) {
      row[HD] = st.m[h];
      row[HD + 1] = l;
    }
#pragma unroll
    for (int d = 0; d < T::kDs / 8; ++d) {
      row[col0 + d * 8 + 2 * (lane % 4)] = st.o[d][2 * h];
      row[col0 + d * 8 + 2 * (lane % 4) + 1] = st.o[d][2 * h + 1];
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < 16 * HD; idx += blockDim.x) {
    const int row = idx / HD, d = idx % HD;
    if (!row_valid(row)) continue;
    float m = -INFINITY;
#pragma unroll
    for (int w = 0; w < kGroups; ++w) m = fmaxf(m, merge[(w * 16 + row) * kStride + HD]);
    const float base = m == -INFINITY ? 0.f : m;
    float l = 0.f, o = 0.f;
#pragma unroll
    for (int w = 0; w < kGroups; ++w) {
      const float* wr = merge + (w * 16 + row) * kStride;
      const float c = exp2f(wr[HD] - base);
      l += wr[HD + 1] * c;
      o += wr[d] * c;
    }
    const int head = row_head(row);
    if constexpr (kCluster) {
      cst[row * kStride + d] = o;
      if (d == 0) {
        cst[row * kStride + HD] = m;
        cst[row * kStride + HD + 1] = l;
      }
    } else if (splits == 1) {
      p.out[(t * p.n_q + head) * HD + d] = f32_to_bf16_bits(o * attention_final_factor(m, l, sinks_log2[row]));
    } else {
      float* part = p.partials + ((t * p.n_q + head) * splits + split) * kStride;
      part[d] = o;
      if (d == 0) {
        part[HD] = m;
        part[HD + 1] = l;
      }
    }
  }
  if constexpr (kCluster)
    cluster_merge_splits<HD, kAttentionDecodeMaxClusterSplits>(p, cst, splits, t, g * group + hb * 16, group - hb * 16,
                                                               sinks_log2);
}

// Combines the splits of one (token, head) and adds the sink: blockDim.x == head_dim. (A variant where the
// decode kernel's last CTA of each (token, kv head) merged, with a ticket, measured slower on an H100, hd 512
// at 1K context 17 -> 63 us: one CTA then merges up to 64 splits of 16 heads.) The splits' (m, l) pairs go
// through shared memory, each read by one thread, and every thread's loads of its accumulators are
// unconditional, so they can all be in flight at once; the loops read m again per split and loaded an
// accumulator only behind its test, one dependent L2 round trip after another.
constexpr int kMaxMergeSplits = 64;
__global__ void attention_merge_kernel(AttentionKernelParams p, int splits) {
  __shared__ float split_m[kMaxMergeSplits], split_l[kMaxMergeSplits];
  pdl_wait();  // launched as a programmatic dependent of the decode kernel
  pdl_launch_dependents();  // after the wait: a dependent may rely on what our predecessors wrote
  const int64_t t = blockIdx.x;
  const int head = blockIdx.y, d = threadIdx.x;
  const int64_t hd = p.head_dim, stride = hd + 2;
  const float* part = p.partials + (t * p.n_q + head) * splits * stride;
  for (int s = d; s < splits; s += blockDim.x) {
    split_m[s] = part[s * stride + hd];
    split_l[s] = part[s * stride + hd + 1];
  }
  __syncthreads();
  float m = -INFINITY;
  for (int s = 0; s < splits; ++s) m = fmaxf(m, split_m[s]);
  const float base = m == -INFINITY ? 0.f : m;
  float l = 0.f, o = 0.f;
#pragma unroll 16
  for (int s = 0; s < splits; ++s) {
    const float acc = part[s * stride + d];
    // A split that saw no key carries m = -inf, l = 0 and may leave its accumulators unwritten.
    if (split_m[s] == -INFINITY) continue;
    const float c = exp2f(split_m[s] - base);
    l += split_l[s] * c;
    o += acc * c;
  }
  p.out[(t * p.n_q + head) * hd + d] = f32_to_bf16_bits(o * attention_final_factor(m, l, attention_sink_log2(p.sinks, head)));
}

Status check_common(const AttentionKernelParams& p) {
  if (!attention_head_dim_supported(p.head_dim)) return unimplemented("attention: head_dim must be 32, 64, 128, 256 or 512");
  if (p.n_kv <= 0 || p.n_q % p.n_kv != 0) return invalid_argument("attention: n_q must be a multiple of n_kv");
  return Status::ok();
}

template <typename Kernel>
Status set_smem(Kernel kernel, int64_t bytes) {
  return cuda_status(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)),
                     "cudaFuncSetAttribute(attention smem)");
}

template <int HD>
Status launch_prefill(const AttentionKernelParams& p, const AttentionPrefillConfig& c, dim3 grid, cudaStream_t stream) {
  if (c.threads != 32 * attention_prefill_warps(HD) || c.rows_per_cta != attention_prefill_rows(HD))
    return internal_error("attention prefill: config for another head dim");
  MX_RETURN_IF_ERROR(set_smem(attention_prefill_kernel<HD>, c.smem_bytes));
  attention_prefill_kernel<HD><<<grid, c.threads, c.smem_bytes, stream>>>(p, c.stages);
  return launch_status("attention_prefill_kernel");
}

// The clustered decode (head dim 64): the splits of a (token, kv head, head block) as one cluster, no merge kernel.
Status launch_decode_clusters(const AttentionKernelParams& p, const AttentionDecodeConfig& c, dim3 grid,
                              cudaStream_t stream) {
  if (c.threads != 32 * attention_decode_warps(64) || p.head_dim != 64 || c.num_splits < 2 ||
      c.num_splits > kAttentionDecodeMaxClusterSplits)
    return internal_error("attention decode: clusters for head dim 64 and 2-16 splits only");
  auto kernel = attention_decode_kernel<64, true>;
  MX_RETURN_IF_ERROR(set_smem(kernel, c.smem_bytes));
  MX_RETURN_IF_ERROR(cuda_status(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1),
                                 "cudaFuncSetAttribute(attention decode clusters)"));
  const dim3 cluster(1, 1, static_cast<unsigned>(c.num_splits));
  MX_RETURN_IF_ERROR(cuda_status(
      launch_pdl_clusters(kernel, grid, dim3(c.threads), cluster, c.smem_bytes, stream, p, c.stages, c.num_splits),
      "attention_decode_kernel (clusters)"));
  return launch_status("attention_decode_kernel (clusters)");
}

template <int HD>
Status launch_decode(const AttentionKernelParams& p, const AttentionDecodeConfig& c, dim3 grid, cudaStream_t stream) {
  if (c.threads != 32 * attention_decode_warps(HD)) return internal_error("attention decode: config for another head dim");
  MX_RETURN_IF_ERROR(set_smem(attention_decode_kernel<HD>, c.smem_bytes));
  MX_RETURN_IF_ERROR(cuda_status(
      launch_pdl(attention_decode_kernel<HD>, grid, dim3(c.threads), c.smem_bytes, stream, p, c.stages, c.num_splits),
      "attention_decode_kernel"));
  return launch_status("attention_decode_kernel");
}

}  // namespace

Status launch_attention_prefill(const AttentionKernelParams& p, const AttentionPrefillConfig& c, cudaStream_t stream) {
  MX_RETURN_IF_ERROR(check_common(p));
  const int64_t group = p.n_q / p.n_kv;
  if (group > c.rows_per_cta)
    return unimplemented("attention prefill: more q heads per kv head than rows per CTA (" +
                         std::to_string(c.rows_per_cta) + ")");
  if (c.stages < 1 || c.stages > 2) return internal_error("attention prefill: config without a valid pipeline");
  if (p.tokens == 0) return Status::ok();
  const int64_t tpc = std::max<int64_t>(1, c.rows_per_cta / group);
  const dim3 grid(static_cast<unsigned>(ceil_div64(p.tokens, tpc)), static_cast<unsigned>(p.n_kv));
  switch (p.head_dim) {
    case 32: return launch_prefill<32>(p, c, grid, stream);
    case 64: return launch_prefill<64>(p, c, grid, stream);
    case 128: return launch_prefill<128>(p, c, grid, stream);
    case 256: return launch_prefill<256>(p, c, grid, stream);
    default: return launch_prefill<512>(p, c, grid, stream);
  }
}

Status launch_attention_decode(const AttentionKernelParams& p, const AttentionDecodeConfig& c, cudaStream_t stream) {
  MX_RETURN_IF_ERROR(check_common(p));
  if (c.stages < 1 || c.stages > 2) return internal_error("attention decode: config without a valid pipeline");
  if (c.num_splits > 1 && !p.partials) return internal_error("attention decode: split-KV without scratch");
  if (p.tokens == 0) return Status::ok();
  const int64_t group = p.n_q / p.n_kv, head_blocks = (group + 15) / 16;
  const dim3 grid(static_cast<unsigned>(p.tokens), static_cast<unsigned>(p.n_kv * head_blocks),
                  static_cast<unsigned>(c.num_splits));
  if (c.clusters) return launch_decode_clusters(p, c, grid, stream);
  switch (p.head_dim) {
    case 32: MX_RETURN_IF_ERROR(launch_decode<32>(p, c, grid, stream)); break;
    case 64: MX_RETURN_IF_ERROR(launch_decode<64>(p, c, grid, stream)); break;
    case 128: MX_RETURN_IF_ERROR(launch_decode<128>(p, c, grid, stream)); break;
    case 256: MX_RETURN_IF_ERROR(launch_decode<256>(p, c, grid, stream)); break;
    default: MX_RETURN_IF_ERROR(launch_decode<512>(p, c, grid, stream)); break;
  }
  if (c.num_splits == 1) return Status::ok();
  return launch_attention_split_merge(p, c.num_splits, stream);
}

Status launch_attention_split_merge(const AttentionKernelParams& p, int splits, cudaStream_t stream) {
  if (splits < 1 || splits > kMaxMergeSplits)
    return internal_error("attention merge: 1 to " + std::to_string(kMaxMergeSplits) + " splits");
  return cuda_status(launch_pdl(attention_merge_kernel, dim3(static_cast<unsigned>(p.tokens), static_cast<unsigned>(p.n_q)),
                                dim3(static_cast<unsigned>(p.head_dim)), 0, stream, p, splits),
                     "attention_merge_kernel");
}

}  // namespace mx::cuda
