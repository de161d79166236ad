// Gemma-4's attention end (gemma_norms.cu: residual += the normed attention output, the dense MLP's and the
// experts' input norms) and its router (gemma_router.cu: the weightless norm of the new residual, x_scale, the
// logits, top-k, softmax, expert scales) in one launch at decode. Why: the router read the residual that the
// attention end had just written, so it waited for that grid and then for a round trip to L2, and the
// dense MLP's first GEMM waited for the router. H200, one token, us per call back to back (session 15 W2):
// attention end alone 1.72, then the router 5.79, both in this launch 5.08 (the router's share 4.07 -> 3.36).
// Session 16 W1 (the same bench, us per call): 5.09 -> 3.83 (the router's share 2.10) with the logits gathered
// by st.async instead of a cluster barrier (4.52 alone) and the fewer reductions (4.18 alone).
//
// One cluster of C CTAs (8 or 16) per token. Every CTA computes the token's new residual row (the attention
// output, the old residual and one norm weight: ~23 KB through L2 at hidden 2816), so it holds x in
// registers, and the logits of its E/C experts from it (their weight rows come into shared memory by
// cp.async.bulk before the PDL wait; a warp's 8 experts' partial sums in 9 shuffles, warp_sum8); each stores
// its logits into CTA 0's shared memory by st.async counted on CTA 0's mbarrier and is done. CTA 0, once its
// barrier has the bytes, picks the top-k (router_parts::select_topk) and stores the residual and the two normed
// rows. CTA 0 writes the residual only then: every CTA with experts has read the old one (its logits come from
// it).
// The attention end's outputs are bit for bit gemma_attention_end_kernel's (the same chunks, block sums and
// order); the logits are the router's up to fp32 rounding (the dot products sum in another order, and the
// router's norm reuses the residual's sum of squares).
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels/gemma_kernels.h"
#include "backend/cuda/kernels/gemma_router_parts.cuh"
#include "backend/cuda/kernels/gemma_row_parts.cuh"
#include "backend/cuda/kernels/mbarrier.cuh"

