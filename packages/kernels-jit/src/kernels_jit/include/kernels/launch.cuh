// Launch helpers: the caller's stream (torch's current stream, passed through tvm-ffi) and a
// checked launch whose error names the kernel's op.
#pragma once

#include <cuda_runtime.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>

#include <atomic>
#include <cstdint>

namespace kernels {

// Selects the tensor's device for the duration of a host entry point, then restores the old one.
inline cudaStream_t current_stream(const tvm::ffi::TensorView& t) {
  return static_cast<cudaStream_t>(TVMFFIEnvGetStream(kDLCUDA, t.device().device_id));
}

class DeviceGuard {
 public:
  explicit DeviceGuard(const tvm::ffi::TensorView& t) {
    cudaGetDevice(&previous_);
    if (previous_ != t.device().device_id) cudaSetDevice(t.device().device_id);
  }
  ~DeviceGuard() { cudaSetDevice(previous_); }

 private:
  int previous_ = 0;
};


// A failed launch (`status`, or the runtime's last error) as a RuntimeError naming the op.
inline void check_launch(const char* op, cudaError_t status = cudaGetLastError()) {
  if (status != cudaSuccess) cudaGetLastError();  // clear it: the error is reported here
  TVM_FFI_CHECK(status == cudaSuccess, RuntimeError)
      << op << ": kernel launch failed: " << cudaGetErrorString(status);
}

// Where and how an entry point launches: the op (for errors), the device, the caller's stream
// and the PDL switch (-1 auto: kernels::pdl_for_grid; 0 off; 1 on). Taken after the DeviceGuard.
struct Launch {
  const char* op;
  int device;
  cudaStream_t stream;
  int enable_pdl;
  Launch(const char* op_name, const tvm::ffi::TensorView& like, int64_t pdl = -1)
      : op(op_name),
        device(like.device().device_id),
        stream(current_stream(like)),
        enable_pdl(static_cast<int>(pdl)) {}
};

inline unsigned ceil_div(long long a, long long b) { return static_cast<unsigned>((a + b - 1) / b); }

inline int sm_count(int device) {
  static int cached[64] = {0};
  if (device < 64 && cached[device]) return cached[device];
  int count = 0;
  cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device);
  if (device < 64) cached[device] = count;
  return count;
}

// The device's peak DRAM bandwidth in GB/s, from its memory clock and bus width (double data
// rate): H100 SXM 3352, H200 4097 (its HBM3e's 4.8 TB/s is not what the attributes give).
inline int dram_gbps(int device) {
  static int cached[64] = {0};
  if (device < 64 && cached[device]) return cached[device];
  int khz = 0, bits = 0;
  cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, device);
  cudaDeviceGetAttribute(&bits, cudaDevAttrGlobalMemoryBusWidth, device);
  const int gbps = static_cast<int>(2.0 * khz * 1e3 * (bits / 8) / 1e9);
  if (device < 64) cached[device] = gbps;
  return gbps;
}

// The smallest power of two >= x (1 for x <= 1), at most 2^30.
inline int next_pow2(int64_t x) {
  int p = 1;
  while (p < x && p < (1 << 30)) p <<= 1;
  return p;
}

// min(needed, the blocks of kKernel (launched with `threads` threads) resident on the device at
// once), at least 1: the grid of a grid-stride kernel that should fill the GPU exactly once.
// The occupancy is cached per device (one kernel, one block size per instantiation).
template <auto kKernel>
inline unsigned resident_grid(int device, int64_t needed, int threads) {
  static int cached[64] = {0};
  int per_sm = device >= 0 && device < 64 ? cached[device] : 0;
  if (per_sm == 0) {
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kKernel, threads, 0);
    per_sm = per_sm > 1 ? per_sm : 1;
    if (device >= 0 && device < 64) cached[device] = per_sm;
  }
  const int64_t resident = static_cast<int64_t>(per_sm) * sm_count(device);
  const int64_t grid = needed < resident ? needed : resident;
  return static_cast<unsigned>(grid > 1 ? grid : 1);
}

// Opts kKernel in to `bytes` of dynamic shared memory per block where that is above the 48 KiB
// default (cudaFuncSetAttribute): once per kernel, device and larger size. A template per kernel,
// so kernels of one signature do not share the record (a flag per signature once let the second
// of two such kernels launch without the opt-in: "invalid argument"). A refusal (more than the
// device allows) is a RuntimeError naming `op`.
template <auto kKernel>
inline void allow_dynamic_smem(const char* op, int device, int64_t bytes) {
  if (bytes <= 48 * 1024) return;
  static std::atomic<int64_t> allowed[64];
  const bool recorded = device >= 0 && device < 64;
  if (recorded && allowed[device].load(std::memory_order_relaxed) >= bytes) return;
  constexpr auto kernel = kKernel;
  check_launch(op, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(bytes)));
  if (!recorded) return;
  int64_t seen = allowed[device].load(std::memory_order_relaxed);
  while (seen < bytes && !allowed[device].compare_exchange_weak(seen, bytes)) {
  }
}

// Threads per row for the gather/scatter kernels that give each row a power-of-two team: about
// `unroll` packs per thread, doubled (up to one per pack of the row, up to `max_threads`) while
// the grid of `rows` teams is short of one wave of 2048 threads per SM (small batches are
// latency-bound: more threads per row means fewer dependent accesses per thread).
inline int threads_per_row(int64_t packs, int64_t rows, int unroll, int max_threads, int device) {
  int g = next_pow2((packs + unroll - 1) / unroll);
  g = g < max_threads ? g : max_threads;
  const int64_t wave = static_cast<int64_t>(sm_count(device)) * 2048;
  while (g < max_threads && g * 2 <= next_pow2(packs) && rows * g * 2 <= wave) g *= 2;
  return g;
}

}  // namespace kernels
