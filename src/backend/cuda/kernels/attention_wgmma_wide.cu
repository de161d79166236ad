// Prefill attention for Hopper (sm_90a) at the wide head dims: Gemma-4's sliding layers (256) and full layers
// (512), where attention.cu's mma.sync kernel ran at ~60 TFLOP/s (session 15: 105 of a 292 ms 8K step).
//
// Two warpgroups, no producer: every thread issues its share of each K/V tile's cp.async copies into a
// 2-stage ring (tile i + 1's under tile i's math). Shape per head dim
// (kernel_configs.h, attention_wide_wgmma_shape):
// - 256: each warpgroup owns 64 of the CTA's 128 rows ((token, q head) pairs of one kv head, as attention.cu
//   packs them) and all 256 output columns (64 x 256 fp32: 128 registers a thread); 64-key tiles.
// - 512: the two warpgroups share 64 rows, each Q K^T over its half of the head dims; the partial scores
//   are summed through shared memory in a fixed order (both hold the same floats and run the same softmax),
//   each then P V for its 256 output columns; 32-key tiles.
// S = Q K^T from shared memory (Q stays there: it does not fit the registers beside O), online softmax in
// fp32 in the exp2 domain (attention_wgmma_parts.cuh), O += P V with P in registers and V as the MN-major
// operand, one m64n256 wgmma a 16-key step. A tile inside every row's visible range is not masked.
// Where K and V share storage (Gemma-4's full layers) only K is loaded and read as V too.
// A CTA whose tokens span sequences runs one pass per sequence, the rows of the others masked (as attention.cu).
#include <climits>

#include "backend/cuda/kernels/attention_wgmma_wide.h"

#include "backend/cuda/attention_wide_config.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels/attention_wgmma_parts.cuh"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/kernels.h"
#include "backend/cuda/kernels/wgmma.cuh"

