// Tensor maps and TMA tile loads (sm_90+): the copy engine moves a whole box of a tensor into shared memory,
// swizzled as wgmma's descriptors expect, from one thread's instruction, and counts its bytes on an mbarrier.
// Against per-thread cp.async copies: no address arithmetic per 16-byte chunk, no producer warps busy for it,
// rows past the tensor's end zero-filled by the engine, and the writes belong to the async proxy that wgmma
// reads through, so a consumer needs no fence.proxy.async after its mbarrier wait.
//
// The host encodes a map with the driver's cuTensorMapEncodeTiled, reached through the runtime's entry point
// (the binary links no libcuda); a kernel takes the map as a __grid_constant__ parameter, so a captured graph
// replays it with the pointers it was built for.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include <string>

#include "core/status.h"

namespace mx::cuda {

// The driver's cuTensorMapEncodeTiled for a tensor of `rank` (<= 5) dims, dims[0] contiguous, with the byte
// strides of dims 1 .. rank - 1, read in boxes of box[0 .. rank - 1] elements. Elements past the tensor's ends
// read as zero.
inline Status encode_tensor_map(CUtensorMap* map, CUtensorMapDataType type, int rank, const void* base,
                                const uint64_t* dims, const uint64_t* strides, const uint32_t* box,
                                CUtensorMapSwizzle swizzle) {
  using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                   const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
  static const EncodeTiled encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      fn = nullptr;
    return reinterpret_cast<EncodeTiled>(fn);
  }();
  if (encode == nullptr) return internal_error("cuTensorMapEncodeTiled: not found through the CUDA driver entry point");
  if (rank < 1 || rank > 5) return internal_error("tensor map: rank 1 to 5");
  if (reinterpret_cast<uintptr_t>(base) % 16 != 0) return invalid_argument("tensor map: the base must be 16-byte aligned");
  cuuint64_t gdims[5], gstrides[4];
  cuuint32_t gbox[5], unit[5];
  for (int i = 0; i < rank; ++i) {
    gdims[i] = dims[i];
    gbox[i] = box[i];
    unit[i] = 1;
    if (i + 1 < rank) {
      if (strides[i] % 16 != 0) return invalid_argument("tensor map: the strides must be multiples of 16 bytes");
      gstrides[i] = strides[i];
    }
  }
  const CUresult r = encode(map, type, static_cast<cuuint32_t>(rank), const_cast<void*>(base), gdims, gstrides, gbox,
                            unit, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return internal_error("cuTensorMapEncodeTiled failed (" + std::to_string(static_cast<int>(r)) + ")");
  return Status::ok();
}

// A bf16 tensor of rank 3 read in boxes with the 128-byte swizzle (box[0] * 2 must be 128: one swizzled row
// per box row).
inline Status encode_bf16_tensor_map_3d(CUtensorMap* map, const void* base, const uint64_t (&dims)[3],
                                        const uint64_t (&strides)[2], const uint32_t (&box)[3]) {
  if (box[0] * 2 != 128) return internal_error("tensor map: a box row must be one 128-byte swizzled row");
  return encode_tensor_map(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, base, dims, strides, box,
                           CU_TENSOR_MAP_SWIZZLE_128B);
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// The box of `map` at element coordinates (c0, c1, c2) into shared memory at `dst` (1024-byte aligned for the
// 128-byte swizzle), its bytes counted on mbarrier `bar` (armed with mbarrier_arrive_expect_tx).
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2,
                                            uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
      "[%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}
// The same for a rank-4 map (no swizzle: `dst` 128-byte aligned).
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2, int c3,
                                            uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}
// Shared memory at `src` (as tma_load_3d lays it out) into the box of `map` at (c0, c1, c2); parts of the box
// past the tensor's ends are not written. Completes in bulk groups: tma_store_commit, tma_store_wait_read.
__device__ __forceinline__ void tma_store_3d(const CUtensorMap* map, uint32_t src, int c0, int c1, int c2) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(src), "r"(c0), "r"(c1), "r"(c2)
               : "memory");
}
__device__ __forceinline__ void tma_store_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Waits until this thread's committed stores have read their shared memory (it may then be overwritten).
__device__ __forceinline__ void tma_store_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
#endif

// The rank-5 load and the descriptor prefetch are empty outside sm_90+ device code (as mbarrier.cuh's wrappers),
// so that a portable kernel may name them in a path the host never launches there.
// The box of a rank-5 map at (c0 .. c4) into shared memory at `dst` (aligned as the map's swizzle needs).
__device__ __forceinline__ void tma_load_5d(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2, int c3,
                                            int c4, uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5, "
      "%6}], [%7];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(bar)
      : "memory");
#endif
}
// Pulls the map's descriptor into the cache ahead of the first load.
__device__ __forceinline__ void tma_prefetch_map(const CUtensorMap* map) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
#endif
}

}  // namespace mx::cuda
