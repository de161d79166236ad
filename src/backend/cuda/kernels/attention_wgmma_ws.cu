// Prefill attention for Hopper (sm_90a), warp-specialized in the FlashAttention-3 shape: FlashAttention with
// both GEMMs on wgmma (tile layout, GEMMs, softmax and store: attention_wgmma_parts.cuh), split by role
// instead of every warp doing everything in lockstep behind a CTA barrier per tile:
//
// - warpgroup 0, the producer (32 registers a thread after setmaxnreg): walks the CTA's K/V tiles, waits
//   for a ring slot to be empty, issues the tile's cp.async copies (attn_copy_kv_tile: 16-byte chunks, one
//   page-table lookup per key row shared with the row's copying lanes by a shuffle, so any page size works)
//   and arms the slot's full mbarrier with cp.async.mbarrier.arrive. It never waits for its own copies: it
//   runs as far ahead as the ring allows.
// - warpgroups 1..kConsumers (the rest of the register pool: 160 registers for the 128-key shape, 104 for
//   the 64-key one): 64 query rows each. Per tile: wait for the slot's full barrier, S = Q K^T, online
//   softmax, O += P V, then each warp releases the slot. No CTA-wide barrier in the loop, so one
//   warpgroup's softmax runs under another's GEMMs (the overlap FA3 gets for head dim 64 from three MMA
//   warpgroups; it uses no scheduling barrier there either).
//
// Two shapes (kernel_configs.h): 128-key tiles and three consumer warpgroups, one CTA per SM, for full
// layers, run as a persistent kernel (attention_prefill_wgmma_persist_kernel below: a CTA per SM walks the
// units of work, so a unit's prologue runs under the previous unit's last tiles); 64-key tiles and two
// consumer warpgroups, two CTAs per SM, for short windows, whose CTAs run only a few tiles (one CTA's
// prologue and first loads then run under the other's math).
//
// Rows pack (token, q head) pairs of one kv head, as in the other prefill kernels; a CTA's tokens split
// into passes, one per sequence, and the producer and consumers walk the same passes and tiles, the ring
// running on across passes.
#include <algorithm>
#include <climits>

#include "backend/cuda/attention_persist_config.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernel_configs.h"
#include "backend/cuda/kernels/attention_wgmma_parts.cuh"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/head_rows.cuh"
#include "backend/cuda/kernels/mbarrier.cuh"
#include "backend/cuda/kernels/tma.cuh"
#include "backend/cuda/kernels/kernels.h"
#include "backend/cuda/kernels/wgmma.cuh"

namespace mx::cuda {
namespace {

constexpr int kProducerThreads = 128;

// One shape of the kernel (kernel_configs.h: kAttnWsWide, kAttnWsNarrow) and what follows from it.
template <int KT, int CONSUMERS, int STAGES, int CTAS_PER_SM>
struct WsShape {
  static constexpr int kThreads = kProducerThreads + 128 * CONSUMERS;
  // Registers a thread after setmaxnreg: the producer gives back what the consumers take, within the pool
  // the CTA was launched with (the cap __launch_bounds__(kThreads, CTAS_PER_SM) sets, in units of 8).
  static constexpr int kLaunchRegisters = (65536 / (kThreads * CTAS_PER_SM)) / 8 * 8;
  static constexpr int kProducerRegisters = 32;
  static constexpr int kConsumerRegisters =
      (kLaunchRegisters * (1 + CONSUMERS) - kProducerRegisters) / CONSUMERS / 8 * 8;
  static_assert(kConsumerRegisters >= kLaunchRegisters && kConsumerRegisters <= 256, "setmaxnreg's range");
};

// Per-token facts the prologue gathers once (tokens are < ROWS) and per-pass bounds (a pass per sequence
// of the CTA's tokens, so at most one per token), in shared memory after the ring.
template <int ROWS>
struct WsTables {
  int tok_first[ROWS], tok_last[ROWS], tok_seq[ROWS];
  int pass_end[ROWS], pass_seq[ROWS], pass_kmin[ROWS], pass_kmax[ROWS];
  int n_passes, whole_fmax, whole_lmin;

