// The pieces of the Hopper prefill attention kernels (attention_wgmma_ws.cu, attention_wgmma_window.cu) that
// do not depend on who loads the tiles: the swizzled tile layout, the two wgmma GEMMs of a 64-row warpgroup
// (waited for, Q in registers, for the ws kernel's in-turn loop; issued only, Q in shared memory, for the
// overlapped one and the window kernel's in-turn loop), one tile's online softmax (whole, or split around the
// previous tile's P V), the overlapped loop's steps (the ws kernel's 64-key shape), and the final
// normalisation and store.
//
// Layouts (per warpgroup of 64 rows): a lane holds rows r0 = 16 w + lane / 4 and r1 = r0 + 8 of its warp w;
// s[4j + e]: key k0 + 8j + 2q + (e & 1) of r0 (e < 2) or r1 (q = lane % 4); o[4j + e]: head dims
// 8j + 2q + (e & 1) likewise. Shared-memory tiles: panels of 64 head dims, rows of 128 bytes with the
// 128-byte swizzle (16-byte chunk c of row n at c ^ (n % 8)) that wgmma's descriptors expect, each tile
// 1024-byte aligned.
#pragma once

#include <cstdint>

#include "backend/cuda/kernels/attention_common.cuh"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/kernels.h"
#include "backend/cuda/kernels/wgmma.cuh"

namespace mx::cuda {

#if MX_SM90A

// D(64 x 8, fp32) += A(64 x 16, bf16, registers) * B(16 x 8) with B MN-major: with B all ones, every column
// of D is the running sum of A's rows (the softmax denominator of the bf16 weights P V multiplies).
__device__ __forceinline__ void wgmma_bf16_rs_n8(float (&d)[4], const uint32_t (&a)[4], uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0,%1,%2,%3}, {%4,%5,%6,%7}, %8, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}

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
// of S past the fence in a 64-key kernel (PTX showed the movs after the fence).
template <int R>
__device__ __forceinline__ void pin_fragments(uint32_t (&a)[R][4]) {
#pragma unroll
  for (int i = 0; i < R; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(a[i][j])::"memory");
}

// Byte offset of 16-byte chunk c (8 head dims) of row `row` in a [panels][rows][64] swizzled tile.
template <int ROWS>
__device__ __forceinline__ int attn_tile_offset(int row, int c) {
  return (c / 8) * ROWS * 128 + row * 128 + (((c % 8) ^ (row & 7)) << 4);
}

// `desc` moved on by `bytes` (a multiple of 16) within its tile. The start-address field (bits 0-13, in
// 16-byte units) of a shared-memory address stays below 2^14 (228 KB), so the add never carries into the
// fields above it and only the low word changes: one add per wgmma instead of rebuilding the descriptor.
__device__ __forceinline__ uint64_t attn_desc_advance(uint64_t desc, uint32_t bytes) {
  const uint32_t lo = static_cast<uint32_t>(desc) + (bytes >> 4);
  return (desc & 0xffffffff00000000ull) | lo;
}

// Which sides of a tile a row's visible range [first, last] may cut (uniform per tile): keys below some
// row's first (kMaskLeft), keys past some row's last (kMaskRight). A tile inside every row's range needs
// no mask; the window's edge tiles need one side each, so each score takes one compare, not two.
enum AttnMaskSides : int { kMaskNone = 0, kMaskLeft = 1, kMaskRight = 2, kMaskBoth = 3 };
__device__ __forceinline__ int attn_mask_sides(int k0, int kt, int fmax, int lmin) {
  return (k0 < fmax ? kMaskLeft : kMaskNone) | (k0 + kt - 1 > lmin ? kMaskRight : kMaskNone);
}

// Q's A fragments of this warp's 16 rows (rows 16 * `warp_row0` / 16 ... of a [rows][64] swizzled tile).
template <int ROWS, int HD>
__device__ __forceinline__ void attn_load_q(uint32_t (&qf)[HD / 16][4], const uint8_t* sq, int warp_row0, int lane) {
  const int m = lane / 8, row = warp_row0 + (m % 2) * 8 + lane % 8;
#pragma unroll
  for (int kc = 0; kc < HD / 16; ++kc) ldmatrix_x4(qf[kc], sq + attn_tile_offset<ROWS>(row, kc * 2 + m / 2));
}