namespace mx::cuda {
namespace {

template <int HD, bool KV_SHARED>
struct Wide {
  static constexpr AttnWideShape kShape = attention_wide_wgmma_shape(HD, KV_SHARED);
  static constexpr int kKt = kShape.keys_per_tile, kSlices = kShape.slices, kRows = 64 * kShape.row_blocks;
  static constexpr int kThreads = 128 * kShape.row_blocks * kSlices;
  static constexpr int kDs = HD / kSlices;  // output columns of a warpgroup
  static constexpr int kTileBytes = kKt * HD * 2, kStageBytes = (kShape.k_only ? 1 : 2) * kTileBytes;
  static constexpr int kQBytes = kRows * HD * 2;
  static constexpr int kXFloats = kSlices > 1 ? kSlices * 64 * kKt : 0;  // partial scores: [slice][kKt / 2][128]
  static_assert(attention_wide_wgmma_smem_bytes(HD, KV_SHARED) ==
                    1024 + kQBytes + kAttnWideStages * kStageBytes + kXFloats * 4 + 2 * kRows * 4,
                "kernel_configs.h counts the shared memory this kernel lays out");
  static_assert(kDs == 256 && kKt % 16 == 0, "a warpgroup's O is 64 x 256; P V takes k steps of 16 keys");
};

// At 256 (one warpgroup a row block) the ring's stages hand over through full and empty mbarriers instead of a
// CTA barrier a tile, so one warpgroup's softmax can run under the other's GEMMs (they drift apart by up to a
// tile; 8K window 1024: 507 against 533 us in step, session 16 W1). At 512 the warpgroups meet every tile
// anyway (the partial scores): a CTA barrier a tile. KV_SHARED: the launch has p.kv.k == p.kv.v (the shape may
// then hold K alone).
template <int HD, bool KV_SHARED>
__global__ void __launch_bounds__(Wide<HD, KV_SHARED>::kThreads, 1)
    attention_prefill_wgmma_wide_kernel(AttentionKernelParams p) {
#if MX_SM90A
  using W = Wide<HD, KV_SHARED>;
  constexpr int kKt = W::kKt, kRows = W::kRows, kDs = W::kDs, kThreads = W::kThreads;
  constexpr bool kDecoupled = W::kSlices == 1;
  extern __shared__ __align__(128) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  uint8_t* sq = smem;                                                          // [HD / 64][kRows][64]
  uint8_t* skv = sq + W::kQBytes;                                              // stages x {K, V} [HD / 64][kKt][64]
  float* xbuf = reinterpret_cast<float*>(skv + kAttnWideStages * W::kStageBytes);  // partial scores
  int* row_first = reinterpret_cast<int*>(xbuf + W::kXFloats);                 // [kRows]: keys a row sees in the pass
  int* row_last = row_first + kRows;
  __shared__ int pass_seq, pass_end, pass_kmin, pass_kmax;
  __shared__ __align__(8) uint64_t ring_bars[2 * kAttnWideStages];  // at 256: full, then empty, a stage

  const int group = static_cast<int>(p.n_q / p.n_kv);
  const int tpc = max(1, kRows / group);  // tokens per CTA
  const int g = blockIdx.y;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * tpc;
  const int n_tok = static_cast<int>(p.tokens - t0 < tpc ? p.tokens - t0 : tpc);
  const int tid = threadIdx.x, wg = tid / 128, warp = (tid / 32) % 4, lane = tid % 32, q4 = lane % 4;
  const int rb = wg / W::kSlices, slice = wg % W::kSlices, col0 = slice * kDs;
  const int r0 = rb * 64 + warp * 16 + lane / 4, r1 = r0 + 8;
  auto row_valid = [&](int row) { return row < tpc * group && row / group < n_tok; };
  const bool kv_same = KV_SHARED || p.kv.k == p.kv.v;

  // Q rows of (token, head) pairs -> the swizzled panels.
  for (int idx = tid; idx < kRows * (HD / 8); idx += kThreads) {
    const int row = idx / (HD / 8), c = idx % (HD / 8);
    const bool ok = row_valid(row);
    const uint16_t* src = ok ? p.q + ((t0 + row / group) * p.n_q + g * group + row % group) * HD + c * 8 : p.q;
    cp_async_16(sq + attn_tile_offset<kRows>(row, c), src, ok);
  }
  cp_async_commit();

  // Keys [k0, k0 + kKt) of sequence seq (zero rows past k_hi or unmapped) into ring stage `stage`: thread t
  // copies chunk t % (HD / 8) of rows t / (HD / 8) + i kRpp; lane i of a warp looks up its rows' i-th page.
  const PagedKv& kv = p.kv;
  auto load_tile = [&](int seq, int k0, int k_hi, int stage) {
    constexpr int kChunks = HD / 8, kRpp = kThreads / kChunks, kIters = kKt / kRpp;
    static_assert(kChunks >= 32 && kIters <= 32, "a warp's threads share their rows");
    const int c = tid % kChunks, rbase = tid / kChunks;
    int pool_row = -1;
    if (lane < kIters) {
      const int key = k0 + rbase + lane * kRpp;
      const int64_t logical = key / kv.page_size;
      if (key <= k_hi && logical < kv.max_pages) {
        const int64_t page = kv.page_table[static_cast<int64_t>(seq) * kv.max_pages + logical];
        if (page >= 0 && page < kv.num_pages) pool_row = static_cast<int>(page * kv.page_size + key - logical * kv.page_size);
      }
    }
    uint8_t* sk = skv + stage * W::kStageBytes;
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      const int pr = __shfl_sync(0xffffffffu, pool_row, i);
      const bool ok = pr >= 0;
      const int64_t off = (static_cast<int64_t>(ok ? pr : 0) * p.n_kv + g) * HD + c * 8;
      const int dst = attn_tile_offset<kKt>(rbase + i * kRpp, c);
      cp_async_16(sk + dst, kv.k + off, ok);
      if (!kv_same) cp_async_16(sk + W::kTileBytes + dst, kv.v + off, ok);
    }
  };

