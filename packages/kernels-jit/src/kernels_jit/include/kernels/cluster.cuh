// The thread-block cluster barrier in two halves (sm_90+), for kernels whose CTAs exchange values
// through distributed shared memory. Every thread of every CTA of the cluster calls each half.
//
// cooperative_groups has the release arrive and the acquire wait (cluster_group::barrier_arrive /
// barrier_wait) but not the relaxed arrive, which orders nothing: the usual use is to arrive at
// kernel start and wait just before the first store into another CTA's shared memory, which
// proves every CTA of the cluster has started (its shared memory exists) without a full barrier
// on the critical path. Then, per exchange: remote stores, cluster_arrive (release), cluster_wait
// (acquire), local reads.
//
// The release arrive is a MEMBAR.GPU in SASS: it waits for every earlier global store of the
// thread to complete. Where a few values are exchanged after global stores (the row engine's
// split rows, after the fused ops' residual stores), the push helpers at the end send them with
// st.async instead: each value lands in the receiver's shared memory and counts its bytes on
// the receiver's mbarrier, which the receiver waits on; no fence, no cluster barrier.
#pragma once

#include <cstdint>

namespace kernels {

// Arrive without ordering any memory access.
__device__ __forceinline__ void cluster_arrive_relaxed() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
#endif
}

// Arrive, releasing this thread's earlier stores (distributed shared memory included).
__device__ __forceinline__ void cluster_arrive() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
#endif
}

// Wait for every thread of the cluster to arrive, acquiring what their arrives released.
__device__ __forceinline__ void cluster_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}

// Push exchange, in three steps (sm_90+; every barrier used for one exchange only):
//   push_barrier_init(bar, bytes): one thread of the receiving CTA, at kernel start, before the
//     cluster_arrive_relaxed whose cluster_wait precedes the first push into this CTA;
//   cluster_push(slot, bar, rank, v): stores v into `slot` of CTA `rank` (the same shared
//     variables, mapped into that CTA), counting 4 bytes on its `bar`;
//   push_barrier_wait(bar): every thread that reads the slots; returns once `bytes` have landed.
__device__ __forceinline__ void push_barrier_init(uint64_t* bar, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(bar));
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(addr) : "memory");
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(addr), "r"(bytes)
               : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

__device__ __forceinline__ void cluster_push(float* slot, uint64_t* bar, unsigned rank, float v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  unsigned remote_slot, remote_bar;
  asm("mapa.shared::cluster.u32 %0, %1, %2;"
      : "=r"(remote_slot)
      : "r"(static_cast<unsigned>(__cvta_generic_to_shared(slot))), "r"(rank));
  asm("mapa.shared::cluster.u32 %0, %1, %2;"
      : "=r"(remote_bar)
      : "r"(static_cast<unsigned>(__cvta_generic_to_shared(bar))), "r"(rank));
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];"
               ::"r"(remote_slot), "r"(__float_as_uint(v)), "r"(remote_bar)
               : "memory");
#endif
}

__device__ __forceinline__ void push_barrier_wait(uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(bar));
  unsigned done = 0;
  do {
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0; selp.u32 %0, 1, 0, "
        "p; }"
        : "=r"(done)
        : "r"(addr)
        : "memory");
  } while (!done);
#endif
}

}  // namespace kernels
