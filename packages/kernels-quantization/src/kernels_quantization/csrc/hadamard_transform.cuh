// quantization.hadamard_transform, CUDA: y = scale * (pad0(x, N) @ H_N)[..., :D], N = next_pow2(D)
// <= 32768, H_N the unnormalised Sylvester matrix, fp32 butterflies, rounded once.
//
// One kernel body per log2(N) (a switch of instantiations at the host), the row read once and
// written once with 16-byte packs (8 elements) when D % 8 == 0 and the rows are aligned, element
// by element otherwise (the padding is zeros that are never read or written).
//
// Index bits of a row element: a thread holds E = 2^e values, P = 2^p threads share a row
// (e + p = log2 N). In the global layout "A" a thread's register r = j + 8k holds element
// j | t << 3 | k << (3 + p): pack k of thread t sits at (k * P + t) * 8, so a warp's 16-byte
// accesses are contiguous; the registers hold index bits {0,1,2} and the top e - 3 bits.
//   - warp kernel (N <= 2048): P <= 32 threads of one warp per row (128 / P rows per block); the
//     register butterflies, then one __shfl_xor_sync stage per thread bit.
//   - block kernel (N >= 4096): P = 128..256 threads per row, one row per block, E = 32 (N =
//     4096), 64, or 128 (N = 32768). Register butterflies and two shuffle stages in A; the row
//     goes through shared memory (fp32, one pad word per 32: every access is conflict-free and
//     a base register plus an immediate) into layout "B", where the lanes hold index bits 0..4
//     and the registers bits 5 .. 5+e-1; butterflies there, then back through shared memory to
//     layout A for the store. Two exchanges, two barriers per row.
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(4);

#include <cuda_runtime.h>

#include <cstdint>

#include <kernels/checks.h>
#include <kernels/cuda_dtype.cuh>
#include <kernels/dtype.h>
#include <kernels/launch.cuh>
#include <kernels/pdl.cuh>
#include <kernels/tensor.h>
#include <kernels/vec.cuh>

namespace hadamard_detail {

constexpr int kMaxLog = 15;  // N <= 32768
constexpr int kWarpThreads = 128;
constexpr int kFirstBlockLog = 12;  // N >= 4096: the block kernel

// Elements per thread (log2): the warp kernel keeps the threads of a row within 32 lanes.
__host__ __device__ constexpr int warp_log_elems(int log_n) {
  return log_n <= 4 ? log_n : (log_n - 5 > 4 ? log_n - 5 : 4);
}
__host__ __device__ constexpr int block_log_elems(int log_n) {
  return log_n == 12 ? 5 : (log_n == 15 ? 7 : 6);
}

// Pack k of the E / 8 a thread moves (or the whole row when E < 8): element 8 * (k * P + t) + j.
template <typename T, int kE, int kP, bool kVec>
__device__ __forceinline__ void load_row(float (&v)[kE], const T* row, int t, int d) {
  constexpr int kW = kE < 8 ? kE : 8;
  constexpr int kPacks = kE / kW;
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const int base = (k * kP + t) * 8;
    if constexpr (kVec) {
      kernels::Pack<T, 8> in;
      float f[8];
      if (base < d) {
        in.load_stream(row + base);
        in.unpack(f);
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) f[j] = 0.f;
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) v[k * 8 + j] = f[j];
    } else {
#pragma unroll
      for (int j = 0; j < kW; ++j) {
        float f[1] = {0.f};
        if (base + j < d) {
          kernels::Pack<T, 1> in;
          in.load(row + base + j);
          in.unpack(f);
        }
        v[k * kW + j] = f[0];
      }
    }
  }
}