  const uint32_t full0 = smem_addr(ring_bars), empty0 = full0 + 8 * kAttnWideStages;
  if (kDecoupled && tid == 0) {
    for (int st = 0; st < kAttnWideStages; ++st) {
      mbarrier_init(full0 + 8 * st, kThreads);   // every thread's cp.async arrival
      mbarrier_init(empty0 + 8 * st, kThreads);  // every thread, once its warpgroup's P V has read the stage
    }
    mbarrier_init_fence();
  }
  cp_async_wait<0>();
  fence_proxy_async_smem();
  __syncthreads();

  const uint32_t sq_addr = smem_addr(sq), skv_addr = smem_addr(skv);
  const uint64_t dq = wgmma_desc_k128(sq_addr + rb * 64 * 128);
  float o[kDs / 2];
#pragma unroll
  for (int i = 0; i < kDs / 2; ++i) o[i] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  // At 256: tile j of the CTA (over all passes) sits in stage j % 2; its full barrier's phase j / 2 says it
  // landed, its empty barrier's that both warpgroups are done with it.
  int j0 = 0;  // the CTA's tiles before this pass
  auto issue = [&](int seq, int k0, int k_hi, int j) {
    const int st = j % kAttnWideStages;
    if (j >= kAttnWideStages) mbarrier_wait(empty0 + 8 * st, ((j / kAttnWideStages) - 1) & 1);
    load_tile(seq, k0, k_hi, st);
    cp_async_mbarrier_arrive(full0 + 8 * st);
  };

