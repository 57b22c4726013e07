// Programmatic dependent launch (PDL, sm_90+): a kernel launched with the programmatic
// stream-serialization attribute may start while the previous kernel on the stream is still
// running; it must call `pdl_wait()` before touching global memory, which returns once that kernel
// has completed and its writes are visible. What it buys is the launch latency and block
// scheduling of back-to-back small kernels (decode), which otherwise sit between them. On older
// GPUs, and for kernels launched without the attribute, both device calls are no-ops.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <utility>

#include "launch.cuh"

namespace kernels {

// First statement of a PDL kernel that reads or writes global memory.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the next PDL-launched kernel start its blocks (they still wait for this grid to finish
// before their own memory accesses). Issue it once this block has issued its loads.
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Whether `device` can launch with PDL (compute capability 9.0 or newer), cached per device.
inline bool pdl_supported(int device) {
  static int cached[64] = {0};  // 0 unknown, 1 no, 2 yes
  if (device >= 0 && device < 64 && cached[device]) return cached[device] == 2;
  int major = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (device >= 0 && device < 64) cached[device] = major >= 9 ? 2 : 1;
  return major >= 9;
}

// Whether `device` launches cooperative grids (cudaDevAttrCooperativeLaunch), cached per device.
inline bool cooperative_supported(int device) {
  static int cached[64] = {0};  // 0 unknown, 1 no, 2 yes
  if (device >= 0 && device < 64 && cached[device]) return cached[device] == 2;
  int ok = 0;
  cudaDeviceGetAttribute(&ok, cudaDevAttrCooperativeLaunch, device);
  if (device >= 0 && device < 64) cached[device] = ok ? 2 : 1;
  return ok != 0;
}

// Grids of up to this many waves run with PDL by default (see pointwise.cuh for the measurements:
// PDL saves the gap between back-to-back small kernels, while in grids of tens of thousands of
// short blocks the two instructions cost up to 20% of the bandwidth).
constexpr int kPdlMaxWaves = 8;

// Whether to launch a grid with PDL. `enable`: 1 on, 0 off, negative: auto, on for sm_90+ grids
// of at most kPdlMaxWaves waves. A wave is the blocks resident at once, estimated from the threads
// (2048 per SM, at most 32 blocks per SM); kernels use fewer registers than would lower that.
inline bool pdl_for_grid(int enable, int device, unsigned grid, unsigned block) {
  if (enable >= 0) return enable > 0;
  if (!pdl_supported(device)) return false;
  const unsigned per_sm = std::min(32u, std::max(1u, 2048u / block));
  return grid <= static_cast<unsigned>(kPdlMaxWaves) * per_sm * sm_count(device);
}

// A cudaLaunchConfig_t with the launch attributes the library's kernels use: PDL (the kernel
// then takes `pdl` and calls pdl_wait), a 1-D thread-block cluster of `cluster` CTAs (0: no
// cluster attribute), a cooperative grid. It owns the attribute array that config points into, so
// it is built where the launch (or occupancy query on `config`) happens and is not copied.
struct LaunchConfig {
  cudaLaunchConfig_t config = {};
  cudaLaunchAttribute attribute[3];

  LaunchConfig(dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream, bool pdl,
               unsigned cluster = 0, bool cooperative = false) {
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = shared_bytes;
    config.stream = stream;
    config.attrs = attribute;
    unsigned n = 0;
    if (pdl) {
      attribute[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attribute[n++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (cluster > 0) {
      attribute[n].id = cudaLaunchAttributeClusterDimension;
      attribute[n].val.clusterDim.x = cluster;
      attribute[n].val.clusterDim.y = 1;
      attribute[n++].val.clusterDim.z = 1;
    }
    if (cooperative) {
      attribute[n].id = cudaLaunchAttributeCooperative;
      attribute[n++].val.cooperative = 1;
    }
    config.numAttrs = n;
  }
  LaunchConfig(const LaunchConfig&) = delete;
  LaunchConfig& operator=(const LaunchConfig&) = delete;

  // The launch status (check it, e.g. with kernels::check_launch).
  template <typename... Params, typename... Args>
  cudaError_t launch(void (*kernel)(Params...), Args&&... args) {
    return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
  }
};

// Launches `kernel` on `stream`, with the PDL attribute when `pdl` is true. Returns the launch
// status (check it, e.g. with kernels::check_launch).
template <typename... Params, typename... Args>
inline cudaError_t launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                              cudaStream_t stream, bool pdl, Args&&... args) {
  return LaunchConfig(grid, block, shared_bytes, stream, pdl).launch(kernel,
                                                                     std::forward<Args>(args)...);
}

// `kernel(pdl, args...)` with `smem` bytes of dynamic shared memory (<= 48 KiB, or opted in by
// allow_dynamic_smem) on the caller's stream, PDL as pdl_for_grid decides from `ctx.enable_pdl`,
// a failure a RuntimeError naming `ctx.op`.
template <typename... Params, typename... Args>
inline void launch_dynamic(const Launch& ctx, void (*kernel)(bool, Params...), unsigned grid,
                           unsigned block, int64_t smem, Args&&... args) {
  const bool pdl = pdl_for_grid(ctx.enable_pdl, ctx.device, grid, block);
  check_launch(ctx.op, launch_pdl(kernel, dim3(grid), dim3(block), static_cast<size_t>(smem),
                                  ctx.stream, pdl, pdl, std::forward<Args>(args)...));
}

// The launch of both engines: launch_dynamic without dynamic shared memory.
template <typename... Params, typename... Args>
inline void launch(const Launch& ctx, void (*kernel)(bool, Params...), unsigned grid,
                   unsigned block, Args&&... args) {
  launch_dynamic(ctx, kernel, grid, block, 0, std::forward<Args>(args)...);
}

// launch_dynamic of kKernel with `smem` bytes, opted in above 48 KiB (allow_dynamic_smem).
template <auto kKernel, typename... Args>
inline void launch_with_smem(const Launch& ctx, unsigned grid, unsigned block, int64_t smem,
                             Args&&... args) {
  allow_dynamic_smem<kKernel>(ctx.op, ctx.device, smem);
  launch_dynamic(ctx, kKernel, grid, block, smem, std::forward<Args>(args)...);
}

}  // namespace kernels
