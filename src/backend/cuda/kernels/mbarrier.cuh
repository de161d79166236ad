// Shared-memory mbarriers and the copy engine's bulk copies (sm_90 and newer): the rings of the
// warp-specialized wgmma kernels (cp.async arrivals) and of the decode kernels that stream weights by
// cp.async.bulk (bytes counted on the barrier). One copy of each PTX wrapper for every kernel family.
//
// The bodies exist only in device code for sm_90+; elsewhere (host pass, older targets) they are empty and a
// try-wait reports done, so portable kernels may name them inside paths the host never launches there.
#pragma once

#include <cstdint>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define MX_MBARRIER_PTX 1
#else
#define MX_MBARRIER_PTX 0
#endif

namespace mx::cuda {

// A phase completes when its expected arrivals (and announced bytes) are in; waiters name the phase by parity
// (a fresh barrier is in phase 0, and waiting on parity 1 returns at once: the "previous" phase counts as
// complete, which lets a producer's first pass through the empty barriers go without waiting).
__device__ __forceinline__ void mbarrier_init(uint32_t bar, uint32_t arrivals) {
#if MX_MBARRIER_PTX
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(arrivals) : "memory");
#endif
}
// Makes initialized barriers visible to the other threads' (and the async arrivals') view of them.
__device__ __forceinline__ void mbarrier_init_fence() {
#if MX_MBARRIER_PTX
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void mbarrier_arrive(uint32_t bar) {
#if MX_MBARRIER_PTX
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(bar) : "memory");
#endif
}
// One arrival that also arms the current phase with `bytes` of copies to come.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
#if MX_MBARRIER_PTX
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1;\n}\n" ::"r"(bar),
               "r"(bytes)
               : "memory");
#endif
}
// One test of the phase of `parity`: true once it completed (callers loop, free to back off between tries).
__device__ __forceinline__ bool mbarrier_try_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 1;
#if MX_MBARRIER_PTX
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
#endif
  return done != 0;
}
// Spins until the phase of `parity` completed.
__device__ __forceinline__ void mbarrier_wait(uint32_t bar, uint32_t parity) {
#if MX_MBARRIER_PTX
  asm volatile(
      "{\n.reg .pred done;\nWAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
#endif
}
// One arrival on `bar` once every cp.async this thread issued so far has landed (noinc: the arrival is one
// of the barrier's expected count, not an extra one).
__device__ __forceinline__ void cp_async_mbarrier_arrive(uint32_t bar) {
#if MX_MBARRIER_PTX
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
#endif
}

// Before the copy engine (async proxy) refills a ring slot that threads read with ordinary loads (generic
// proxy): the barrier that ordered those reads before the refilling thread (a CTA barrier, or an `empty`
// mbarrier's arrivals and wait) orders them for the threads only, not across the proxies. Without it the bulk
// experts' refills gave wrong values in about one run in 50-100 on an H200 (docs/PERF.md, session 20).
__device__ __forceinline__ void fence_ring_refill() {
#if MX_MBARRIER_PTX
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// Global -> shared copy by the copy engine of `bytes` (a multiple of 16; both ends 16-byte aligned), counted
// on `bar`.
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
#if MX_MBARRIER_PTX
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
#endif
}
// The same copy under an L2 cache policy (l2_evict_first_policy: data read once per step, such as decode
// weights, should not push activations and the KV cache out of L2).
__device__ __forceinline__ void bulk_copy_with_policy(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar,
                                                      uint64_t policy) {
#if MX_MBARRIER_PTX
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;\n" ::"r"(
          dst),
      "l"(src), "r"(bytes), "r"(bar), "l"(policy)
      : "memory");
#endif
}
__device__ __forceinline__ uint64_t l2_evict_first_policy() {
  uint64_t policy = 0;
#if MX_MBARRIER_PTX
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
#endif
  return policy;
}

}  // namespace mx::cuda
