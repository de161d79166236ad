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
#include "backend/cuda/kernels/attention_common.cuh"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/kernels.h"
#include "backend/cuda/kernels/wgmma.cuh"

namespace mx::cuda {
namespace {

constexpr int kStages = kAttnWgmmaStages;

#if MX_SM90A

// Descriptor of an MN-major B operand: rows of 64 n (128 bytes, 128-byte swizzle) along k, 8-row groups
// 1024 bytes apart (stride byte offset), the next 64 n at `panel_bytes` (leading byte offset).
__device__ __forceinline__ uint64_t wgmma_desc_mn128(uint32_t addr, uint32_t panel_bytes) {
  return static_cast<uint64_t>((addr & 0x3ffff) >> 4) | (static_cast<uint64_t>((panel_bytes >> 4) & 0x3fff) << 16) |
         (static_cast<uint64_t>(1024 >> 4) << 32) | (1ull << 62);
}

// D(64 x 64, fp32) += A(64 x 16, bf16, registers) * B(16 x 64) with B MN-major (transposed flag set).
__device__ __forceinline__ void wgmma_bf16_rs_mn64(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
      "}, {%32,%33,%34,%35}, %36, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}

// wgmma.fence must follow every register write to a wgmma's accumulators and A fragments. An empty asm that
// "modifies" them pins those writes before the (volatile) fence; without it the compiler sank the zeroing
// of S past the fence in the 64-key kernel (measured: wrong results, PTX showed the movs after the fence).
template <int R>
__device__ __forceinline__ void pin_fragments(uint32_t (&a)[R][4]) {
#pragma unroll
  for (int i = 0; i < R; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(a[i][j])::"memory");
}

// Byte offset of 16-byte chunk c (8 head dims) of row `row` in a [panels][rows][64] swizzled tile.
template <int ROWS>
__device__ __forceinline__ int tile_offset(int row, int c) {
  return (c / 8) * ROWS * 128 + row * 128 + (((c % 8) ^ (row & 7)) << 4);
}

__device__ __forceinline__ void key_range(const AttentionKernelParams& p, int64_t t, int* first, int* last) {
  const int pos = p.kv.positions[t];
  *last = pos;
  *first = p.window > 0 ? max(0, pos - static_cast<int>(p.window) + 1) : 0;
}

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
    const int dst = tile_offset<KT>(row, c);
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
    cp_async_16(sq + tile_offset<kRows>(row, c), src, ok);
  }
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  uint32_t qf[kSteps][4];
  {
    const int m = lane / 8, row = warp * 16 + (m % 2) * 8 + lane % 8;
#pragma unroll
    for (int kc = 0; kc < kSteps; ++kc) ldmatrix_x4(qf[kc], sq + tile_offset<kRows>(row, kc * 2 + m / 2));
  }

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
        key_range(p, t0 + i, &f, &l);
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
      if (row_valid(row) && tl >= start && tl < pass_end) key_range(p, t0 + tl, &f, &l);
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
#pragma unroll
      for (int e = 0; e < KT / 2; ++e) s[e] = 0.f;
      wgmma_fence_regs(s);
      wgmma_fence();
#pragma unroll
      for (int kc = 0; kc < kSteps; ++kc)
        wgmma_bf16_rs<KT>(s, qf[kc], wgmma_desc_k128(k_addr + (kc / 4) * KT * 128 + (kc % 4) * 32));
      wgmma_commit();
      wgmma_wait<0>();
      wgmma_fence_regs(s);

      // s[4j + e]: key k0 + 8j + 2q + (e & 1) of row r0 (e < 2) or r1. Raw scores; scaled inside exp2.
      if (!(k0 >= fmax && k0 + KT - 1 <= lmin)) {
#pragma unroll
        for (int j = 0; j < KT / 8; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = k0 + 8 * j + 2 * q4 + (e & 1);
            const bool ok = e < 2 ? (key >= f0 && key <= l0) : (key >= f1 && key <= l1);
            if (!ok) s[4 * j + e] = -INFINITY;
          }
      }
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int j = 0; j < KT / 8; ++j) {
        mx[0] = fmaxf(mx[0], fmaxf(s[4 * j], s[4 * j + 1]));
        mx[1] = fmaxf(mx[1], fmaxf(s[4 * j + 2], s[4 * j + 3]));
      }
      float corr[2], base[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
        const float m_new = fmaxf(m_run[h], mx[h] * p.scale_log2);
        base[h] = m_new == -INFINITY ? 0.f : m_new;  // a row with nothing visible yet stays at zero weight
        corr[h] = exp2f(m_run[h] - base[h]);
        m_run[h] = m_new;
        l_run[h] *= corr[h];
      }
#pragma unroll
      for (int j = 0; j < HD / 8; ++j) {
        o[4 * j] *= corr[0];
        o[4 * j + 1] *= corr[0];
        o[4 * j + 2] *= corr[1];
        o[4 * j + 3] *= corr[1];
      }
      uint32_t pa[KT / 16][4];
#pragma unroll
      for (int j = 0; j < KT / 8; ++j) {
        const float e0 = exp2f(fmaf(s[4 * j], p.scale_log2, -base[0]));
        const float e1 = exp2f(fmaf(s[4 * j + 1], p.scale_log2, -base[0]));
        const float e2 = exp2f(fmaf(s[4 * j + 2], p.scale_log2, -base[1]));
        const float e3 = exp2f(fmaf(s[4 * j + 3], p.scale_log2, -base[1]));
        l_run[0] += e0 + e1;
        l_run[1] += e2 + e3;
        // A fragment of k16 step j / 2: {row r keys 2q.., row r + 8 keys 2q.., row r keys 8 + 2q.., row r + 8 ...}.
        pa[j / 2][(j % 2) * 2] = pack_bf16x2(e0, e1);
        pa[j / 2][(j % 2) * 2 + 1] = pack_bf16x2(e2, e3);
      }
      wgmma_fence_regs(o);
      pin_fragments(pa);
      wgmma_fence();
#pragma unroll
      for (int kc = 0; kc < KT / 16; ++kc)
        wgmma_bf16_rs_mn64(o, pa[kc], wgmma_desc_mn128(v_addr + kc * 16 * 128, KT * 128));
      wgmma_commit();
      wgmma_wait<0>();
      wgmma_fence_regs(o);
    }
    cp_async_wait<0>();
    __syncthreads();  // the ring and the row bounds are rewritten by the next pass
    start = end;
  }

  // Finalize: the sink (if any) joins the denominator once.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = h == 0 ? r0 : r1;
    float l = l_run[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if (!row_valid(row)) continue;
    const int head = row_head(row);
    const float factor = attention_final_factor(m_run[h], l, attention_sink_log2(p.sinks, head));
    uint16_t* out = p.out + ((t0 + row / group) * p.n_q + head) * HD;
#pragma unroll
    for (int j = 0; j < HD / 8; ++j)
      *reinterpret_cast<uint32_t*>(out + j * 8 + 2 * q4) = pack_bf16x2(o[4 * j + 2 * h] * factor, o[4 * j + 2 * h + 1] * factor);
  }
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