namespace mx::cuda {
namespace {

using namespace gemma_rows;
using namespace router_parts;

constexpr int kChunks = 2;           // 8-value chunks per thread: hidden <= 8 * 256 * 2 = 4096
constexpr int kMaxCtaExperts = 32;   // 256 experts over a cluster of 8
constexpr int kGroup = 8;            // experts whose partial sums a thread holds at once
constexpr int64_t kMaxWeightBytes = 200 * 1024;  // a CTA's weight rows in shared memory

struct Params {
  GemmaAttentionEndKernelParams end;
  GemmaRouterParams router;  // x, tickets and the kernel choices unused: x is the new residual
};

__global__ void __launch_bounds__(kRowThreads) gemma_attention_end_route_kernel(Params p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(16) uint16_t weight_rows[];  // [CTA's experts][hidden]
  __shared__ __align__(8) uint64_t weights_landed;
  __shared__ __align__(8) uint64_t logits_landed;  // CTA 0's: the other CTAs' logits landed
  __shared__ float2 scratch[kRowThreads / 32];
  __shared__ float row[kMaxExperts];     // CTA 0's: the token's logits from every CTA of the cluster
  __shared__ float scales[kMaxExperts];  // CTA 0's: the per-expert scales (with expert_scale)
  __shared__ float part[kRowThreads / 32][kMaxCtaExperts];
  const GemmaAttentionEndKernelParams& e = p.end;
  const GemmaRouterParams& r = p.router;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const bool lead = blockIdx.x == 0;
  const int64_t t = blockIdx.y, chunks = e.hidden / 8, base = t * e.hidden;
  const int64_t cta_experts = (r.experts + gridDim.x - 1) / gridDim.x, e_begin = blockIdx.x * cta_experts;
  const int n_experts = static_cast<int>(e_begin >= r.experts            ? 0
                                         : e_begin + cta_experts <= r.experts ? cta_experts
                                                                              : r.experts - e_begin);
  const uint32_t bar = smem_addr(&weights_landed);
  if (lead && tid == 0) {  // armed for the bytes of the other CTAs' logits
    mbarrier_init(smem_addr(&logits_landed), 1);
    mbarrier_init_fence();
    mbarrier_arrive_expect_tx(smem_addr(&logits_landed), static_cast<uint32_t>((r.experts - n_experts) * 4));
  }
  // Phase 0: once it completes every CTA runs, and CTA 0's row (and its barrier) may be written.
  cluster_arrive_relaxed();

  // Constants, in flight before the wait: the CTA's weight rows, CTA 0's expert scales, the norm weights,
  // x_scale; and the old residual, last written several kernels back (as gemma_norms.cu reads it).
  if (tid == 0) {
    const auto bytes = static_cast<uint32_t>(e.hidden * 2);
    mbarrier_init(bar, 1);
    mbarrier_init_fence();
    mbarrier_arrive_expect_tx(bar, bytes * static_cast<uint32_t>(n_experts));
    for (int i = 0; i < n_experts; ++i)
      bulk_copy(smem_addr(weight_rows + i * e.hidden), r.weight + (e_begin + i) * e.hidden, bytes, bar);
  }
  const bool smem_scales = lead && r.expert_scale != nullptr;
  if (smem_scales)
    for (int i = tid; i < r.experts; i += kRowThreads) scales[i] = expert_scale_at(r, i);
  uint4 w_attn[kChunks], w_mlp[kChunks], w_moe[kChunks];
  float res[kChunks][8], xs[kChunks][8];
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int64_t i = chunk_index(c, chunks);
    if (i < 0) break;
    w_attn[c] = load_raw8(e.post_attention_norm, i);
    if (lead) {
      w_mlp[c] = load_raw8(e.pre_mlp_norm, i);
      if (e.pre_moe_norm) w_moe[c] = load_raw8(e.pre_moe_norm, i);
    }
    load8(e.residual + base, i, res[c]);
    load8(r.x_scale, i, xs[c]);
  }
  __syncthreads();  // the barrier is initialized before anyone waits on it; the scales are in
  pdl_wait();       // the attention output comes from the kernel before
  pdl_launch_dependents();

  // gemma_attention_end_kernel's arithmetic: the residual plus the normed attention output, its sum of squares.
  float v[kChunks][8];
  float s = 0.f;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int64_t i = chunk_index(c, chunks);
    if (i < 0) break;
    load8(e.attn_out + base, i, v[c]);
    s += sum_sq(v[c]);
  }
  const float inv_attn = rsqrtf(block_sum2(s, 0.f, scratch).x / static_cast<float>(e.hidden) + e.eps);
  s = 0.f;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int64_t i = chunk_index(c, chunks);
    if (i < 0) break;
    float w[8];
    unpack8(w_attn[c], w);
#pragma unroll
    for (int j = 0; j < 8; ++j) v[c][j] = res[c][j] + w[j] * (v[c][j] * inv_attn);
    s += sum_sq(v[c]);
  }
  const float total_sq = block_sum2(s, 0.f, scratch).x;
  const float inv_res = rsqrtf(total_sq / static_cast<float>(e.hidden) + e.eps);
  const float inv_route = r.norm_eps > 0.f ? rsqrtf(total_sq / static_cast<float>(e.hidden) + r.norm_eps) : 1.f;

  // The router's dot products of x * x_scale with the CTA's experts, kGroup at a time: per thread over its
  // chunks, then per warp, then over the warps in order.
  float xz[kChunks][8];
#pragma unroll
  for (int c = 0; c < kChunks; ++c)
