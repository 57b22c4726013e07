// Row-wise kernels (the norms of kernels-layernorm, elementwise.fused_dual_residual_rmsnorm):
// how rows are found in memory, how the threads of a row are laid out, the row reduction, and the
// host-side launch plan and launch. Each kernel takes `bool pdl` first, then its Params; the
// launch decides PDL per grid (kernels::pdl_for_grid), and the kernel runs the PDL instructions
// only when it is set.
//
// Thread layout. A row is split over `tpr` threads ("threads per row"). Either tpr <= 32 is a power
// of two and the row's threads are an aligned group of lanes of one warp (reduction: shuffles
// only; a block holds several rows), or tpr > 32 is a multiple of 32 equal to the block size (one
// row per block; reduction: shuffles, one shared-memory step, one barrier). Thread `lane` of a row
// owns the accesses lane, lane + tpr, lane + 2 tpr, ... so each access of the row's threads is one
// coalesced sweep over the row.
//
// Rows in memory. A tensor's leading dims are merged where its layout allows into at most two
// levels (outer, inner): row r starts at element (r / inner) * s0 + (r % inner) * s1. That covers
// contiguous and row-strided [T, H] (inner = 1) and head-strided [T, heads, D] views such as q and
// k inside a fused qkv buffer.
#pragma once

#include <kernels/checks.h>
#include <kernels/cuda_dtype.cuh>
#include <kernels/dtype.h>
#include <kernels/launch.cuh>
#include <kernels/pdl.cuh>
#include <kernels/reduce.cuh>
#include <kernels/vec.cuh>

#include <array>
#include <cstdint>
#include <cstring>
#include <initializer_list>

namespace rowwise {

// Largest block; the register kernels declare it in __launch_bounds__, which caps them at
// 65536 / 512 = 128 registers per thread (1024 would cap them at 64 and spill the row).
constexpr int kMaxBlock = 512;
// Accesses per thread of the register kernels (8 x 16 bytes: 64 bf16 values, 32 registers).
constexpr int kMaxVectorsPerThread = 8;
// Rows of at most this many 16-byte vectors stay in registers between the reduction and the
// normalisation (32768 bf16/fp16 or 16384 fp32 elements); longer rows take the loop kernel, which
// reads the row again (from L2) for the normalisation.
constexpr int kRegisterMaxVectors = kMaxBlock * kMaxVectorsPerThread;
// Warps per block when several rows share a block.
constexpr int kMaxWarpsPerBlock = 8;
constexpr int kMaxDims = 16;

// ---------------------------------------------------------------------------------------------
// Device side.

// Conversions between 32-bit words of packed storage and floats.
template <typename T>
struct Words;

template <>
struct Words<float> {
  static constexpr int kPerWord = 1;
  static __device__ __forceinline__ void unpack(uint32_t w, float* f) { f[0] = __uint_as_float(w); }
  static __device__ __forceinline__ uint32_t pack(const float* f) { return __float_as_uint(f[0]); }
};

template <>
struct Words<__nv_bfloat16> {
  static constexpr int kPerWord = 2;
  static __device__ __forceinline__ void unpack(uint32_t w, float* f) {
    f[0] = __uint_as_float(w << 16);
    f[1] = __uint_as_float(w & 0xffff0000u);
  }
  static __device__ __forceinline__ uint32_t pack(const float* f) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(f[0], f[1]);  // one F2FP.BF16.F32.PACK_AB
    uint32_t w;
    memcpy(&w, &h, sizeof(w));
    return w;
  }
};

template <>
struct Words<__half> {
  static constexpr int kPerWord = 2;
  static __device__ __forceinline__ void unpack(uint32_t w, float* f) {
    __half2 h;
    memcpy(&h, &w, sizeof(w));
    const float2 v = __half22float2(h);
    f[0] = v.x;
    f[1] = v.y;
  }
  static __device__ __forceinline__ uint32_t pack(const float* f) {
    const __half2 h = __floats2half2_rn(f[0], f[1]);
    uint32_t w;
    memcpy(&w, &h, sizeof(w));
    return w;
  }
};

// kN consecutive elements of T: one 16-byte access (LDG/STG.E.128) when kN * sizeof(T) == 16,
// else a single element (kN == 1, the scalar path). The vector form stores raw 32-bit words: a
// register array of class types (__nv_bfloat16) that is also copied as a whole ends up in local
// memory (a 104-byte stack frame and 240 bytes of spills in the bf16 x 8 kernel).
//   load_stream: data read once (the input rows): evict-first, and a coherent load, not
//     ld.global.nc, because outputs may alias inputs (out = input, the fused ops in place).
//   load_shared: data every row reads (weights, bias): the read-only path, kept in L1/L2.
//   load: data read again later (loop kernels) or written earlier by this thread.
template <typename T, int kN, bool kVector = (sizeof(T) * kN == 16)>
struct Pack;