// S = Q K^T of the warpgroup's 64 rows and the KT keys of the K tile at `k_addr` (K-major), waited for.
template <int KT, int HD>
__device__ __forceinline__ void attn_qk(float (&s)[KT / 2], const uint32_t (&qf)[HD / 16][4], uint32_t k_addr) {
#pragma unroll
  for (int e = 0; e < KT / 2; ++e) s[e] = 0.f;
  wgmma_fence_regs(s);
  wgmma_fence();
  const uint64_t dk = wgmma_desc_k128(k_addr);
#pragma unroll
  for (int kc = 0; kc < HD / 16; ++kc) wgmma_bf16_rs<KT>(s, qf[kc], attn_desc_advance(dk, (kc / 4) * KT * 128 + (kc % 4) * 32));
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_fence_regs(s);
}

// 2^x on the SFU alone: exp2f adds a range check and rescale for denormal results (3 more instructions per
// weight, on the issue slots the softmax is short of); here results below 2^-126 flush to 0, a weight that
// small vanishes next to the row's largest, 1. 2^-inf = +0.
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// The start of a tile's online softmax, shared by both consumer loops: scores of keys a row does not see
// (outside [f0, l0] for r0, [f1, l1] for r1) become -inf on the sides `sides` names (attn_mask_sides:
// none when the whole tile is visible to every row); each row's running max moves to its largest score
// (raw scores, scaled inside exp2), the running sums take the rescale `corr` (what O must be multiplied by
// too), and `base` is what the tile's scaled scores are taken relative to.
template <int KT, int SIDES>
__device__ __forceinline__ void attn_mask_cols(float (&s)[KT / 2], int lo0, int hi0, int lo1, int hi1) {
#pragma unroll
  for (int j = 0; j < KT / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = 8 * j + (e & 1), lo = e < 2 ? lo0 : lo1, hi = e < 2 ? hi0 : hi1;
      const bool ok = ((SIDES & kMaskLeft) == 0 || col >= lo) && ((SIDES & kMaskRight) == 0 || col <= hi);
      if (!ok) s[4 * j + e] = -INFINITY;
    }
}
// LAZY (FA4's conditional rescale): the running max moves only when a tile's max passes it by more than
// kAttnLazyRescaleLog2 (2^8); below that the tile's weights are taken relative to the old max (at most 2^8,
// well within fp32 and bf16's range; the sums and O use the same reference, so the result is unchanged),
// corr stays exactly 1 and the warp skips rescaling O when no row of it moved (attn_softmax_tile). Once a
// row's max has settled, which in a long row is after its first tiles, no tile rescales.
inline constexpr float kAttnLazyRescaleLog2 = 8.f;
template <int KT, bool LAZY = false>
__device__ __forceinline__ void attn_mask_move_max(float (&s)[KT / 2], float (&m_run)[2], float (&l_run)[2],
                                                   float (&corr)[2], float (&base)[2], int sides, int k0, int q4,
                                                   int f0, int l0, int f1, int l1, float scale_log2) {
  if (sides != kMaskNone) {
    // Bounds relative to the lane's first column (key k0 + 2 q4): each test compares against a constant.
    const int c0 = k0 + 2 * q4, lo0 = f0 - c0, hi0 = l0 - c0, lo1 = f1 - c0, hi1 = l1 - c0;
    if (sides == kMaskLeft)
      attn_mask_cols<KT, kMaskLeft>(s, lo0, hi0, lo1, hi1);
    else if (sides == kMaskRight)
      attn_mask_cols<KT, kMaskRight>(s, lo0, hi0, lo1, hi1);
    else
      attn_mask_cols<KT, kMaskBoth>(s, lo0, hi0, lo1, hi1);
  }
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int j = 0; j < KT / 8; ++j) {
    mx[0] = fmaxf(mx[0], fmaxf(s[4 * j], s[4 * j + 1]));
    mx[1] = fmaxf(mx[1], fmaxf(s[4 * j + 2], s[4 * j + 3]));
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
    if constexpr (LAZY) {
      const float m_tile = mx[h] * scale_log2;
      const bool grow = m_tile > m_run[h] + kAttnLazyRescaleLog2;  // -inf + 8 = -inf: a first visible key grows
      const float m_new = grow ? m_tile : m_run[h];
      base[h] = m_new == -INFINITY ? 0.f : m_new;  // a row with nothing visible yet stays at zero weight
      corr[h] = grow ? exp2_ftz(m_run[h] - base[h]) : 1.f;
      m_run[h] = m_new;
    } else {
      const float m_new = fmaxf(m_run[h], mx[h] * scale_log2);
      base[h] = m_new == -INFINITY ? 0.f : m_new;  // a row with nothing visible yet stays at zero weight
      corr[h] = exp2_ftz(m_run[h] - base[h]);
      m_run[h] = m_new;
    }
    l_run[h] *= corr[h];
  }
}