template <typename T, int kE, int kP, bool kVec>
__device__ __forceinline__ void store_row(T* row, const float (&v)[kE], int t, int d, float scale) {
  constexpr int kW = kE < 8 ? kE : 8;
  constexpr int kPacks = kE / kW;
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const int base = (k * kP + t) * 8;
    if constexpr (kVec) {
      if (base < d) {
        float f[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) f[j] = v[k * 8 + j] * scale;
        kernels::Pack<T, 8> o;
        o.pack(f);
        o.store_stream(row + base);
      }
    } else {
#pragma unroll
      for (int j = 0; j < kW; ++j) {
        if (base + j < d) {
          float f[1] = {v[k * kW + j] * scale};
          kernels::Pack<T, 1> o;
          o.pack(f);
          o.store(row + base + j);
        }
      }
    }
  }
}

// Every butterfly over the register bits.
template <int kE>
__device__ __forceinline__ void butterflies(float (&v)[kE]) {
#pragma unroll
  for (int h = 1; h < kE; h <<= 1) {
#pragma unroll
    for (int r = 0; r < kE; ++r) {
      if (!(r & h)) {
        const float a = v[r], b = v[r + h];
        v[r] = a + b;
        v[r + h] = a - b;
      }
    }
  }
}

// The butterfly over lane bit `bit`: the lower partner keeps a + b, the upper one a - b.
template <int kE>
__device__ __forceinline__ void shuffle_stage(float (&v)[kE], int lane, int bit) {
  const float sign = (lane >> bit) & 1 ? -1.f : 1.f;
#pragma unroll
  for (int r = 0; r < kE; ++r) {
    const float other = __shfl_xor_sync(0xffffffffu, v[r], 1 << bit);
    v[r] = fmaf(sign, v[r], other);
  }
}

// N <= 2048: P threads of one warp per row, 128 / P rows per block.
template <typename T, int kLog, bool kVec>
__global__ void __launch_bounds__(kWarpThreads)
    warp_kernel(bool pdl, T* out, int64_t out_stride, const T* x, int64_t x_stride, int64_t rows,
                int d, float scale) {
  constexpr int kLogE = warp_log_elems(kLog);
  constexpr int kE = 1 << kLogE;
  constexpr int kLogP = kLog - kLogE;
  constexpr int kP = 1 << kLogP;
  constexpr int kRows = kWarpThreads / kP;
  const int t = threadIdx.x & (kP - 1);
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRows + threadIdx.x / kP;
  const bool active = row < rows;  // every lane stays for the shuffles
  if (pdl) kernels::pdl_wait();
  float v[kE];
  if (active) {
    load_row<T, kE, kP, kVec>(v, x + row * x_stride, t, d);
  } else {
#pragma unroll
    for (int r = 0; r < kE; ++r) v[r] = 0.f;
  }
  if (pdl) kernels::pdl_launch_dependents();
  butterflies(v);
#pragma unroll
  for (int b = 0; b < kLogP; ++b) shuffle_stage(v, t, b);
  if (active) store_row<T, kE, kP, kVec>(out + row * out_stride, v, t, d, scale);
}

// Shared-memory position of element i: one pad word per 32, so lanes spread over idx bits 3..7
// (layout A) or 0..4 (layout B) hit 32 distinct banks. Additive over disjoint bits, so every
// address is a per-thread base plus an immediate.
__device__ __forceinline__ constexpr int padded(int i) { return i + (i >> 5); }

template <int kLog>
struct BlockShape {
  static constexpr int kLogE = block_log_elems(kLog);
  static constexpr int kE = 1 << kLogE;
  static constexpr int kLogP = kLog - kLogE;
  static constexpr int kP = 1 << kLogP;
  // Layout B: registers hold index bits 5 .. 5+e-1, of which 5 .. 3+p-1 are still to do.
  static constexpr int kLogB = kLogP - 2;
  static constexpr size_t kSmem = sizeof(float) * ((1 << kLog) + (1 << (kLog - 5)));
  static_assert(kLogB <= kLogE && 5 + kLogE <= kLog, "layout B covers the thread bits");
  static_assert(kLogP >= 5, "whole warps per row");
};

// The index bits of register r in layout A (the thread's bits are t << 3).
template <int kLogP>
__device__ __forceinline__ constexpr int a_reg(int r) {
  return (r & 7) | ((r >> 3) << (3 + kLogP));
}

