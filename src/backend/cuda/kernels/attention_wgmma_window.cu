// Prefill attention for Hopper (sm_90a) on sliding-window layers (gpt-oss's sliding layers: 128 keys).
// The warp-specialized kernel (attention_wgmma_ws.cu) gives each CTA one block of 16 tokens (x 8 heads =
// 128 rows), which sees 143 keys: the CTA loads 3 K/V tiles, pays its prologue, and runs a 3-tile pipeline
// that is mostly fill and drain (8K window 128 at 12% of its floor). Here a CTA walks `blocks_per_cta`
// consecutive blocks of one kv head, and consecutive blocks see mostly the same keys: the K/V tiles sit at
// fixed 64-key boundaries (key k in tile k / 64) and stay in the ring while a later block still needs
// them, so a tile is loaded once per CTA instead of once per block, Q of the next block loads under the
// current block's math, and the prologue is paid once per CTA. The grid is sized to one wave of two CTAs
// per SM.
//
// Roles as in attention_wgmma_ws.cu (tile layout, GEMMs, softmax, store: attention_wgmma_parts.cuh):
// - producer warpgroup (setmaxnreg 32): warps 0-1 load K/V tiles into the ring (attn_copy_kv_tile: one
//   page lookup per key row; cp.async arrivals on mbarriers; with RoPE in the Q load, between rotations of Q
//   boxes, see below); one thread of warp 2 loads each block's Q into
//   one of two buffers as one TMA box (tma.cuh: a tensor map over Q, its bytes counted on the buffer's
//   mbarrier; no consumer fence, and two warps' address arithmetic gone). The first two boxes go out from
//   thread kQEarly right after the barriers' init and the PDL wait, while the other threads build the tables.
// - two consumer warpgroups of 64 rows (104 registers), each tile in turn: S = Q K^T (both from shared
//   memory), softmax, O += P V; the warpgroups of the SM's two CTAs overlap each other. A warpgroup (8
//   tokens at g8) computes only the 16-key groups of a tile that its rows see: its 135 keys take 9 groups
//   (144 keys) instead of 3 whole 64-key tiles (192), a quarter less QK, softmax and P V work. In the steady
//   state of a 128-key window (every row of the warpgroup in one pass, 9 groups over 3 tiles, the inner 7
//   visible to every row) the 9 groups are one 144-key score tile: three score GEMMs (m64n16..64, one per
//   tile) into one accumulator, one max and sum, no rescale, one P V over the three tiles' V rows, masks on
//   the edge groups only; other blocks take the groups tile by tile (m64n16..64 score GEMMs). A block's O,
//   normalised, is written over its Q buffer and stored as one TMA box by one thread (the output's tensor
//   map), which hands the buffer back to the Q loader once the store has read it: no per-row global stores
//   with 64-bit addresses, sink loads or IEEE divisions in the loop (ncu: the old epilogue issued ~15% of
//   the kernel's instructions). At g8 each warpgroup stores its own 8 tokens as a half box after a barrier
//   of its own 4 warps, not of both warpgroups (session 23, 8K: rope-q -0.2 to -0.3 us, the pair -0.4 to
//   -0.5). The ws kernel's overlapped loop (QK(i) issued with P V(i - 1)) spilled P and had its wgmmas
//   serialized at this budget (ptxas C7512) and ran 7% slower; four consumer warpgroups at one CTA per SM
//   (112 registers, not serialized) and one pipeline across blocks were slower still (session 12,
//   docs/PERF.md). A softmax without the row max (weights relative to each row's log-sum-exp of the block
//   before) spilled at this budget and ran slower (session 23).
//
// The tile list: a CTA's tokens split into passes (a pass: tokens of one block and one sequence at
// consecutive positions). A pass sees keys [kmin, kmax], tiles [tlo, thi]; it reuses the previous pass's
// tiles when it belongs to the same sequence and its keys move forward (kmin and kmax not smaller, tlo
// within the previous tiles), else it starts fresh tiles. Tiles get list indices in the order passes
// first need them, which is the order the producer loads them and the slot (index % stages) they take.
// Consumers release a tile (once per warp) when they start the first pass that no longer needs it, so the
// ring holds at most one pass's tiles plus prefetched ones; the host only picks this kernel when a pass's
// tiles fit the ring (attention_window_wgmma_takes). A warp waits for a tile (and fences the copies for
// wgmma) only the first time; later passes reuse it as it is.
//
// Launched as a programmatic dependent (PDL) of qkv_rope, which writes Q and the new K/V: the CTAs start while
// qkv_rope's last wave runs and build the token, pass and tile tables (the batch's token layout only, uploaded
// before the step) before griddepcontrol.wait; only what reads Q, K or V waits. Alone, the wait returns at once.
//
// RoPE in the Q load (p.q_inv_freq; gpt-oss's prefill): Q is the q|k|v projection's unrotated rows (qkv_rope writes
// K and V alone), rotated with qkv_rope's bits (rope_cos_sin, rope_rotate_pair2) once its box has landed.
// At 8 q heads a kv head (gpt-oss; the kernel's kGroup = 8 instance) each consumer warp rotates its own 16 rows in
// registers at the block's start: a warp's rows r0 are one token and its rows r1 the next, so lane L computes the
// sincosf of dims 2 (L % 16), + 1 of one of them and every lane gathers its 8 dims of each by shuffles; ldmatrix,
// the rotation, stmatrix back, the warpgroup's barrier, then the QK wgmmas read the rows as before, and the
// producers load K, V and Q as when Q is written. The sincosf of block b + 1 run while block b's P V wgmmas do (the
// fast case; else before its epilogue's barrier). (Session 22, 8K, one process, three rounds: 92.5 -> 87.0 us with
// the sincosf at the block's start, 83.2 under the P V wait, 86.5 before the epilogue's barrier; the pair behind
// the K/V-only qkv_rope 101.3 -> 96.3 / 94.0 / 95.1; a cos / sin table written by producer warp 3 instead of the
// consumers' sincosf: 99.4, the consumers waiting for it.)
// Other groups: the whole producer warpgroup rotates a block's box while the consumers run the block before, and
// releases the consumers through named barrier 4 + (b & 1). Warps 0-1 load the K/V tiles whose ring slots are free
// before each box and while they wait for it (mbarrier test_wait, never blocking: a slot frees only when the
// consumers start a later block, which needs the box); a steady-state tile's slot frees about 5 blocks before
// its first use, so the copies keep their lead. (Session 20, 8K: warps 2-3 alone 104 us, the consumers rotating
// their own rows at each block's start 116, 78 with Q written; the consumers and the rotators splitting the
// words measured no better. Session 21, one run each: all four warps 92.1 against 104.7 us, the pair behind the
// K/V-only qkv_rope 101.0 against 113.2; Q boxes prefetched into L2 two blocks ahead gave nothing.) The
// projection was complete before qkv_rope let this grid start, so Q's first boxes go out before
// griddepcontrol.wait and neither the Q loader nor the rotators wait for it; only the K/V copies do. qkv_rope no
// longer writes Q nor this kernel reads it back.
#include <algorithm>
#include <climits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernel_configs.h"
#include "backend/cuda/kernels/attention_wgmma_parts.cuh"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/head_rows.cuh"
#include "backend/cuda/kernels/kernels.h"
#include "backend/cuda/kernels/mbarrier.cuh"
#include "backend/cuda/kernels/tma.cuh"
#include "backend/cuda/kernels/wgmma.cuh"