// One tile's online softmax of rows r0 (keys [f0, l0] visible) and r1 ([f1, l1]), whole (the in-turn loop):
// attn_mask_move_max with the lazy rescale, then O and the row sums `lsum` (which attn_pv_sum adds, not this)
// rescaled unless no row of the warp moved its max (the common case once the rows' maxima settle: 36
// multiplies a tile saved), and the weights packed as the A fragments of P V.
template <int KT, int HD>
__device__ __forceinline__ void attn_softmax_tile(float (&s)[KT / 2], float (&o)[HD / 2], float (&lsum)[4],
                                                  float (&m_run)[2], float (&l_run)[2], uint32_t (&pa)[KT / 16][4],
                                                  int sides, int k0, int q4, int f0, int l0, int f1, int l1,
                                                  float scale_log2) {
  float corr[2], base[2];
  attn_mask_move_max<KT, /*LAZY=*/true>(s, m_run, l_run, corr, base, sides, k0, q4, f0, l0, f1, l1, scale_log2);
  if (__any_sync(0xffffffffu, corr[0] != 1.f || corr[1] != 1.f)) {
#pragma unroll
    for (int j = 0; j < HD / 8; ++j) {
      o[4 * j] *= corr[0];
      o[4 * j + 1] *= corr[0];
      o[4 * j + 2] *= corr[1];
      o[4 * j + 3] *= corr[1];
    }
    lsum[0] *= corr[0];
    lsum[1] *= corr[0];
    lsum[2] *= corr[1];
    lsum[3] *= corr[1];
  }
#pragma unroll
  for (int j = 0; j < KT / 8; ++j) {
    const float e0 = exp2_ftz(fmaf(s[4 * j], scale_log2, -base[0]));
    const float e1 = exp2_ftz(fmaf(s[4 * j + 1], scale_log2, -base[0]));
    const float e2 = exp2_ftz(fmaf(s[4 * j + 2], scale_log2, -base[1]));
    const float e3 = exp2_ftz(fmaf(s[4 * j + 3], scale_log2, -base[1]));
    // A fragment of k16 step j / 2: {row r keys 2q.., row r + 8 keys 2q.., row r keys 8 + 2q.., row r + 8 ...}.
    pa[j / 2][(j % 2) * 2] = pack_bf16x2(e0, e1);
    pa[j / 2][(j % 2) * 2 + 1] = pack_bf16x2(e2, e3);
  }
}

// Issues (commits, does not wait for) S = Q K^T of the warpgroup's 64 rows, Q at `q_addr` ([64][64] swizzled,
// 1024-byte aligned) and the KT keys at `k_addr`, both from shared memory.
template <int KT, int HD>
__device__ __forceinline__ void attn_qk_issue(float (&s)[KT / 2], uint32_t q_addr, uint32_t k_addr) {
  static_assert(HD == 64, "one 64-dim panel: the k steps walk one 128-byte row");
  const uint64_t dq = wgmma_desc_k128(q_addr), dk = wgmma_desc_k128(k_addr);
  wgmma_bf16_ss<KT, false>(s, dq, dk);
#pragma unroll
  for (int kc = 1; kc < HD / 16; ++kc)
    wgmma_bf16_ss<KT, true>(s, attn_desc_advance(dq, kc * 32), attn_desc_advance(dk, kc * 32));
  wgmma_commit();
}

