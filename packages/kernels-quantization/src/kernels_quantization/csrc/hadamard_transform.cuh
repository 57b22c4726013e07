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
//   - block kernel (N >= 4096): P = 64..256 threads per row, one row per block, E = 64 (N =
//     4096) or 128. Register butterflies in A; the row goes through shared memory (fp32,
//     padded so that every access is bank-conflict-free and a base register plus an
//     immediate) into layout "B", whose registers hold A's thread bits 3 .. 3+p-1 (all of
//     them while p <= e, i.e. N <= 16384; at N = 32768 one shuffle stage in A does bit 3) and
//     whose lanes hold bits 0,1,2 (3) and A's lowest upper register bits; butterflies there,
//     then back through shared memory to layout A for the store. Two exchanges, two barriers
//     per row and no shuffles: shuffles and exchanges share the shared-memory pipe, whose 4
//     words per element (6 with two shuffle stages) come close to HBM's time per row.

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
// The block kernel: 64 elements per thread at N = 4096, 128 above, so that layout B's registers
// take every thread bit of layout A up to N = 16384 (no shuffles).
__host__ __device__ constexpr int block_log_elems(int log_n) { return log_n == 12 ? 6 : 7; }

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

// Bank (mod 32) of index bit b >= 0 under i + i / 32.
__host__ __device__ constexpr int natural_bank(int b) {
  return ((1 << b) + (b >= 5 ? 1 << (b - 5) : 0)) & 31;
}

template <int kLog>
struct BlockShape {
  static constexpr int kLogE = block_log_elems(kLog);
  static constexpr int kE = 1 << kLogE;
  static constexpr int kLogP = kLog - kLogE;
  static constexpr int kP = 1 << kLogP;
  // Layout A's thread bits (index bits 3 .. 3+p-1) that do not fit layout B's registers: done
  // by shuffles over A's lowest lane bits (none up to N = 16384, one at N = 32768).
  static constexpr int kShuffles = kLogP > kLogE ? kLogP - kLogE : 0;
  // Layout B: lanes hold index bits 0 .. kLowLanes-1 and kHigh .. kHigh+kHighLanes-1, registers
  // bits kLowLanes .. 3+p-1 (the kMid still to do) then kRegShift .., warps bits kWarpShift ..
  static constexpr int kLowLanes = 3 + kShuffles;
  static constexpr int kMid = kLogP - kShuffles;
  static constexpr int kHigh = 3 + kLogP;  // layout A's upper register bits
  static constexpr int kHighLanes = 5 - kLowLanes;
  static constexpr int kRegShift = kHigh + kHighLanes;
  static constexpr int kWarpShift = 5 + kLogE;
  static_assert(kLowLanes <= 5 && kLogP >= 5, "whole warps per row, at most two shuffles");
  // Shared-memory padding (see padded): kC0 / kC1 words per 2^kHigh / 2^(kHigh+1) elements
  // give layout B's high lane bits the banks 1 << kLowLanes and 16.
  static constexpr int kC0 = kHighLanes ? ((1 << kLowLanes) - natural_bank(kHigh)) & 31 : 0;
  static constexpr int kC1 =
      kHighLanes == 2 ? (16 - natural_bank(kHigh + 1) - 2 * kC0) & 31 : 0;
  static constexpr int kLast = (1 << kLog) - 1;
  static constexpr size_t kSmem =
      sizeof(float) * (kLast + (kLast >> 5) + kC0 * (kLast >> kHigh) +
                       kC1 * (kLast >> (kHigh + 1)) + 1);
  // At most 168 registers: six rows of 64 threads or three of 128 per SM, as many as their
  // shared memory allows.
  static constexpr int kMinBlocks = 384 / kP;
};

// Shared-memory position of element i: i + i / 32 spreads layout A's lanes (index bits 3..7)
// over the 32 banks; the kC0 / kC1 terms do the same for layout B's high lane bits. Monotone,
// so injective, and additive over disjoint bits, so every access is a per-thread base plus an
// immediate.
template <typename S>
__host__ __device__ constexpr int padded(int i) {
  return i + (i >> 5) + S::kC0 * (i >> S::kHigh) + S::kC1 * (i >> (S::kHigh + 1));
}

// The index bits of thread t and of register r in layout B.
template <typename S>
__host__ __device__ constexpr int b_thread(int t) {
  return (t & ((1 << S::kLowLanes) - 1)) | (((t & 31) >> S::kLowLanes) << S::kHigh) |
         ((t >> 5) << S::kWarpShift);
}
template <typename S>
__host__ __device__ constexpr int b_reg(int r) {
  return ((r & ((1 << S::kMid) - 1)) << S::kLowLanes) | ((r >> S::kMid) << S::kRegShift);
}

// Whether one warp's 32 lanes hit 32 distinct banks, in layout A (lanes at index bits 3..7) or
// B (b_thread).
template <typename S>
constexpr bool conflict_free(bool layout_b) {
  unsigned banks = 0;
  for (int lane = 0; lane < 32; ++lane) {
    banks |= 1u << (padded<S>(layout_b ? b_thread<S>(lane) : lane << 3) & 31);
  }
  return banks == 0xffffffffu;
}

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
// and 3+p.., threads bits 3 .. 3+p-1: register butterflies, then kShuffles shuffle stages
// (index bits 3 ..). Through shared memory to layout B, whose registers hold the remaining
// thread bits of A: butterflies over them. Back to layout A for the store.
template <typename T, int kLog, bool kVec>
__global__ void __launch_bounds__(BlockShape<kLog>::kP, BlockShape<kLog>::kMinBlocks)
    block_kernel(bool pdl, T* out, int64_t out_stride, const T* x, int64_t x_stride, int d,
                 float scale) {
  using S = BlockShape<kLog>;
  static_assert(conflict_free<S>(false) && conflict_free<S>(true), "conflict-free exchanges");
  constexpr int kE = S::kE, kP = S::kP, kLogP = S::kLogP;
  extern __shared__ float smem[];
  const int t = threadIdx.x;
  const int64_t row = blockIdx.x;
  if (pdl) kernels::pdl_wait();
  float v[kE];
  load_row<T, kE, kP, kVec>(v, x + row * x_stride, t, d);
  if (pdl) kernels::pdl_launch_dependents();
  butterflies(v);  // index bits 0,1,2 and 3+p..
#pragma unroll
  for (int b = 0; b < S::kShuffles; ++b) shuffle_stage(v, t, b);  // index bit 3 + b
  float* a_row = smem + padded<S>(t << 3);
  float* b_row = smem + padded<S>(b_thread<S>(t));
#pragma unroll
  for (int r = 0; r < kE; ++r) a_row[padded<S>(a_reg<kLogP>(r))] = v[r];
  __syncthreads();
#pragma unroll
  for (int r = 0; r < kE; ++r) v[r] = b_row[padded<S>(b_reg<S>(r))];
  butterflies_low<S::kMid>(v);  // index bits 3+kShuffles .. 3+p-1
  // Each thread rewrites the slots it read: no barrier needed before these stores.
#pragma unroll
  for (int r = 0; r < kE; ++r) b_row[padded<S>(b_reg<S>(r))] = v[r];
  __syncthreads();
#pragma unroll
  for (int r = 0; r < kE; ++r) v[r] = a_row[padded<S>(a_reg<kLogP>(r))];
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