namespace mx::cuda {
namespace {

constexpr int kHd = 64, kKt = kAttnWindowKeys, kStages = kAttnWindowStages, kMaxTok = kAttnWindowMaxTokens;
constexpr int kConsumers = 2, kRows = 64 * kConsumers, kThreads = 128 * (1 + kConsumers);
constexpr int kTileBytes = kKt * kHd * 2, kStageBytes = 2 * kTileBytes, kQBytes = kRows * kHd * 2;

// Per-token facts (index: token within the CTA) and the pass and tile list (see the file comment).
struct WinTables {
  int tok_first[kMaxTok], tok_last[kMaxTok], tok_seq[kMaxTok];
  int pass_start[kMaxTok + 1];  // first token of each pass; [n_passes] = n_tok
  int pass_tlo[kMaxTok], pass_tiles[kMaxTok], pass_jlo[kMaxTok];  // first tile, tile count, list index of tlo
  int pass_new[kMaxTok];        // tiles this pass appends to the list (its last ones)
  int pass_head[kMaxTok];       // first pass of its chain of reusing passes
  int chain_hi[kMaxTok];        // by head: the chain's last key (keys past it are not loaded)
  int block_pass[kMaxTok + 1];  // first pass of each block; [n_blocks] = n_passes
  int n_passes, n_list;
};
static_assert(attention_window_wgmma_smem_bytes() ==
                  1024 + 2 * kQBytes + kStages * kStageBytes + (2 * kStages + 4) * 8 + sizeof(WinTables),
              "kernel_configs.h counts the shared memory this kernel lays out");

// The kernel's constants and helpers exist for sm_90a's pass only (other archs compile an empty kernel).
#if MX_SM90A
constexpr int kKvLoaders = 64;      // producer threads that copy K/V tiles (warps 0-1)
constexpr int kQLoader = kKvLoaders;  // the producer thread that issues Q's TMA boxes (warp 2's first)
// The thread that inits the barriers, waits for qkv_rope and issues Q's first two boxes: one with no token of
// the tables to read (thread i reads token i), so that the others build them under the wait.
constexpr int kQEarly = kMaxTok;
static_assert(kQEarly < kThreads, "a thread past the tables' tokens");
// Registers after setmaxnreg: two CTAs of 384 threads share the file (80 a thread at launch); the producer
// gives back what the consumers take.
constexpr int kLaunchRegisters = (65536 / (kThreads * 2)) / 8 * 8;
constexpr int kProducerRegisters = 32;
constexpr int kConsumerRegisters = (kLaunchRegisters * (1 + kConsumers) - kProducerRegisters) / kConsumers / 8 * 8;

// Inclusive prefix sum / max over the warp's lanes.
__device__ __forceinline__ int warp_scan_sum(int v, int lane) {
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const int u = __shfl_up_sync(0xffffffffu, v, d);
    if (lane >= d) v += u;
  }
  return v;
}
__device__ __forceinline__ int warp_scan_max(int v, int lane) {
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const int u = __shfl_up_sync(0xffffffffu, v, d);
    if (lane >= d) v = max(v, u);
  }
  return v;
}

// One warp builds the pass and tile list of the CTA's n_tok tokens (tables already hold the per-token
// facts), 32 tokens or passes a step.
__device__ void build_passes(WinTables& tab, int n_tok, int tpb, int lane) {
  int n_passes = 0;
  for (int c = 0; c < n_tok; c += 32) {
    const int i = c + lane;
    bool start = false;
    if (i < n_tok)
      start = i % tpb == 0 || tab.tok_seq[i] != tab.tok_seq[i - 1] || tab.tok_last[i] != tab.tok_last[i - 1] + 1;
    const unsigned starts = __ballot_sync(0xffffffffu, start);
    if (start) {
      const int idx = n_passes + __popc(starts & ((1u << lane) - 1));
      tab.pass_start[idx] = i;
      if (i % tpb == 0) tab.block_pass[i / tpb] = idx;
    }
    n_passes += __popc(starts);
  }
  if (lane == 0) {
    tab.pass_start[n_passes] = n_tok;
    tab.block_pass[(n_tok + tpb - 1) / tpb] = n_passes;
    tab.n_passes = n_passes;
  }
  __syncwarp();
  // The previous pass's facts, carried from lane 31 to the next step's lane 0.
  int c_seq = -1, c_kmin = 0, c_kmax = 0, c_thi = 0, c_jend = 0, c_head = 0;
  for (int c = 0; c < n_passes; c += 32) {
    const int ps = c + lane;
    const bool valid = ps < n_passes;
    int seq = -1, kmin = 0, kmax = 0, tlo = 0, thi = 0;
    if (valid) {
      const int start = tab.pass_start[ps], end = tab.pass_start[ps + 1];
      seq = tab.tok_seq[start];
      kmin = tab.tok_first[start];  // positions are consecutive within a pass: first and last grow with them
      kmax = tab.tok_last[end - 1];
      tlo = kmin / kKt;
      thi = kmax / kKt;
    }
    int p_seq = __shfl_up_sync(0xffffffffu, seq, 1), p_kmin = __shfl_up_sync(0xffffffffu, kmin, 1);
    int p_kmax = __shfl_up_sync(0xffffffffu, kmax, 1), p_thi = __shfl_up_sync(0xffffffffu, thi, 1);
    if (lane == 0) {
      p_seq = c_seq;
      p_kmin = c_kmin;
      p_kmax = c_kmax;
      p_thi = c_thi;
    }
    const bool reuse = valid && ps > 0 && seq == p_seq && kmin >= p_kmin && kmax >= p_kmax && tlo <= p_thi;
    const int fresh = valid ? (reuse ? thi - p_thi : thi - tlo + 1) : 0;
    const int jend = warp_scan_sum(fresh, lane) + c_jend;  // list length after this pass
    const int head = max(warp_scan_max(valid && !reuse ? ps : -1, lane), c_head);
    if (valid) {
      tab.pass_tlo[ps] = tlo;
      tab.pass_tiles[ps] = thi - tlo + 1;
      tab.pass_jlo[ps] = jend - (thi - tlo + 1);
      tab.pass_new[ps] = fresh;
      tab.pass_head[ps] = head;
      if (!reuse) tab.chain_hi[ps] = kmax;
    }
    __syncwarp();
    if (reuse) atomicMax(&tab.chain_hi[head], kmax);  // kmax grows along a chain: the max is its last pass's
    __syncwarp();
    c_seq = __shfl_sync(0xffffffffu, seq, 31);
    c_kmin = __shfl_sync(0xffffffffu, kmin, 31);
    c_kmax = __shfl_sync(0xffffffffu, kmax, 31);
    c_thi = __shfl_sync(0xffffffffu, thi, 31);
    c_jend = __shfl_sync(0xffffffffu, jend, 31);
    c_head = __shfl_sync(0xffffffffu, head, 31);
  }
  if (lane == 0) tab.n_list = c_jend;
}
#endif  // MX_SM90A

