// CTA cluster steps (sm_90+): the cluster barrier's halves and distributed shared memory loads and stores, used by
// the Gemma-4 router (partial logits to a token's owner CTA) and the clustered decode attention (a split's
// softmax state read by the CTA that merges its columns).
#pragma once

#include <cstdint>

#include "backend/cuda/kernels/common.cuh"

namespace mx::cuda {

__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_arrive_release() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait_acquire() {
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
__device__ __forceinline__ unsigned cluster_cta_rank() {
  unsigned rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  return rank;
}
// The shared-memory address of `local`'s offset in the cluster's CTA `rank`.
__device__ __forceinline__ uint32_t cluster_address(const void* local, unsigned rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(smem_addr(local)), "r"(rank));
  return remote;
}
// The float at `local`'s offset in the shared memory of the cluster's CTA `rank` = v.
__device__ __forceinline__ void store_to_cluster_rank(const float* local, unsigned rank, float v) {
  asm volatile("st.shared::cluster.f32 [%0], %1;\n" ::"r"(cluster_address(local, rank)), "f"(v) : "memory");
}
// The same store as one the receiver waits for: it counts its 4 bytes on the mbarrier at `bar`'s offset in CTA
// `rank` (armed there with mbarrier_arrive_expect_tx), so only that CTA waits, on its barrier, instead of the
// whole cluster on barrier.cluster; the sender may exit once it is issued.
__device__ __forceinline__ void store_async_to_cluster_rank(const float* local, unsigned rank, float v,
                                                            const uint64_t* bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];\n" ::"r"(
                   cluster_address(local, rank)),
               "r"(__float_as_uint(v)), "r"(cluster_address(bar, rank))
               : "memory");
}
// The float at `local`'s offset in the shared memory of the cluster's CTA `rank` (not volatile: several such
// loads may be in flight before the first is used).
__device__ __forceinline__ float load_from_cluster_rank(const float* local, unsigned rank) {
  float v;
  asm("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(cluster_address(local, rank)) : "memory");
  return v;
}

// launch_pdl (common.cuh) with the grid in CTA clusters of `cluster` (sm_90+). Clusters above 8 CTAs are
// non-portable: the caller first sets cudaFuncAttributeNonPortableClusterSizeAllowed on the kernel.
template <typename... Params, typename... Args>
cudaError_t launch_pdl_clusters(void (*kernel)(Params...), dim3 grid, dim3 block, dim3 cluster, size_t smem,
                                cudaStream_t stream, Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attrs[2] = {};
  attrs[0].id = cudaLaunchAttributeClusterDimension;
  attrs[0].val.clusterDim.x = cluster.x;
  attrs[0].val.clusterDim.y = cluster.y;
  attrs[0].val.clusterDim.z = cluster.z;
  attrs[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[1].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attrs;
  cfg.numAttrs = 2;
  return cudaLaunchKernelEx(&cfg, kernel, static_cast<Params>(args)...);
}

}  // namespace mx::cuda
