// Single-node all-reduce over CUDA IPC buffers, alone (custom_all_reduce) and fused with the
// residual add and RMSNorm (all_reduce_add_rmsnorm). No NVLS/multimem: plain loads and stores
// through peer mappings (NVLink P2P).
//
// Each rank owns one cudaMalloc'ed region, opened by every peer through cudaIpcOpenMemHandle:
//   [Signal (flags) | staging: max_size bytes | tmp: 2 * max_size bytes]
// A call first copies x into the rank's staging inside the kernel (each block copies exactly the
// elements that the same block index reads on every rank), unless x itself is a registered
// buffer (CUDA graphs: the pointer table of the call's slot holds x's own and its peers'
// mappings, filled by register_graph_buffers after capture).
//
// Algorithms (both sum in fp32 in rank order 0..n-1 and round once, so every rank, and both
// algorithms, give the same bits; the fused op normalises that same fp32 sum plus its residual):
//   one-shot: copy, start barrier, every rank reduces the whole tensor from all n stagings,
//             end barrier (peers may still read this rank's staging until then).
//   two-shot: copy, start barrier, rank r reduces slice r into its tmp, mid barrier, every rank
//             gathers every slice from the peers' tmp. No end barrier: a peer's staging and tmp
//             are rewritten only after the next call's start barrier, which this block reaches
//             only once this whole kernel is done.
//   fused two-shot splits rows (not elements): rank r reduces its rows into fp32 tmp, then every
//             rank adds its own residual and normalises every row from the owners' tmp.
//
// Barriers: per-block flags carrying a per-block epoch that increases by one per call (no reset
// pass); every rank issues the same sequence of calls with the same grid, so the epochs agree.
// Block b of rank r stores the epoch into flag[b][r] of every peer (release, system scope) and
// spins until its own flag[b][p] holds the epoch for every peer p (acquire). The spin is bounded:
// after timeout_ns (%globaltimer, nanoseconds) it records the peer and the barrier into a
// host-mapped error word, marks this rank's signal aborted (later calls return at once) and
// leaves; the host raises a clear error on the next call (or comm.check()).
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(2);

#include <cuda.h>
#include <cuda_runtime.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <kernels/checks.h>
#include <kernels/dtype.h>
#include <kernels/launch.cuh>
#include <kernels/reduce.cuh>
#include <kernels/tensor.h>
#include <kernels/vec.cuh>

