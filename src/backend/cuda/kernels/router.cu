// Router: fp32 logits of x W^T + b (bf16 products, fp32 accumulation), then top-k and a softmax over the
// k selected logits, ties to the lower expert index (the CPU twin's order).
// Small batches run one fused launch: CTA (expert block, token) computes 8 logits, and one CTA per token
// selects the top-k. With up to kMaxRouterClusterCtas expert blocks (gpt-oss-20b: 4 at 32 experts) a token's
// blocks are one CTA cluster, and after one cluster barrier its first CTA reads the others' logits from their
// shared memory: on an H200 (docs/PERF.md, session 15 W2) 4.60 -> 4.14 us at one token and 4.68 -> 4.17 at 8. With
// more blocks the last CTA of a token to finish (an atomic ticket, reset by that CTA so graph replays start from
// zero) reads them from global memory after a fence: 120b's 16 blocks as a cluster of 16 measured no faster at
// one token (4.70 vs 4.76 us) and slower at 8 (7.96 vs 5.32: a CTA per SM, 16 SMs of one GPC per cluster).
// Large batches take their logits from cuBLASLt and run the top-k kernel alone.
// add_rms_norm_route: the clustered form with the norm before it in the same launch (each CTA of the token's
// cluster computes the normed row itself): on an H200 (docs/PERF.md, session 16 W1) the norm and the router back
// to back in a graph 5.97 -> 5.61 us at one token, 6.22 -> 5.71 at 8. With more expert blocks (120b's 16) the same
// in the ticketed form: the token's last CTA stores the new residual (every CTA has read the old one by its ticket).
#include <climits>
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels/cluster.cuh"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/kernels.h"
#include "backend/cuda/kernels/norm_fusion_kernels.h"
#include "backend/cuda/kernels/row_norm.cuh"

