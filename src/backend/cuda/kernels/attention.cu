// Paged attention with GQA, learned sinks and sliding windows, on mma.sync (m16n8k16, bf16 in, fp32 out).
//
// Prefill (FlashAttention-2 style): a CTA takes up to 64 query rows that pack (token, q head) pairs of one
// kv head (64 / group tokens), so each K/V tile loaded to shared memory serves every head of the group.
// 4 warps own 16 rows each; online softmax in fp32 in the exp2 domain; P goes to bf16 for the P.V mma.
// A CTA whose tokens span sequences runs one pass per sequence (tokens of a sequence are contiguous in a
// BatchView), masking the rows of the others.
// Decode: one CTA per (token, kv head, block of 16 heads, KV split); its 4 warps split every 64-key tile,
// their states merge through shared memory; with several splits a merge kernel combines them.
// The sink enters once, at the very end: m' = max(m, s), l' = l 2^(m - m') + 2^(s - m'), s in log2 units.
// K/V tiles: [64 keys][head_dim] bf16 in shared memory, 16-byte chunks XOR-swizzled by row so that
// ldmatrix reads of 8 rows hit 8 different bank groups.
#include <cfloat>
#include <climits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/kernels.h"

namespace mx::cuda {
namespace {

constexpr int kKeys = 64;
constexpr float kLog2e = 1.4426950408889634f;

template <int HD>
__device__ __forceinline__ int swizzle(int row, int chunk) {
  if constexpr (HD == 64) return chunk ^ (row & 7);
  else return chunk ^ ((row >> 1) & 3);
}

template <int HD>
__device__ __forceinline__ uint16_t* tile_at(uint16_t* tile, int row, int col) {
  return tile + row * HD + swizzle<HD>(row, col / 8) * 8 + (col % 8);
}

// Loads keys [k0, k0 + 64) of kv head g of sequence seq (zero-filled past k_last or outside the cache).
template <int HD>
__device__ __forceinline__ void load_kv_tile(const PagedKv& kv, int64_t n_kv, int g, int seq, int k0, int k_last,
                                             uint16_t* sk, uint16_t* sv) {
  constexpr int kChunks = HD / 8;
  for (int idx = threadIdx.x; idx < kKeys * kChunks; idx += blockDim.x) {
    const int row = idx / kChunks, c = idx % kChunks;
    const int key = k0 + row;
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

// One pass over keys [k_first, k_last] of a sequence for one kv head, in n_tiles tiles of 64 keys.
struct KvPass {
  int seq, k_first, k_last, n_tiles;
};

// Issues the copies of tile i of the pass into the stage at `stage` ({K, V}, [64][HD] each).
template <int HD>
__device__ __forceinline__ void load_pass_tile(const AttentionKernelParams& p, int g, const KvPass& pass, int i,
                                               uint16_t* stage) {
  load_kv_tile<HD>(p.kv, p.n_kv, g, pass.seq, pass.k_first + i * kKeys, pass.k_last, stage, stage + kKeys * HD);
}

// The K/V ring shared by prefill and decode: `stages` (1 or 2) stages at skv, tile 0 issued into stage 0
// before the loop. Waits until this thread's copies of tile i landed and returns its stage; the caller
// syncs the CTA before reading it and after its last read. Two stages: tile i + 1 is issued into the other
// stage first, so its copy overlaps the math of tile i. One stage (when two do not fit): tile i is issued
// only now, into the stage the previous iteration has released.
template <int HD>
__device__ __forceinline__ int wait_kv_tile(const AttentionKernelParams& p, int g, const KvPass& pass, int i,
                                            int stages, uint16_t* skv) {
  if (stages == 1) {
    if (i > 0) {
      load_pass_tile<HD>(p, g, pass, i, skv);
      cp_async_commit();
    }
    cp_async_wait<0>();
    return 0;
  }
  const int stage = i & 1;
  if (i + 1 < pass.n_tiles) {
    load_pass_tile<HD>(p, g, pass, i + 1, skv + ((i + 1) & 1) * 2 * kKeys * HD);
    cp_async_commit();
    cp_async_wait<1>();
  } else {
    cp_async_wait<0>();
  }
  return stage;
}

// A-operand fragments of 16 query rows starting at `row0` of a [rows][HD] swizzled tile.
template <int HD>
__device__ __forceinline__ void load_q_fragments(uint16_t* sq, int row0, uint32_t (&qf)[HD / 16][4]) {
  const int lane = threadIdx.x % 32, m = lane / 8;
#pragma unroll
  for (int kc = 0; kc < HD / 16; ++kc)
    ldmatrix_x4(qf[kc], tile_at<HD>(sq, row0 + (m % 2) * 8 + lane % 8, kc * 16 + (m / 2) * 8));
}

// Online-softmax state of the two rows (r, r + 8) a lane holds.
template <int HD>
struct RowState {
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.f, 0.f};  // this lane's partial sums; reduced over the 4 lanes of a row at the end
  float o[HD / 8][4] = {};
};

// Scores of 16 rows x (8 * NT) keys: S = Q K^T for the NT key n-tiles starting at key row `key0` of sk.
template <int HD, int NT>
__device__ __forceinline__ void qk_scores(const uint32_t (&qf)[HD / 16][4], uint16_t* sk, int key0, float (&s)[NT][4]) {
  const int lane = threadIdx.x % 32, m = lane / 8;
#pragma unroll
  for (int n = 0; n < NT; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
  for (int kc = 0; kc < HD / 16; ++kc) {
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      uint32_t kb[4];
      ldmatrix_x4(kb, tile_at<HD>(sk, key0 + np * 16 + (m / 2) * 8 + lane % 8, kc * 16 + (m % 2) * 8));
      mma_bf16_16816(s[2 * np], qf[kc], kb[0], kb[1]);
      mma_bf16_16816(s[2 * np + 1], qf[kc], kb[2], kb[3]);
    }
  }
}

// Folds masked, log2-scaled scores into the state and accumulates P.V for the same keys.
template <int HD, int NT>
__device__ __forceinline__ void softmax_pv(RowState<HD>& st, float (&s)[NT][4], uint16_t* sv, int key0) {
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
  for (int d = 0; d < HD / 8; ++d) {
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
    for (int dp = 0; dp < HD / 16; ++dp) {
      uint32_t vb[4];
      ldmatrix_x4_trans(vb, tile_at<HD>(sv, key0 + kc * 16 + (m % 2) * 8 + lane % 8, dp * 16 + (m / 2) * 8));
      mma_bf16_16816(st.o[2 * dp], a, vb[0], vb[1]);
      mma_bf16_16816(st.o[2 * dp + 1], a, vb[2], vb[3]);
    }
  }
}

__device__ __forceinline__ void key_range(const AttentionKernelParams& p, int64_t t, int* first, int* last) {
  const int pos = p.kv.positions[t];
  *last = pos;
  *first = p.window > 0 ? max(0, pos - static_cast<int>(p.window) + 1) : 0;
}

template <int HD>
__global__ void __launch_bounds__(128) attention_prefill_kernel(AttentionKernelParams p, int stages) {
  extern __shared__ __align__(128) uint8_t smem_raw[];
  uint16_t* sq = reinterpret_cast<uint16_t*>(smem_raw);  // [64][HD]
  uint16_t* skv = sq + 64 * HD;                           // stages x {K [64][HD], V [64][HD]}
  __shared__ int row_first[64], row_last[64];
  __shared__ int pass_seq, pass_end, pass_kmin, pass_kmax;

  const int group = static_cast<int>(p.n_q / p.n_kv);
  const int tpc = max(1, 64 / group);  // tokens per CTA
  const int g = blockIdx.y;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * tpc;
  const int n_tok = static_cast<int>(p.tokens - t0 < tpc ? p.tokens - t0 : tpc);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  auto row_valid = [&](int row) { return row / group < n_tok && row < tpc * group; };
  auto row_head = [&](int row) { return g * group + row % group; };

  // Q rows -> shared memory.
  for (int idx = threadIdx.x; idx < 64 * (HD / 8); idx += blockDim.x) {
    const int row = idx / (HD / 8), c = idx % (HD / 8);
    const bool ok = row_valid(row);
    const int64_t t = t0 + row / group;
    const uint16_t* src = ok ? p.q + (t * p.n_q + row_head(row)) * HD + c * 8 : p.q;
    cp_async_16(sq + row * HD + swizzle<HD>(row, c) * 8, src, ok);
  }
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  uint32_t qf[HD / 16][4];
  load_q_fragments<HD>(sq, warp * 16, qf);

  RowState<HD> st;
  const int r0 = warp * 16 + lane / 4, r1 = r0 + 8;
  for (int start = 0; start < n_tok;) {
    if (threadIdx.x == 0) {
      const int seq = p.kv.token_seq[t0 + start];
      int end = start + 1;
      while (end < n_tok && p.kv.token_seq[t0 + end] == seq) ++end;
      int kmin = INT_MAX, kmax = -1;
      for (int i = start; i < end; ++i) {
        int f, l;
        key_range(p, t0 + i, &f, &l);
        kmin = min(kmin, f);
        kmax = max(kmax, l);
      }
      pass_seq = seq;
      pass_end = end;
      pass_kmin = kmin;
      pass_kmax = kmax;
    }
    __syncthreads();
    if (threadIdx.x < 64) {
      const int row = threadIdx.x, tl = row / group;
      int f = 1, l = 0;  // empty range: the row is not in this pass
      if (row_valid(row) && tl >= start && tl < pass_end) key_range(p, t0 + tl, &f, &l);
      row_first[row] = f;
      row_last[row] = l;
    }
    const int seq = pass_seq, kmin = pass_kmin, kmax = pass_kmax;
    const int end = pass_end;
    __syncthreads();

    const KvPass pass{seq, kmin, kmax, kmax >= kmin ? (kmax - kmin + kKeys) / kKeys : 0};
    const int f0 = row_first[r0], l0 = row_last[r0], f1 = row_first[r1], l1 = row_last[r1];
    if (pass.n_tiles > 0) {
      load_pass_tile<HD>(p, g, pass, 0, skv);
      cp_async_commit();
    }
    for (int i = 0; i < pass.n_tiles; ++i) {
      const int stage = wait_kv_tile<HD>(p, g, pass, i, stages, skv);
      __syncthreads();
      uint16_t* sk = skv + stage * 2 * kKeys * HD;
      uint16_t* sv = sk + kKeys * HD;
      const int k0 = kmin + i * kKeys;
      float s[8][4];
      qk_scores<HD, 8>(qf, sk, 0, s);
#pragma unroll
      for (int n = 0; n < 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = k0 + n * 8 + 2 * (lane % 4) + (e & 1);
          const bool ok = e < 2 ? (key >= f0 && key <= l0) : (key >= f1 && key <= l1);
          s[n][e] = ok ? s[n][e] * p.scale_log2 : -INFINITY;
        }
      }
      softmax_pv<HD, 8>(st, s, sv, 0);
      __syncthreads();
    }
    start = end;
  }

  // Finalize: the sink joins the denominator once.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = h == 0 ? r0 : r1;
    float l = st.l[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if (!row_valid(row)) continue;
    const int head = row_head(row);
    const float sink = bf16_bits_to_f32(p.sinks[head]) * kLog2e;
    const float m_f = fmaxf(st.m[h], sink);
    const float scale = exp2f(st.m[h] - m_f);
    const float factor = scale / (l * scale + exp2f(sink - m_f));
    uint16_t* out = p.out + ((t0 + row / group) * p.n_q + head) * HD;
#pragma unroll
    for (int d = 0; d < HD / 8; ++d)
      *reinterpret_cast<uint32_t*>(out + d * 8 + 2 * (lane % 4)) =
          pack_bf16x2(st.o[d][2 * h] * factor, st.o[d][2 * h + 1] * factor);
  }
}

template <int HD>
__global__ void __launch_bounds__(128) attention_decode_kernel(AttentionKernelParams p, int stages, int splits) {
  extern __shared__ __align__(128) uint8_t smem_raw[];
  uint16_t* skv = reinterpret_cast<uint16_t*>(smem_raw);   // stages x {K, V} [64][HD]
  uint16_t* sq = skv + stages * 2 * kKeys * HD;            // [16][HD]
  float* merge = reinterpret_cast<float*>(sq + 16 * HD);   // [4 warps][16 rows][HD + 2]
  pdl_wait();  // launched as a programmatic dependent: q and the new K/V come from qkv_rope
  pdl_launch_dependents();  // after the wait: a dependent may rely on what our predecessors wrote

  const int group = static_cast<int>(p.n_q / p.n_kv);
  const int head_blocks = (group + 15) / 16;
  const int64_t t = blockIdx.x;
  const int g = blockIdx.y / head_blocks, hb = blockIdx.y % head_blocks;
  const int split = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  auto row_valid = [&](int row) { return hb * 16 + row < group; };
  auto row_head = [&](int row) { return g * group + hb * 16 + row; };

  for (int idx = threadIdx.x; idx < 16 * (HD / 8); idx += blockDim.x) {
    const int row = idx / (HD / 8), c = idx % (HD / 8);
    const bool ok = row_valid(row);
    const uint16_t* src = ok ? p.q + (t * p.n_q + row_head(row)) * HD + c * 8 : p.q;
    cp_async_16(sq + row * HD + swizzle<HD>(row, c) * 8, src, ok);
  }
  cp_async_commit();

  int first, last;
  key_range(p, t, &first, &last);
  const int seq = p.kv.token_seq[t];
  const int len = last - first + 1;
  const int chunk = ((len + splits - 1) / splits + kKeys - 1) / kKeys * kKeys;
  const int kstart = first + split * chunk;
  const int kend = min(last, kstart + chunk - 1);
  const KvPass pass{seq, kstart, kend, kend >= kstart ? (kend - kstart + kKeys) / kKeys : 0};

  if (pass.n_tiles > 0) load_pass_tile<HD>(p, g, pass, 0, skv);
  cp_async_commit();
  cp_async_wait<1>();  // the Q group
  __syncthreads();
  uint32_t qf[HD / 16][4];
  load_q_fragments<HD>(sq, 0, qf);

  RowState<HD> st;
  for (int i = 0; i < pass.n_tiles; ++i) {
    const int stage = wait_kv_tile<HD>(p, g, pass, i, stages, skv);
    __syncthreads();
    uint16_t* sk = skv + stage * 2 * kKeys * HD;
    uint16_t* sv = sk + kKeys * HD;
    const int k0 = kstart + i * kKeys + warp * 16;  // this warp's 16 keys
    float s[2][4];
    qk_scores<HD, 2>(qf, sk, warp * 16, s);
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = k0 + n * 8 + 2 * (lane % 4) + (e & 1);
        s[n][e] = key <= kend ? s[n][e] * p.scale_log2 : -INFINITY;
      }
    softmax_pv<HD, 2>(st, s, sv, warp * 16);
    __syncthreads();
  }
  cp_async_wait<0>();