template <typename T, int kN>
struct Pack<T, kN, true> {
  static constexpr int kWords = 4;
  static constexpr int kPerWord = Words<T>::kPerWord;
  static_assert(kWords * kPerWord == kN, "a 16-byte pack");
  uint32_t w[kWords];

  __device__ __forceinline__ void set(const uint4& r) {
    w[0] = r.x;
    w[1] = r.y;
    w[2] = r.z;
    w[3] = r.w;
  }
  __device__ __forceinline__ void zero() { set(make_uint4(0, 0, 0, 0)); }
  __device__ __forceinline__ void load_stream(const T* p) {
    set(__ldcs(reinterpret_cast<const uint4*>(p)));
  }
  __device__ __forceinline__ void load_shared(const T* p) {
    set(__ldg(reinterpret_cast<const uint4*>(p)));
  }
  __device__ __forceinline__ void load(const T* p) { set(*reinterpret_cast<const uint4*>(p)); }
  __device__ __forceinline__ void store(T* p) const {
    *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
  }
  __device__ __forceinline__ void to_floats(float (&f)[kN]) const {
#pragma unroll
    for (int i = 0; i < kWords; ++i) Words<T>::unpack(w[i], f + i * kPerWord);
  }
  __device__ __forceinline__ void from_floats(const float (&f)[kN]) {
#pragma unroll
    for (int i = 0; i < kWords; ++i) w[i] = Words<T>::pack(f + i * kPerWord);
  }
};

template <typename T>
struct Pack<T, 1, false> {
  T v;

  __device__ __forceinline__ void zero() { v = kernels::from_float<T>(0.0f); }
  __device__ __forceinline__ void load_stream(const T* p) { v = *p; }
  __device__ __forceinline__ void load_shared(const T* p) { v = __ldg(p); }
  __device__ __forceinline__ void load(const T* p) { v = *p; }
  __device__ __forceinline__ void store(T* p) const { *p = v; }
  __device__ __forceinline__ void to_floats(float (&f)[1]) const { f[0] = kernels::to_float(v); }
  __device__ __forceinline__ void from_floats(const float (&f)[1]) {
    v = kernels::from_float<T>(f[0]);
  }
};

// Element offset of row r in a tensor of rows (outer, inner) with strides (s0, s1).
struct RowMap {
  int64_t s0 = 0;
  int64_t s1 = 0;
};

__device__ __forceinline__ int64_t row_offset(const RowMap& m, int64_t r, uint32_t inner) {
  if (inner == 1) return r * m.s0;
  // row_layout() guarantees rows < 2^32 when inner > 1, so 32-bit division (a few instructions
  // instead of a 64-bit division routine) is exact.
  const uint32_t r32 = static_cast<uint32_t>(r);
  return static_cast<int64_t>(r32 / inner) * m.s0 + static_cast<int64_t>(r32 % inner) * m.s1;
}

// Thread coordinates of the row layout described at the top of this file.
struct RowThread {
  int lane;     // index among the row's threads
  int64_t row;  // global row index (may be >= rows in the last block: such threads only reduce)
};

__device__ __forceinline__ RowThread row_thread(int tpr, int tpr_shift, int rows_per_block) {
  if (tpr <= 32) {
    return {static_cast<int>(threadIdx.x & (tpr - 1)),
            static_cast<int64_t>(blockIdx.x) * rows_per_block + (threadIdx.x >> tpr_shift)};
  }
  return {static_cast<int>(threadIdx.x), static_cast<int64_t>(blockIdx.x)};
}

// Sum of `v` over the threads of one row; every thread of the row gets it. All threads of the
// block must call it (threads of a row past the end pass 0). `shared` holds 32 floats and is used
// once per kernel call site (distinct arrays for successive reductions, so no trailing barrier).
__device__ __forceinline__ float row_sum(float v, int tpr, float* shared) {
  if (tpr <= 32) {
    for (int offset = tpr >> 1; offset > 0; offset >>= 1)
      v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
  }
  v = kernels::warp_sum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x >> 5) ? shared[lane] : 0.0f;
  return kernels::warp_sum(v);
}

// Accesses per thread and pass that the loop kernels issue together before their first use:
// their loads are in flight at once even where out aliases the input (which keeps the compiler
// from moving loads across stores).
constexpr int kLoopBatch = 4;