namespace mx::cuda {
namespace {

constexpr int kExpertsPerCta = 8;
constexpr int kMaxExperts = 256;
constexpr int kMaxTopK = 16;
// Expert blocks of a token in one cluster at most (the sizes measured: 1 and 4).
constexpr int kMaxRouterClusterCtas = 4;
// The fused norm's rows (add_rms_norm_route): the norm's own limit.
constexpr int64_t kMaxNormHidden = 8 * kRowThreads * kMaxChunks;

// Warp-level top-k over `row` (length e_count, in shared or global memory), lane 0 writes the results.
__device__ void warp_topk(const float* row, int e_count, int top_k, int32_t* ids, float* weights) {
  const int lane = threadIdx.x % 32;
  constexpr int kPerLane = kMaxExperts / 32;
  float v[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + 32 * i;
    v[i] = e < e_count ? row[e] : -INFINITY;
  }
  float chosen[kMaxTopK];
  int chosen_id[kMaxTopK];
  for (int j = 0; j < top_k; ++j) {
    float best = -INFINITY;
    int best_id = INT_MAX;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int e = lane + 32 * i;
      if (e < e_count && (v[i] > best || (v[i] == best && e < best_id))) {
        best = v[i];
        best_id = e;
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int oid = __shfl_xor_sync(0xffffffffu, best_id, o);
      if (ob > best || (ob == best && oid < best_id)) {
        best = ob;
        best_id = oid;
      }
    }
    if (best_id == INT_MAX) best_id = j;  // NaN logits: keep the ids valid; the weights show the NaN
#pragma unroll
    for (int i = 0; i < kPerLane; ++i)
      if (lane + 32 * i == best_id) v[i] = -INFINITY;
    chosen[j] = best;
    chosen_id[j] = best_id;
  }
  if (lane != 0) return;
  float sum = 0.f;
  for (int j = 0; j < top_k; ++j) sum += expf(chosen[j] - chosen[0]);
  for (int j = 0; j < top_k; ++j) {
    ids[j] = chosen_id[j];
    weights[j] = expf(chosen[j] - chosen[0]) / sum;
  }
}

// NormRes void: the router of p.x. Else (add_rms_norm_route) the router's x is first made by add_rms_norm (`norm`:
// residual += delta, x = rms_norm(residual) * weight; NormRes the residual's element type): every CTA of the token
// computes the row (rms_norm_row's arithmetic: the same bits) into its shared memory, the first CTA also writes it
// to norm.out and, once every CTA has read the old residual (clustered: after the cluster barrier; else the last
// CTA by the ticket), the first CTA (clustered) or the last one stores the new residual.
template <bool kClustered, typename NormRes = void>
__global__ void __launch_bounds__(32 * kExpertsPerCta) router_topk_kernel(RouterKernelParams p, RmsNormParams norm) {
  constexpr bool kNorm = !std::is_void_v<NormRes>;
  static_assert(32 * kExpertsPerCta == kRowThreads, "the norm's CTA is the router's");
  const int64_t t = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t e = static_cast<int64_t>(blockIdx.x) * kExpertsPerCta + warp;
  const bool has_expert = e < p.experts;
  const uint4* w = reinterpret_cast<const uint4*>(p.weight + (has_expert ? e : 0) * p.hidden);
  const int64_t n = p.hidden / 8;
  __shared__ float block_logits[kExpertsPerCta];  // clustered: this CTA's logits, read by the cluster's first CTA
  // kNorm: the normed row (bf16 bits) the dot products read.
  __shared__ __align__(16) uint16_t normed_row[kNorm ? kMaxNormHidden : 8];
  // The weights are constant: the first kWeightsAhead 16-byte chunks of the lane's row (all of a row up to
  // hidden 4096) are requested before the wait, so their HBM round trip overlaps the norm before us and
  // only x's (L2) is left after it.
  constexpr int kWeightsAhead = 16;
  uint4 w_ahead[kWeightsAhead];
#pragma unroll
  for (int u = 0; u < kWeightsAhead; ++u)
    if (has_expert && lane + 32 * u < n) w_ahead[u] = w[lane + 32 * u];
  // The bias and the fused norm's weight too, where asked (constants; the same bits either way).
  const bool bias_ahead = p.bias_before_wait && has_expert && lane == 0;
  const uint16_t bias_bits = bias_ahead ? p.bias[e] : uint16_t{0};
  [[maybe_unused]] NormWeights norm_w;
  if constexpr (kNorm) read_norm_weights(norm, norm_w);
  pdl_wait();  // launched as a programmatic dependent: x comes from the norm before
  pdl_launch_dependents();  // after the wait: a dependent may rely on what our predecessors wrote
  const uint4* x = reinterpret_cast<const uint4*>(p.x + t * p.hidden);
  [[maybe_unused]] float residual_row[kMaxChunks][8];
  if constexpr (kNorm) {
    __shared__ float scratch[kRowThreads / 32];
    const float inv = add_norm_row_in_registers<NormRes>(norm, t, scratch, residual_row);
    const bool first = kClustered ? cluster_cta_rank() == 0 : blockIdx.x == 0;
    store_normed_row(norm, residual_row, inv, normed_row, first ? norm.out + t * norm.hidden : nullptr, &norm_w);
    __syncthreads();
    x = reinterpret_cast<const uint4*>(normed_row);
  }
  if (has_expert) {
    // All of a group's loads are issued before its FMAs: a loop that waited on each 16-byte load in
    // turn spent ~7 us at one token on memory round trips. The sum order is i ascending per lane in
    // both parts, as before the weights were requested ahead, so the logits are bitwise the same.
    float acc = 0.f;
    uint4 x_ahead[kWeightsAhead];
#pragma unroll
    for (int u = 0; u < kWeightsAhead; ++u)
      if (lane + 32 * u < n) x_ahead[u] = x[lane + 32 * u];
#pragma unroll
    for (int u = 0; u < kWeightsAhead; ++u) {
      if (lane + 32 * u >= n) break;
      const uint16_t* xs = reinterpret_cast<const uint16_t*>(&x_ahead[u]);
      const uint16_t* ws = reinterpret_cast<const uint16_t*>(&w_ahead[u]);
#pragma unroll
      for (int j = 0; j < 8; ++j) acc = fmaf(bf16_bits_to_f32(xs[j]), bf16_bits_to_f32(ws[j]), acc);
    }
    constexpr int kLoadsInFlight = 8;  // the rest of a longer row
    for (int64_t base = lane + 32 * kWeightsAhead; base < n; base += 32 * kLoadsInFlight) {
      uint4 xv[kLoadsInFlight], wv[kLoadsInFlight];
#pragma unroll
      for (int u = 0; u < kLoadsInFlight; ++u) {
        const int64_t i = base + 32 * u;
        if (i < n) {
          xv[u] = x[i];
          wv[u] = w[i];
        }
      }
#pragma unroll
      for (int u = 0; u < kLoadsInFlight; ++u) {
        if (base + 32 * u >= n) break;
        const uint16_t* xs = reinterpret_cast<const uint16_t*>(&xv[u]);
        const uint16_t* ws = reinterpret_cast<const uint16_t*>(&wv[u]);
#pragma unroll
        for (int j = 0; j < 8; ++j) acc = fmaf(bf16_bits_to_f32(xs[j]), bf16_bits_to_f32(ws[j]), acc);
      }
    }
    acc = warp_sum(acc);
    if (lane == 0) {
      const float logit = acc + bf16_bits_to_f32(bias_ahead ? bias_bits : p.bias[e]);
      p.logits[t * p.experts + e] = logit;
      if constexpr (kClustered) block_logits[warp] = logit;
    }
  }
  __shared__ float row[kMaxExperts];
  if constexpr (kClustered) {
    // Every CTA's logits are in its shared memory; the cluster's first CTA gathers them, then lets the others exit.
    cluster_arrive_release();
    cluster_wait_acquire();
    const bool selects = cluster_cta_rank() == 0 && warp == 0;
    if (selects) {
      for (int i = lane; i < static_cast<int>(p.experts); i += 32)
        row[i] = load_from_cluster_rank(&block_logits[i % kExpertsPerCta], static_cast<unsigned>(i / kExpertsPerCta));
      __syncwarp();
    }
    cluster_arrive_relaxed();  // after the gather: no CTA's shared memory is read again
    if (selects)
      warp_topk(row, static_cast<int>(p.experts), static_cast<int>(p.top_k), p.topk_ids + t * p.top_k,
                p.topk_weights + t * p.top_k);
    if constexpr (kNorm)
      if (cluster_cta_rank() == 0) store_residual_row<NormRes>(norm, t, residual_row);
    cluster_wait_acquire();
    return;
  }
  // The last CTA of this token selects the top-k.
  __shared__ bool last;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    const unsigned ticket = atomicAdd(p.tickets + t, 1u);
    last = ticket == gridDim.x - 1;
    if (last) p.tickets[t] = 0;
  }
  __syncthreads();
  if (!last) return;
  if constexpr (kNorm) store_residual_row<NormRes>(norm, t, residual_row);
  if (warp != 0) return;
  __threadfence();
  // Other CTAs' logits are read through L2 (volatile) after their fences.
  for (int64_t i = lane; i < p.experts; i += 32) row[i] = *reinterpret_cast<volatile float*>(p.logits + t * p.experts + i);
  __syncwarp();
  warp_topk(row, static_cast<int>(p.experts), static_cast<int>(p.top_k), p.topk_ids + t * p.top_k,
            p.topk_weights + t * p.top_k);
}

__global__ void topk_softmax_kernel(RouterKernelParams p) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (t >= p.tokens) return;
  float* row = p.logits + t * p.experts;
  for (int64_t i = threadIdx.x % 32; i < p.experts; i += 32) row[i] += bf16_bits_to_f32(p.bias[i]);
  __syncwarp();
  warp_topk(row, static_cast<int>(p.experts), static_cast<int>(p.top_k), p.topk_ids + t * p.top_k,
            p.topk_weights + t * p.top_k);
}