namespace car {

constexpr int kMaxRanks = 8;
constexpr int kMaxBlocks = 64;
constexpr int kThreads = 512;
constexpr int kFusedMaxPacks = 4;  // 16-byte packs of a fused row per thread (H <= 16384 bf16)
constexpr int64_t kSignalBytes = 64 * 1024;

enum Phase : uint32_t { kStart = 0, kMid = 1, kEnd = 2 };

struct Signal {
  uint32_t flag[3][kMaxBlocks][kMaxRanks];  // [phase][block][from rank]
  uint32_t epoch[kMaxBlocks];               // this rank's last epoch per block (local)
  uint32_t aborted;                         // sticky: a barrier of this rank timed out
};
static_assert(sizeof(Signal) <= kSignalBytes, "Signal must fit its reserved region");

// The input pointer of every rank for one call: a communicator's staging slot, or a graph slot.
struct RankPtrs {
  const void* p[kMaxRanks];
};

// What a call needs besides its tensors; built once per communicator (car_create).
struct Ctl {
  const RankPtrs* in;
  Signal* self;
  Signal* sig[kMaxRanks];
  void* tmp[kMaxRanks];
  volatile uint32_t* error;  // host-mapped: [0] code (1 = timeout), [1] peer, [2] phase
  unsigned long long timeout_ns;
  int rank;
};

struct State {
  Ctl ctl;
  int world;
  int device;
  int64_t max_size;
};

__device__ __forceinline__ unsigned long long globaltimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ void st_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t ld_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// A pack read through L2 only (data another GPU wrote during this kernel).
template <typename Pack, typename T>
__device__ __forceinline__ void load_cg(Pack& v, const T* p) {
#pragma unroll
  for (int a = 0; a < Pack::kAccesses; ++a) v.set(a, __ldcg(reinterpret_cast<const uint4*>(p) + a));
}

// Block-wide barrier with every peer's block of the same index. Returns true when it timed out
// (the caller then leaves the kernel).
template <int kWorld>
__device__ __forceinline__ bool barrier(const Ctl& c, Phase phase, uint32_t epoch) {
  __syncthreads();
  bool bad = false;
  if (threadIdx.x < kWorld) {
    const int peer = threadIdx.x;
    __threadfence_system();
    st_release_sys(&c.sig[peer]->flag[phase][blockIdx.x][c.rank], epoch);
    const uint32_t* own = &c.self->flag[phase][blockIdx.x][peer];
    unsigned long long start = 0;
    while (ld_acquire_sys(own) != epoch) {
      if (c.timeout_ns == 0) continue;
      const unsigned long long now = globaltimer();
      if (start == 0) {
        start = now;
      } else if (now - start > c.timeout_ns) {
        c.error[1] = static_cast<uint32_t>(peer);
        c.error[2] = static_cast<uint32_t>(phase);
        __threadfence_system();
        c.error[0] = 1u;
        *reinterpret_cast<volatile uint32_t*>(&c.self->aborted) = 1u;
        bad = true;
        break;
      }
    }
  }
  return __syncthreads_or(bad);
}

__device__ __forceinline__ bool aborted(const Ctl& c) {
  return *reinterpret_cast<volatile const uint32_t*>(&c.self->aborted) != 0u;
}

// ---- custom_all_reduce ---------------------------------------------------------------------

// Sum over ranks (rank order, fp32) of pack idx of every rank's input.
template <typename T, int kWorld>
__device__ __forceinline__ kernels::Pack<T> reduce_pack(const RankPtrs& in, int64_t idx) {
  using P = kernels::Pack<T>;
  float acc[P::size], v[P::size];
  P a;
  load_cg(a, static_cast<const T*>(in.p[0]) + idx * P::size);
  a.unpack(acc);
#pragma unroll
  for (int q = 1; q < kWorld; ++q) {
    load_cg(a, static_cast<const T*>(in.p[q]) + idx * P::size);
    a.unpack(v);
#pragma unroll
    for (int k = 0; k < P::size; ++k) acc[k] += v[k];
  }
  a.pack(acc);
  return a;
}

// packs: the message in 16-byte packs. part: packs per rank slice (two-shot).
template <typename T, int kWorld, bool kTwoShot>
__global__ void __launch_bounds__(kThreads) all_reduce_kernel(const Ctl c, const T* __restrict__ x,
                                                               T* __restrict__ out, int64_t packs,
                                                               int64_t part) {
  using P = kernels::Pack<T>;
  if (aborted(c)) return;
  const uint32_t epoch = c.self->epoch[blockIdx.x] + 1;
  const RankPtrs in = *c.in;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  // Stage x unless it is registered (then in.p[rank] is x itself).
  T* staging = const_cast<T*>(static_cast<const T*>(c.in->p[c.rank]));
  if (staging != x) {
    if constexpr (kTwoShot) {
      for (int s = 0; s < kWorld; ++s) {
        for (int64_t i = first; i < part; i += stride) {
          const int64_t idx = s * part + i;
          if (idx < packs) {
            P v;
            v.load_stream(x + idx * P::size);
            v.store(staging + idx * P::size);
          }
        }
      }
    } else {
      for (int64_t idx = first; idx < packs; idx += stride) {
        P v;
        v.load_stream(x + idx * P::size);
        v.store(staging + idx * P::size);
      }
    }
  }
  if (barrier<kWorld>(c, kStart, epoch)) return;
  if constexpr (!kTwoShot) {
    for (int64_t idx = first; idx < packs; idx += stride) {
      reduce_pack<T, kWorld>(in, idx).store_stream(out + idx * P::size);
    }
    if (barrier<kWorld>(c, kEnd, epoch)) return;
  } else {
    T* tmp = static_cast<T*>(c.tmp[c.rank]);
    const int64_t base = c.rank * part;
    for (int64_t i = first; i < part && base + i < packs; i += stride) {
      reduce_pack<T, kWorld>(in, base + i).store(tmp + i * P::size);
    }
    if (barrier<kWorld>(c, kMid, epoch)) return;
    for (int s = 0; s < kWorld; ++s) {
      const T* src = static_cast<const T*>(c.tmp[s]);
      for (int64_t i = first; i < part && s * part + i < packs; i += stride) {
        P v;
        load_cg(v, src + i * P::size);
        v.store_stream(out + (s * part + i) * P::size);
      }
    }
  }
  if (threadIdx.x == 0) c.self->epoch[blockIdx.x] = epoch;
}

// ---- all_reduce_add_rmsnorm ----------------------------------------------------------------

// The fp32 sum over ranks (rank order) of pack idx: the same sum as reduce_pack, unrounded.
template <typename T, int kWorld, int kV>
__device__ __forceinline__ void reduce_float(const RankPtrs& in, int64_t idx, float (&acc)[kV]) {
  using P = kernels::Pack<T>;
  float v[kV];
  P a;
  load_cg(a, static_cast<const T*>(in.p[0]) + idx * kV);
  a.unpack(acc);
#pragma unroll
  for (int q = 1; q < kWorld; ++q) {
    load_cg(a, static_cast<const T*>(in.p[q]) + idx * kV);
    a.unpack(v);
#pragma unroll
    for (int k = 0; k < kV; ++k) acc[k] += v[k];
  }
}

// x, residual: [rows, hp * kV] contiguous; one block per row at a time, the row's fp32 sum kept
// in registers (at most kFusedMaxPacks packs per thread), residual written once, x overwritten.
// kWorld == 1: no peers, no barriers (the sum is x itself). Two-shot: rows_per rows per rank.
template <typename T, int kWorld, bool kTwoShot>
__global__ void __launch_bounds__(kThreads)
    fused_kernel(const Ctl c, T* x, T* residual, const T* __restrict__ weight, int64_t rows,
                 int hp, int64_t rows_per, float inv_hidden, float eps) {
  using P = kernels::Pack<T>;
  constexpr int kV = P::size;
  using F = kernels::Pack<float, kV>;
  __shared__ float red[32];
  uint32_t epoch = 0;
  RankPtrs in{};
  if constexpr (kWorld > 1) {
    if (aborted(c)) return;
    epoch = c.self->epoch[blockIdx.x] + 1;
    in = *c.in;
    // Stage the rows this block index reduces on every rank (x is overwritten, never shared).
    T* staging = const_cast<T*>(static_cast<const T*>(c.in->p[c.rank]));
    const int owners = kTwoShot ? kWorld : 1;
    const int64_t local_rows = kTwoShot ? rows_per : rows;
    for (int s = 0; s < owners; ++s) {
      for (int64_t l = blockIdx.x; l < local_rows; l += gridDim.x) {
        const int64_t j = kTwoShot ? s * rows_per + l : l;
        if (j >= rows) break;
        for (int i = threadIdx.x; i < hp; i += blockDim.x) {
          P v;
          v.load_stream(x + (j * hp + i) * kV);
          v.store(staging + (j * hp + i) * kV);
        }
      }
    }
    if (barrier<kWorld>(c, kStart, epoch)) return;
    if constexpr (kTwoShot) {
      float* tmp = static_cast<float*>(c.tmp[c.rank]);
      for (int64_t l = blockIdx.x; l < rows_per; l += gridDim.x) {
        const int64_t j = c.rank * rows_per + l;
        if (j >= rows) break;
        for (int i = threadIdx.x; i < hp; i += blockDim.x) {
          float acc[kV];
          reduce_float<T, kWorld, kV>(in, j * hp + i, acc);
          F f;
          f.pack(acc);
          f.store(tmp + (l * hp + i) * kV);
        }
      }
      if (barrier<kWorld>(c, kMid, epoch)) return;
    }
  }

  // Row j: its fp32 sum from `owner`'s tmp row l (two-shot), the peers' stagings (one-shot) or
  // x itself (world 1); + residual; stored; normalised.
  auto do_row = [&](int64_t j, int owner, int64_t l) {
    float r[kFusedMaxPacks][kV];
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < kFusedMaxPacks; ++k) {
      const int i = threadIdx.x + k * blockDim.x;
      if (i < hp) {
        const int64_t at = (j * hp + i) * kV;
        if constexpr (kWorld == 1) {
          P a;
          a.load(x + at);
          a.unpack(r[k]);
        } else if constexpr (kTwoShot) {
          F f;
          load_cg(f, static_cast<const float*>(c.tmp[owner]) + (l * hp + i) * kV);
          f.unpack(r[k]);
        } else {
          reduce_float<T, kWorld, kV>(in, j * hp + i, r[k]);
        }
        P res;
        res.load(residual + at);
        float b[kV];
        res.unpack(b);
#pragma unroll
        for (int e = 0; e < kV; ++e) {
          r[k][e] += b[e];
          ss = fmaf(r[k][e], r[k][e], ss);
        }
        res.pack(r[k]);
        res.store(residual + at);
      }
    }
    const float rstd = rsqrtf(kernels::block_sum(ss, red) * inv_hidden + eps);
#pragma unroll
    for (int k = 0; k < kFusedMaxPacks; ++k) {
      const int i = threadIdx.x + k * blockDim.x;
      if (i < hp) {
        P w;
        w.load_cached(weight + i * kV);
        float wf[kV];
        w.unpack(wf);
#pragma unroll
        for (int e = 0; e < kV; ++e) r[k][e] = r[k][e] * rstd * wf[e];
        P y;
        y.pack(r[k]);
        y.store(x + (j * hp + i) * kV);
      }
    }
  };

