// Gemma-4's per-head q/k/v RMSNorms and RoPE with the paged KV write in one kernel (QkvRopeParams with
// norm_eps > 0): at decode the two were separate launches of ~1.5 us each per layer, and the norms wrote
// the whole q|k|v row back only for RoPE to read it again. Grid: (token, group of 8 heads), one warp per
// head: the warp holds its head's row in registers for the sum of squares, puts the normed row (fp32) in
// shared memory for the half rotation's partner elements, and writes 16 bytes per lane access. cos/sin as
// rope.cu computes them (fp32 angle, precise sincosf); v heads are normed and copied, not rotated.
// At decode the kernel also pulls the weight the step reads after the attention (o_proj) into the L2
// (GemmaQkvNormRopeParams::prefetch): this kernel and the attention leave HBM idle for ~10 us a layer at one token,
// and the o_proj GEMV then reads its weight from the L2 instead of HBM.
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels/gemma_kernels.h"
#include "backend/cuda/kernels/head_rows.cuh"

namespace mx::cuda {
namespace {

constexpr int kWarps = 8;       // heads per CTA
constexpr int kMaxHalf = 256;   // head_dim <= 512 (Gemma-4's full layers)
constexpr int kMaxChunks = 2;   // 8-element chunks per lane: 32 * 2 * 8 = 512
constexpr int64_t kPrefetchChunk = 16 << 10;  // bytes per bulk L2 prefetch: ~1,500 for o_proj's 23 MB

// This thread's share of [base, base + bytes) as bulk L2 prefetches of kPrefetchChunk bytes (the last one shorter),
// chunk i to thread i % threads: fire and forget, nothing waits for them.
__device__ __forceinline__ void prefetch_l2_share(const void* base, int64_t bytes, int64_t thread, int64_t threads) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const auto* p = static_cast<const char*>(base);
  for (int64_t off = thread * kPrefetchChunk; off < bytes; off += threads * kPrefetchChunk) {
    const auto size = static_cast<uint32_t>(bytes - off < kPrefetchChunk ? bytes - off : kPrefetchChunk);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + off), "r"(size) : "memory");
  }
#else
  (void)base, (void)bytes, (void)thread, (void)threads;
#endif
}

__global__ void __launch_bounds__(kWarps * 32) gemma_qkv_norm_rope_kernel(GemmaQkvNormRopeParams p) {
  __shared__ float cos_t[kMaxHalf], sin_t[kMaxHalf];
  __shared__ float normed[kWarps][2 * kMaxHalf];
  const int64_t t = blockIdx.x;
  const int hd = static_cast<int>(p.head_dim), half = hd / 2, chunks = hd / 8;
  const int heads = static_cast<int>(p.n_q + 2 * p.n_kv);
  // Only qkv comes from the kernel before (the projection). The position, the rope table, the cache slot
  // (positions and pages come from the step's staging) and the norm weights are ready before the wait:
  // after it, as before, they were three dependent round trips to memory and the sincosf on every layer's path.
  const int32_t pos = p.kv.positions[t];
  rope_table(cos_t, sin_t, half, pos, p.inv_freq, p.rope_scale);
  __syncthreads();  // the last barrier: warps whose head is past the end may leave below
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int h = static_cast<int>(blockIdx.y) * kWarps + warp;
  const bool is_q = h < p.n_q, is_k = !is_q && h < p.n_q + p.n_kv;
  const uint16_t* weight = is_q ? p.q_norm : is_k ? p.k_norm : nullptr;
  const int64_t slot = h < heads ? kv_row(p.kv, t, pos, p.n_kv) : -1;
  const bool cache_ok = slot >= 0;
  uint4 weight_raw[kMaxChunks] = {};
#pragma unroll
  for (int c = 0; c < kMaxChunks; ++c) {
    const int i = lane + 32 * c;
    if (i >= chunks) break;
    if (weight && h < heads) weight_raw[c] = reinterpret_cast<const uint4*>(weight)[i];
  }
  if (p.prefetch_bytes > 0) {
    const int64_t threads = static_cast<int64_t>(gridDim.x) * gridDim.y * blockDim.x;
    const int64_t thread = (static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x) * blockDim.x + threadIdx.x;
    prefetch_l2_share(p.prefetch, p.prefetch_bytes, thread, threads);
  }
  pdl_wait();
  pdl_launch_dependents();
  if (h >= heads) return;

  float v[kMaxChunks][8];
  const float sum_sq = load_head_row(p.qkv + (t * heads + h) * hd, chunks, v);
  const float inv = rsqrtf(sum_sq / static_cast<float>(hd) + p.eps);
  float* row = normed[warp];
#pragma unroll
  for (int c = 0; c < kMaxChunks; ++c) {
    const int i = lane + 32 * c;
    if (i >= chunks) break;
    float w[8] = {1.f, 1.f, 1.f, 1.f, 1.f, 1.f, 1.f, 1.f};
    if (weight) {
      const uint16_t* ws = reinterpret_cast<const uint16_t*>(&weight_raw[c]);
#pragma unroll
      for (int j = 0; j < 8; ++j) w[j] = bf16_bits_to_f32(ws[j]);
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      v[c][j] = w[j] * (v[c][j] * inv);
      row[8 * i + j] = v[c][j];
    }
  }
  __syncwarp();
  uint16_t* dst = is_q ? p.q_out + (t * p.n_q + h) * hd
                  : is_k ? (cache_ok ? p.kv.k + (slot + (h - p.n_q)) * hd : nullptr)
                         : (cache_ok ? p.kv.v + (slot + (h - p.n_q - p.n_kv)) * hd : nullptr);
  if (!dst) return;  // a token without a cache slot (validated on the host; never written out of bounds)
#pragma unroll
  for (int c = 0; c < kMaxChunks; ++c) {
    const int i = lane + 32 * c;
    if (i >= chunks) break;
    uint16_t o[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int e = 8 * i + j;
      float y = v[c][j];
      if (is_q || is_k) {
        // NeoX half rotation: (a, b) = (x[e], x[e + half]) -> (a cos - b sin, b cos + a sin).
        y = e < half ? y * cos_t[e] - row[e + half] * sin_t[e] : y * cos_t[e - half] + row[e - half] * sin_t[e - half];
      }
      o[j] = f32_to_bf16_bits(y);
    }
    reinterpret_cast<uint4*>(dst)[i] = *reinterpret_cast<const uint4*>(o);
  }
}

}  // namespace

Status launch_gemma_qkv_norm_rope(const GemmaQkvNormRopeParams& p, cudaStream_t stream) {
  if (p.head_dim < 8 || p.head_dim % 8 != 0 || p.head_dim > 2 * kMaxHalf)
    return unimplemented("qkv norms + rope: head_dim must be a multiple of 8 in [8, 512]");
  if (p.tokens == 0) return Status::ok();
  if (p.prefetch_bytes < 0 || p.prefetch_bytes % 16 != 0 || reinterpret_cast<uintptr_t>(p.prefetch) % 16 != 0)
    return invalid_argument("qkv norms + rope: the L2 prefetch needs 16-byte alignment and a multiple of 16 bytes");
  const int64_t groups = ceil_div64(p.n_q + 2 * p.n_kv, kWarps);
  if (groups > 65535) return unimplemented("qkv norms + rope: too many heads");
  const dim3 grid(static_cast<unsigned>(p.tokens), static_cast<unsigned>(groups));
  return cuda_status(launch_pdl(gemma_qkv_norm_rope_kernel, grid, dim3(kWarps * 32), 0, stream, p),
                     "gemma_qkv_norm_rope_kernel");
}

}  // namespace mx::cuda