Status check(const RouterKernelParams& p) {
  if (p.experts > kMaxExperts || p.top_k > kMaxTopK || p.top_k > p.experts || p.top_k < 1)
    return unimplemented("router: at most 256 experts and top-k in [1, 16]");
  if (p.hidden % 8 != 0) return unimplemented("router: hidden size must be a multiple of 8");
  return Status::ok();
}

__global__ void local_routing_kernel(LocalRoutingParams p) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= p.slots) return;
  const int32_t local = p.ids[i] - p.first_expert;
  const bool here = local >= 0 && local < p.num_experts;
  p.local_ids[i] = here ? local : 0;
  p.local_weights[i] = here ? p.weights[i] : 0.0f;
}

// Whether a token's expert blocks run as one CTA cluster (sm_90+, up to kMaxRouterClusterCtas blocks).
Result<bool> router_clustered(const RouterKernelParams& p) {
  int device = 0, major = 0;
  MX_RETURN_IF_ERROR(cuda_status(cudaGetDevice(&device), "cudaGetDevice"));
  MX_RETURN_IF_ERROR(cuda_status(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device),
                                 "cudaDeviceGetAttribute"));
  return major >= 9 && ceil_div64(p.experts, kExpertsPerCta) <= kMaxRouterClusterCtas;
}

}  // namespace