  if constexpr (kTwoShot) {
    for (int s = 0; s < kWorld; ++s) {
      for (int64_t l = blockIdx.x; l < rows_per; l += gridDim.x) {
        const int64_t j = s * rows_per + l;
        if (j >= rows) break;
        do_row(j, s, l);
      }
    }
  } else {
    for (int64_t j = blockIdx.x; j < rows; j += gridDim.x) do_row(j, 0, 0);
  }
  if constexpr (kWorld > 1) {
    if constexpr (!kTwoShot) {
      if (barrier<kWorld>(c, kEnd, epoch)) return;
    }
    if (threadIdx.x == 0) c.self->epoch[blockIdx.x] = epoch;
  }
}

// ---- host side -----------------------------------------------------------------------------

class DeviceScope {
 public:
  explicit DeviceScope(int64_t device) {
    cudaGetDevice(&previous_);
    if (previous_ != device) cudaSetDevice(static_cast<int>(device));
  }
  ~DeviceScope() { cudaSetDevice(previous_); }

 private:
  int previous_ = 0;
};

inline void check_cuda(const char* what, cudaError_t status) {
  if (status != cudaSuccess) cudaGetLastError();
  TVM_FFI_CHECK(status == cudaSuccess, RuntimeError)
      << "communication: " << what << " failed: " << cudaGetErrorString(status);
}