  for (int start = 0; start < n_tok;) {
    if (tid == 0) attention_pass_bounds(p, t0, start, n_tok, &pass_seq, &pass_end, &pass_kmin, &pass_kmax);
    __syncthreads();
    const int seq = pass_seq, end = pass_end, kmin = pass_kmin, kmax = pass_kmax;
    if (tid < kRows) {
      const int row = tid, tl = row / group;
      int f = 1, l = 0;  // empty range: the row is not in this pass
      if (row_valid(row) && tl >= start && tl < end) attn_key_range(p, t0 + tl, &f, &l);
      row_first[row] = f;
      row_last[row] = l;
    }
    __syncthreads();
    // Keys every valid row of this warpgroup sees, [fmax, lmin]: tiles inside them go unmasked.
    int fmax = INT_MIN, lmin = INT_MAX;
    for (int row = rb * 64; row < rb * 64 + 64; ++row)
      if (row_valid(row)) {
        fmax = max(fmax, row_first[row]);
        lmin = min(lmin, row_last[row]);
      }
    const int f0 = row_first[r0], l0 = row_last[r0], f1 = row_first[r1], l1 = row_last[r1];
    const int n_tiles = kmax >= kmin ? (kmax - kmin + kKt) / kKt : 0;
    if (n_tiles > 0) {
      if constexpr (kDecoupled) {
        issue(seq, kmin, kmax, j0);
      } else {
        load_tile(seq, kmin, kmax, 0);
        cp_async_commit();
      }
    }
    for (int i = 0; i < n_tiles; ++i) {
      const int stage = kDecoupled ? (j0 + i) % kAttnWideStages : i & 1;
      if constexpr (kDecoupled) {
        if (i + 1 < n_tiles) issue(seq, kmin + (i + 1) * kKt, kmax, j0 + i + 1);
        mbarrier_wait(full0 + 8 * stage, ((j0 + i) / kAttnWideStages) & 1);
        fence_proxy_async_smem();  // the landed copies, seen through the barrier, made visible to wgmma's reads
      } else {
        if (i + 1 < n_tiles) {
          load_tile(seq, kmin + (i + 1) * kKt, kmax, (i + 1) & 1);
          cp_async_commit();
          cp_async_wait<1>();
        } else {
          cp_async_wait<0>();
        }
        fence_proxy_async_smem();  // this thread's landed copies, made visible to wgmma's reads
        __syncthreads();
      }
      const uint32_t k_addr = skv_addr + stage * W::kStageBytes;
      const uint32_t v_addr = kv_same ? k_addr : k_addr + W::kTileBytes;
      const int k0 = kmin + i * kKt;

      // S = Q K^T over this warpgroup's head dims (k16 steps slice * kDs / 16 ...).
      float s[kKt / 2];
      const uint64_t dk = wgmma_desc_k128(k_addr);
      wgmma_fence();
#pragma unroll
      for (int kc = 0; kc < kDs / 16; ++kc) {
        const int kg = slice * (kDs / 16) + kc;
        const uint64_t a = attn_desc_advance(dq, (kg / 4) * kRows * 128 + (kg % 4) * 32);
        const uint64_t b = attn_desc_advance(dk, (kg / 4) * kKt * 128 + (kg % 4) * 32);
        if (kc == 0)
          wgmma_bf16_ss<kKt, false>(s, a, b);
        else
          wgmma_bf16_ss<kKt, true>(s, a, b);
      }
      wgmma_commit();
      wgmma_wait<0>();
      wgmma_fence_regs(s);
      if constexpr (W::kSlices > 1) {
        float* mine = xbuf + slice * 64 * kKt + tid % 128;
#pragma unroll
        for (int e = 0; e < kKt / 2; ++e) mine[e * 128] = s[e];
        __syncthreads();
        const float* x = xbuf + tid % 128;
#pragma unroll
        for (int e = 0; e < kKt / 2; ++e) {
          float sum = x[e * 128];
#pragma unroll
          for (int j = 1; j < W::kSlices; ++j) sum += x[(j * kKt / 2 + e) * 128];
          s[e] = sum;
        }
      }

      // Online softmax with the lazy rescale (attn_mask_move_max): O is rescaled only when a row of the warp
      // moved its max, which after a row's first tiles is rare.
      float corr[2], base[2];
      attn_mask_move_max<kKt, /*LAZY=*/true>(s, m_run, l_run, corr, base, attn_mask_sides(k0, kKt, fmax, lmin), k0,
                                             q4, f0, l0, f1, l1, p.scale_log2);
      uint32_t pa[kKt / 16][4];
#pragma unroll
      for (int j = 0; j < kKt / 8; ++j) {
        const float e0 = exp2_ftz(fmaf(s[4 * j], p.scale_log2, -base[0]));
        const float e1 = exp2_ftz(fmaf(s[4 * j + 1], p.scale_log2, -base[0]));
        const float e2 = exp2_ftz(fmaf(s[4 * j + 2], p.scale_log2, -base[1]));
        const float e3 = exp2_ftz(fmaf(s[4 * j + 3], p.scale_log2, -base[1]));
        l_run[0] += e0 + e1;
        l_run[1] += e2 + e3;
        pa[j / 2][(j % 2) * 2] = pack_bf16x2(e0, e1);
        pa[j / 2][(j % 2) * 2 + 1] = pack_bf16x2(e2, e3);
      }
      if (__any_sync(0xffffffffu, corr[0] != 1.f || corr[1] != 1.f)) attn_rescale_o<kDs>(o, corr);

      // O += P V: V as the MN-major operand, the warpgroup's 256 output columns (4 panels) in one m64n256k16 a
      // k step.
      wgmma_fence_regs(o);
      pin_fragments(pa);
      wgmma_fence();
      const uint64_t dv = wgmma_desc_mn128(v_addr + (col0 / 64) * kKt * 128, kKt * 128);
#pragma unroll
      for (int kk = 0; kk < kKt / 16; ++kk) wgmma_bf16_rs<kDs, 1>(o, pa[kk], attn_desc_advance(dv, kk * 16 * 128));
      wgmma_commit();
      wgmma_wait<0>();
      wgmma_fence_regs(o);
      if constexpr (kDecoupled)
        mbarrier_arrive(empty0 + 8 * stage);
      else
        __syncthreads();  // the stage (and the partial scores) are free for the next tile
    }
    j0 += n_tiles;
    start = end;
  }