// Pack arithmetic of the RMS kernels, in fp32: the running sum of squares, and
// y = x * rstd * (w + offset) rounded once.
template <typename T, int kN>
__device__ __forceinline__ float sum_squares(const Pack<T, kN>& x, float acc) {
  float f[kN];
  x.to_floats(f);
#pragma unroll
  for (int k = 0; k < kN; ++k) acc = fmaf(f[k], f[k], acc);
  return acc;
}

template <typename T, int kN>
__device__ __forceinline__ Pack<T, kN> scale(const Pack<T, kN>& x, const Pack<T, kN>& w,
                                             float rstd, float offset) {
  float a[kN], b[kN];
  x.to_floats(a);
  w.to_floats(b);
#pragma unroll
  for (int k = 0; k < kN; ++k) a[k] = a[k] * rstd * (b[k] + offset);
  Pack<T, kN> y;
  y.from_floats(a);
  return y;
}

// ---------------------------------------------------------------------------------------------
// Host side.

using tvm::ffi::TensorView;

template <typename T = void>
inline T* data(const TensorView& t) {
  return reinterpret_cast<T*>(static_cast<char*>(t.data_ptr()) + t.byte_offset());
}

// Leading dims of tensors of one shape, merged into (outer, inner) with each tensor's strides.
struct RowLayout {
  int64_t outer = 1;
  int64_t inner = 1;
  RowMap map[4];
  int64_t rows() const { return outer * inner; }
};

// `tensors` share a shape [..., H] (checked by the caller). Merges adjacent leading dims where
// every tensor's strides allow (size-1 dims are skipped); more than two levels is a ValueError.
inline RowLayout row_layout(const char* op, const char* what, const TensorView* const* tensors,
                            int count) {
  constexpr int kMaxTensors = sizeof(RowLayout::map) / sizeof(RowMap);
  TVM_FFI_CHECK(count <= kMaxTensors, InternalError) << op << ": row_layout of " << count
                                                     << " tensors (at most " << kMaxTensors << ")";
  const TensorView& t0 = *tensors[0];
  const int lead = t0.ndim() - 1;
  TVM_FFI_CHECK(lead < kMaxDims, ValueError) << op << ": " << what << " has too many dims ("
                                             << t0.ndim() << ")";
  int64_t size[kMaxDims];
  int64_t stride[kMaxTensors][kMaxDims];
  int levels = 0;
  for (int d = 0; d < lead; ++d) {
    const int64_t n = t0.size(d);
    if (n == 1) continue;
    bool merge = levels > 0;
    for (int i = 0; merge && i < count; ++i)
      merge = stride[i][levels - 1] == tensors[i]->stride(d) * n;
    if (merge) {
      size[levels - 1] *= n;
      for (int i = 0; i < count; ++i) stride[i][levels - 1] = tensors[i]->stride(d);
    } else {
      TVM_FFI_CHECK(levels < 2, ValueError)
          << op << ": the leading dims of " << what << " " << kernels::shape_string(t0)
          << " cannot be merged into (tokens, heads) rows with one stride each; pass a "
          << "contiguous tensor (.contiguous()) or a view whose leading dims collapse";
      size[levels] = n;
      for (int i = 0; i < count; ++i) stride[i][levels] = tensors[i]->stride(d);
      ++levels;
    }
  }
  RowLayout layout;
  if (levels >= 1) {
    layout.outer = size[0];
    for (int i = 0; i < count; ++i) layout.map[i].s0 = stride[i][0];
  }
  if (levels == 2) {
    layout.inner = size[1];
    for (int i = 0; i < count; ++i) layout.map[i].s1 = stride[i][1];
  }
  TVM_FFI_CHECK(layout.inner == 1 || layout.rows() < (int64_t{1} << 32), ValueError)
      << op << ": " << what << " " << kernels::shape_string(t0) << " has too many rows";
  return layout;
}

// 16-byte vectors (`vec` elements) are legal when every row start is 16-byte aligned: the base
// `pointers` aligned (null ones, absent tensors, pass), the hidden size and every row stride of
// `maps` multiples of the vector.
inline bool vectors_fit(int64_t hidden, int64_t vec, std::initializer_list<const void*> pointers,
                        std::initializer_list<RowMap> maps) {
  bool fit = hidden % vec == 0;
  for (const void* ptr : pointers) fit = fit && kernels::is_aligned(ptr);
  for (const RowMap& m : maps) fit = fit && m.s0 % vec == 0 && m.s1 % vec == 0;
  return fit;
}