inline State* state_of(const char* op, int64_t handle) {
  TVM_FFI_CHECK(handle != 0, ValueError) << op << ": the communicator has no CUDA state";
  return reinterpret_cast<State*>(handle);
}

// vLLM's choice (REDUCE_CASE): world 2 always one-shot; <= 4 ranks below 512 KiB and <= 8 ranks
// below 256 KiB one-shot; two-shot otherwise. algo: -1 auto, 0 one-shot, 1 two-shot.
inline bool use_two_shot(int world, int64_t bytes, int64_t algo) {
  if (algo >= 0) return algo == 1;
  if (world == 2) return false;
  if (world <= 4 && bytes < 512 * 1024) return false;
  if (world <= 8 && bytes < 256 * 1024) return false;
  return true;
}

inline unsigned grid_for(int64_t work, int64_t per_block, int64_t max_blocks) {
  int64_t cap = max_blocks < 1 ? 1 : (max_blocks > kMaxBlocks ? kMaxBlocks : max_blocks);
  int64_t g = (work + per_block - 1) / per_block;
  return static_cast<unsigned>(g < 1 ? 1 : (g > cap ? cap : g));
}

inline void check_aligned(const char* op, const char* arg, const void* p) {
  TVM_FFI_CHECK(reinterpret_cast<uintptr_t>(p) % 16 == 0, ValueError)
      << op << ": " << arg << " must be 16-byte aligned";
}