// The first half of a tile's online softmax, the part that needs no O (so it can run while the previous
// tile's P V is in flight): attn_mask_move_max, then s turned into the unnormalised weights in place and
// added to the running sums. `corr` is what O must be multiplied by before this tile's P V joins it
// (attn_rescale_pack).
template <int KT>
__device__ __forceinline__ void attn_softmax_weights(float (&s)[KT / 2], float (&m_run)[2], float (&l_run)[2],
                                                     float (&corr)[2], int sides, int k0, int q4, int f0, int l0,
                                                     int f1, int l1, float scale_log2) {
  float base[2];
  attn_mask_move_max<KT>(s, m_run, l_run, corr, base, sides, k0, q4, f0, l0, f1, l1, scale_log2);
#pragma unroll
  for (int j = 0; j < KT / 8; ++j) {
    s[4 * j] = exp2_ftz(fmaf(s[4 * j], scale_log2, -base[0]));
    s[4 * j + 1] = exp2_ftz(fmaf(s[4 * j + 1], scale_log2, -base[0]));
    s[4 * j + 2] = exp2_ftz(fmaf(s[4 * j + 2], scale_log2, -base[1]));
    s[4 * j + 3] = exp2_ftz(fmaf(s[4 * j + 3], scale_log2, -base[1]));
    l_run[0] += s[4 * j] + s[4 * j + 1];
    l_run[1] += s[4 * j + 2] + s[4 * j + 3];
  }
}

// The second half, once O is free (no P V in flight): O *= corr (attn_rescale_o), and the weights packed as
// P V's A fragments (attn_pack_p; k16 step j / 2: {row r keys 2q.., row r + 8 keys 2q.., row r keys
// 8 + 2q.., row r + 8 ...}).
template <int HD>
__device__ __forceinline__ void attn_rescale_o(float (&o)[HD / 2], const float (&corr)[2]) {
#pragma unroll
  for (int j = 0; j < HD / 8; ++j) {
    o[4 * j] *= corr[0];
    o[4 * j + 1] *= corr[0];
    o[4 * j + 2] *= corr[1];
    o[4 * j + 3] *= corr[1];
  }
}
template <int KT>
__device__ __forceinline__ void attn_pack_p(const float (&w)[KT / 2], uint32_t (&pa)[KT / 16][4]) {
#pragma unroll
  for (int j = 0; j < KT / 8; ++j) {
    pa[j / 2][(j % 2) * 2] = pack_bf16x2(w[4 * j], w[4 * j + 1]);
    pa[j / 2][(j % 2) * 2 + 1] = pack_bf16x2(w[4 * j + 2], w[4 * j + 3]);
  }
}
template <int KT, int HD>
__device__ __forceinline__ void attn_rescale_pack(float (&o)[HD / 2], const float (&corr)[2], const float (&w)[KT / 2],
                                                  uint32_t (&pa)[KT / 16][4]) {
  attn_rescale_o<HD>(o, corr);
  attn_pack_p<KT>(w, pa);
}

// Issues (commits, does not wait for) O += P V with the V tile at `v_addr` (as attn_pv).
template <int KT, int HD>
__device__ __forceinline__ void attn_pv_issue(float (&o)[HD / 2], uint32_t (&pa)[KT / 16][4], uint32_t v_addr) {
  static_assert(HD == 64, "the P.V wgmma wrapper is written for n = 64; wider heads need n = HD");
  const uint64_t dv = wgmma_desc_mn128(v_addr, KT * 128);
#pragma unroll
  for (int kc = 0; kc < KT / 16; ++kc) wgmma_bf16_rs_mn64(o, pa[kc], attn_desc_advance(dv, kc * 16 * 128));
  wgmma_commit();
}

// O += P V with the V tile at `v_addr` as an MN-major operand (rows of 128 bytes: no transpose), waited for.
template <int KT, int HD>
__device__ __forceinline__ void attn_pv(float (&o)[HD / 2], uint32_t (&pa)[KT / 16][4], uint32_t v_addr) {
  static_assert(HD == 64, "the P.V wgmma wrapper is written for n = 64; wider heads need n = HD");
  wgmma_fence_regs(o);
  pin_fragments(pa);
  wgmma_fence();
  const uint64_t dv = wgmma_desc_mn128(v_addr, KT * 128);
#pragma unroll
  for (int kc = 0; kc < KT / 16; ++kc) wgmma_bf16_rs_mn64(o, pa[kc], attn_desc_advance(dv, kc * 16 * 128));
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_fence_regs(o);
}