// Butterflies over register bits 0 .. kBits-1 only.
template <int kBits, int kE>
__device__ __forceinline__ void butterflies_low(float (&v)[kE]) {
#pragma unroll
  for (int h = 1; h < (1 << kBits); h <<= 1) {
#pragma unroll
    for (int r = 0; r < kE; ++r) {
      if (!(r & h)) {
        const float a = v[r], b = v[r + h];
        v[r] = a + b;
        v[r + h] = a - b;
      }
    }
  }
}

// N >= 4096: one row per block of P threads. Layout A (global): registers hold index bits 0,1,2
// and 3+p.., threads bits 3 .. 3+p-1: register butterflies, then shuffles over lane bits 0,1
// (index bits 3,4). Through shared memory to layout B: threads hold index bits 0..4 (the lanes)
// and 5+e.., registers 5 .. 5+e-1: butterflies over index bits 5 .. 3+p-1. Back to layout A.
template <typename T, int kLog, bool kVec>
__global__ void __launch_bounds__(BlockShape<kLog>::kP)
    block_kernel(bool pdl, T* out, int64_t out_stride, const T* x, int64_t x_stride, int d,
                 float scale) {
  using S = BlockShape<kLog>;
  constexpr int kE = S::kE, kLogE = S::kLogE, kP = S::kP, kLogP = S::kLogP;
  extern __shared__ float smem[];
  const int t = threadIdx.x;
  const int64_t row = blockIdx.x;
  if (pdl) kernels::pdl_wait();
  float v[kE];
  load_row<T, kE, kP, kVec>(v, x + row * x_stride, t, d);
  if (pdl) kernels::pdl_launch_dependents();
  butterflies(v);             // index bits 0,1,2 and 3+p..
  shuffle_stage(v, t, 0);     // index bit 3
  shuffle_stage(v, t, 1);     // index bit 4
  float* a_row = smem + padded(t << 3);
  float* b_row = smem + padded((t & 31) | ((t >> 5) << (5 + kLogE)));
#pragma unroll
  for (int r = 0; r < kE; ++r) a_row[padded(a_reg<kLogP>(r))] = v[r];
  __syncthreads();
#pragma unroll
  for (int r = 0; r < kE; ++r) v[r] = b_row[padded(r << 5)];
  butterflies_low<S::kLogB>(v);  // index bits 5 .. 3+p-1
  // Each thread rewrites the slots it read: no barrier needed before these stores.
#pragma unroll
  for (int r = 0; r < kE; ++r) b_row[padded(r << 5)] = v[r];
  __syncthreads();
#pragma unroll
  for (int r = 0; r < kE; ++r) v[r] = a_row[padded(a_reg<kLogP>(r))];
  store_row<T, kE, kP, kVec>(out + row * out_stride, v, t, d, scale);
}

template <typename T, int kLog, bool kVec>
inline void launch_log(const kernels::Launch& ctx, T* out, int64_t out_stride, const T* x,
                       int64_t x_stride, int64_t rows, int d, float scale) {
  if constexpr (kLog < kFirstBlockLog) {
    constexpr int kRows = kWarpThreads >> (kLog - warp_log_elems(kLog));
    const int64_t blocks = (rows + kRows - 1) / kRows;
    TVM_FFI_CHECK(blocks < (int64_t{1} << 31), ValueError) << ctx.op << ": too many rows (" << rows
                                                           << ")";
    kernels::launch(ctx, warp_kernel<T, kLog, kVec>, static_cast<unsigned>(blocks), kWarpThreads,
                    out, out_stride, x, x_stride, rows, d, scale);
  } else {
    using S = BlockShape<kLog>;
    TVM_FFI_CHECK(rows < (int64_t{1} << 31), ValueError) << ctx.op << ": too many rows (" << rows
                                                         << ")";
    kernels::launch_with_smem<block_kernel<T, kLog, kVec>>(ctx, static_cast<unsigned>(rows), S::kP,
                                                          S::kSmem, out, out_stride, x, x_stride,
                                                          d, scale);
  }
}