  // The passes of the first n_tok tokens, from tok_*: runs of one sequence (a sequence's tokens are
  // contiguous), each loading keys [min first, max last] of its tokens. One thread.
  __device__ __forceinline__ void build_passes(int n_tok) {
    int n = 0, fmax = -1, lmin = INT_MAX;
    for (int start = 0; start < n_tok; ++n) {
      const int seq = tok_seq[start];
      int kmin = INT_MAX, kmax = -1, end = start;
      for (; end < n_tok && tok_seq[end] == seq; ++end) {
        kmin = min(kmin, tok_first[end]);
        kmax = max(kmax, tok_last[end]);
        fmax = max(fmax, tok_first[end]);
        lmin = min(lmin, tok_last[end]);
      }
      pass_end[n] = end;
      pass_seq[n] = seq;
      pass_kmin[n] = kmin;
      pass_kmax[n] = kmax;
      start = end;
    }
    n_passes = n;
    // Keys every row sees, [fmax, lmin]: only with one pass (else other passes' rows need their masks).
    whole_fmax = n == 1 ? fmax : INT_MAX;
    whole_lmin = n == 1 ? lmin : -1;
  }
};
template <const AttnWsShape& S>
constexpr bool smem_counted() {
  const int rows = 64 * S.consumers;
  return attention_prefill_wgmma_ws_smem_bytes(64, S) ==
         1024 + rows * 64 * 2 + S.stages * 2 * S.keys_per_tile * 64 * 2 + 2 * S.stages * 8 + sizeof(WsTables<64 * S.consumers>);
}
static_assert(smem_counted<kAttnWsNarrow>(), "kernel_configs.h counts the shared memory this kernel lays out");

// The overlapped shapes (the narrow one): the consumer loop issues S(i) = Q K(i)^T and O += P(i-1) V(i-1)
// together and runs tile i's softmax while the P V is in flight (FA3's intra-warpgroup overlap; Q read from
// shared memory, which also leaves the registers for a score tile next to P). In turn, with Q in registers and
// m64n64 score GEMMs under the narrow shape's 104-register budget, it gave wrong results on an H100, as session
// 7's 64-key kernel did; the in-turn (wide) shape runs as attention_prefill_wgmma_persist_kernel below.
template <int HD, int KT, int CONSUMERS, int STAGES, int CTAS_PER_SM, bool OVERLAP>
__global__ void __launch_bounds__(WsShape<KT, CONSUMERS, STAGES, CTAS_PER_SM>::kThreads, CTAS_PER_SM)
    attention_prefill_wgmma_ws_kernel(AttentionKernelParams p) {
  static_assert(OVERLAP, "the in-turn shape runs as attention_prefill_wgmma_persist_kernel");
#if MX_SM90A
  using Shape = WsShape<KT, CONSUMERS, STAGES, CTAS_PER_SM>;
  constexpr int kRows = 64 * CONSUMERS, kThreads = Shape::kThreads, kStages = STAGES, kConsumers = CONSUMERS;
  static_assert(HD == 64, "one 64-dim panel per row: the producer's chunk map and the P.V wgmma assume it");
  constexpr int kTileBytes = KT * HD * 2, kStageBytes = 2 * kTileBytes;
  extern __shared__ __align__(128) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  uint8_t* sq = smem;                                // [kRows][64], swizzled
  uint8_t* skv = sq + kRows * HD * 2;                // kStages x {K, V} [KT][64], swizzled
  uint64_t* bars = reinterpret_cast<uint64_t*>(skv + kStages * kStageBytes);  // full[kStages], empty[kStages]
  WsTables<kRows>& tab = *reinterpret_cast<WsTables<kRows>*>(bars + 2 * kStages);
  const uint32_t full0 = smem_addr(bars), empty0 = full0 + 8 * kStages;

  const int group = static_cast<int>(p.n_q / p.n_kv);
  const int tpc = max(1, kRows / group);  // tokens per CTA
  const int g = blockIdx.y;
  // Heaviest CTAs (latest tokens: most keys under the causal mask) start first.
  const int64_t t0 = static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * tpc;
  const int n_tok = static_cast<int>(p.tokens - t0 < tpc ? p.tokens - t0 : tpc);
  const int tid = threadIdx.x;
  auto row_valid = [&](int row) { return row / group < n_tok && row < tpc * group; };

  // Prologue, every thread: Q rows into shared memory, each token's key range and sequence.
  for (int idx = tid; idx < kRows * (HD / 8); idx += kThreads) {
    const int row = idx / (HD / 8), c = idx % (HD / 8);
    const bool ok = row_valid(row);
    const int64_t t = t0 + row / group;
    const uint16_t* src = ok ? p.q + (t * p.n_q + g * group + row % group) * HD + c * 8 : p.q;
    cp_async_16(sq + attn_tile_offset<kRows>(row, c), src, ok);
  }
  cp_async_commit();
  if (tid < n_tok) {
    int f, l;
    attn_key_range(p, t0 + tid, &f, &l);
    tab.tok_first[tid] = f;
    tab.tok_last[tid] = l;
    tab.tok_seq[tid] = p.kv.token_seq[t0 + tid];
  }
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(full0 + 8 * s, kProducerThreads);  // each producer thread's cp.async arrival
      mbarrier_init(empty0 + 8 * s, 4 * kConsumers);   // each consumer warp, once its GEMMs left the slot
    }
    mbarrier_init_fence();
  }
  __syncthreads();
  if (tid == 0) tab.build_passes(n_tok);
  cp_async_wait<0>();
  fence_proxy_async_smem();  // Q's copies, read by wgmma from shared memory
  __syncthreads();
  const int n_passes = tab.n_passes;
  const uint32_t skv_addr = smem_addr(skv);