  // Each warpgroup writes its output columns of its rows.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = h == 0 ? r0 : r1;
    float l = l_run[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if (!row_valid(row)) continue;
    const int head = g * group + row % group;
    const float factor = attention_final_factor(m_run[h], l, attention_sink_log2(p.sinks, head));
    uint16_t* out = p.out + ((t0 + row / group) * p.n_q + head) * HD + col0;
#pragma unroll
    for (int j = 0; j < kDs / 8; ++j)
      *reinterpret_cast<uint32_t*>(out + j * 8 + 2 * q4) = pack_bf16x2(o[4 * j + 2 * h] * factor, o[4 * j + 2 * h + 1] * factor);
  }
#endif  // MX_SM90A
}

template <int HD, bool KV_SHARED, typename Kernel>
Status launch_wide_kernel(Kernel kernel, const AttentionKernelParams& p, const AttentionWideWgmmaConfig& c,
                          cudaStream_t stream) {
  using W = Wide<HD, KV_SHARED>;
  if (c.threads != W::kThreads || c.rows_per_cta != W::kRows || c.keys_per_tile != W::kKt ||
      c.smem_bytes != attention_wide_wgmma_smem_bytes(HD, KV_SHARED))
    return internal_error("attention prefill wgmma (wide heads): config does not match the kernel");
  MX_RETURN_IF_ERROR(cuda_status(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(c.smem_bytes)),
      "cudaFuncSetAttribute(attention wgmma wide smem)"));
  const int64_t tpc = std::max<int64_t>(1, W::kRows / (p.n_q / p.n_kv));
  const dim3 grid(static_cast<unsigned>(ceil_div64(p.tokens, tpc)), static_cast<unsigned>(p.n_kv));
  kernel<<<grid, W::kThreads, c.smem_bytes, stream>>>(p);
  return launch_status("attention_prefill_wgmma_wide_kernel");
}

// Head dim 256: V's storage does not change the shape (the kernel checks it); 512: K alone in the stages where
// V is K's storage.
Status launch_wide(const AttentionKernelParams& p, const AttentionWideWgmmaConfig& c, cudaStream_t stream) {
  if (p.head_dim == 256) return launch_wide_kernel<256, false>(attention_prefill_wgmma_wide_kernel<256, false>, p, c, stream);
  if (c.kv_shared) return launch_wide_kernel<512, true>(attention_prefill_wgmma_wide_kernel<512, true>, p, c, stream);
  return launch_wide_kernel<512, false>(attention_prefill_wgmma_wide_kernel<512, false>, p, c, stream);
}

}  // namespace

Status launch_attention_prefill_wgmma_wide(const AttentionKernelParams& p, const AttentionWideWgmmaConfig& c,
                                           cudaStream_t stream) {
  if (!c.enabled) return unimplemented("attention prefill wgmma (wide heads): needs sm_90 and head_dim 256 or 512");
  if (p.head_dim != 256 && p.head_dim != 512)
    return unimplemented("attention prefill wgmma (wide heads): head_dim must be 256 or 512");
  if (p.n_kv <= 0 || p.n_q % p.n_kv != 0) return invalid_argument("attention: n_q must be a multiple of n_kv");
  if (p.n_q / p.n_kv > c.rows_per_cta)
    return unimplemented("attention prefill wgmma (wide heads): more q heads per kv head than rows per CTA");
  if (c.kv_shared && p.kv.k != p.kv.v)
    return internal_error("attention prefill wgmma (wide heads): the config is for V in K's storage");
  if (p.tokens == 0) return Status::ok();
  return launch_wide(p, c, stream);
}

}  // namespace mx::cuda