template <typename T, int kLog>
inline void launch_vec(const kernels::Launch& ctx, bool vec, T* out, int64_t out_stride, const T* x,
                       int64_t x_stride, int64_t rows, int d, float scale) {
  if constexpr (kLog >= 3) {
    if (vec) {
      launch_log<T, kLog, true>(ctx, out, out_stride, x, x_stride, rows, d, scale);
      return;
    }
  }
  launch_log<T, kLog, false>(ctx, out, out_stride, x, x_stride, rows, d, scale);
}

template <typename T, int kLog = 0>
inline void dispatch_log(int log_n, const kernels::Launch& ctx, bool vec, T* out,
                         int64_t out_stride, const T* x, int64_t x_stride, int64_t rows, int d,
                         float scale) {
  if constexpr (kLog <= kMaxLog) {
    if (log_n == kLog) {
      launch_vec<T, kLog>(ctx, vec, out, out_stride, x, x_stride, rows, d, scale);
    } else {
      dispatch_log<T, kLog + 1>(log_n, ctx, vec, out, out_stride, x, x_stride, rows, d, scale);
    }
  }
}

}  // namespace hadamard_detail

// out, x: [..., D] of one shape and dtype (float32, float16 or bfloat16), last dim contiguous,
// leading dims collapsing into one row stride each; next_pow2(D) <= 32768. out may be x itself
// (in place) but must not otherwise overlap it.
inline void hadamard_transform(tvm::ffi::TensorView out, tvm::ffi::TensorView x, double scale) {
  namespace detail = hadamard_detail;
  constexpr const char* kOp = "quantization.hadamard_transform";
  // 1. Validate.
  TVM_FFI_CHECK(x.ndim() >= 1, ValueError) << kOp << ": x must have at least 1 dim [..., D]";
  kernels::check_same_shape(kOp, "out", out, "x", x);
  kernels::check_same_dtype(kOp, "out", out, "x", x);
  kernels::check_device(kOp, "x", x, kDLCUDA);
  kernels::check_same_device(kOp, "out", out, "x", x);
  kernels::check_last_dim_contiguous(kOp, "x", x);
  kernels::check_last_dim_contiguous(kOp, "out", out);
  const int64_t d = x.size(x.ndim() - 1);
  int log_n = 0;
  while ((int64_t{1} << log_n) < d && log_n <= detail::kMaxLog) ++log_n;
  TVM_FFI_CHECK(log_n <= detail::kMaxLog, ValueError)
      << kOp << ": the last dim of x pads to more than 32768 (the largest supported transform), "
      << "got D = " << d;
  if (x.numel() == 0) return;
  const kernels::RowView xv = kernels::row_view(x);
  const kernels::RowView ov = kernels::row_view(out);
  TVM_FFI_CHECK(xv.ok && ov.ok, ValueError)
      << kOp << ": the leading dims of x and out must collapse into rows with one stride each; "
      << "pass a contiguous tensor (.contiguous())";
  const bool same = kernels::data(out) == kernels::data(x) && ov.stride == xv.stride;
  if (!same) kernels::check_no_overlap(kOp, "out", out, "x", x);
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(x);
  const kernels::Launch ctx(kOp, x);
  // 4. Dispatch on dtype and log2(N), launch (checked).
  const bool vec = d % 8 == 0 && kernels::is_aligned(kernels::data(x)) &&
                   kernels::is_aligned(kernels::data(out)) && xv.stride % 8 == 0 &&
                   ov.stride % 8 == 0;
  KERNELS_DISPATCH_FLOAT(x.dtype(), kOp, T, [&] {
    detail::dispatch_log<T>(log_n, ctx, vec, kernels::data<T>(out), ov.stride,
                            kernels::data<const T>(x), xv.stride, xv.rows, static_cast<int>(d),
                            static_cast<float>(scale));
  });
}