// attn_pv plus each row's sum of P into `lsum` (every column of the m64n8 result: the ones block at
// `ones_desc`, 16 x 64 bf16 ones, is the B of every k step).
template <int KT, int HD>
__device__ __forceinline__ void attn_pv_sum(float (&o)[HD / 2], float (&lsum)[4], uint32_t (&pa)[KT / 16][4],
                                            uint32_t v_addr, uint64_t ones_desc) {
  static_assert(HD == 64, "the P.V wgmma wrapper is written for n = 64; wider heads need n = HD");
  wgmma_fence_regs(o);
  wgmma_fence_regs(lsum);
  pin_fragments(pa);
  wgmma_fence();
  const uint64_t dv = wgmma_desc_mn128(v_addr, KT * 128);
#pragma unroll
  for (int kc = 0; kc < KT / 16; ++kc) {
    wgmma_bf16_rs_mn64(o, pa[kc], attn_desc_advance(dv, kc * 16 * 128));
    wgmma_bf16_rs_n8(lsum, pa[kc], ones_desc);
  }
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_fence_regs(o);
  wgmma_fence_regs(lsum);
}

// One K/V tile of KT key rows from the paged cache into a ring stage (K at `stage`, V `tile_bytes` after it,
// both [KT][64] swizzled) by WARPS producer warps, one page lookup per key row: warp w owns rows
// w R .. w R + R - 1 (R = KT / WARPS); lane L < R looks up row w R + L's pool row (page * page_size + offset;
// -1 outside [klo, khi] or where the page is not mapped: those rows are zero-filled); lane L then copies
// 16-byte chunk L % 8 of rows w R + L / 8 + 4 i, taking the pool row from lane L / 8 + 4 i by a shuffle. Per
// copied row: a shuffle, two address computations (32-bit row times stride into a 64-bit pointer) and two
// cp.async; a row's lookup and 64-bit offset arithmetic are no longer repeated by its 8 chunk threads. Rows
// 4 apart alternate between two swizzle phases (R is a multiple of 8).
template <int KT, int HD, int WARPS>
__device__ __forceinline__ void attn_copy_kv_tile(uint8_t* stage, int tile_bytes, const PagedKv& kv,
                                                  const int32_t* table, int k0, int klo, int khi, int g, int64_t n_kv,
                                                  bool pow2, int page_shift, int tid) {
  constexpr int R = KT / WARPS;
  static_assert(HD == 64 && R % 8 == 0 && R <= 32, "rows of 128 bytes; a warp's rows fit its lanes");
  const int w = tid / 32, lane = tid % 32, ch = lane % 8, rsub = lane / 8;
  const int page_size = static_cast<int>(kv.page_size);
  int pool_row = -1;
  if (lane < R) {
    const int key = k0 + w * R + lane;
    const int logical = pow2 ? key >> page_shift : key / page_size;
    const int page = key >= klo && key <= khi && logical < kv.max_pages ? table[logical] : -1;
    if (page >= 0 && page < kv.num_pages) pool_row = page * page_size + (key - logical * page_size);
  }
  const int row_stride = static_cast<int>(n_kv) * HD;
  const uint16_t* k_chunk = kv.k + g * HD + ch * 8;
  const uint16_t* v_chunk = kv.v + g * HD + ch * 8;
  const int row_base = (w * R + rsub) * 128;
  const int dst_even = row_base + ((ch ^ rsub) << 4), dst_odd = row_base + ((ch ^ (rsub + 4)) << 4) + 512;
#pragma unroll
  for (int i = 0; i < R / 4; ++i) {
    const int row = __shfl_sync(0xffffffffu, pool_row, rsub + 4 * i);
    const bool ok = row >= 0;
    const int64_t off = static_cast<int64_t>(ok ? row : 0) * row_stride;
    const int dst = ((i & 1) ? dst_odd : dst_even) + (i / 2) * 1024;
    cp_async_16(stage + dst, k_chunk + off, ok);
    cp_async_16(stage + tile_bytes + dst, v_chunk + off, ok);
  }
}