template <int kWorld, typename T>
void launch_all_reduce(const Ctl& c, const T* x, T* out, int64_t packs, bool two_shot,
                       int64_t max_blocks, cudaStream_t stream, const char* op) {
  if (two_shot) {
    const int64_t part = (packs + kWorld - 1) / kWorld;
    all_reduce_kernel<T, kWorld, true>
        <<<grid_for(part, kThreads, max_blocks), kThreads, 0, stream>>>(c, x, out, packs, part);
  } else {
    all_reduce_kernel<T, kWorld, false>
        <<<grid_for(packs, kThreads, max_blocks), kThreads, 0, stream>>>(c, x, out, packs, packs);
  }
  kernels::check_launch(op);
}

template <int kWorld, typename T>
void launch_fused(const Ctl& c, T* x, T* res, const T* w, int64_t rows, int hp, bool two_shot,
                  int64_t max_blocks, float inv_hidden, float eps, cudaStream_t stream,
                  const char* op) {
  int threads = (hp + 31) / 32 * 32;
  if (threads > kThreads) threads = kThreads;
  if constexpr (kWorld > 1) {
    if (two_shot) {
      const int64_t rows_per = (rows + kWorld - 1) / kWorld;
      fused_kernel<T, kWorld, true><<<grid_for(rows_per, 1, max_blocks), threads, 0, stream>>>(
          c, x, res, w, rows, hp, rows_per, inv_hidden, eps);
      kernels::check_launch(op);
      return;
    }
  }
  const int64_t cap = kWorld == 1 ? 1 << 20 : max_blocks;
  const unsigned grid = kWorld == 1 ? static_cast<unsigned>(rows < (1 << 20) ? rows : (1 << 20))
                                    : grid_for(rows, 1, cap);
  fused_kernel<T, kWorld, false>
      <<<grid, threads, 0, stream>>>(c, x, res, w, rows, hp, rows, inv_hidden, eps);
  kernels::check_launch(op);
}

}  // namespace car

// ---- exported entries ----------------------------------------------------------------------

// Bytes reserved for the Signal at the start of each rank's region.
inline int64_t car_signal_bytes() { return car::kSignalBytes; }

// Zeroed device memory of `bytes` on `device` (setup only: synchronises).
inline int64_t car_malloc(int64_t device, int64_t bytes) {
  car::DeviceScope scope(device);
  void* p = nullptr;
  car::check_cuda("cudaMalloc", cudaMalloc(&p, static_cast<size_t>(bytes)));
  car::check_cuda("cudaMemset", cudaMemset(p, 0, static_cast<size_t>(bytes)));
  car::check_cuda("cudaDeviceSynchronize", cudaDeviceSynchronize());
  return reinterpret_cast<int64_t>(p);
}

inline void car_free(int64_t device, int64_t ptr) {
  car::DeviceScope scope(device);
  car::check_cuda("cudaFree", cudaFree(reinterpret_cast<void*>(ptr)));
}

// Zeroed pinned host memory mapped into the device address space (the error word).
inline int64_t car_host_alloc(int64_t bytes) {
  void* p = nullptr;
  car::check_cuda("cudaHostAlloc",
                  cudaHostAlloc(&p, static_cast<size_t>(bytes), cudaHostAllocMapped |
                                                                     cudaHostAllocPortable));
  std::memset(p, 0, static_cast<size_t>(bytes));
  return reinterpret_cast<int64_t>(p);
}

inline void car_host_free(int64_t ptr) {
  car::check_cuda("cudaFreeHost", cudaFreeHost(reinterpret_cast<void*>(ptr)));
}