  if (tid < kProducerThreads) {
    setmaxnreg_dec<Shape::kProducerRegisters>();
    const PagedKv& kv = p.kv;
    // Page sizes are powers of two in practice (16): a shift, not a division per key row.
    const int page_size = static_cast<int>(kv.page_size);
    const bool pow2 = (page_size & (page_size - 1)) == 0;
    const int page_shift = __ffs(page_size) - 1;
    int slot = 0;
    uint32_t parity = 1;  // a fresh ring is empty
    for (int ps = 0; ps < n_passes; ++ps) {
      const int kmin = tab.pass_kmin[ps], kmax = tab.pass_kmax[ps];
      const int32_t* table = kv.page_table + static_cast<int64_t>(tab.pass_seq[ps]) * kv.max_pages;
      const int n_tiles = kmax >= kmin ? (kmax - kmin + KT) / KT : 0;
      for (int i = 0; i < n_tiles; ++i) {
        mbarrier_wait(empty0 + 8 * slot, parity);
        attn_copy_kv_tile<KT, HD, kProducerThreads / 32>(skv + slot * kStageBytes, kTileBytes, kv, table, kmin + i * KT,
                                                         kmin, kmax, g, p.n_kv, pow2, page_shift, tid);
        cp_async_mbarrier_arrive(full0 + 8 * slot);
        if (++slot == kStages) {
          slot = 0;
          parity ^= 1;
        }
      }
    }
    cp_async_wait<0>();  // no thread leaves with copies in flight
    return;
  }

  setmaxnreg_inc<Shape::kConsumerRegisters>();
  const int ct = tid - kProducerThreads, warp = ct / 32, lane = tid % 32;  // warp: 0 .. 4 kConsumers - 1
  const int r0 = warp * 16 + lane / 4, r1 = r0 + 8, q4 = lane % 4;
  const int tl0 = row_valid(r0) ? r0 / group : -1, tl1 = row_valid(r1) ? r1 / group : -1;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  float o[HD / 2];
#pragma unroll
  for (int i = 0; i < HD / 2; ++i) o[i] = 0.f;
  const int fmax = tab.whole_fmax, lmin = tab.whole_lmin;
  const uint32_t q_addr = smem_addr(sq) + (warp / 4) * 64 * 128;  // this warpgroup's 64 rows

  int slot = 0;
  uint32_t parity = 0;
  // The ring's next slot, waited for (its copies landed and are visible to wgmma's reads).
  auto acquire = [&]() {
    mbarrier_wait(full0 + 8 * slot, parity);
    fence_proxy_async_smem();  // the landed copies, seen through the barrier, made visible to wgmma's reads
    const int got = slot;
    if (++slot == kStages) {
      slot = 0;
      parity ^= 1;
    }
    return got;
  };
  auto release = [&](int got) {  // this warp's GEMMs are done with the slot
    if (lane == 0) mbarrier_arrive(empty0 + 8 * got);
  };
  auto k_tile = [&](int got) { return skv_addr + got * kStageBytes; };
  auto v_tile = [&](int got) { return skv_addr + got * kStageBytes + kTileBytes; };
  for (int ps = 0, start = 0; ps < n_passes; ++ps) {
    const int end = tab.pass_end[ps], kmin = tab.pass_kmin[ps], kmax = tab.pass_kmax[ps];
    // A row outside this pass sees nothing here (empty range [1, 0]).
    const bool in0 = tl0 >= start && tl0 < end, in1 = tl1 >= start && tl1 < end;
    const int f0 = in0 ? tab.tok_first[tl0] : 1, l0 = in0 ? tab.tok_last[tl0] : 0;
    const int f1 = in1 ? tab.tok_first[tl1] : 1, l1 = in1 ? tab.tok_last[tl1] : 0;
    const int n_tiles = kmax >= kmin ? (kmax - kmin + KT) / KT : 0;
    start = end;
    auto sides = [&](int k0) { return attn_mask_sides(k0, KT, fmax, lmin); };
    if (n_tiles == 0) continue;
    // The overlapped steps (attention_wgmma_parts.cuh); a slot is released once its P V is done.
    uint32_t pa[KT / 16][4];
    int prev = acquire();
    attn_overlap_first<KT, HD>(o, pa, m_run, l_run, q_addr, k_tile(prev), sides(kmin), kmin, q4, f0, l0, f1, l1,
                               p.scale_log2);
    for (int i = 1; i < n_tiles; ++i) {
      const int got = acquire();
      const int k0 = kmin + i * KT;
      attn_overlap_step<KT, HD>(o, pa, m_run, l_run, q_addr, k_tile(got), v_tile(prev), sides(k0), k0, q4, f0, l0,
                                f1, l1, p.scale_log2, [&] { release(prev); });
      prev = got;
    }
    attn_overlap_last_pv<KT, HD>(o, pa, v_tile(prev));
    release(prev);
  }