Status launch_local_routing(const LocalRoutingParams& p, cudaStream_t stream) {
  if (p.slots == 0) return Status::ok();
  local_routing_kernel<<<static_cast<unsigned>(ceil_div64(p.slots, 256)), 256, 0, stream>>>(p);
  return launch_status("local_routing_kernel");
}

Status launch_router_topk(const RouterKernelParams& p, cudaStream_t stream) {
  MX_RETURN_IF_ERROR(check(p));
  if (p.tokens == 0) return Status::ok();
  const int blocks = static_cast<int>(ceil_div64(p.experts, kExpertsPerCta));
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(p.tokens));
  MX_ASSIGN_OR_RETURN(const bool clustered, router_clustered(p));
  if (!clustered)
    return cuda_status(launch_pdl(router_topk_kernel<false>, grid, dim3(32 * kExpertsPerCta), 0, stream, p,
                                  RmsNormParams{}),
                       "router_topk_kernel");
  return cuda_status(launch_pdl_clusters(router_topk_kernel<true>, grid, dim3(32 * kExpertsPerCta),
                                         dim3(static_cast<unsigned>(blocks)), 0, stream, p, RmsNormParams{}),
                     "router_topk_kernel (clusters)");
}

Result<bool> can_fuse_add_rms_norm_route(const RmsNormParams& norm, const RouterKernelParams& route) {
  if (!check(route).is_ok() || norm.residual == nullptr || norm.rows != route.tokens || norm.hidden != route.hidden ||
      norm.hidden % 8 != 0 || norm.hidden > kMaxNormHidden)
    return false;
  MX_ASSIGN_OR_RETURN(const bool clustered, router_clustered(route));
  return clustered || route.tickets != nullptr;
}

Status launch_add_rms_norm_route(const RmsNormParams& norm, const RouterKernelParams& route, cudaStream_t stream) {
  MX_ASSIGN_OR_RETURN(const bool fusable, can_fuse_add_rms_norm_route(norm, route));
  if (!fusable) return unimplemented("add_rms_norm_route: this norm and router do not fuse (can_fuse_add_rms_norm_route)");
  if (route.tokens == 0) return Status::ok();
  const int blocks = static_cast<int>(ceil_div64(route.experts, kExpertsPerCta));
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(route.tokens));
  MX_ASSIGN_OR_RETURN(const bool clustered, router_clustered(route));
  if (!clustered) {
    auto kernel = norm.residual_f32 ? router_topk_kernel<false, float> : router_topk_kernel<false, uint16_t>;
    return cuda_status(launch_pdl(kernel, grid, dim3(32 * kExpertsPerCta), 0, stream, route, norm),
                       "router_topk_kernel (add_rms_norm_route, tickets)");
  }
  auto kernel = norm.residual_f32 ? router_topk_kernel<true, float> : router_topk_kernel<true, uint16_t>;
  return cuda_status(launch_pdl_clusters(kernel, grid, dim3(32 * kExpertsPerCta), dim3(static_cast<unsigned>(blocks)), 0,
                                         stream, route, norm),
                     "router_topk_kernel (add_rms_norm_route)");
}

Status launch_topk_softmax(const RouterKernelParams& p, cudaStream_t stream) {
  MX_RETURN_IF_ERROR(check(p));
  if (p.tokens == 0) return Status::ok();
  topk_softmax_kernel<<<static_cast<unsigned>(ceil_div64(p.tokens, 8)), 256, 0, stream>>>(p);
  return launch_status("topk_softmax_kernel");
}

}  // namespace mx::cuda
