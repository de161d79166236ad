// Prefill attention for Hopper (sm_90a): FlashAttention with both GEMMs on wgmma (bf16 in, fp32 out).
//
// A CTA takes 64 x kWarpgroups query rows that pack (token, q head) pairs of one kv head, as the mma.sync
// kernel does (attention.cu), so each K/V tile in shared memory serves every head of the group. Each
// warpgroup owns 64 rows: S = Q K^T with Q in registers (A) and the K tile in shared memory (B, K-major),
// online softmax in fp32 in the exp2 domain, then O += P V with P in registers and the V tile as an
// MN-major B operand (no transpose: V rows are 128-byte rows of head dims, like K).
// K/V tiles of KT keys come through a cp.async ring of kAttnWgmmaStages stages; every thread loads
// (16-byte chunks, one page-table lookup per key row), so any page size works.
// Tile skipping: a pass loads only keys [min first, max last] of its rows (causal and window bounds), and
// tiles that every row sees whole skip the per-element mask.
// The sink (optional) enters once, at the end (attention_common.cuh).
// Shared-memory tiles: panels of 64 head dims, rows of 128 bytes with the 128-byte swizzle (16-byte chunk c
// of row n at c ^ (n % 8)) that wgmma's descriptors expect; each tile starts 1024-byte aligned.
#include <cfloat>
#include <climits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernel_configs.h"
#include "backend/cuda/kernels/attention_wgmma_parts.cuh"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/kernels.h"
#include "backend/cuda/kernels/wgmma.cuh"