#if MX_SM90A
// Arrival at named barrier `id` among `threads` threads (whole warps) without waiting: the Q rotators release the
// consumers, who bar.sync on it.
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// One test of the phase of `parity` that never suspends the thread: true once it completed.
__device__ __forceinline__ bool mbarrier_test_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}

// Four 8 x 8 bf16 blocks from registers into shared memory (the mma fragment layout: lane t holds row t / 4,
// columns 2 (t % 4) and the next, of each); lane t gives the address of row t % 8 of block t / 8.
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}
#endif

// `q_map`: Q as [tokens][n_q][64] in boxes of a block's tokens x one kv head's q heads (the launcher's).
// `o_map`: the output as [tokens][n_q][64] in the same boxes; a block's O is written over its Q buffer and
// stored as one box. `kGroup`: 8 (gpt-oss's q heads a kv head: its divisions become shifts, and with RoPE in the Q
// load the consumers rotate their own rows, see the file comment) or 0 (any group: p.n_q / p.n_kv).
template <int kGroup>
__global__ void __launch_bounds__(kThreads, 2)
    attention_prefill_wgmma_window_kernel(AttentionKernelParams p, int blocks_per_cta,
                                          const __grid_constant__ CUtensorMap q_map,
                                          const __grid_constant__ CUtensorMap o_map) {
#if MX_SM90A
  extern __shared__ __align__(128) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023);
  uint8_t* sq = smem;                  // 2 x [kRows][64], swizzled
  uint8_t* skv = sq + 2 * kQBytes;     // kStages x {K, V} [kKt][64], swizzled
  uint64_t* bars = reinterpret_cast<uint64_t*>(skv + kStages * kStageBytes);
  WinTables& tab = *reinterpret_cast<WinTables*>(bars + 2 * kStages + 4);
  constexpr bool kConsumerRope = kGroup == 8;  // with p.q_inv_freq
  // At g8 each consumer warpgroup stores its own 64 rows (8 tokens) of O as a half-block box after a barrier of its
  // own warps; other groups' warpgroups may share a token, so both store one box after a barrier of both.
  constexpr bool kWgStore = kGroup == 8;
  constexpr int kStorers = kWgStore ? kConsumers : 1;
  const uint32_t full0 = smem_addr(bars), empty0 = full0 + 8 * kStages;  // K/V ring
  const uint32_t qfull0 = empty0 + 8 * kStages, qempty0 = qfull0 + 16;   // the two Q buffers

  const int group = kGroup > 0 ? kGroup : static_cast<int>(p.n_q / p.n_kv);
  const int tpb = max(1, kRows / group);  // tokens per block
  const int g = blockIdx.y;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * blocks_per_cta * tpb;
  const int64_t left = p.tokens - t0;
  const int n_tok = static_cast<int>(left < static_cast<int64_t>(blocks_per_cta) * tpb ? left : blocks_per_cta * tpb);
  const int n_blocks = (n_tok + tpb - 1) / tpb;
  const int tid = threadIdx.x;
  const uint32_t q_bytes = static_cast<uint32_t>(group * tpb * kHd * 2);  // a whole Q box, tails zero-filled

  for (int i = tid; i < n_tok; i += kThreads) {
    int f, l;
    attn_key_range(p, t0 + i, &f, &l);
    tab.tok_first[i] = f;
    tab.tok_last[i] = l;
    tab.tok_seq[i] = p.kv.token_seq[t0 + i];
  }
  if (tid == kQEarly) {
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(full0 + 8 * s, kKvLoaders);      // each K/V loader's cp.async arrival
      mbarrier_init(empty0 + 8 * s, 4 * kConsumers);  // each consumer warp, once no pass of it needs the tile
    }
    for (int b = 0; b < 2; ++b) {
      mbarrier_init(qfull0 + 8 * b, 1);  // the Q loader's arrival, with the box's bytes
      mbarrier_init(qempty0 + 8 * b, kStorers);  // the O stores' issuers, once their stores have read the buffer
    }
    mbarrier_init_fence();
    // Q comes from qkv_rope, or with RoPE in the Q load (p.q_inv_freq) from the q|k|v projection before it,
    // which qkv_rope's CTAs waited for before they let this grid start: no wait, Q's first boxes go out now.
    if (p.q_inv_freq == nullptr) pdl_wait();
    // Q boxes 0 and 1 now, under the tables' global reads and scans (the Q loader takes the rest): the one
    // wave of CTAs starts with every CTA's first Q, tiles and tables in flight at once (8K and 4K: -0.8 us).
    for (int b = 0; b < min(2, n_blocks); ++b) {
      mbarrier_arrive_expect_tx(qfull0 + 8 * b, q_bytes);
      tma_load_3d(smem_addr(sq) + b * kQBytes, &q_map, 0, g * group, static_cast<int>(t0) + b * tpb, qfull0 + 8 * b);
    }
  }
  __syncthreads();
  // The pass and tile tables in closed form, one thread a block, when the CTA's tokens are one sequence at
  // consecutive positions and every block reuses the previous one's tiles (a prompt's steady state): block b
  // is pass b, its keys [first of its first token, last of its last], and the list is the tiles from the
  // first pass's first on (pass b's first tile at list index tlo(b) - tlo(0); it appends thi(b) - thi(b - 1)).
  // build_passes' scans over all tokens by one warp held every warp of the CTA at the barrier below (ncu: 3%
  // of the kernel's samples at 8K).
  const int seq0 = tab.tok_seq[0], last0 = tab.tok_last[0];
  bool closed_form = true;
  for (int i = tid; i < n_tok; i += kThreads)
    closed_form = closed_form && tab.tok_seq[i] == seq0 && tab.tok_last[i] == last0 + i;
  auto kmin_of = [&](int b) { return tab.tok_first[b * tpb]; };
  auto kmax_of = [&](int b) { return tab.tok_last[min(n_tok, (b + 1) * tpb) - 1]; };
  for (int b = 1 + tid; b < n_blocks; b += kThreads)  // build_passes' reuse test, true for every block
    closed_form = closed_form && kmin_of(b) >= kmin_of(b - 1) && kmax_of(b) >= kmax_of(b - 1) &&
                  kmin_of(b) / kKt <= kmax_of(b - 1) / kKt;
  if (__syncthreads_and(closed_form)) {
    const int tlo0 = kmin_of(0) / kKt;
    for (int b = tid; b < n_blocks; b += kThreads) {
      const int tlo = kmin_of(b) / kKt, thi = kmax_of(b) / kKt;
      tab.pass_start[b] = b * tpb;
      tab.block_pass[b] = b;
      tab.pass_tlo[b] = tlo;
      tab.pass_tiles[b] = thi - tlo + 1;
      tab.pass_jlo[b] = tlo - tlo0;
      tab.pass_new[b] = b == 0 ? thi - tlo + 1 : thi - kmax_of(b - 1) / kKt;
      tab.pass_head[b] = 0;
    }
    if (tid == 0) {
      tab.pass_start[n_blocks] = n_tok;
      tab.block_pass[n_blocks] = n_blocks;
      tab.n_passes = n_blocks;
      tab.n_list = kmax_of(n_blocks - 1) / kKt - tlo0 + 1;
      tab.chain_hi[0] = kmax_of(n_blocks - 1);
    }
  } else if (tid < 32) {
    build_passes(tab, n_tok, tpb, tid);
  }
  __syncthreads();
  const int n_passes = tab.n_passes, n_list = tab.n_list;
  const uint32_t skv_addr = smem_addr(skv), sq_addr = smem_addr(sq);

  if (tid < 128) {
    setmaxnreg_dec<kProducerRegisters>();
    // K and V come from qkv_rope, and so does Q unless the kernel rotates it (then the Q loader and the rotators
    // read the projection and do not wait).
    if (tid < kKvLoaders || p.q_inv_freq == nullptr) pdl_wait();
    // The K/V loaders' walk over the tile list (passes in order, each pass's new tiles): `block` waits for each
    // tile's slot; otherwise the walk stops at the first slot still in use (warp-uniform: lane 0's test), so
    // that warps 0-1 can rotate Q between tiles and never hold a box while a slot frees.
    int kv_ps = 0, kv_i = 0;  // the next tile: tile kv_i of pass kv_ps
    auto load_tiles = [&](bool block) {
      const PagedKv& kv = p.kv;
      const int page_size = static_cast<int>(kv.page_size);
      const bool pow2 = (page_size & (page_size - 1)) == 0;
      const int page_shift = __ffs(page_size) - 1;
      while (kv_ps < n_passes) {
        const int tiles = tab.pass_tiles[kv_ps];
        kv_i = max(kv_i, tiles - tab.pass_new[kv_ps]);
        if (kv_i >= tiles) {
          ++kv_ps;
          kv_i = 0;
          continue;
        }
        const int j = tab.pass_jlo[kv_ps] + kv_i, slot = j % kStages;
        const uint32_t parity = ((j / kStages) & 1) ^ 1;  // a fresh ring is empty
        if (!block && __shfl_sync(0xffffffffu, mbarrier_test_wait(empty0 + 8 * slot, parity) ? 1 : 0, 0) == 0) return;
        mbarrier_wait(empty0 + 8 * slot, parity);
        const int start = tab.pass_start[kv_ps];
        const int lo = tab.tok_first[start], hi = tab.chain_hi[tab.pass_head[kv_ps]];  // keys worth loading
        const int32_t* table = kv.page_table + static_cast<int64_t>(tab.tok_seq[start]) * kv.max_pages;
        attn_copy_kv_tile<kKt, kHd, kKvLoaders / 32>(skv + slot * kStageBytes, kTileBytes, kv, table,
                                                      (tab.pass_tlo[kv_ps] + kv_i) * kKt, lo, hi, g, p.n_kv, pow2,
                                                      page_shift, tid);
        cp_async_mbarrier_arrive(full0 + 8 * slot);
        ++kv_i;
      }
    };
    if (p.q_inv_freq != nullptr && !kConsumerRope) {
      // RoPE for Q by the whole producer warpgroup: the Q loader issues box b (boxes 0 and 1 went out early),
      // all 128 threads rotate box b once landed, and named barrier 4 + (b & 1) releases the consumers (who wait
      // there instead of on the box's mbarrier); warps 0-1 load the K/V tiles whose slots are free before each
      // box and while they wait for it. A thread takes (chunk j, token) pairs and one half of the chunk (`half`):
      // dims f .. f + 3 (f = 8 j + 4 half, two words, 8 bytes) and their partners 32 on, of the token's `group`
      // rows, four sincosf, then a row at a time: 2 loads, 2 rotate_pair2, 2 stores (W2: 92.1 us alone against
      // 94.7 with a word a thread and two rows in flight). At g8 warp j holds chunk j of 16 tokens; token k
      // starts at head k % group, so a half-warp's 8 tokens and 2 halves hit 16 different 8-byte slots of the
      // swizzled rows.
      const int half = tid & 1;  // which word pair of a chunk's four words
      if (tid == kQLoader) tma_prefetch_map(&q_map);
      for (int b = 0; b < n_blocks; ++b) {
        const int buf = b & 1, b0 = b * tpb;
        if (tid == kQLoader && b >= 2) {
          mbarrier_wait(qempty0 + 8 * buf, ((b >> 1) & 1) ^ 1);
          mbarrier_arrive_expect_tx(qfull0 + 8 * buf, q_bytes);
          tma_load_3d(sq_addr + buf * kQBytes, &q_map, 0, g * group, static_cast<int>(t0) + b0, qfull0 + 8 * buf);
        }
        __syncwarp();
        if (tid < kKvLoaders) {
          load_tiles(false);
          while (__shfl_sync(0xffffffffu, mbarrier_test_wait(qfull0 + 8 * buf, (b >> 1) & 1) ? 1 : 0, 0) == 0)
            load_tiles(false);
        }
        mbarrier_wait(qfull0 + 8 * buf, (b >> 1) & 1);
        const uint32_t buf_addr = sq_addr + buf * kQBytes;
        for (int v = tid >> 1; v < 4 * tpb; v += 64) {  // v = chunk j x tpb + token
          const int j = v / tpb, tok = v - j * tpb;
          if (b0 + tok >= n_tok) continue;
          const int32_t pos = tab.tok_last[b0 + tok];
          const int f = 8 * j + 4 * half;  // dims f .. f + 3: words f / 2 and f / 2 + 1 of chunk j
          float c[8];
#pragma unroll
          for (int k = 0; k < 4; ++k) rope_cos_sin(pos, p.q_inv_freq[f + k], p.q_rope_scale, c[2 * k], c[2 * k + 1]);
          const int h0 = tok % group, row0 = tok * group;
          const uint32_t tok_addr = buf_addr + row0 * 128 + half * 8;
          for (int hh = 0; hh < group; ++hh) {
            const int h = hh + h0 < group ? hh + h0 : hh + h0 - group;  // (hh + tok) % group
            const uint32_t a0 = tok_addr + h * 128 + ((j ^ ((row0 + h) & 7)) << 4), a1 = a0 ^ 64u;
            uint32_t x0, x1, y0, y1, z0, z1, u0, u1;
            asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];\n" : "=r"(x0), "=r"(x1) : "r"(a0));
            asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];\n" : "=r"(y0), "=r"(y1) : "r"(a1));
            rope_rotate_pair2(x0, y0, c[0], c[1], c[2], c[3], z0, u0);
            rope_rotate_pair2(x1, y1, c[4], c[5], c[6], c[7], z1, u1);
            asm volatile("st.shared.v2.b32 [%0], {%1, %2};\n" ::"r"(a0), "r"(z0), "r"(z1));
            asm volatile("st.shared.v2.b32 [%0], {%1, %2};\n" ::"r"(a1), "r"(u0), "r"(u1));
          }
        }
        fence_proxy_async_smem();  // the generic writes, seen by wgmma's reads
        __syncwarp();
        if (buf == 0)  // constant barrier ids
          named_barrier_arrive(4, 128 * (1 + kConsumers));
        else
          named_barrier_arrive(5, 128 * (1 + kConsumers));
      }
      if (tid < kKvLoaders) load_tiles(true);
    } else if (tid < kKvLoaders) {
      load_tiles(true);
    } else if (tid == kQLoader) {
      tma_prefetch_map(&q_map);
      for (int b = 2; b < n_blocks; ++b) {  // boxes 0 and 1 went out with the barriers' init (kQEarly)
        const int buf = b & 1;
        mbarrier_wait(qempty0 + 8 * buf, ((b >> 1) & 1) ^ 1);
        mbarrier_arrive_expect_tx(qfull0 + 8 * buf, q_bytes);
        tma_load_3d(sq_addr + buf * kQBytes, &q_map, 0, g * group, static_cast<int>(t0) + b * tpb, qfull0 + 8 * buf);
      }
    }
    cp_async_wait<0>();  // no thread leaves with copies in flight
    return;
  }

  setmaxnreg_inc<kConsumerRegisters>();
  const int ct = tid - 128, warp = ct / 32, lane = tid % 32;  // warp: 0 .. 4 kConsumers - 1
  const int r0 = warp * 16 + lane / 4, r1 = r0 + 8, q4 = lane % 4;
  // This warpgroup's 64 rows within a Q buffer; the index read from lane 0 is warp-uniform to the compiler,
  // so Q's wgmma descriptors live in uniform registers.
  const int wg = __shfl_sync(0xffffffffu, warp / 4, 0);
  const uint32_t q_row_off = wg * 64 * 128;
  // This warpgroup's tokens within a block, and whether all its 64 rows hold (token, head) pairs.
  const int wg_tok_lo = wg * 64 / group, wg_tok_hi = min((wg * 64 + 63) / group, tpb - 1);
  const bool wg_rows_full = wg * 64 + 63 < tpb * group;
  int released = 0;                                  // list indices below this were released by this warp
  int acquired = 0;                                  // and below this waited for
  auto release_to = [&](int j_end) {
    for (; released < j_end; ++released)
      if (lane == 0) mbarrier_arrive(empty0 + 8 * (released % kStages));
  };
  auto acquire = [&](int j) {  // tile j of the list, waited for once (passes take tiles in list order)
    if (j >= acquired) {
      mbarrier_wait(full0 + 8 * (j % kStages), (j / kStages) & 1);
      fence_proxy_async_smem();  // the landed copies, seen through the barrier, made visible to wgmma's reads
      acquired = j + 1;
    }
    return skv_addr + (j % kStages) * kStageBytes;
  };

  // RoPE by the consumers (kGroup = 8): this lane's frequencies, dims 2 (lane % 16) and + 1.
  const float freq0 = kConsumerRope && p.q_inv_freq != nullptr ? p.q_inv_freq[2 * (lane % 16)] : 0.f;
  const float freq1 = kConsumerRope && p.q_inv_freq != nullptr ? p.q_inv_freq[2 * (lane % 16) + 1] : 0.f;
  float sink_row[2];  // the sinks of this lane's two rows (log2 units): a row's head is the same in every block