// The overlapped consumer loop over a pass's tiles (FA3's intra-warpgroup overlap) of the ws kernel's 64-key
// shape: attn_overlap_first runs tile 0 alone; each attn_overlap_step issues S(i) = Q K(i)^T and O += P(i-1) V(i-1)
// together, runs softmax(i) under the P V and, once the P V is done, rescales O and packs P(i) into `pa`;
// attn_overlap_last_pv issues the last P V and waits for it. Q is read from shared memory at `q_addr`
// (attn_qk_issue), V of the previous tile at `v_prev`.
template <int KT, int HD>
__device__ __forceinline__ void attn_overlap_first(float (&o)[HD / 2], uint32_t (&pa)[KT / 16][4], float (&m_run)[2],
                                                   float (&l_run)[2], uint32_t q_addr, uint32_t k_addr,
                                                   int sides, int k0, int q4, int f0, int l0, int f1, int l1,
                                                   float scale_log2) {
  float s[KT / 2], corr[2];
  wgmma_fence();
  attn_qk_issue<KT, HD>(s, q_addr, k_addr);
  wgmma_wait<0>();
  wgmma_fence_regs(s);
  attn_softmax_weights<KT>(s, m_run, l_run, corr, sides, k0, q4, f0, l0, f1, l1, scale_log2);
  attn_rescale_pack<KT, HD>(o, corr, s, pa);
}

// `release_prev()` runs once the previous tile's P V is done (the ws kernel frees its ring slot there).
template <int KT, int HD, typename ReleasePrev>
__device__ __forceinline__ void attn_overlap_step(float (&o)[HD / 2], uint32_t (&pa)[KT / 16][4], float (&m_run)[2],
                                                  float (&l_run)[2], uint32_t q_addr, uint32_t k_addr,
                                                  uint32_t v_prev, int sides, int k0, int q4, int f0, int l0,
                                                  int f1, int l1, float scale_log2, ReleasePrev release_prev) {
  float s[KT / 2], corr[2];
  wgmma_fence_regs(o);
  pin_fragments(pa);
  wgmma_fence();
  attn_qk_issue<KT, HD>(s, q_addr, k_addr);
  attn_pv_issue<KT, HD>(o, pa, v_prev);
  wgmma_wait<1>();  // S(i) is in; P(i-1) V(i-1) may still run
  wgmma_fence_regs(s);
  attn_softmax_weights<KT>(s, m_run, l_run, corr, sides, k0, q4, f0, l0, f1, l1, scale_log2);
  wgmma_wait<0>();
  wgmma_fence_regs(o);
  pin_fragments(pa);
  release_prev();
  attn_rescale_pack<KT, HD>(o, corr, s, pa);
}

template <int KT, int HD>
__device__ __forceinline__ void attn_overlap_last_pv(float (&o)[HD / 2], uint32_t (&pa)[KT / 16][4], uint32_t v_prev) {
  wgmma_fence_regs(o);
  pin_fragments(pa);
  wgmma_fence();
  attn_pv_issue<KT, HD>(o, pa, v_prev);
  wgmma_wait<0>();
  wgmma_fence_regs(o);
}

// The end of the lane's two rows: running sums summed over the quad, the sink (if any) joins the
// denominator once, bf16 out. `token[h]` < 0: row h holds no (token, head) pair and is not stored.
// SUMS_WHOLE: l_run already holds each row's whole sum (attn_pv_sum), not the lane's quarter.
template <int HD, bool SUMS_WHOLE = false>
__device__ __forceinline__ void attn_store_rows(const AttentionKernelParams& p, const float (&o)[HD / 2],
                                                const float (&m_run)[2], const float (&l_run)[2],
                                                const int64_t (&token)[2], const int (&head)[2], int q4) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = l_run[h];
    if constexpr (!SUMS_WHOLE) {
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
    }
    if (token[h] < 0) continue;
    const float factor = attention_final_factor(m_run[h], l, attention_sink_log2(p.sinks, head[h]));
    uint16_t* out = p.out + (token[h] * p.n_q + head[h]) * HD;
#pragma unroll
    for (int j = 0; j < HD / 8; ++j)
      *reinterpret_cast<uint32_t*>(out + j * 8 + 2 * q4) =
          pack_bf16x2(o[4 * j + 2 * h] * factor, o[4 * j + 2 * h + 1] * factor);
  }
}

#endif  // MX_SM90A

}  // namespace mx::cuda