  // Merge the 4 warps' states.
  constexpr int kStride = HD + 2;
  const int r0 = lane / 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = st.l[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    float* row = merge + (warp * 16 + r0 + 8 * h) * kStride;
    if (lane % 4 == 0) {
      row[HD] = st.m[h];
      row[HD + 1] = l;
    }
#pragma unroll
    for (int d = 0; d < HD / 8; ++d) {
      row[d * 8 + 2 * (lane % 4)] = st.o[d][2 * h];
      row[d * 8 + 2 * (lane % 4) + 1] = st.o[d][2 * h + 1];
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < 16 * HD; idx += blockDim.x) {
    const int row = idx / HD, d = idx % HD;
    if (!row_valid(row)) continue;
    float m = -INFINITY;
#pragma unroll
    for (int w = 0; w < 4; ++w) m = fmaxf(m, merge[(w * 16 + row) * kStride + HD]);
    const float base = m == -INFINITY ? 0.f : m;
    float l = 0.f, o = 0.f;
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const float* wr = merge + (w * 16 + row) * kStride;
      const float c = exp2f(wr[HD] - base);
      l += wr[HD + 1] * c;
      o += wr[d] * c;
    }
    const int head = row_head(row);
    if (splits == 1) {
      const float sink = bf16_bits_to_f32(p.sinks[head]) * kLog2e;
      const float m_f = fmaxf(m, sink);
      const float scale = exp2f(m - m_f);
      p.out[(t * p.n_q + head) * HD + d] = f32_to_bf16_bits(o * scale / (l * scale + exp2f(sink - m_f)));
    } else {
      float* part = p.partials + ((t * p.n_q + head) * splits + split) * kStride;
      part[d] = o;
      if (d == 0) {
        part[HD] = m;
        part[HD + 1] = l;
      }
    }
  }
}

// Combines the splits of one (token, head) and adds the sink: blockDim.x == head_dim.
__global__ void attention_merge_kernel(AttentionKernelParams p, int splits) {
  pdl_wait();  // launched as a programmatic dependent of the decode kernel
  pdl_launch_dependents();  // after the wait: a dependent may rely on what our predecessors wrote
  const int64_t t = blockIdx.x;
  const int head = blockIdx.y, d = threadIdx.x;
  const int64_t hd = p.head_dim, stride = hd + 2;
  const float* part = p.partials + (t * p.n_q + head) * splits * stride;
  const float sink = bf16_bits_to_f32(p.sinks[head]) * kLog2e;
  float m = sink;
  for (int s = 0; s < splits; ++s) m = fmaxf(m, part[s * stride + hd]);
  float l = exp2f(sink - m), o = 0.f;
  for (int s = 0; s < splits; ++s) {
    const float c = exp2f(part[s * stride + hd] - m);
    l += part[s * stride + hd + 1] * c;
    o += part[s * stride + d] * c;
  }
  p.out[(t * p.n_q + head) * hd + d] = f32_to_bf16_bits(o / l);
}

Status check_common(const AttentionKernelParams& p) {
  if (p.head_dim != 64 && p.head_dim != 32) return unimplemented("attention: head_dim must be 32 or 64");
  if (p.n_kv <= 0 || p.n_q % p.n_kv != 0) return invalid_argument("attention: n_q must be a multiple of n_kv");
  return Status::ok();
}

template <typename Kernel>
Status set_smem(Kernel kernel, int64_t bytes) {
  return cuda_status(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)),
                     "cudaFuncSetAttribute(attention smem)");
}

}  // namespace