// Threads per row, vectors per thread and the grid of one launch.
struct Plan {
  int vectors_per_thread;  // register kernels: the template argument; loop kernels: unused
  int tpr;
  int tpr_shift;  // log2(tpr) when tpr <= 32
  int rows_per_block;
  unsigned block;
  unsigned grid;
};

inline int log2_exact(int x) {
  int s = 0;
  while ((1 << s) < x) ++s;
  return s;
}

inline int next_pow2(int64_t x) {
  int p = 1;
  while (p < x) p <<= 1;
  return p;
}

// Blocks of several rows shrink for few rows so that they spread over the SMs (decode: one warp
// per block), and grow to kMaxWarpsPerBlock warps once there are rows to fill every SM.
inline void finish_plan(Plan& plan, int64_t rows, int device) {
  if (plan.tpr > 32) {
    plan.tpr_shift = 0;
    plan.rows_per_block = 1;
    plan.block = static_cast<unsigned>(plan.tpr);
  } else {
    plan.tpr_shift = log2_exact(plan.tpr);
    const int64_t warps = (rows * plan.tpr + 31) / 32;
    const int64_t sms = kernels::sm_count(device);
    int64_t per_block = (warps + sms - 1) / sms;
    per_block = per_block < 1 ? 1 : (per_block > kMaxWarpsPerBlock ? kMaxWarpsPerBlock : per_block);
    plan.block = static_cast<unsigned>(per_block * 32);
    plan.rows_per_block = static_cast<int>(plan.block) / plan.tpr;
  }
  const int64_t grid = (rows + plan.rows_per_block - 1) / plan.rows_per_block;
  TVM_FFI_CHECK(grid < (int64_t{1} << 31), ValueError) << "too many rows (" << rows << ")";
  plan.grid = static_cast<unsigned>(grid);
}

// Register kernels: `vectors` 16-byte vectors per row. Short rows spread over a few lanes of a
// warp (qk heads of 128: 8 lanes x 2 vectors; up to 1024 bf16: one warp x 4). Longer rows:
//   - few rows (at most two per SM: decode, small batches): the fewest vectors per thread, from 2,
//     that fit a block of kMaxBlock threads (H = 4096 bf16: 256 threads x 2), so that a row's
//     accesses spread over many threads;
//   - more rows: 8 vectors per thread (H = 4096 bf16: 64 threads), which keeps more loads in
//     flight per thread.
// Measured on the H200 (2026-12-02, bf16): the wide layout took rmsnorm at one token from 1.57 to
// 1.15 us and fused_add_rmsnorm from 2.07 to 1.57 us, but at 8192 rows and more it was up to 30%
// slower than the 8-vector layout for rmsnorm and up to 28% for layernorm (7168 and 8192 wide).
inline Plan plan_registers(int64_t vectors, int64_t rows, int device) {
  Plan plan{};
  if (vectors <= 4) {
    plan.vectors_per_thread = 1;
    plan.tpr = next_pow2(vectors);
  } else if (vectors <= 64) {
    plan.vectors_per_thread = 2;
    plan.tpr = next_pow2((vectors + 1) / 2);
  } else if (vectors <= 128) {
    plan.vectors_per_thread = 4;
    plan.tpr = 32;
  } else {
    int per_thread = kMaxVectorsPerThread;
    if (rows <= 2 * int64_t{kernels::sm_count(device)}) {
      per_thread = 2;
      while (per_thread < kMaxVectorsPerThread && vectors > int64_t{kMaxBlock} * per_thread)
        per_thread *= 2;
    }
    plan.vectors_per_thread = per_thread;
    const int64_t threads = (vectors + per_thread - 1) / per_thread;
    plan.tpr = static_cast<int>(threads <= 32 ? 32 : (threads + 31) / 32 * 32);
  }
  finish_plan(plan, rows, device);
  return plan;
}

// Loop kernels: `accesses` per row (16-byte vectors or scalars), about 4 per thread per pass for
// short rows, up to kMaxBlock threads for long ones.
inline Plan plan_loop(int64_t accesses, int64_t rows, int device) {
  Plan plan{};
  plan.vectors_per_thread = 0;
  const int64_t threads = (accesses + 3) / 4;
  if (threads <= 32) {
    plan.tpr = next_pow2(threads);
  } else {
    const int64_t t = (threads + 31) / 32 * 32;
    plan.tpr = static_cast<int>(t > kMaxBlock ? kMaxBlock : t);
  }
  finish_plan(plan, rows, device);
  return plan;
}

