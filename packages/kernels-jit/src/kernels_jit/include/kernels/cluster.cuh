// The thread-block cluster barrier in two halves (sm_90+), for kernels whose CTAs exchange values
// through distributed shared memory. Every thread of every CTA of the cluster calls each half.
//
// cooperative_groups has the release arrive and the acquire wait (cluster_group::barrier_arrive /
// barrier_wait) but not the relaxed arrive, which orders nothing: the usual use is to arrive at
// kernel start and wait just before the first store into another CTA's shared memory, which
// proves every CTA of the cluster has started (its shared memory exists) without a full barrier
// on the critical path. Then, per exchange: remote stores, cluster_arrive (release), cluster_wait
// (acquire), local reads.
#pragma once

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

}  // namespace kernels