#pragma unroll
  for (int h = 0; h < 2; ++h) sink_row[h] = attention_sink_log2(p.sinks, g * group + (h == 0 ? r0 : r1) % group);
  // Lane L's cos and sin for block bb: dims 2 (L % 16), + 1 of the warp's first token (L < 16) or its second.
  const bool consumer_rope = kConsumerRope && p.q_inv_freq != nullptr;
  auto cos_sin_of = [&](int bb, float (&cs)[4]) {
    const int tl = bb * tpb + (lane < 16 ? r0 : r1) / 8;
    const int32_t pos = tl < n_tok ? tab.tok_last[tl] : 0;
    rope_cos_sin(pos, freq0, p.q_rope_scale, cs[0], cs[1]);
    rope_cos_sin(pos, freq1, p.q_rope_scale, cs[2], cs[3]);
  };
  float own_next[4] = {0.f, 0.f, 0.f, 0.f};  // the next block's
  if (consumer_rope) cos_sin_of(0, own_next);
  for (int b = 0; b < n_blocks; ++b) {
    bool next_done = b + 1 >= n_blocks || !consumer_rope;  // own_next holds block b + 1's
    const int buf = b & 1;
    if (ct % (128 * kConsumers / kStorers) == 0 && b > 0) {  // the block before's O store has read its buffer
      tma_store_wait_read();
      mbarrier_arrive(qempty0 + 8 * (buf ^ 1));
    }
    const uint32_t q_addr = sq_addr + buf * kQBytes + q_row_off;
    const int b0 = b * tpb;
    if (kConsumerRope && p.q_inv_freq != nullptr) {
      // This warp's 16 rows: rows r0 are token r0 / 8 of the block, rows r1 the next.
      float own[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) own[i] = own_next[i];
      mbarrier_wait(qfull0 + 8 * buf, (b >> 1) & 1);
      uint32_t qf[kHd / 16][4];
      const int m = lane / 8, row = warp * 16 + (m % 2) * 8 + lane % 8;  // ldmatrix's and stmatrix's row
      const uint32_t row_addr = sq_addr + buf * kQBytes + row * 128;
#pragma unroll
      for (int kc = 0; kc < kHd / 16; ++kc)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(qf[kc][0]), "=r"(qf[kc][1]), "=r"(qf[kc][2]), "=r"(qf[kc][3])
                     : "r"(row_addr + (((kc * 2 + m / 2) ^ (row & 7)) << 4)));
      // Fragment register e of k step kc: dims d, d + 1 (d = 16 kc + 8 (e / 2) + 2 q4) of row r0 (even e) or r1; k
      // step kc + 2 holds their partners.
#pragma unroll
      for (int kc = 0; kc < kHd / 32; ++kc)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int d = 16 * kc + 8 * (e >> 1) + 2 * q4, src = 16 * (e & 1) + d / 2;
          const float c0 = __shfl_sync(0xffffffffu, own[0], src), s0 = __shfl_sync(0xffffffffu, own[1], src);
          const float c1 = __shfl_sync(0xffffffffu, own[2], src), s1 = __shfl_sync(0xffffffffu, own[3], src);
          rope_rotate_pair2(qf[kc][e], qf[kc + kHd / 32][e], c0, s0, c1, s1, qf[kc][e], qf[kc + kHd / 32][e]);
        }