Status launch_attention_prefill(const AttentionKernelParams& p, const AttentionPrefillConfig& c, cudaStream_t stream) {
  MX_RETURN_IF_ERROR(check_common(p));
  const int64_t group = p.n_q / p.n_kv;
  if (group > 64) return unimplemented("attention prefill: more than 64 q heads per kv head");
  if (c.stages < 1 || c.stages > 2) return internal_error("attention prefill: config without a valid pipeline");
  if (p.tokens == 0) return Status::ok();
  const int64_t tpc = std::max<int64_t>(1, 64 / group);
  const dim3 grid(static_cast<unsigned>(ceil_div64(p.tokens, tpc)), static_cast<unsigned>(p.n_kv));
  if (p.head_dim == 64) {
    MX_RETURN_IF_ERROR(set_smem(attention_prefill_kernel<64>, c.smem_bytes));
    attention_prefill_kernel<64><<<grid, c.threads, c.smem_bytes, stream>>>(p, c.stages);
  } else {
    MX_RETURN_IF_ERROR(set_smem(attention_prefill_kernel<32>, c.smem_bytes));
    attention_prefill_kernel<32><<<grid, c.threads, c.smem_bytes, stream>>>(p, c.stages);
  }
  return launch_status("attention_prefill_kernel");
}