// The IPC handle of the allocation holding `ptr` (64 bytes into `handle`, a CPU uint8 tensor);
// returns ptr's offset from the allocation's start.
inline int64_t car_ipc_handle(int64_t device, int64_t ptr, tvm::ffi::TensorView handle) {
  TVM_FFI_CHECK(handle.numel() == sizeof(cudaIpcMemHandle_t) && handle.device().device_type ==
                                                                    kDLCPU,
                ValueError)
      << "communication: the IPC handle must be a CPU uint8 tensor of "
      << sizeof(cudaIpcMemHandle_t) << " bytes";
  car::DeviceScope scope(device);
  using GetRange = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);
  static GetRange get_range = nullptr;
  if (get_range == nullptr) {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    car::check_cuda("cudaGetDriverEntryPointByVersion(cuMemGetAddressRange)",
                    cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000,
                                                     cudaEnableDefault, &found));
    TVM_FFI_CHECK(found == cudaDriverEntryPointSuccess && fn != nullptr, RuntimeError)
        << "communication: the driver has no cuMemGetAddressRange";
    get_range = reinterpret_cast<GetRange>(fn);
  }
  CUdeviceptr base = 0;
  size_t size = 0;
  TVM_FFI_CHECK(get_range(&base, &size, static_cast<CUdeviceptr>(ptr)) == CUDA_SUCCESS,
                RuntimeError)
      << "communication: cuMemGetAddressRange failed for a registered buffer";
  cudaIpcMemHandle_t h;
  car::check_cuda("cudaIpcGetMemHandle (expandable segments cannot be shared)",
                  cudaIpcGetMemHandle(&h, reinterpret_cast<void*>(base)));
  std::memcpy(kernels::data(handle), &h, sizeof(h));
  return ptr - static_cast<int64_t>(base);
}

// Opens a peer's handle (from car_ipc_handle); returns the mapped base of its allocation.
inline int64_t car_ipc_open(int64_t device, tvm::ffi::TensorView handle) {
  TVM_FFI_CHECK(handle.numel() == sizeof(cudaIpcMemHandle_t), ValueError)
      << "communication: an IPC handle has " << sizeof(cudaIpcMemHandle_t) << " bytes";
  car::DeviceScope scope(device);
  cudaIpcMemHandle_t h;
  std::memcpy(&h, kernels::data(handle), sizeof(h));
  void* p = nullptr;
  car::check_cuda("cudaIpcOpenMemHandle",
                  cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess));
  return reinterpret_cast<int64_t>(p);
}

inline void car_ipc_close(int64_t device, int64_t base) {
  car::DeviceScope scope(device);
  car::check_cuda("cudaIpcCloseMemHandle", cudaIpcCloseMemHandle(reinterpret_cast<void*>(base)));
}

// Copies a CPU tensor's bytes to device address `dst` (setup: synchronous).
inline void car_h2d(int64_t device, int64_t dst, tvm::ffi::TensorView src) {
  car::DeviceScope scope(device);
  const size_t bytes = static_cast<size_t>(src.numel()) * (src.dtype().bits / 8);
  car::check_cuda("cudaMemcpy", cudaMemcpy(reinterpret_cast<void*>(dst), kernels::data(src),
                                           bytes, cudaMemcpyHostToDevice));
}

// The per-communicator state: every rank's signal and tmp address (CPU int64 [world] tensors,
// mapped in this process), the host-mapped error word, the spin timeout.
inline int64_t car_create(int64_t device, int64_t rank, int64_t world, tvm::ffi::TensorView sigs,
                          tvm::ffi::TensorView tmps, int64_t error_host, double timeout_s,
                          int64_t max_size) {
  TVM_FFI_CHECK(world >= 1 && world <= car::kMaxRanks && rank >= 0 && rank < world, ValueError)
      << "communication: rank " << rank << " of world " << world << " is out of range";
  TVM_FFI_CHECK(sigs.numel() == world && tmps.numel() == world, ValueError)
      << "communication: one signal and one tmp address per rank";
  car::DeviceScope scope(device);
  auto* st = new car::State{};
  st->world = static_cast<int>(world);
  st->device = static_cast<int>(device);
  st->max_size = max_size;
  const int64_t* s = kernels::data<int64_t>(sigs);
  const int64_t* t = kernels::data<int64_t>(tmps);
  for (int64_t r = 0; r < world; ++r) {
    st->ctl.sig[r] = reinterpret_cast<car::Signal*>(s[r]);
    st->ctl.tmp[r] = reinterpret_cast<void*>(t[r]);
  }
  st->ctl.self = st->ctl.sig[rank];
  st->ctl.rank = static_cast<int>(rank);
  st->ctl.timeout_ns =
      timeout_s > 0 ? static_cast<unsigned long long>(timeout_s * 1e9) : 0ull;
  void* dev = nullptr;
  if (error_host != 0) {
    car::check_cuda("cudaHostGetDevicePointer",
                    cudaHostGetDevicePointer(&dev, reinterpret_cast<void*>(error_host), 0));
  }
  st->ctl.error = static_cast<volatile uint32_t*>(dev);
  return reinterpret_cast<int64_t>(st);
}