#pragma unroll
      for (int kc = 0; kc < kHd / 16; ++kc)
        stmatrix_x4(row_addr + (((kc * 2 + m / 2) ^ (row & 7)) << 4), qf[kc][0], qf[kc][1], qf[kc][2], qf[kc][3]);
      fence_proxy_async_smem();  // the generic writes, seen by wgmma's reads
      if (wg == 0)  // constant barrier ids
        named_barrier_sync(2, 128);
      else
        named_barrier_sync(3, 128);
    } else if (p.q_inv_freq != nullptr) {  // rotated by the producer warpgroup
      if (buf == 0)
        named_barrier_sync(4, 128 * (1 + kConsumers));
      else
        named_barrier_sync(5, 128 * (1 + kConsumers));
    } else {
      mbarrier_wait(qfull0 + 8 * buf, (b >> 1) & 1);
    }
    const int tl0 = r0 / group < tpb && b0 + r0 / group < n_tok ? b0 + r0 / group : -1;
    const int tl1 = r1 / group < tpb && b0 + r1 / group < n_tok ? b0 + r1 / group : -1;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
    float o[kHd / 2];
    // 144 keys from key kb as one score tile: NA from the end of tile `ta_addr`, 64 of `tb_addr`, 80 - NA from
    // the start of `tc_addr`; one max, one sum, no rescale; only the first and last 16-key groups are masked
    // (every row's first key lies in the first, its last in the last). O is written here from zero, so its
    // registers are free while the score tile is live.
    auto one_tile = [&]<int NA>(uint32_t ta_addr, uint32_t tb_addr, uint32_t tc_addr, int kb, int f0, int l0,
                                int f1, int l1) {
      constexpr int NC = 80 - NA;
      float s[72], corr[2];
      uint32_t pa[9][4];
      wgmma_fence();
      attn_qk_issue<NA, kHd>(*reinterpret_cast<float(*)[NA / 2]>(&s[0]), q_addr, ta_addr + (64 - NA) * 128);
      attn_qk_issue<64, kHd>(*reinterpret_cast<float(*)[32]>(&s[NA / 2]), q_addr, tb_addr);
      attn_qk_issue<NC, kHd>(*reinterpret_cast<float(*)[NC / 2]>(&s[NA / 2 + 32]), q_addr, tc_addr);
      wgmma_wait<0>();
      wgmma_fence_regs(s);
      const int c0 = kb + 2 * q4, c8 = kb + 128 + 2 * q4;
      attn_mask_cols<16, kMaskLeft>(*reinterpret_cast<float(*)[8]>(&s[0]), f0 - c0, l0 - c0, f1 - c0, l1 - c0);
      attn_mask_cols<16, kMaskRight>(*reinterpret_cast<float(*)[8]>(&s[64]), f0 - c8, l0 - c8, f1 - c8, l1 - c8);
      attn_softmax_weights<144>(s, m_run, l_run, corr, kMaskNone, kb, q4, f0, l0, f1, l1, p.scale_log2);
      attn_pack_p<144>(s, pa);
#pragma unroll
      for (int i = 0; i < kHd / 2; ++i) o[i] = 0.f;
      wgmma_fence_regs(o);
      pin_fragments(pa);
      wgmma_fence();
      const uint64_t dva = wgmma_desc_mn128(ta_addr + kTileBytes, kKt * 128);
      const uint64_t dvb = wgmma_desc_mn128(tb_addr + kTileBytes, kKt * 128);
      const uint64_t dvc = wgmma_desc_mn128(tc_addr + kTileBytes, kKt * 128);
#pragma unroll
      for (int kk = 0; kk < NA / 16; ++kk)
        wgmma_bf16_rs_mn64(o, pa[kk], attn_desc_advance(dva, (64 - NA + 16 * kk) * 128));
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) wgmma_bf16_rs_mn64(o, pa[NA / 16 + kk], attn_desc_advance(dvb, 16 * kk * 128));
#pragma unroll
      for (int kk = 0; kk < NC / 16; ++kk)
        wgmma_bf16_rs_mn64(o, pa[NA / 16 + 4 + kk], attn_desc_advance(dvc, 16 * kk * 128));
      wgmma_commit();
      if (!next_done) {  // the next block's cos / sin while the P V wgmmas run
        cos_sin_of(b + 1, own_next);
        next_done = true;
      }
      wgmma_wait<0>();
      wgmma_fence_regs(o);
    };
    // The fast case: all of this warpgroup's rows in one pass whose keys make exactly 9 16-key groups over 3
    // tiles of the pass, and every row sees the 7 inner groups whole (every steady-state block of a 128-key
    // window at g8). Only in a block of one pass: the fast case releases the ring's tiles up to its own pass
    // alone, so in a block of two passes (a sequence's last tokens, then the next one's first) the other
    // warpgroup's later pass could wait for a slot this warpgroup never frees while it waits at the block's
    // barrier (8 sequences of 1,028 tokens hung so), and a fast pass after the block's first would free tiles
    // it never waited for.
    bool done = false;
    if (wg_rows_full && tab.block_pass[b + 1] == tab.block_pass[b] + 1) {
      for (int ps = tab.block_pass[b]; ps < tab.block_pass[b + 1]; ++ps) {
        const int start = tab.pass_start[ps], end = tab.pass_start[ps + 1];
        const int a = b0 + wg_tok_lo, z = b0 + wg_tok_hi;
        if (start > a || end <= z) continue;
        const int tlo = tab.pass_tlo[ps], tiles = tab.pass_tiles[ps], jlo = tab.pass_jlo[ps];
        const int kmin_w = tab.tok_first[a], kmax_w = tab.tok_last[z], g0 = kmin_w / 16, ta = kmin_w / kKt - tlo;
        // Only the edge groups need masks: every row's first key in group 0 (or at group 1's start), its last
        // in group 8 (or at group 7's end).
        const bool edges = tab.tok_first[z] <= 16 * g0 + 16 && tab.tok_last[a] >= 16 * g0 + 127;
        if (kmax_w / 16 - g0 != 8 || ta + 3 > tiles || !edges) break;
        release_to(jlo);
        for (int i = 0; i < ta + 3; ++i) acquire(jlo + i);
        const uint32_t a0 = skv_addr + ((jlo + ta) % kStages) * kStageBytes;
        const uint32_t a1 = skv_addr + ((jlo + ta + 1) % kStages) * kStageBytes;
        const uint32_t a2 = skv_addr + ((jlo + ta + 2) % kStages) * kStageBytes;
        const int f0 = tab.tok_first[tl0], l0 = tab.tok_last[tl0], f1 = tab.tok_first[tl1], l1 = tab.tok_last[tl1];
        switch (g0 % 4) {
          case 0: one_tile.template operator()<64>(a0, a1, a2, g0 * 16, f0, l0, f1, l1); break;
          case 1: one_tile.template operator()<48>(a0, a1, a2, g0 * 16, f0, l0, f1, l1); break;
          case 2: one_tile.template operator()<32>(a0, a1, a2, g0 * 16, f0, l0, f1, l1); break;
          default: one_tile.template operator()<16>(a0, a1, a2, g0 * 16, f0, l0, f1, l1); break;
        }
        done = true;
        break;
      }
    }
    if (!done) {
#pragma unroll
      for (int i = 0; i < kHd / 2; ++i) o[i] = 0.f;
      bool o_empty = true;  // until the block's first P V: its rescale of a zero O is skipped
      for (int ps = tab.block_pass[b]; ps < tab.block_pass[b + 1]; ++ps) {
        const int start = tab.pass_start[ps], end = tab.pass_start[ps + 1];
        const int tlo = tab.pass_tlo[ps], tiles = tab.pass_tiles[ps], jlo = tab.pass_jlo[ps];
        release_to(jlo);
        // A row outside this pass sees nothing here (empty range [1, 0]).
        const bool in0 = tl0 >= start && tl0 < end, in1 = tl1 >= start && tl1 < end;
        const int f0 = in0 ? tab.tok_first[tl0] : 1, l0 = in0 ? tab.tok_last[tl0] : 0;
        const int f1 = in1 ? tab.tok_first[tl1] : 1, l1 = in1 ? tab.tok_last[tl1] : 0;
        // One tile's (or sub-tile's: KT keys from key k0 at byte `row_off` of the tile) QK, softmax and P V.
        auto step = [&]<int KT>(uint32_t got, uint32_t row_off, int k0, int sides) {
          float s[KT / 2], corr[2];
          uint32_t pa[KT / 16][4];
          wgmma_fence();
          attn_qk_issue<KT, kHd>(s, q_addr, got + row_off);
          wgmma_wait<0>();
          wgmma_fence_regs(s);
          attn_softmax_weights<KT>(s, m_run, l_run, corr, sides, k0, q4, f0, l0, f1, l1, p.scale_log2);
          if (!o_empty) attn_rescale_o<kHd>(o, corr);
          o_empty = false;
          attn_pack_p<KT>(s, pa);
          attn_pv<KT, kHd>(o, pa, got + kTileBytes + row_off);
        };
        // This warpgroup's tokens in the pass, [a, z] (empty: a > z), and the keys they see, [kmin_w, kmax_w]
        // (first and last grow along a pass). Of each tile the warpgroup computes only the 16-key groups that
        // hold those keys: an 8-token warpgroup's 135 keys take 144 (9 groups), not 3 whole tiles' 192. Keys
        // every row of the warpgroup sees, [fmax, lmin] when all its rows are in this pass: groups inside them
        // go unmasked, the edge groups masked on one side.
        const int a = max(start, b0 + wg_tok_lo), z = min(end - 1, b0 + wg_tok_hi);
        const bool wg_whole = wg_rows_full && a == b0 + wg_tok_lo && z == b0 + wg_tok_hi;
        const int kmin_w = a <= z ? tab.tok_first[a] : 1, kmax_w = a <= z ? tab.tok_last[z] : 0;
        const int fmax = wg_whole ? tab.tok_first[z] : INT_MAX, lmin = wg_whole ? tab.tok_last[a] : -1;
        for (int i = 0; i < tiles; ++i) {
          const uint32_t got = acquire(jlo + i);
          const int k0 = (tlo + i) * kKt, lo = max(k0, kmin_w), hi = min(k0 + kKt - 1, kmax_w);
          if (lo > hi) continue;
          const int g_lo = (lo - k0) / 16, groups = (hi - k0) / 16 - g_lo + 1, ks = k0 + 16 * g_lo;
          const uint32_t off = static_cast<uint32_t>(g_lo) * 16 * 128;
          switch (groups) {
            case 4: step.template operator()<64>(got, off, ks, attn_mask_sides(ks, 64, fmax, lmin)); break;
            case 3: step.template operator()<48>(got, off, ks, attn_mask_sides(ks, 48, fmax, lmin)); break;
            case 2: step.template operator()<32>(got, off, ks, attn_mask_sides(ks, 32, fmax, lmin)); break;
            default: step.template operator()<16>(got, off, ks, attn_mask_sides(ks, 16, fmax, lmin)); break;
          }
        }
      }
    }
    // O, normalised (the sink joins the denominator; ex2.approx and one fast division: far below bf16's
    // rounding), over this block's Q buffer: the warp's own QKs are done with it, and the barrier below holds
    // the store until every warp's are. Rows without a (token, head) pair (tl < 0) lie outside the box or past
    // the last token, which the store leaves out.
    {
      uint8_t* so = sq + buf * kQBytes;
      float factor[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float l = l_run[h];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        // A row without a (token, head) pair has m_run = -inf and l = 0: factor 0 (written, never stored).
        const float m_f = fmaxf(m_run[h], sink_row[h]);
        factor[h] = 0.f;
        if (m_f != -INFINITY) {
          const float scale = exp2_ftz(m_run[h] - m_f), denom = l * scale + exp2_ftz(sink_row[h] - m_f);
          factor[h] = denom > 0.f ? __fdividef(scale, denom) : 0.f;
        }
      }
      // By stmatrix, 4 a warp (ncu: the 16 4-byte stores a lane and their swizzle arithmetic were ~10% of the
      // epilogue's instructions; 8K 79.6 -> 75.0 us): store i writes the 8 x 8 blocks (head dims 16 i.., rows
      // 16 w..), (16 i.., 16 w + 8..), (16 i + 8.., 16 w..), (16 i + 8.., 16 w + 8..) of this warp w; lane t
      // gives row t % 8 of block t / 8, whose 16 bytes are swizzled chunk 2 i + t / 16 of that row.
      const int row = warp * 16 + 8 * ((lane >> 3) & 1) + (lane & 7);
      const uint32_t row_addr = smem_addr(so) + row * 128;
#pragma unroll
      for (int i = 0; i < kHd / 16; ++i)
        stmatrix_x4(row_addr + (((2 * i + (lane >> 4)) ^ (lane & 7)) << 4),
                    pack_bf16x2(o[8 * i] * factor[0], o[8 * i + 1] * factor[0]),
                    pack_bf16x2(o[8 * i + 2] * factor[1], o[8 * i + 3] * factor[1]),
                    pack_bf16x2(o[8 * i + 4] * factor[0], o[8 * i + 5] * factor[0]),
                    pack_bf16x2(o[8 * i + 6] * factor[1], o[8 * i + 7] * factor[1]));
      fence_proxy_async_smem();  // the generic writes, seen by the TMA engine's reads
      if (!next_done) cos_sin_of(b + 1, own_next);  // a block not in the fast case: here, before the barrier
      if constexpr (!kWgStore)
        named_barrier_sync(1, 128 * kConsumers);
      else if (wg == 0)  // constant barrier ids
        named_barrier_sync(2, 128);
      else
        named_barrier_sync(3, 128);
      if (ct % (128 * kConsumers / kStorers) == 0) {
        tma_store_3d(&o_map, smem_addr(so) + (kWgStore ? q_row_off : 0), 0, g * group,
                     static_cast<int>(t0) + b * tpb + (kWgStore ? wg * (tpb / 2) : 0));
        tma_store_commit();
      }
    }
  }
  release_to(n_list);
  if (ct % (128 * kConsumers / kStorers) == 0) tma_store_wait_read();  // smem stays until the last store read it