  int64_t token[2];
  int head[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = h == 0 ? r0 : r1, tl = h == 0 ? tl0 : tl1;
    token[h] = tl >= 0 ? t0 + tl : -1;
    head[h] = g * group + row % group;
  }
  attn_store_rows<HD>(p, o, m_run, l_run, token, head, q4);
#endif  // MX_SM90A
}

// The wide (in-turn) shape as a persistent kernel: one CTA per SM walks units (a unit: the 192 rows of one kv
// head that a CTA of the kernel above takes) in a fixed snake order over the heaviest-first list (round r
// takes units r G .. r G + G - 1, forwards on even rounds and backwards on odd ones, so every CTA's sum of
// unit costs is about equal; G = the grid). The producer builds the next unit's tables and loads its Q (one
// TMA box into the other of two Q buffers) once it has issued the current unit's last K/V tile, and the K/V
// ring runs on across units: the next unit's Q and first tiles load under the current unit's last tiles.
// As separate CTAs (one per SM at this shape's registers and shared memory) each unit paid its prologue (Q,
// tables, the first tiles' latency) with nothing else on its SM: 8K causal on an H200 1298 -> 1203 us (W1b).
// RoPE in the Q load (p.q_inv_freq): Q's box comes from the q|k|v projection's rows and each consumer rotates its
// A fragments after ldmatrix (dims d and d + 32 sit in the same register of fragments kc and kc + 2), 16 sincosf a
// lane per unit, with qkv_rope's bits; qkv_rope then writes K and V alone.
template <int HD, int KT, int CONSUMERS, int STAGES>
struct PersistShape {
  static constexpr int kRows = 64 * CONSUMERS, kThreads = kProducerThreads + 128 * CONSUMERS;
  static constexpr int kTileBytes = KT * HD * 2, kStageBytes = 2 * kTileBytes, kQBytes = kRows * HD * 2;
  static constexpr int kOnesBytes = 2048;  // 16 rows of 128 bytes: the B of the row-sum wgmma
  static constexpr int smem_bytes() {
    return 1024 + 2 * kQBytes + kOnesBytes + STAGES * kStageBytes + (2 * STAGES + 4) * 8 + 2 * sizeof(WsTables<kRows>);
  }
};
static_assert(PersistShape<64, kAttnWsWide.keys_per_tile, kAttnWsWide.consumers, kAttnWsWide.stages>::smem_bytes() ==
                  attention_prefill_wgmma_persist_smem_bytes(64, kAttnWsWide),
              "attention_persist_config.h counts the shared memory the persistent kernel lays out");

#if MX_SM90A  // the helpers of sm_90a's pass (other archs compile an empty kernel)
// Unit `j` of the heaviest-first list: its kv head and first token.
__device__ __forceinline__ void persist_unit(int j, int n_kv, int units_x, int tpc, int* g, int* t0) {
  *g = j % n_kv;
  *t0 = (units_x - 1 - j / n_kv) * tpc;
}
// The CTA's `n`th unit in the snake order, or -1 past the list.
__device__ __forceinline__ int persist_unit_index(int n, int n_units) {
  const int G = static_cast<int>(gridDim.x), c = static_cast<int>(blockIdx.x);
  const int j = n * G + ((n & 1) == 0 ? c : G - 1 - c);
  return j < n_units ? j : -1;
}
#endif