Status launch_attention_decode(const AttentionKernelParams& p, const AttentionDecodeConfig& c, cudaStream_t stream) {
  MX_RETURN_IF_ERROR(check_common(p));
  if (c.stages < 1 || c.stages > 2) return internal_error("attention decode: config without a valid pipeline");
  if (c.num_splits > 1 && !p.partials) return internal_error("attention decode: split-KV without scratch");
  if (p.tokens == 0) return Status::ok();
  const int64_t group = p.n_q / p.n_kv, head_blocks = (group + 15) / 16;
  const dim3 grid(static_cast<unsigned>(p.tokens), static_cast<unsigned>(p.n_kv * head_blocks),
                  static_cast<unsigned>(c.num_splits));
  if (p.head_dim == 64) {
    MX_RETURN_IF_ERROR(set_smem(attention_decode_kernel<64>, c.smem_bytes));
    MX_RETURN_IF_ERROR(cuda_status(
        launch_pdl(attention_decode_kernel<64>, grid, dim3(c.threads), c.smem_bytes, stream, p, c.stages, c.num_splits),
        "attention_decode_kernel"));
  } else {
    MX_RETURN_IF_ERROR(set_smem(attention_decode_kernel<32>, c.smem_bytes));
    MX_RETURN_IF_ERROR(cuda_status(
        launch_pdl(attention_decode_kernel<32>, grid, dim3(c.threads), c.smem_bytes, stream, p, c.stages, c.num_splits),
        "attention_decode_kernel"));
  }
  MX_RETURN_IF_ERROR(launch_status("attention_decode_kernel"));
  if (c.num_splits == 1) return Status::ok();
  return cuda_status(launch_pdl(attention_merge_kernel, dim3(static_cast<unsigned>(p.tokens), static_cast<unsigned>(p.n_q)),
                                dim3(static_cast<unsigned>(p.head_dim)), 0, stream, p, c.num_splits),
                     "attention_merge_kernel");
}

}  // namespace mx::cuda