namespace mx::cuda {
namespace {

constexpr int kStages = kAttnWgmmaStages;

#if MX_SM90A

// Issues the copies of keys [k0, k0 + KT) of kv head g of sequence seq into {K, V} at `stage`
// (zero-filled past k_last or outside the cache).
template <int HD, int KT, int THREADS>
__device__ __forceinline__ void load_kv_tile(const AttentionKernelParams& p, int g, int seq, int k0, int k_last,
                                             uint8_t* stage) {
  constexpr int kChunks = HD / 8;
  const PagedKv& kv = p.kv;
#pragma unroll
  for (int j = 0; j < KT * kChunks / THREADS; ++j) {
    const int idx = threadIdx.x + j * THREADS, row = idx / kChunks, c = idx % kChunks;
    const int key = k0 + row;
    int64_t page = -1;
    if (key >= 0 && key <= k_last) {
      const int64_t logical = key / kv.page_size;
      if (logical < kv.max_pages) page = kv.page_table[static_cast<int64_t>(seq) * kv.max_pages + logical];
    }
    const bool ok = page >= 0 && page < kv.num_pages;
    const int64_t off = ok ? (((page * kv.page_size + key % kv.page_size) * p.n_kv + g) * HD + c * 8) : 0;
    const int dst = attn_tile_offset<KT>(row, c);
    cp_async_16(stage + dst, kv.k + off, ok);
    cp_async_16(stage + KT * HD * 2 + dst, kv.v + off, ok);
  }
}

#endif  // MX_SM90A

// KT = 128 keys per tile, one CTA per SM (184 registers). A 64-key variant with two CTAs per SM (112
// registers) timed 1.37x faster at 8K on an H100 but gave wrong results whenever a CTA ran more than one
// tile (docs/PERF.md); it is not instantiated until that is understood.
template <int HD, int WGS, int KT>
__global__ void __launch_bounds__(128 * WGS, KT == 64 ? 2 : 1) attention_prefill_wgmma_kernel(AttentionKernelParams p) {
#if MX_SM90A
  static_assert(HD % 64 == 0, "head dims come in panels of 64");
  static_assert(HD == 64, "the P.V wgmma wrapper is written for n = 64; wider heads need n = HD");
  constexpr int kThreads = 128 * WGS, kRows = 64 * WGS, kSteps = HD / 16;
  constexpr int kTileBytes = KT * HD * 2;
  // Aligned at run time (an __align__(1024) here would let the compiler fold the adjustment away).
  extern __shared__ __align__(128) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  uint8_t* sq = smem;                                         // [panels][kRows][64]
  uint8_t* skv = sq + kRows * HD * 2;                         // kStages x {K, V} [panels][KT][64]
  int* row_first = reinterpret_cast<int*>(skv + kStages * 2 * kTileBytes);  // [kRows]
  int* row_last = row_first + kRows;                                         // [kRows]
  __shared__ int pass_seq, pass_end, pass_kmin, pass_kmax, pass_fmax, pass_lmin;

  const int group = static_cast<int>(p.n_q / p.n_kv);
  const int tpc = max(1, kRows / group);  // tokens per CTA
  const int g = blockIdx.y;
  // Heaviest CTAs (latest tokens: most keys under the causal mask) start first.
  const int64_t t0 = static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * tpc;
  const int n_tok = static_cast<int>(p.tokens - t0 < tpc ? p.tokens - t0 : tpc);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;

  auto row_valid = [&](int row) { return row / group < n_tok && row < tpc * group; };
  auto row_head = [&](int row) { return g * group + row % group; };

  // Q rows -> shared memory -> A fragments (the m16n8k16 layout: this warp's 16 rows).
  for (int idx = tid; idx < kRows * (HD / 8); idx += kThreads) {
    const int row = idx / (HD / 8), c = idx % (HD / 8);
    const bool ok = row_valid(row);
    const int64_t t = t0 + row / group;
    const uint16_t* src = ok ? p.q + (t * p.n_q + row_head(row)) * HD + c * 8 : p.q;
    cp_async_16(sq + attn_tile_offset<kRows>(row, c), src, ok);
  }
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  uint32_t qf[kSteps][4];
  attn_load_q<kRows, HD>(qf, sq, warp * 16, lane);

  // Online-softmax state of the rows r0 and r1 = r0 + 8 this lane holds; o[4j + e]: head dims 8j + 2q + (e & 1)
  // of r0 (e < 2) or r1.
  const int r0 = warp * 16 + lane / 4, r1 = r0 + 8, q4 = lane % 4;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  float o[HD / 2];
#pragma unroll
  for (int i = 0; i < HD / 2; ++i) o[i] = 0.f;

  const uint32_t skv_addr = smem_addr(skv);
  for (int start = 0; start < n_tok;) {
    if (tid == 0) {
      const int seq = p.kv.token_seq[t0 + start];
      int end = start + 1;
      while (end < n_tok && p.kv.token_seq[t0 + end] == seq) ++end;
      int kmin = INT_MAX, kmax = -1, fmax = -1, lmin = INT_MAX;
      for (int i = start; i < end; ++i) {
        int f, l;
        attn_key_range(p, t0 + i, &f, &l);
        kmin = min(kmin, f);
        kmax = max(kmax, l);
        fmax = max(fmax, f);
        lmin = min(lmin, l);
      }
      pass_seq = seq;
      pass_end = end;
      pass_kmin = kmin;
      pass_kmax = kmax;
      // Keys every row sees: only when the pass holds all of the CTA's rows (else the others need masks).
      const bool whole = start == 0 && end == n_tok;
      pass_fmax = whole ? fmax : INT_MAX;
      pass_lmin = whole ? lmin : -1;
    }
    __syncthreads();
    for (int row = tid; row < kRows; row += kThreads) {
      const int tl = row / group;
      int f = 1, l = 0;  // empty range: the row is not in this pass
      if (row_valid(row) && tl >= start && tl < pass_end) attn_key_range(p, t0 + tl, &f, &l);
      row_first[row] = f;
      row_last[row] = l;
    }
    const int seq = pass_seq, kmin = pass_kmin, kmax = pass_kmax, end = pass_end;
    const int fmax = pass_fmax, lmin = pass_lmin;
    __syncthreads();
    const int f0 = row_first[r0], l0 = row_last[r0], f1 = row_first[r1], l1 = row_last[r1];
    const int n_tiles = kmax >= kmin ? (kmax - kmin + KT) / KT : 0;

    for (int s = 0; s < kStages - 1; ++s) {
      if (s < n_tiles) load_kv_tile<HD, KT, kThreads>(p, g, seq, kmin + s * KT, kmax, skv + s * 2 * kTileBytes);
      cp_async_commit();
    }
    for (int i = 0; i < n_tiles; ++i) {
      cp_async_wait<kStages - 2>();  // this thread's copies of tile i landed
      fence_proxy_async_smem();      // ... and are visible to wgmma's reads
      __syncthreads();               // everyone's; every warpgroup finished tile i - 1, whose stage is reloaded next
      {
        const int next = i + kStages - 1;
        if (next < n_tiles)
          load_kv_tile<HD, KT, kThreads>(p, g, seq, kmin + next * KT, kmax, skv + (next % kStages) * 2 * kTileBytes);
        cp_async_commit();
      }
      const uint32_t k_addr = skv_addr + (i % kStages) * 2 * kTileBytes, v_addr = k_addr + kTileBytes;
      const int k0 = kmin + i * KT;

      float s[KT / 2];
      attn_qk<KT, HD>(s, qf, k_addr);
      uint32_t pa[KT / 16][4];
      attn_softmax_tile<KT, HD>(s, o, m_run, l_run, pa, k0 >= fmax && k0 + KT - 1 <= lmin, k0, q4, f0, l0, f1, l1,
                                p.scale_log2);
      attn_pv<KT, HD>(o, pa, v_addr);
    }
    cp_async_wait<0>();
    __syncthreads();  // the ring and the row bounds are rewritten by the next pass
    start = end;
  }

  int64_t token[2];
  int head[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = h == 0 ? r0 : r1;
    token[h] = row_valid(row) ? t0 + row / group : -1;
    head[h] = row_head(row);
  }
  attn_store_rows<HD>(p, o, m_run, l_run, token, head, q4);
#endif  // MX_SM90A
}

}  // namespace

Status launch_attention_prefill_wgmma(const AttentionKernelParams& p, const AttentionPrefillWgmmaConfig& c,
                                      cudaStream_t stream) {
  if (!c.enabled) return unimplemented("attention prefill wgmma: needs sm_90 and head_dim 64");
  if (p.head_dim != 64) return unimplemented("attention prefill wgmma: head_dim must be 64");
  if (p.n_kv <= 0 || p.n_q % p.n_kv != 0) return invalid_argument("attention: n_q must be a multiple of n_kv");
  const int64_t group = p.n_q / p.n_kv;
  if (group > c.rows_per_cta) return unimplemented("attention prefill wgmma: more q heads per kv head than rows");
  if (c.threads != 128 * kAttnWgmmaWarpgroups || c.rows_per_cta != 64 * kAttnWgmmaWarpgroups)
    return internal_error("attention prefill wgmma: config does not match the kernel");
  if (p.tokens == 0) return Status::ok();
  const int64_t tpc = std::max<int64_t>(1, c.rows_per_cta / group);
  const dim3 grid(static_cast<unsigned>(ceil_div64(p.tokens, tpc)), static_cast<unsigned>(p.n_kv));
  if (c.keys_per_tile != 128) return internal_error("attention prefill wgmma: keys per tile must be 128");
  auto kernel = attention_prefill_wgmma_kernel<64, kAttnWgmmaWarpgroups, 128>;
  MX_RETURN_IF_ERROR(cuda_status(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(c.smem_bytes)),
      "cudaFuncSetAttribute(attention wgmma smem)"));
  kernel<<<grid, c.threads, c.smem_bytes, stream>>>(p);
  return launch_status("attention_prefill_wgmma_kernel");
}

}  // namespace mx::cuda
