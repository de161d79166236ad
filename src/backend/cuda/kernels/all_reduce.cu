// The one-shot all-reduce over peer memory: the handshake and why it is safe are in all_reduce.h.
#include <string>
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels/all_reduce.h"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/row_norm.cuh"

namespace mx::cuda {
namespace {

__device__ __forceinline__ void store_release_sys(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ uint64_t load_acquire_sys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// Spins until *flag >= epoch; false when the group aborted first. The abort word is host memory (a PCIe read),
// so it is looked at only every 1024 polls.
__device__ bool wait_for_flag(const uint64_t* flag, uint64_t epoch, const int* abort) {
  for (uint32_t polls = 1;; ++polls) {
    if (load_acquire_sys(flag) >= epoch) return true;
    if ((polls & 1023) == 0 && *reinterpret_cast<const volatile int*>(abort) != 0) return false;
  }
}

// Loads of the slots bypass L1: peers write them over NVLink, and a line of an earlier call could still sit there.
template <typename Unit>
__device__ __forceinline__ Unit load_slot(const Unit* p) {
  if constexpr (sizeof(Unit) == 16) return __ldcg(reinterpret_cast<const uint4*>(p));
  else if constexpr (sizeof(Unit) == 4) return __ldcg(reinterpret_cast<const float*>(p));
  else return __ldcg(reinterpret_cast<const unsigned short*>(p));
}

// Unit i of x, which is element-aligned but for 16-byte units maybe not 16-byte aligned (a view at an odd
// offset): the launch shape depends on the size alone, so that every rank's CTAs pair up, whatever each address.
template <typename Unit>
__device__ __forceinline__ Unit load_x(const void* x, int64_t i, bool aligned) {
  if constexpr (sizeof(Unit) == 16) {
    if (!aligned) {
      Unit u;
      const uint16_t* src = static_cast<const uint16_t*>(x) + i * 8;  // bf16 and f32 are 2-byte aligned
      auto* dst = reinterpret_cast<uint16_t*>(&u);
#pragma unroll
      for (int j = 0; j < 8; ++j) dst[j] = src[j];
      return u;
    }
  }
  return static_cast<const Unit*>(x)[i];
}
template <typename Unit>
__device__ __forceinline__ void store_x(void* x, int64_t i, const Unit& u, bool aligned) {
  if constexpr (sizeof(Unit) == 16) {
    if (!aligned) {
      uint16_t* dst = static_cast<uint16_t*>(x) + i * 8;
      const auto* src = reinterpret_cast<const uint16_t*>(&u);
#pragma unroll
      for (int j = 0; j < 8; ++j) dst[j] = src[j];
      return;
    }
  }
  static_cast<Unit*>(x)[i] = u;
}

// Adds one unit of `Element`s (bf16 bits or f32) into acc, in f32.
template <typename Element, typename Unit>
__device__ __forceinline__ void accumulate(float* acc, const Unit& u) {
  constexpr int kCount = sizeof(Unit) / sizeof(Element);
  const auto* e = reinterpret_cast<const Element*>(&u);
#pragma unroll
  for (int j = 0; j < kCount; ++j) {
    if constexpr (sizeof(Element) == 2) acc[j] += bf16_bits_to_f32(e[j]);
    else acc[j] += e[j];
  }
}

template <typename Element, typename Unit>
__device__ __forceinline__ Unit pack(const float* acc) {
  constexpr int kCount = sizeof(Unit) / sizeof(Element);
  Unit u;
  auto* e = reinterpret_cast<Element*>(&u);
#pragma unroll
  for (int j = 0; j < kCount; ++j) {
    if constexpr (sizeof(Element) == 2) e[j] = f32_to_bf16_bits(acc[j]);
    else e[j] = acc[j];
  }
  return u;
}

// Element: uint16_t (bf16 bits) or float. Unit: what one thread moves at a time, uint4 (16 bytes) or Element.
// NormRes: void, or the residual's element type (float or bf16 bits) when the add + RMSNorm follows (one CTA
// per row).
template <typename Element, typename Unit, typename NormRes>
__global__ void __launch_bounds__(kOneShotThreads) one_shot_all_reduce_kernel(OneShotAllReduceParams p, int64_t units) {
  __shared__ uint64_t epoch_s;
  __shared__ int aborted_s;
  __shared__ float norm_scratch[kOneShotThreads / 32];
  pdl_wait();  // launched as a programmatic dependent: x (and the state) come from earlier kernels
  pdl_launch_dependents();  // after the wait: a dependent may rely on what our predecessors wrote
  const int tid = static_cast<int>(threadIdx.x), b = static_cast<int>(blockIdx.x);
  if (tid == 0) {
    epoch_s = *reinterpret_cast<volatile uint64_t*>(&p.state->epoch) + 1;
    aborted_s = 0;
  }
  __syncthreads();
  const uint64_t epoch = epoch_s;
  const int64_t parity_offset = static_cast<int64_t>(epoch & 1) * p.ranks * kOneShotSlotBytes;
  // This CTA's share: units [begin, end).
  const int64_t per_block = (units + gridDim.x - 1) / gridDim.x;
  const int64_t begin = b * per_block, end = min(units, begin + per_block);
  auto slot = [&](int owner, int sender) {
    return reinterpret_cast<Unit*>(p.slots[owner] + parity_offset + sender * kOneShotSlotBytes);
  };

  // 1. This rank's share into every rank's slot [parity][rank] (its own included, so that the sum below reads
  // every rank's the same way).
  const bool aligned = reinterpret_cast<uintptr_t>(p.x) % 16 == 0;
  for (int64_t i = begin + tid; i < end; i += blockDim.x) {
    const Unit u = load_x<Unit>(p.x, i, aligned);
    for (int r = 0; r < p.ranks; ++r) slot(r, p.rank)[i] = u;
  }
  __syncthreads();
  // 2. Thread r raises this CTA's flag on rank r (the release orders the CTA's writes above, which the barrier
  // made this thread's predecessors), then waits for rank r's flag here.
  if (tid < p.ranks) {
    store_release_sys(p.flags[tid] + b * p.ranks + p.rank, epoch);
    if (!wait_for_flag(p.flags[p.rank] + b * p.ranks + tid, epoch, p.abort)) aborted_s = 1;
  }
  __syncthreads();
  if (aborted_s) return;
  // 3. The sum in rank order, in f32 from zero (the CPU communicator's order, so the same bits), into x.
  constexpr int kCount = sizeof(Unit) / sizeof(Element);
  for (int64_t i = begin + tid; i < end; i += blockDim.x) {
    float acc[kCount];
#pragma unroll
    for (int j = 0; j < kCount; ++j) acc[j] = 0.0f;
    for (int r = 0; r < p.ranks; ++r) accumulate<Element>(acc, load_slot(slot(p.rank, r) + i));
    store_x(p.x, i, pack<Element, Unit>(acc), aligned);
  }
  // 3b. This CTA's row of the sum is in x: its residual add and norm.
  if constexpr (!std::is_void_v<NormRes>) {
    __syncthreads();
    rms_norm_row<NormRes>(p.norm, b, norm_scratch);
  }
  // 4. The last CTA to finish advances the epoch: every CTA read it before counting itself done.
  __syncthreads();
  if (tid == 0) {
    __threadfence();
    if (atomicAdd(&p.state->blocks_done, 1u) == gridDim.x - 1) {
      p.state->blocks_done = 0;
      *reinterpret_cast<volatile uint64_t*>(&p.state->epoch) = epoch;
    }
  }
}

template <typename Element>
Status launch_typed(const OneShotAllReduceParams& p, cudaStream_t stream) {
  const OneShotLaunch l = one_shot_launch(p.n * static_cast<int64_t>(sizeof(Element)), sizeof(Element));
  const cudaError_t e =
      l.vectorized ? launch_pdl(one_shot_all_reduce_kernel<Element, uint4, void>, dim3(l.blocks), dim3(l.threads), 0, stream, p, l.units)
                   : launch_pdl(one_shot_all_reduce_kernel<Element, Element, void>, dim3(l.blocks), dim3(l.threads), 0, stream, p, l.units);
  return cuda_status(e, "one_shot_all_reduce_kernel");
}

// One CTA per row: the kernel's even split of the rows' 16-byte units gives each CTA exactly its row.
Status launch_with_norm(const OneShotAllReduceParams& p, cudaStream_t stream) {
  const RmsNormParams& n = p.norm;
  if (!p.bf16 || reinterpret_cast<uintptr_t>(p.x) % 16 != 0 || n.delta != p.x || !n.residual)
    return invalid_argument("one-shot all-reduce + add_rms_norm: x must be bf16, 16-byte aligned, and the norm's delta");
  if (n.rows < 1 || n.rows > kOneShotMaxNormRows || n.hidden % 8 != 0 || n.hidden > 8 * kRowThreads * kMaxChunks ||
      n.rows * n.hidden != p.n)
    return invalid_argument("one-shot all-reduce + add_rms_norm of [" + std::to_string(n.rows) + ", " + std::to_string(n.hidden) +
                            "]: 1 to " + std::to_string(kOneShotMaxNormRows) + " rows of a multiple of 8 up to 8192");
  static_assert(kRowThreads == kOneShotThreads, "the norm's rows take the all-reduce's CTAs");
  const dim3 grid(static_cast<unsigned>(n.rows)), block(kOneShotThreads);
  const int64_t units = p.n / 8;
  const cudaError_t e = n.residual_f32
                            ? launch_pdl(one_shot_all_reduce_kernel<uint16_t, uint4, float>, grid, block, 0, stream, p, units)
                            : launch_pdl(one_shot_all_reduce_kernel<uint16_t, uint4, uint16_t>, grid, block, 0, stream, p, units);
  return cuda_status(e, "one_shot_all_reduce_kernel (+ add_rms_norm)");
}

}  // namespace

Status launch_one_shot_all_reduce(const OneShotAllReduceParams& p, cudaStream_t stream) {
  const int64_t element_bytes = p.bf16 ? 2 : 4;
  if (p.ranks < 2 || p.ranks > kOneShotMaxRanks || p.rank < 0 || p.rank >= p.ranks)
    return invalid_argument("one-shot all-reduce of rank " + std::to_string(p.rank) + " of " + std::to_string(p.ranks));
  if (p.n <= 0 || p.n * element_bytes > kOneShotSlotBytes)
    return invalid_argument("one-shot all-reduce of " + std::to_string(p.n) + " elements: 1 to " +
                            std::to_string(kOneShotSlotBytes / element_bytes) + " fit a slot");
  for (int r = 0; r < p.ranks; ++r)
    if (!p.slots[r] || !p.flags[r]) return invalid_argument("one-shot all-reduce without rank " + std::to_string(r) + "'s exchange");
  if (!p.x || !p.state || !p.abort) return invalid_argument("one-shot all-reduce without its buffers");
  if (p.norm.out) return launch_with_norm(p, stream);
  return p.bf16 ? launch_typed<uint16_t>(p, stream) : launch_typed<float>(p, stream);
}

}  // namespace mx::cuda