template <int HD, int KT, int CONSUMERS, int STAGES>
__global__ void __launch_bounds__(PersistShape<HD, KT, CONSUMERS, STAGES>::kThreads, 1)
    attention_prefill_wgmma_persist_kernel(AttentionKernelParams p, const __grid_constant__ CUtensorMap q_map) {
#if MX_SM90A
  using S = PersistShape<HD, KT, CONSUMERS, STAGES>;
  using Regs = WsShape<KT, CONSUMERS, STAGES, 1>;
  constexpr int kRows = S::kRows, kStages = STAGES, kConsumers = CONSUMERS;
  constexpr int kTileBytes = S::kTileBytes, kStageBytes = S::kStageBytes, kQBytes = S::kQBytes;
  static_assert(HD == 64, "one 64-dim panel per row");
  extern __shared__ __align__(128) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  uint8_t* sq = smem;                           // 2 x [kRows][64], swizzled
  uint8_t* sones = sq + 2 * kQBytes;            // [16][64] bf16 ones
  uint8_t* skv = sones + S::kOnesBytes;         // kStages x {K, V} [KT][64], swizzled
  uint64_t* bars = reinterpret_cast<uint64_t*>(skv + kStages * kStageBytes);
  WsTables<kRows>* tabs = reinterpret_cast<WsTables<kRows>*>(bars + 2 * kStages + 4);  // one per Q buffer
  const uint32_t full0 = smem_addr(bars), empty0 = full0 + 8 * kStages;
  const uint32_t ufull0 = empty0 + 8 * kStages, uempty0 = ufull0 + 16;  // a unit's Q + tables, per buffer

  const int group = static_cast<int>(p.n_q / p.n_kv);
  const int tpc = max(1, kRows / group);  // tokens per unit
  const int units_x = static_cast<int>((p.tokens + tpc - 1) / tpc);
  const int n_units = units_x * static_cast<int>(p.n_kv);
  const int tid = threadIdx.x;

  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(full0 + 8 * s, kProducerThreads);  // each producer thread's cp.async arrival
      mbarrier_init(empty0 + 8 * s, 4 * kConsumers);   // each consumer warp, once its GEMMs left the slot
    }
    for (int b = 0; b < 2; ++b) {
      mbarrier_init(ufull0 + 8 * b, 1);                // the table builder's arrival, with Q's bytes
      mbarrier_init(uempty0 + 8 * b, 4 * kConsumers);  // each consumer warp, once the unit is done
    }
    mbarrier_init_fence();
  }
  __syncthreads();
  const uint32_t skv_addr = smem_addr(skv);

  if (tid < kProducerThreads) {
    setmaxnreg_dec<Regs::kProducerRegisters>();
    const PagedKv& kv = p.kv;
    const int page_size = static_cast<int>(kv.page_size);
    const bool pow2 = (page_size & (page_size - 1)) == 0;
    const int page_shift = __ffs(page_size) - 1;
    if (tid == 0) tma_prefetch_map(&q_map);
    int slot = 0;
    uint32_t parity = 1;  // a fresh ring is empty
    for (int n = 0;; ++n) {
      const int j = persist_unit_index(n, n_units);
      if (j < 0) break;
      const int b = n & 1;
      int g, t0;
      persist_unit(j, static_cast<int>(p.n_kv), units_x, tpc, &g, &t0);
      const int n_tok = min(tpc, static_cast<int>(p.tokens) - t0);
      WsTables<kRows>& tab = tabs[b];
      mbarrier_wait(uempty0 + 8 * b, ((n >> 1) & 1) ^ 1);  // the consumers are done with unit n - 2
      if (tid < 32) {
        for (int i = tid; i < n_tok; i += 32) {
          int f, l;
          attn_key_range(p, t0 + i, &f, &l);
          tab.tok_first[i] = f;
          tab.tok_last[i] = l;
          tab.tok_seq[i] = p.kv.token_seq[t0 + i];
        }
        __syncwarp();
        if (tid == 0) {
          tab.build_passes(n_tok);
          // The tables (this warp's writes, ordered by the arrival's release) and Q's box, on one phase.
          mbarrier_arrive_expect_tx(ufull0 + 8 * b, static_cast<uint32_t>(group * tpc * HD * 2));
          tma_load_3d(smem_addr(sq) + b * kQBytes, &q_map, 0, g * group, t0, ufull0 + 8 * b);
        }
      }
      named_barrier_sync(1, kProducerThreads);  // the pass tables, seen by the other producer warps
      const int n_passes = tab.n_passes;
      for (int ps = 0; ps < n_passes; ++ps) {
        const int kmin = tab.pass_kmin[ps], kmax = tab.pass_kmax[ps];
        const int32_t* table = kv.page_table + static_cast<int64_t>(tab.pass_seq[ps]) * kv.max_pages;
        const int n_tiles = kmax >= kmin ? (kmax - kmin + KT) / KT : 0;
        for (int i = 0; i < n_tiles; ++i) {
          mbarrier_wait(empty0 + 8 * slot, parity);
          attn_copy_kv_tile<KT, HD, kProducerThreads / 32>(skv + slot * kStageBytes, kTileBytes, kv, table,
                                                           kmin + i * KT, kmin, kmax, g, p.n_kv, pow2, page_shift,
                                                           tid);
          cp_async_mbarrier_arrive(full0 + 8 * slot);
          if (++slot == kStages) {
            slot = 0;
            parity ^= 1;
          }
        }
      }
    }  // (warp 0 rewrites this unit's tables two units on, after every producer warp passed the next unit's barrier)
    cp_async_wait<0>();  // no thread leaves with copies in flight
    return;
  }

  setmaxnreg_inc<Regs::kConsumerRegisters>();
  const int ct = tid - kProducerThreads, warp = ct / 32, lane = tid % 32;
  const int r0 = warp * 16 + lane / 4, r1 = r0 + 8, q4 = lane % 4;
  if (ct < 128) {
    *reinterpret_cast<uint4*>(sones + ct * 16) = make_uint4(0x3f803f80u, 0x3f803f80u, 0x3f803f80u, 0x3f803f80u);
    fence_proxy_async_smem();  // the ones, written by the generic proxy, seen by wgmma's reads
  }
  named_barrier_sync(2, 128 * kConsumers);
  const uint64_t ones_desc = wgmma_desc_mn128(smem_addr(sones), 64 * 128);
  int slot = 0;
  uint32_t parity = 0;
  auto acquire = [&]() {
    mbarrier_wait(full0 + 8 * slot, parity);
    fence_proxy_async_smem();  // the landed copies, seen through the barrier, made visible to wgmma's reads
    const int got = slot;
    if (++slot == kStages) {
      slot = 0;
      parity ^= 1;
    }
    return got;
  };
  auto k_tile = [&](int got) { return skv_addr + got * kStageBytes; };
  auto v_tile = [&](int got) { return skv_addr + got * kStageBytes + kTileBytes; };
  // RoPE in the Q load: this lane's frequencies, dims 2 (lane % 16) and + 1 (below).
  const float freq0 = p.q_inv_freq != nullptr ? p.q_inv_freq[2 * (lane % 16)] : 0.f;
  const float freq1 = p.q_inv_freq != nullptr ? p.q_inv_freq[2 * (lane % 16) + 1] : 0.f;
  for (int n = 0;; ++n) {
    const int j = persist_unit_index(n, n_units);
    if (j < 0) break;
    const int b = n & 1;
    int g, t0;
    persist_unit(j, static_cast<int>(p.n_kv), units_x, tpc, &g, &t0);
    const int n_tok = min(tpc, static_cast<int>(p.tokens) - t0);
    auto row_valid = [&](int row) { return row / group < n_tok && row < tpc * group; };
    const int tl0 = row_valid(r0) ? r0 / group : -1, tl1 = row_valid(r1) ? r1 / group : -1;
    const WsTables<kRows>& tab = tabs[b];
    mbarrier_wait(ufull0 + 8 * b, (n >> 1) & 1);
    uint32_t qf[HD / 16][4];
    attn_load_q<kRows, HD>(qf, sq + b * kQBytes, warp * 16, lane);
    if (p.q_inv_freq != nullptr) {  // RoPE in the Q load: qf[kc] holds dims 16 kc.., qf[kc + 2] their partners
      // At a group that is a multiple of 8 the warp's rows r0 are one token and its rows r1 another: lane L takes
      // the sincosf of dims 2 (L % 16), + 1 of token L < 16 ? r0's : r1's, and every lane gathers its 8 dims of
      // each by shuffles (2 sincosf a lane, not 16). Other groups compute their own.
      // A token's position is its last key (the unit's tables, shared memory) and the lane's two frequencies
      // stay in registers: no global load after the unit's Q wait (W1's form loaded both there: +40 us at 8K).
      const bool warp_tokens = group % 8 == 0;
      float own[4] = {0.f, 0.f, 0.f, 0.f};
      if (warp_tokens) {
        const int tl = lane < 16 ? tl0 : tl1;
        const int32_t pos = tl >= 0 ? tab.tok_last[tl] : 0;
        rope_cos_sin(pos, freq0, p.q_rope_scale, own[0], own[1]);
        rope_cos_sin(pos, freq1, p.q_rope_scale, own[2], own[3]);
      }
      const int32_t pos0 = tl0 >= 0 ? tab.tok_last[tl0] : 0, pos1 = tl1 >= 0 ? tab.tok_last[tl1] : 0;
#pragma unroll
      for (int kc = 0; kc < HD / 32; ++kc)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int d = 16 * kc + 8 * (e >> 1) + 2 * q4;  // register e: row r0 (even e) or r1, dims d, d + 1
          float c0, s0, c1, s1;
          if (warp_tokens) {
            const int src = 16 * (e & 1) + d / 2;
            c0 = __shfl_sync(0xffffffffu, own[0], src);
            s0 = __shfl_sync(0xffffffffu, own[1], src);
            c1 = __shfl_sync(0xffffffffu, own[2], src);
            s1 = __shfl_sync(0xffffffffu, own[3], src);
          } else {
            const int32_t pos = (e & 1) ? pos1 : pos0;
            rope_cos_sin(pos, p.q_inv_freq[d], p.q_rope_scale, c0, s0);
            rope_cos_sin(pos, p.q_inv_freq[d + 1], p.q_rope_scale, c1, s1);
          }
          rope_rotate_pair2(qf[kc][e], qf[kc + HD / 32][e], c0, s0, c1, s1, qf[kc][e], qf[kc + HD / 32][e]);
        }
    }
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
    float lsum[4] = {0.f, 0.f, 0.f, 0.f};
    float o[HD / 2];
