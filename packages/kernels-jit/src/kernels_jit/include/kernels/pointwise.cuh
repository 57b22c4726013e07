// The pointwise engine (activations, gates, softcap, add_constant):
//   - FastDivmod: a flat work index -> (row, column) without a hardware divide;
//   - launch_pointwise: one work item (a 16-byte kernels::Pack, or one element) per thread, PDL
//     for small grids, a checked launch;
//   - unary_rows: the whole engine for out = op(x), with op a functor such as math::Silu, over a
//     tensor seen as rows of a contiguous last dim with one row stride (kernels::row_view).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <tvm/ffi/container/tensor.h>

#include <algorithm>
#include <cstdint>

#include "cuda_dtype.cuh"
#include "launch.cuh"
#include "pdl.cuh"
#include "tensor.h"
#include "vec.cuh"

namespace kernels {

// Unsigned division by a divisor fixed at launch: one IMAD.HI, one add and one shift instead of
// the ~20-instruction integer divide. Valid for dividends and divisors below 2^31 (launchers
// split larger problems).
struct FastDivmod {
  uint32_t divisor = 1;
  uint32_t multiplier = 0;
  uint32_t shift = 0;

  FastDivmod() = default;
  __host__ explicit FastDivmod(uint32_t d) : divisor(d) {
    while (shift < 32 && (uint64_t{1} << shift) < d) ++shift;
    const uint64_t excess = (uint64_t{1} << shift) - d;
    multiplier = static_cast<uint32_t>((excess << 32) / d + 1);
  }
  __device__ __forceinline__ uint32_t div(uint32_t n) const {
    return (__umulhi(n, multiplier) + n) >> shift;
  }
  __device__ __forceinline__ void divmod(uint32_t n, uint32_t& q, uint32_t& r) const {
    q = div(n);
    r = n - q * divisor;
  }
};

// ---------------------------------------------------------------------------------------------
// Host side: tensors as rows (kernels/tensor.h has data<T>, RowView and row_view).

// Calls fn(first_row, num_rows) over row chunks whose flat work count (rows x per_row) stays
// below 2^31, the range of FastDivmod and of 32-bit work indices. One chunk below ~8 GB.
template <typename F>
inline void for_row_chunks(int64_t rows, int64_t per_row, F&& fn) {
  constexpr int64_t kMaxWork = (int64_t{1} << 31) - 1;
  const int64_t chunk = std::max<int64_t>(1, kMaxWork / std::max<int64_t>(per_row, 1));
  for (int64_t r = 0; r < rows; r += chunk) fn(r, std::min(chunk, rows - r));
}

// Whether a 16-byte pack of T can be loaded at every row start and every pack of the row.
inline bool packs_fit(const void* ptr, int64_t cols, int64_t row_stride, int64_t elem_bytes) {
  return vectors_fit(cols, kVectorBytes / elem_bytes, {ptr}, {RowMap{row_stride, 0}});
}

// ---------------------------------------------------------------------------------------------
// The pointwise launch: one work item (a 16-byte pack, or one element on the scalar path) per
// thread, in blocks of kPointwiseThreads. Kernels take `bool pdl` as their first parameter: when
// it is set (grids of up to kPdlMaxWaves waves), the launch uses programmatic dependent launch
// and the kernel calls pdl_wait() before its first global access and pdl_launch_dependents() once
// its loads are issued; larger grids run without either instruction.
//
// Chosen by sweeps on the H200 (2026-12-02; silu_and_mul and relu2 in bf16, tokens 1-32768 x
// hidden 4096/8192, CUDA graphs):
//   - one item per thread in blocks of 128 was within 1% of the best of {64, 128, 256, 512}
//     threads x {1, 2, 4} items at every shape; 4 items per thread (the previous plan for large
//     shapes) cost up to 9% at 32768 x 8192, and 512-thread blocks 15% at one token;
//   - PDL took a one-token kernel from 1.28 to 0.93 us per call in a graph of back-to-back calls
//     (an empty kernel: 0.70 us), and silu_and_mul at 1024 x 4096 from 8.2 to 7.7 us;
//   - with the PDL instructions in every block of a large grid (tens of thousands of short
//     blocks), relu2 and softcap reached 76-79% of copy at 8192 tokens and more, and
//     silu_and_mul 90% at 8192 x 4096, whether the grid was launched with PDL or not; the
//     sweep's kernels of the same layout without the instructions reached 93-99% and 96%.

constexpr int kPointwiseThreads = 128;

inline unsigned pointwise_blocks(int64_t work) {
  return std::max(1u, ceil_div(work, int64_t{kPointwiseThreads}));
}

// Launches `kernel(pdl, args...)` over `work` items (kernels::launch: PDL per grid, a failure a
// RuntimeError naming the op).
template <typename... Params, typename... Args>
inline void launch_pointwise(const Launch& ctx, void (*kernel)(bool, Params...), int64_t work,
                             Args&&... args) {
  launch(ctx, kernel, pointwise_blocks(work), kPointwiseThreads, std::forward<Args>(args)...);
}

// ---------------------------------------------------------------------------------------------
// The unary row engine: out[r, c] = op(x[r, c]) over rows of a contiguous last dim, one flat
// work index per 16-byte pack of x (or per element on the scalar path), split into (row, column)
// by FastDivmod, so any row count keeps every SM busy and a warp's accesses stay coalesced.

// One kernel for both paths: kN = a 16-byte pack of TIn (x and out 16-byte aligned, cols and row
// strides whole packs) or 1 (any alignment and width). `tail` (< one pack) is the last partial
// pack of a contiguous tensor seen as one row; block 0 writes it.
template <typename TIn, typename TOut, int kN, typename Op>
__global__ void __launch_bounds__(kPointwiseThreads)
    unary_kernel(bool pdl, TOut* __restrict__ out, int64_t out_stride, const TIn* __restrict__ x,
                 int64_t x_stride, FastDivmod per_row, uint32_t total, uint32_t tail, Op op) {
  static_assert(kN == 1 || sizeof(TOut) >= sizeof(TIn), "outputs narrower than inputs");
  const uint32_t i = blockIdx.x * kPointwiseThreads + threadIdx.x;
  if (pdl) pdl_wait();
  if (i < total) {
    uint32_t r, c;
    per_row.divmod(i, r, c);
    Pack<TIn, kN> in;
    in.load_stream(x + r * x_stride + c * kN);
    if (pdl) pdl_launch_dependents();
    typename Pack<TIn, kN>::Value v[kN];
    in.unpack(v);
#pragma unroll
    for (int k = 0; k < kN; ++k) v[k] = op(v[k]);
    Pack<TOut, kN> y;
    y.pack(v);
    y.store_stream(out + r * out_stride + c * kN);
  }
  if (kN > 1 && blockIdx.x == 0 && threadIdx.x < tail) {
    const int64_t e = static_cast<int64_t>(total) * kN + threadIdx.x;
    Pack<TIn, 1> in;
    in.load(x + e);
    typename Pack<TIn, 1>::Value v[1];
    in.unpack(v);
    v[0] = op(v[0]);
    Pack<TOut, 1> y;
    y.pack(v);
    y.store(out + e);
  }
}

// out = op(x) elementwise; out and x have one shape, and row_view(out).ok and row_view(x).ok
// (checked by the caller). Contiguous tensors stream as one row of packs plus a tail.
template <typename TIn, typename TOut, typename Op>
void unary_rows(const Launch& ctx, const tvm::ffi::TensorView& out_t,
                const tvm::ffi::TensorView& x_t, Op op) {
  constexpr int P = Pack<TIn>::size;
  const RowView xv = row_view(x_t), ov = row_view(out_t);
  const int64_t rows = xv.rows, cols = xv.cols;
  TOut* out = data<TOut>(out_t);
  const TIn* x = data<const TIn>(x_t);
  if (rows == 0 || cols == 0) return;
  if (x_t.IsContiguous() && out_t.IsContiguous() && is_aligned(out) && is_aligned(x)) {
    const int64_t n = rows * cols;
    const int64_t packs = n / P;
    // Slices of at most 2^28 packs (4 GiB of x), each seen as one row, so that a pack's element
    // offset c * P stays below 2^31; the last slice also writes the tail.
    constexpr int64_t kSlice = int64_t{1} << 28;
    int64_t start = 0;
    do {
      const int64_t len = std::min(kSlice, packs - start);
      const uint32_t tail = start + len == packs ? static_cast<uint32_t>(n % P) : 0;
      const FastDivmod one_row(static_cast<uint32_t>(std::max<int64_t>(len, 1)));
      launch_pointwise(ctx, unary_kernel<TIn, TOut, P, Op>, len, out + start * P, int64_t{0},
                       x + start * P, int64_t{0}, one_row, static_cast<uint32_t>(len), tail, op);
      start += len;
    } while (start < packs);
    return;
  }
  const bool packed = packs_fit(x, cols, xv.stride, sizeof(TIn)) &&
                      packs_fit(out, cols, ov.stride, sizeof(TOut));
  const int64_t per_row = packed ? cols / P : cols;
  const FastDivmod divmod(static_cast<uint32_t>(per_row));
  for_row_chunks(rows, per_row, [&](int64_t r0, int64_t n) {
    const int64_t work = n * per_row;
    auto kernel = packed ? unary_kernel<TIn, TOut, P, Op> : unary_kernel<TIn, TOut, 1, Op>;
    launch_pointwise(ctx, kernel, work, out + r0 * ov.stride, ov.stride, x + r0 * xv.stride,
                     xv.stride, divmod, static_cast<uint32_t>(work), uint32_t{0}, op);
  });
}

}  // namespace kernels