#endif  // MX_SM90A
}

// Blocks per CTA: as few as keep the grid within one wave of two CTAs per SM (every block of a window
// costs about the same; a CTA walks one kv head, so each head gets an equal share of the CTA slots),
// within the CTA's tables.
int blocks_per_cta(int64_t tokens, int64_t tpb, int64_t n_kv, int sm_count) {
  const int64_t per_head = std::max<int64_t>(1, 2 * static_cast<int64_t>(std::max(sm_count, 1)) / n_kv);
  return static_cast<int>(std::clamp<int64_t>(ceil_div64(ceil_div64(tokens, tpb), per_head), 1, kMaxTok / tpb));
}

}  // namespace

Status launch_attention_prefill_wgmma_window(const AttentionKernelParams& p, const AttentionWindowWgmmaConfig& c,
                                             cudaStream_t stream) {
  if (!c.enabled) return unimplemented("attention prefill wgmma (windows): needs sm_90 and head_dim 64");
  if (p.head_dim != kHd) return unimplemented("attention prefill wgmma (windows): head_dim must be 64");
  if (p.n_kv <= 0 || p.n_q % p.n_kv != 0) return invalid_argument("attention: n_q must be a multiple of n_kv");
  if (c.threads != kThreads || c.smem_bytes != attention_window_wgmma_smem_bytes())
    return internal_error("attention prefill wgmma (windows): config does not match the kernel");
  if (p.n_q / p.n_kv > kRows)
    return unimplemented("attention prefill wgmma (windows): more q heads per kv head than rows");
  if (!attention_window_wgmma_takes(p.window, p.n_q / p.n_kv))
    return unimplemented("attention prefill wgmma (windows): a block's keys do not fit the ring (window too long)");
  if (p.tokens == 0) return Status::ok();
  auto kernel =
      p.n_q / p.n_kv == 8 ? attention_prefill_wgmma_window_kernel<8> : attention_prefill_wgmma_window_kernel<0>;
  MX_RETURN_IF_ERROR(cuda_status(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(c.smem_bytes)),
      "cudaFuncSetAttribute(attention wgmma window smem)"));
  // The whole carveout as shared memory, so that two CTAs' rings fit an SM.
  MX_RETURN_IF_ERROR(cuda_status(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                                      static_cast<int>(cudaSharedmemCarveoutMaxShared)),
                                 "cudaFuncSetAttribute(attention wgmma window carveout)"));
  // Grid: x = CTAs of blocks_per_cta blocks of 128 / group tokens, y = kv heads.
  const int64_t group = p.n_q / p.n_kv, tpb = std::max<int64_t>(1, kRows / group);
  const int bpc = blocks_per_cta(p.tokens, tpb, p.n_kv, c.sm_count);
  const dim3 grid(static_cast<unsigned>(ceil_div64(p.tokens, tpb * bpc)), static_cast<unsigned>(p.n_kv));
  // Q as [tokens][n_q][64]; a block's box: tpb tokens x the kv head's `group` q heads x 64 dims, its rows in the
  // order the consumers' rows take them (token-major).
  // With RoPE in the Q load, Q's rows are the q|k|v projection's (q_stride apart).
  const int64_t q_stride = p.q_stride > 0 ? p.q_stride : p.n_q * kHd;
  if (q_stride < p.n_q * kHd || q_stride % 8 != 0)
    return invalid_argument("attention prefill wgmma (windows): q rows must hold n_q heads, 16-byte aligned");
  CUtensorMap q_map{};
  MX_RETURN_IF_ERROR(encode_bf16_tensor_map_3d(
        &q_map, p.q, {static_cast<uint64_t>(kHd), static_cast<uint64_t>(p.n_q), static_cast<uint64_t>(p.tokens)},
        {static_cast<uint64_t>(kHd) * 2, static_cast<uint64_t>(q_stride) * 2},
        {static_cast<uint32_t>(kHd), static_cast<uint32_t>(group), static_cast<uint32_t>(tpb)}));
  CUtensorMap o_map{};  // the output in the same boxes; at g8 half boxes (each consumer warpgroup's 8 tokens)
  MX_RETURN_IF_ERROR(encode_bf16_tensor_map_3d(
      &o_map, p.out, {static_cast<uint64_t>(kHd), static_cast<uint64_t>(p.n_q), static_cast<uint64_t>(p.tokens)},
      {static_cast<uint64_t>(kHd) * 2, static_cast<uint64_t>(p.n_q) * kHd * 2},
      {static_cast<uint32_t>(kHd), static_cast<uint32_t>(group), static_cast<uint32_t>(group == 8 ? tpb / 2 : tpb)}));
  // A programmatic dependent of qkv_rope (the kernel waits before it reads Q, K or V). It does not trigger its
  // own dependents early: o_proj after it is a plain cuBLASLt launch.
  return cuda_status(launch_pdl(kernel, grid, dim3(kThreads), c.smem_bytes, stream, p, bpc, q_map, o_map),
                     "attention_prefill_wgmma_window_kernel");
}

}  // namespace mx::cuda