#pragma unroll
    for (int i = 0; i < HD / 2; ++i) o[i] = 0.f;
    const int fmax = tab.whole_fmax, lmin = tab.whole_lmin, n_passes = tab.n_passes;
    for (int ps = 0, start = 0; ps < n_passes; ++ps) {
      const int end = tab.pass_end[ps], kmin = tab.pass_kmin[ps], kmax = tab.pass_kmax[ps];
      const bool in0 = tl0 >= start && tl0 < end, in1 = tl1 >= start && tl1 < end;
      const int f0 = in0 ? tab.tok_first[tl0] : 1, l0 = in0 ? tab.tok_last[tl0] : 0;
      const int f1 = in1 ? tab.tok_first[tl1] : 1, l1 = in1 ? tab.tok_last[tl1] : 0;
      const int n_tiles = kmax >= kmin ? (kmax - kmin + KT) / KT : 0;
      start = end;
      for (int i = 0; i < n_tiles; ++i) {
        const int got = acquire();
        const int k0 = kmin + i * KT;
        float s[KT / 2];
        attn_qk<KT, HD>(s, qf, k_tile(got));
        uint32_t pa[KT / 16][4];
        attn_softmax_tile<KT, HD>(s, o, lsum, m_run, l_run, pa, attn_mask_sides(k0, KT, fmax, lmin), k0, q4, f0, l0,
                                  f1, l1, p.scale_log2);
        attn_pv_sum<KT, HD>(o, lsum, pa, v_tile(got), ones_desc);
        if (lane == 0) mbarrier_arrive(empty0 + 8 * got);
      }
    }
    __syncwarp();
    if (lane == 0) mbarrier_arrive(uempty0 + 8 * b);  // this warp read its Q and the tables for the last time
    int64_t token[2];
    int head[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = h == 0 ? r0 : r1, tl = h == 0 ? tl0 : tl1;
      token[h] = tl >= 0 ? t0 + tl : -1;
      head[h] = g * group + row % group;
    }
    const float l_whole[2] = {lsum[0], lsum[2]};
    attn_store_rows<HD, /*SUMS_WHOLE=*/true>(p, o, m_run, l_whole, token, head, q4);
  }