inline void car_destroy(int64_t state) { delete reinterpret_cast<car::State*>(state); }

// out = sum over ranks of x (contiguous, nbytes % 16 == 0, <= max_size, 16-byte aligned).
// slot: the device RankPtrs of this call's inputs. algo: -1 auto, 0 one-shot, 1 two-shot.
inline void custom_all_reduce(tvm::ffi::TensorView out, tvm::ffi::TensorView x, int64_t state,
                              int64_t slot, int64_t algo, int64_t max_blocks) {
  constexpr const char* kOp = "communication.custom_all_reduce";
  // 1. Validate.
  car::State* st = car::state_of(kOp, state);
  kernels::check_same_shape(kOp, "out", out, "x", x);
  kernels::check_same_dtype(kOp, "out", out, "x", x);
  kernels::check_contiguous(kOp, "x", x);
  kernels::check_contiguous(kOp, "out", out);
  kernels::check_device(kOp, "x", x, kDLCUDA);
  kernels::check_same_device(kOp, "out", out, "x", x);
  const int64_t bytes = x.numel() * (x.dtype().bits / 8);
  TVM_FFI_CHECK(bytes % 16 == 0 && bytes <= st->max_size, ValueError)
      << kOp << ": the custom path takes whole 16-byte packs up to " << st->max_size
      << " bytes, got " << bytes;
  if (bytes == 0) return;
  car::check_aligned(kOp, "x", kernels::data(x));
  car::check_aligned(kOp, "out", kernels::data(out));
  TVM_FFI_CHECK(x.device().device_id == st->device, ValueError)
      << kOp << ": x is on cuda:" << x.device().device_id << ", the communicator on cuda:"
      << st->device;
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(x);
  const kernels::Launch ctx(kOp, x);
  if (st->world == 1) {
    car::check_cuda("cudaMemcpyAsync", cudaMemcpyAsync(kernels::data(out), kernels::data(x), bytes,
                                                       cudaMemcpyDeviceToDevice, ctx.stream));
    return;
  }
  car::Ctl c = st->ctl;
  c.in = reinterpret_cast<const car::RankPtrs*>(slot);
  const int64_t packs = bytes / 16;
  const bool two_shot = car::use_two_shot(st->world, bytes, algo);
  // 4. Dispatch on dtype and world size, launch (checked).
  KERNELS_DISPATCH_FLOAT(x.dtype(), kOp, T, [&] {
    const T* xp = kernels::data<T>(x);
    T* op = kernels::data<T>(out);
    const int64_t elems = packs;  // packs of kernels::Pack<T>: 16 bytes each
    switch (st->world) {
      case 2: car::launch_all_reduce<2>(c, xp, op, elems, two_shot, max_blocks, ctx.stream, kOp); break;
      case 4: car::launch_all_reduce<4>(c, xp, op, elems, two_shot, max_blocks, ctx.stream, kOp); break;
      case 6: car::launch_all_reduce<6>(c, xp, op, elems, two_shot, max_blocks, ctx.stream, kOp); break;
      case 8: car::launch_all_reduce<8>(c, xp, op, elems, two_shot, max_blocks, ctx.stream, kOp); break;
      default: TVM_FFI_THROW(ValueError) << kOp << ": world size " << st->world << " is not 2, 4, 6 or 8";
    }
  });
}