// Launches `kernel(pdl, args...)` with the plan's grid, PDL as kernels::pdl_for_grid decides from
// `enable_pdl` (-1 auto, 0 off, 1 on), and turns a failure into a RuntimeError naming the op.
template <typename... Params, typename... Args>
inline void launch(const char* op, void (*kernel)(bool, Params...), const Plan& plan,
                   cudaStream_t stream, int enable_pdl, int device, Args&&... args) {
  const bool pdl = kernels::pdl_for_grid(enable_pdl, device, plan.grid, plan.block);
  const cudaError_t status = kernels::launch_pdl(kernel, dim3(plan.grid), dim3(plan.block), 0,
                                                 stream, pdl, pdl, std::forward<Args>(args)...);
  TVM_FFI_CHECK(status == cudaSuccess, RuntimeError)
      << op << ": kernel launch failed: " << cudaGetErrorString(status);
}

// A row-wise kernel over Params `P`, which carries the plan's layout in `tpr`, `tpr_shift` and
// `rows_per_block` and its row count in `rows`.
template <typename P>
using RowKernel = void (*)(bool, P);

template <typename P>
inline void apply_plan(P& p, const Plan& plan) {
  p.tpr = plan.tpr;
  p.tpr_shift = plan.tpr_shift;
  p.rows_per_block = plan.rows_per_block;
}

// The register kernel of `vectors` 16-byte vectors per row: `kernels` holds its instantiations
// for 1, 2, 4 and 8 vectors per thread (null where one is not built).
template <typename P>
inline void launch_registers(const char* op, const std::array<RowKernel<P>, 4>& kernels,
                             int64_t vectors, P& p, cudaStream_t stream, int enable_pdl,
                             int device) {
  const Plan plan = plan_registers(vectors, p.rows, device);
  const RowKernel<P> kernel = kernels[log2_exact(plan.vectors_per_thread)];
  TVM_FFI_CHECK(kernel != nullptr, InternalError)
      << op << ": no register kernel of " << plan.vectors_per_thread << " vectors per thread";
  apply_plan(p, plan);
  launch(op, kernel, plan, stream, enable_pdl, device, p);
}

// The loop kernel over `accesses` per row (16-byte vectors or single elements).
template <typename P>
inline void launch_loop(const char* op, RowKernel<P> kernel, int64_t accesses, P& p,
                        cudaStream_t stream, int enable_pdl, int device) {
  const Plan plan = plan_loop(accesses, p.rows, device);
  apply_plan(p, plan);
  launch(op, kernel, plan, stream, enable_pdl, device, p);
}

inline void check_eps(const char* op, double eps) {
  TVM_FFI_CHECK(eps >= 0.0 && eps < 1e30, ValueError)
      << op << ": eps must be a finite number >= 0, got " << eps;
}

// Argument checks of the host entry points. Device checks come last, so that every other check
// can be exercised with CPU tensors on a machine without a GPU.

// [..., H] with at least one dim and a contiguous last dim.
inline void check_rows(const char* op, const char* arg, const TensorView& t) {
  const DLDataType d = t.dtype();
  TVM_FFI_CHECK(kernels::is_dtype(d, kDLFloat, 32) || kernels::is_dtype(d, kDLFloat, 16) ||
                    kernels::is_dtype(d, kDLBfloat, 16),
                TypeError)
      << op << ": " << arg << " must have dtype float32, float16 or bfloat16";
  TVM_FFI_CHECK(t.ndim() >= 1, ValueError)
      << op << ": " << arg << " must have at least 1 dim [..., hidden], got a scalar";
  kernels::check_last_dim_contiguous(op, arg, t);
  TVM_FFI_CHECK(t.size(-1) < (int64_t{1} << 30), ValueError)
      << op << ": " << arg << " has a last dim of " << t.size(-1) << " (at most 2^30)";
}

// A 1-D [n] tensor with unit stride and the dtype of `like` (a weight or bias).
inline void check_vector_arg(const char* op, const char* arg, const TensorView& t, int64_t n,
                             const char* like_name, const TensorView& like) {
  TVM_FFI_CHECK(t.ndim() == 1 && t.size(0) == n, ValueError)
      << op << ": " << arg << " must have shape [" << n << "] (the last dim of " << like_name
      << "), got " << kernels::shape_string(t);
  TVM_FFI_CHECK(n <= 1 || t.stride(0) == 1, ValueError)
      << op << ": " << arg << " must be contiguous, got stride " << t.stride(0);
  kernels::check_same_dtype(op, arg, t, like_name, like);
}

}  // namespace rowwise