#endif  // MX_SM90A
}

// The persistent kernel of shape Sh: grid = the SMs (or fewer units), Q's tensor map in boxes of a unit.
template <const AttnWsShape& Sh>
Status launch_persist(const AttentionKernelParams& p, const AttentionPrefillWgmmaConfig& c, cudaStream_t stream) {
  using S = PersistShape<64, Sh.keys_per_tile, Sh.consumers, Sh.stages>;
  auto kernel = attention_prefill_wgmma_persist_kernel<64, Sh.keys_per_tile, Sh.consumers, Sh.stages>;
  MX_RETURN_IF_ERROR(cuda_status(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(c.smem_bytes)),
      "cudaFuncSetAttribute(attention wgmma persist smem)"));
  const int64_t group = p.n_q / p.n_kv, tpc = std::max<int64_t>(1, S::kRows / group);
  const int64_t units = ceil_div64(p.tokens, tpc) * p.n_kv;
  // Q as [tokens][n_q][64]; a unit's box: tpc tokens x the kv head's `group` q heads, rows token-major as the
  // consumers take them (rows past the last token zero-filled).
  // With RoPE in the Q load, Q's rows are the q|k|v projection's (q_stride apart).
  const int64_t q_stride = p.q_stride > 0 ? p.q_stride : p.n_q * 64;
  if (q_stride < p.n_q * 64 || q_stride % 8 != 0)
    return invalid_argument("attention prefill wgmma (persistent): q rows must hold n_q heads, 16-byte aligned");
  CUtensorMap q_map{};
  MX_RETURN_IF_ERROR(encode_bf16_tensor_map_3d(
      &q_map, p.q, {64, static_cast<uint64_t>(p.n_q), static_cast<uint64_t>(p.tokens)},
      {64 * 2, static_cast<uint64_t>(q_stride) * 2},
      {64, static_cast<uint32_t>(group), static_cast<uint32_t>(tpc)}));
  int device = 0, sms = 0;
  MX_RETURN_IF_ERROR(cuda_status(cudaGetDevice(&device), "cudaGetDevice"));
  MX_RETURN_IF_ERROR(
      cuda_status(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute"));
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>(units, std::max(sms, 1))));
  kernel<<<grid, S::kThreads, c.smem_bytes, stream>>>(p, q_map);
  return launch_status("attention_prefill_wgmma_persist_kernel");
}