// In place: r = sum over ranks of x + residual (fp32); residual = r; x = r * rstd * weight.
// x, residual: [T, H] contiguous; weight: [H]; all one dtype; H a whole number of 16-byte packs,
// at most kFusedMaxPacks * 512 packs; 16-byte aligned; T * H * size <= max_size (world > 1).
inline void all_reduce_add_rmsnorm(tvm::ffi::TensorView x, tvm::ffi::TensorView residual,
                                   tvm::ffi::TensorView weight, double eps, int64_t state,
                                   int64_t slot, int64_t algo, int64_t max_blocks) {
  constexpr const char* kOp = "communication.all_reduce_add_rmsnorm";
  // 1. Validate.
  car::State* st = car::state_of(kOp, state);
  kernels::check_ndim(kOp, "x", x, 2);
  kernels::check_same_shape(kOp, "residual", residual, "x", x);
  kernels::check_same_dtype(kOp, "residual", residual, "x", x);
  kernels::check_same_dtype(kOp, "weight", weight, "x", x);
  kernels::check_contiguous(kOp, "x", x);
  kernels::check_contiguous(kOp, "residual", residual);
  kernels::check_contiguous(kOp, "weight", weight);
  kernels::check_eps(kOp, eps);
  kernels::check_no_overlap(kOp, "x", x, "residual", residual);
  kernels::check_device(kOp, "x", x, kDLCUDA);
  kernels::check_same_device(kOp, "residual", residual, "x", x);
  kernels::check_same_device(kOp, "weight", weight, "x", x);
  const int64_t rows = x.size(0), hidden = x.size(1);
  const int64_t esize = x.dtype().bits / 8;
  TVM_FFI_CHECK(weight.ndim() == 1 && weight.size(0) == hidden, ValueError)
      << kOp << ": weight must be [" << hidden << "], got " << kernels::shape_string(weight);
  const int64_t vec = 16 / esize;
  TVM_FFI_CHECK(hidden % vec == 0 && hidden / vec <= car::kFusedMaxPacks * car::kThreads,
                ValueError)
      << kOp << ": the fused kernel takes H a multiple of " << vec << " up to "
      << car::kFusedMaxPacks * car::kThreads * vec << ", got " << hidden;
  const int64_t bytes = rows * hidden * esize;
  TVM_FFI_CHECK(st->world == 1 || bytes <= st->max_size, ValueError)
      << kOp << ": the custom path takes up to " << st->max_size << " bytes, got " << bytes;
  if (rows == 0 || hidden == 0) return;
  car::check_aligned(kOp, "x", kernels::data(x));
  car::check_aligned(kOp, "residual", kernels::data(residual));
  car::check_aligned(kOp, "weight", kernels::data(weight));
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(x);
  const kernels::Launch ctx(kOp, x);
  car::Ctl c = st->ctl;
  c.in = reinterpret_cast<const car::RankPtrs*>(slot);
  const bool two_shot = car::use_two_shot(st->world, bytes, algo);
  const int hp = static_cast<int>(hidden / vec);
  const float inv_hidden = 1.0f / static_cast<float>(hidden);
  const float e = static_cast<float>(eps);
  // 4. Dispatch on dtype and world size, launch (checked).
  KERNELS_DISPATCH_FLOAT(x.dtype(), kOp, T, [&] {
    T* xp = kernels::data<T>(x);
    T* rp = kernels::data<T>(residual);
    const T* wp = kernels::data<T>(weight);
    auto fused = [&](auto world) {
      car::launch_fused<decltype(world)::value>(c, xp, rp, wp, rows, hp, two_shot, max_blocks,
                                                 inv_hidden, e, ctx.stream, kOp);
    };
    switch (st->world) {
      case 1: fused(std::integral_constant<int, 1>{}); break;
      case 2: fused(std::integral_constant<int, 2>{}); break;
      case 4: fused(std::integral_constant<int, 4>{}); break;
      case 6: fused(std::integral_constant<int, 6>{}); break;
      case 8: fused(std::integral_constant<int, 8>{}); break;
      default:
        TVM_FFI_THROW(ValueError) << kOp << ": world size " << st->world
                                  << " is not 1, 2, 4, 6 or 8";
    }
  });
}
