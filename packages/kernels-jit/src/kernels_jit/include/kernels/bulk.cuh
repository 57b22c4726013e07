// TMA bulk copies between global and shared memory and the mbarriers they complete on (sm_90+),
// with the L2 eviction policies they take: the pieces that kernels staging bytes through shared
// memory (kvcache's bulk rows, per_tensor_quant_fp8's resident chunks) share.
//
//   mbarrier_init(bar) (one arrival), then mbarrier_init_fence() before any copy may complete on
//     it; per use: mbarrier_expect_tx(bar, bytes) by the thread that issues the copies,
//     bulk_load(dst, src, bytes, bar, policy) for each, mbarrier_wait(bar, parity) by the readers
//     (parity: the barrier's use count mod 2); mbarrier_test(bar, parity) asks without waiting.
//   bulk_store(dst, src, bytes) into this thread's current bulk group, bulk_commit() to close it,
//     bulk_wait_read<N>() until at most N of its groups may still read their shared memory.
// Addresses of shared memory are 32-bit shared-window addresses (shared_address); copies move a
// multiple of 16 bytes between 16-byte aligned addresses. On older architectures the functions
// compile to nothing (the host never selects their paths there) and the policies are 0.
#pragma once

#include <cstdint>

namespace kernels {

// The shared-window address of p (for mbarrier and bulk-copy operands).
__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// L2 policies for loads (and bulk copies) with a cache hint: evict-first for lines read once,
// evict-last for lines read again soon.
__device__ __forceinline__ uint64_t l2_evict_first() {
  uint64_t policy = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
#endif
  return policy;
}

__device__ __forceinline__ uint64_t l2_evict_last() {
  uint64_t policy = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
#endif
  return policy;
}

// An mbarrier of one arrival (the thread that arms it with mbarrier_expect_tx).
__device__ __forceinline__ void mbarrier_init(uint32_t bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar) : "memory");
#endif
}

// Makes this thread's mbarrier initialisations visible to the bulk copies (the async proxy).
__device__ __forceinline__ void mbarrier_init_fence() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

// Arrives on bar, expecting `bytes` of copies to complete on it before its phase flips.
__device__ __forceinline__ void mbarrier_expect_tx(uint32_t bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
#endif
}

// Waits until the phase of bar with this parity has completed.
__device__ __forceinline__ void mbarrier_wait(uint32_t bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n"
      "}" ::"r"(bar),
      "r"(parity)
      : "memory");
#endif
}

// Whether the phase of bar with this parity has completed, without waiting (true below sm_90,
// where nothing is copied).
__device__ __forceinline__ bool mbarrier_test(uint32_t bar, uint32_t parity) {
  uint32_t done = 1;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{ .reg .pred p; mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, "
      "p; }"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
#endif
  return done != 0;
}

// Global -> shared, completing its bytes on bar, with an L2 policy (l2_evict_first, ...).
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes,
                                          uint32_t bar, uint64_t policy) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1], %2, [%3], %4;" ::"r"(dst),
      "l"(src), "r"(bytes), "r"(bar), "l"(policy)
      : "memory");
#endif
}

// Shared -> global, in this thread's current bulk group.
__device__ __forceinline__ void bulk_store(void* dst, uint32_t src, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(src),
               "r"(bytes)
               : "memory");
#endif
}

__device__ __forceinline__ void bulk_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
#endif
}

// Until at most kN of this thread's bulk groups may still read their shared memory.
template <int kN>
__device__ __forceinline__ void bulk_wait_read() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(kN) : "memory");
#endif
}

}  // namespace kernels