// Launches shape S (its config checked by the caller) on grid x = the CTAs of rows_per_cta / group tokens
// each, y = kv heads.
template <const AttnWsShape& S>
Status launch_shape(const AttentionKernelParams& p, const AttentionPrefillWgmmaConfig& c, cudaStream_t stream) {
  auto kernel = attention_prefill_wgmma_ws_kernel<64, S.keys_per_tile, S.consumers, S.stages, S.ctas_per_sm, S.overlap>;
  MX_RETURN_IF_ERROR(cuda_status(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(c.smem_bytes)),
      "cudaFuncSetAttribute(attention wgmma ws smem)"));
  if (S.ctas_per_sm > 1)  // the whole carveout as shared memory, so that several CTAs' rings fit an SM
    MX_RETURN_IF_ERROR(cuda_status(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                                        static_cast<int>(cudaSharedmemCarveoutMaxShared)),
                                   "cudaFuncSetAttribute(attention wgmma ws carveout)"));
  const int64_t tpc = std::max<int64_t>(1, c.rows_per_cta / (p.n_q / p.n_kv));
  const dim3 grid(static_cast<unsigned>(ceil_div64(p.tokens, tpc)), static_cast<unsigned>(p.n_kv));
  kernel<<<grid, c.threads, c.smem_bytes, stream>>>(p);
  return launch_status("attention_prefill_wgmma_ws_kernel");
}

bool config_is(const AttentionPrefillWgmmaConfig& c, const AttnWsShape& s, int64_t head_dim) {
  return c.keys_per_tile == s.keys_per_tile && c.threads == 128 * (1 + s.consumers) &&
         c.rows_per_cta == 64 * s.consumers && c.stages == s.stages && c.ctas_per_sm == s.ctas_per_sm &&
         c.smem_bytes == (s.overlap ? attention_prefill_wgmma_ws_smem_bytes(head_dim, s)
                                    : attention_prefill_wgmma_persist_smem_bytes(head_dim, s));
}

}  // namespace

Status launch_attention_prefill_wgmma_ws(const AttentionKernelParams& p, const AttentionPrefillWgmmaConfig& c,
                                         cudaStream_t stream) {
  if (!c.enabled) return unimplemented("attention prefill wgmma (warp-specialized): needs sm_90 and head_dim 64");
  if (p.head_dim != 64) return unimplemented("attention prefill wgmma (warp-specialized): head_dim must be 64");
  if (p.n_kv <= 0 || p.n_q % p.n_kv != 0) return invalid_argument("attention: n_q must be a multiple of n_kv");
  if (p.n_q / p.n_kv > c.rows_per_cta)
    return unimplemented("attention prefill wgmma (warp-specialized): more q heads per kv head than rows");
  const bool wide = config_is(c, kAttnWsWide, p.head_dim), narrow = config_is(c, kAttnWsNarrow, p.head_dim);
  if (!wide && !narrow)
    return internal_error("attention prefill wgmma (warp-specialized): config does not match a shape of the kernel");
  if (p.tokens == 0) return Status::ok();
  return wide ? launch_persist<kAttnWsWide>(p, c, stream) : launch_shape<kAttnWsNarrow>(p, c, stream);
}

}  // namespace mx::cuda