#pragma unroll
    for (int j = 0; j < 8; ++j) xz[c][j] = chunk_index(c, chunks) < 0 ? 0.f : v[c][j] * xs[c][j];
  mbarrier_wait(bar, 0);
  for (int e0 = 0; e0 < n_experts; e0 += kGroup) {
    float acc[kGroup];
#pragma unroll
    for (int g = 0; g < kGroup; ++g) acc[g] = 0.f;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int64_t i = chunk_index(c, chunks);
      if (i < 0) break;
#pragma unroll
      for (int g = 0; g < kGroup; ++g) {
        if (e0 + g >= n_experts) break;
        float w[8];
        unpack8(load_raw8(weight_rows + (e0 + g) * e.hidden, i), w);
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[g] = fmaf(xz[c][j], w[j], acc[g]);
      }
    }
    const float sum = warp_sum8(acc);  // lanes 4g hold expert e0 + g's
    if ((lane & 3) == 0 && e0 + lane / 4 < n_experts) part[warp][e0 + lane / 4] = sum;
  }
  __syncthreads();
  cluster_wait_acquire();  // phase 0
  if (tid < n_experts) {
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < kRowThreads / 32; ++w) sum += part[w][tid];
    const float logit = sum * inv_route;
    r.logits[t * r.experts + e_begin + tid] = logit;
    if (lead)
      row[e_begin + tid] = logit;  // warp 0's lanes: CTA 0 has at most 32 experts
    else
      store_async_to_cluster_rank(row + e_begin + tid, 0, logit, &logits_landed);
  }
  // Only CTA 0 waits, for the bytes on its barrier: once they are in, every CTA with experts has used the old
  // residual (its logits come from it; a CTA without any stores nothing).
  if (!lead) return;
  __syncwarp();
  mbarrier_wait(smem_addr(&logits_landed), 0);
  // Warp 0 picks the top-k first (the end of the critical path), then stores its chunks as the others do.
  if (warp == 0) select_topk(r, t, row, smem_scales ? scales : nullptr);
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int64_t i = chunk_index(c, chunks);
    if (i < 0) break;
    store8(e.residual + base, i, v[c]);
    store_weighted_norm(w_mlp[c], e.mlp_in + base, i, v[c], inv_res);
    if (e.pre_moe_norm) store_weighted_norm(w_moe[c], e.moe_in + base, i, v[c], inv_res);
  }
#endif
}

int64_t weight_bytes(const GemmaRouterParams& r, int ctas) { return ceil_div64(r.experts, ctas) * r.hidden * 2; }

}  // namespace

bool gemma_attention_end_route_fits(const GemmaAttentionEndKernelParams& end, const GemmaRouterParams& router) {
  const int ctas = router.cluster_ctas;
  return (ctas == 8 || ctas == 16) && end.rows >= 1 && end.rows <= 65535 && end.hidden == router.hidden &&
         end.hidden % 8 == 0 && end.hidden <= 8 * kRowThreads * kChunks && router.experts <= kMaxExperts &&
         ceil_div64(router.experts, ctas) <= kMaxCtaExperts && weight_bytes(router, ctas) <= kMaxWeightBytes &&
         router.top_k >= 1 && router.top_k <= kMaxTopK && router.top_k <= router.experts;
}

Status launch_gemma_attention_end_route(const GemmaAttentionEndKernelParams& end, const GemmaRouterParams& router,
                                        cudaStream_t stream) {
  if (!gemma_attention_end_route_fits(end, router))
    return unimplemented("gemma_attention_end_route: clusters of 8 or 16, hidden % 8 == 0 and <= 4096, the CTA's "
                         "router rows in shared memory, at most 256 experts and top-k <= 16");
  if (router.weight == nullptr || router.x_scale == nullptr || router.logits == nullptr)
    return invalid_argument("gemma_attention_end_route: a bf16 router weight, its x_scale and a logits buffer");
  const int64_t smem = weight_bytes(router, router.cluster_ctas);
  auto kernel = gemma_attention_end_route_kernel;
  MX_RETURN_IF_ERROR(cuda_status(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1),
                                 "cudaFuncSetAttribute(attention end route clusters)"));
  MX_RETURN_IF_ERROR(cuda_status(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
      "cudaFuncSetAttribute(attention end route smem)"));
  const unsigned ctas = static_cast<unsigned>(router.cluster_ctas);
  return cuda_status(launch_pdl_clusters(kernel, dim3(ctas, static_cast<unsigned>(end.rows)), dim3(kRowThreads),
                                         dim3(ctas), static_cast<size_t>(smem), stream, Params{end, router}),
                     "gemma_attention_end_route_kernel");
}

}  // namespace mx::cuda
