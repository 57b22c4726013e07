// Building blocks of row-wise pointwise kernels (activations, gates, softcap, fused norms):
//   - FastDivmod: a flat work index -> (row, column) without a hardware divide;
//   - 16-byte packs of T converted to and from float arrays, with streaming or cached loads;
//   - RowView: a tensor seen as rows of a contiguous last dim with one row stride (what engines
//     pass: contiguous tensors and slices of wider buffers), derived on the host;
//   - launch_pointwise (one item per thread, PDL for small grids) and the unary row engine.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <tvm/ffi/container/tensor.h>

#include <algorithm>
#include <cstdint>

#include "cuda_dtype.cuh"
#include "launch.cuh"
#include "pdl.cuh"
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
// 16-byte packs <-> float arrays. A pack holds 16 / sizeof(T) elements (8 bf16/fp16, 4 fp32).

template <typename T>
struct Pack {
  static constexpr int size = kVectorBytes / static_cast<int>(sizeof(T));
};

__device__ __forceinline__ void unpack(const int4& raw, float* f, float*) {
  f[0] = __int_as_float(raw.x);
  f[1] = __int_as_float(raw.y);
  f[2] = __int_as_float(raw.z);
  f[3] = __int_as_float(raw.w);
}
__device__ __forceinline__ void unpack(const int4& raw, float* f, __half*) {
  const __half2* h = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 v = __half22float2(h[i]);
    f[2 * i] = v.x;
    f[2 * i + 1] = v.y;
  }
}
__device__ __forceinline__ void unpack(const int4& raw, float* f, __nv_bfloat16*) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 v = __bfloat1622float2(h[i]);
    f[2 * i] = v.x;
    f[2 * i + 1] = v.y;
  }
}

__device__ __forceinline__ int4 pack(const float* f, float*) {
  return make_int4(__float_as_int(f[0]), __float_as_int(f[1]), __float_as_int(f[2]),
                   __float_as_int(f[3]));
}
// Pairs round with one F2FP.PACK_AB each (round to nearest even, like torch's casts).
__device__ __forceinline__ int4 pack(const float* f, __half*) {
  int4 raw;
  __half2* h = reinterpret_cast<__half2*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = __floats2half2_rn(f[2 * i], f[2 * i + 1]);
  return raw;
}
__device__ __forceinline__ int4 pack(const float* f, __nv_bfloat16*) {
  int4 raw;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
  return raw;
}

// Raw 16-byte accesses. Streaming (evict-first) for data touched once; cached (the read-only
// path: never for data the kernel writes) for data every block reuses, such as weights.
__device__ __forceinline__ int4 load16_stream(const void* p) {
  return __ldcs(reinterpret_cast<const int4*>(p));
}
__device__ __forceinline__ int4 load16_cached(const void* p) {
  return __ldg(reinterpret_cast<const int4*>(p));
}
__device__ __forceinline__ void store16_stream(void* p, const int4& v) {
  __stcs(reinterpret_cast<int4*>(p), v);
}

// N elements of T (N * sizeof(T) a multiple of 16) from/to a float array.
template <typename T, int N>
__device__ __forceinline__ void raw_to_floats(const int4* raw, float* f) {
  constexpr int kPack = Pack<T>::size;
  static_assert(N % kPack == 0, "N must fill whole 16-byte packs");
#pragma unroll
  for (int c = 0; c < N / kPack; ++c) unpack(raw[c], f + c * kPack, static_cast<T*>(nullptr));
}
template <typename T, int N>
__device__ __forceinline__ void store_floats_stream(T* p, const float* f) {
  constexpr int kPack = Pack<T>::size;
  static_assert(N % kPack == 0, "N must fill whole 16-byte packs");
#pragma unroll
  for (int c = 0; c < N / kPack; ++c)
    store16_stream(p + c * kPack, pack(f + c * kPack, static_cast<T*>(nullptr)));
}

// One access of W = kPacked ? Pack<T>::size : 1 contiguous elements, kept raw in registers until
// used (a raw pack is 4 registers, its floats 8): row kernels with a packed and a scalar variant
// share one body through it.
template <typename T, bool kPacked>
struct Access;

template <typename T>
struct Access<T, true> {
  static constexpr int width = Pack<T>::size;
  using Raw = int4;
  __device__ __forceinline__ static Raw load_stream(const T* p) { return load16_stream(p); }
  __device__ __forceinline__ static Raw load_cached(const T* p) { return load16_cached(p); }
  // Coherent with the kernel's own earlier stores (load_cached is not: it may use the read-only
  // path); pass a pointer that is not __restrict__, or the compiler may pick that path anyway.
  __device__ __forceinline__ static Raw load(const T* p) {
    return *reinterpret_cast<const int4*>(p);
  }
  __device__ __forceinline__ static void store_stream(T* p, const Raw& r) { store16_stream(p, r); }
  __device__ __forceinline__ static void to_floats(const Raw& r, float* f) {
    unpack(r, f, static_cast<T*>(nullptr));
  }
  __device__ __forceinline__ static Raw from_floats(const float* f) {
    return pack(f, static_cast<T*>(nullptr));
  }
};

template <typename T>
struct Access<T, false> {
  static constexpr int width = 1;
  using Raw = T;
  __device__ __forceinline__ static Raw load_stream(const T* p) { return *p; }
  __device__ __forceinline__ static Raw load_cached(const T* p) { return *p; }
  __device__ __forceinline__ static Raw load(const T* p) { return *p; }
  __device__ __forceinline__ static void store_stream(T* p, const Raw& r) { *p = r; }
  __device__ __forceinline__ static void to_floats(const Raw& r, float* f) { f[0] = to_float(r); }
  __device__ __forceinline__ static Raw from_floats(const float* f) { return from_float<T>(f[0]); }
};

// ---------------------------------------------------------------------------------------------
// Host side: tensors as rows.

inline char* data_at(const tvm::ffi::TensorView& t) {
  return static_cast<char*>(t.data_ptr()) + t.byte_offset();
}

// `t` as `rows` rows of its last dim (`cols` elements, stride 1), row r at element r * stride.
// Leading dims collapse when each one's stride is the next one's stride times its size (size-1
// dims are ignored); `ok` is false otherwise, and callers send such tensors elsewhere.
struct RowView {
  int64_t rows = 1;
  int64_t cols = 1;
  int64_t stride = 0;
  bool ok = true;
};

inline RowView row_view(const tvm::ffi::TensorView& t) {
  RowView v;
  const int nd = t.ndim();
  v.cols = nd ? t.size(nd - 1) : 1;
  if (nd && v.cols > 1 && t.stride(nd - 1) != 1) v.ok = false;
  v.stride = v.cols;
  bool have_stride = false;
  int64_t expect = 0;  // stride the next outer dim must have to collapse into the rows
  for (int i = nd - 2; i >= 0; --i) {
    const int64_t size = t.size(i);
    v.rows *= size;
    if (size == 1) continue;
    if (!have_stride) {
      v.stride = t.stride(i);
      have_stride = true;
    } else if (t.stride(i) != expect) {
      v.ok = false;
    }
    expect = t.stride(i) * size;
  }
  return v;
}

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
  const int64_t per_pack = kVectorBytes / elem_bytes;
  return is_aligned(ptr) && cols % per_pack == 0 && row_stride % per_pack == 0;
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

// Launches `kernel(pdl, args...)` over `work` items on `stream`; a failed launch is reported by
// the entry point's check_launch (the runtime records it as the last error).
template <typename... Params, typename... Args>
inline void launch_pointwise(void (*kernel)(bool, Params...), int64_t work, int device,
                             cudaStream_t stream, Args&&... args) {
  const unsigned blocks = pointwise_blocks(work);
  const bool pdl = pdl_for_grid(-1, device, blocks, kPointwiseThreads);
  (void)launch_pdl(kernel, dim3(blocks), dim3(kPointwiseThreads), 0, stream, pdl, pdl,
                   std::forward<Args>(args)...);
}

// ---------------------------------------------------------------------------------------------
// The unary row engine: out[r, c] = op(x[r, c]) over rows of a contiguous last dim, one flat
// work index per 16-byte pack of x (or per element on the scalar path), split into (row, column)
// by FastDivmod, so any row count keeps every SM busy and a warp's accesses stay coalesced.

// Packs: x and out 16-byte aligned, cols and row strides whole packs. `tail` (< one pack) is the
// last partial pack of a contiguous tensor seen as one row; block 0 writes it.
template <typename TIn, typename TOut, typename Op>
__global__ void __launch_bounds__(kPointwiseThreads)
    unary_packs_kernel(bool pdl, TOut* __restrict__ out, int64_t out_stride,
                       const TIn* __restrict__ x, int64_t x_stride, FastDivmod per_row,
                       uint32_t total, uint32_t tail, Op op) {
  constexpr int P = Pack<TIn>::size;
  static_assert(sizeof(TOut) >= sizeof(TIn), "outputs narrower than inputs are not packed");
  const uint32_t i = blockIdx.x * kPointwiseThreads + threadIdx.x;
  if (pdl) pdl_wait();
  if (i < total) {
    uint32_t r, c;
    per_row.divmod(i, r, c);
    const int4 raw = load16_stream(x + r * x_stride + c * P);
    if (pdl) pdl_launch_dependents();
    float f[P];
    raw_to_floats<TIn, P>(&raw, f);
#pragma unroll
    for (int k = 0; k < P; ++k) f[k] = op(f[k]);
    store_floats_stream<TOut, P>(out + r * out_stride + c * P, f);
  }
  if (blockIdx.x == 0 && threadIdx.x < tail) {
    const int64_t e = static_cast<int64_t>(total) * P + threadIdx.x;
    out[e] = from_float<TOut>(op(to_float(x[e])));
  }
}

// Any alignment and width: one element per work index.
template <typename TIn, typename TOut, typename Op>
__global__ void __launch_bounds__(kPointwiseThreads)
    unary_scalar_kernel(bool pdl, TOut* __restrict__ out, int64_t out_stride,
                        const TIn* __restrict__ x, int64_t x_stride, FastDivmod per_row,
                        uint32_t total, Op op) {
  const uint32_t i = blockIdx.x * kPointwiseThreads + threadIdx.x;
  if (pdl) pdl_wait();
  if (i < total) {
    uint32_t r, c;
    per_row.divmod(i, r, c);
    const float v = to_float(x[r * x_stride + c]);
    if (pdl) pdl_launch_dependents();
    out[r * out_stride + c] = from_float<TOut>(op(v));
  }
}

// out = op(x) elementwise over `rows` x `cols` (both RowViews of the same shape). `contiguous`
// says both tensors are dense, so the whole tensor is streamed as one row of packs plus a tail.
template <typename TIn, typename TOut, typename Op>
void unary_rows(TOut* out, int64_t out_stride, const TIn* x, int64_t x_stride, int64_t rows,
                int64_t cols, bool contiguous, Op op, int device, cudaStream_t stream) {
  constexpr int P = Pack<TIn>::size;
  if (rows == 0 || cols == 0) return;
  if (contiguous && is_aligned(out) && is_aligned(x)) {
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
      launch_pointwise(unary_packs_kernel<TIn, TOut, Op>, len, device, stream, out + start * P,
                       int64_t{0}, x + start * P, int64_t{0}, one_row,
                       static_cast<uint32_t>(len), tail, op);
      start += len;
    } while (start < packs);
    return;
  }
  const bool packed = packs_fit(x, cols, x_stride, sizeof(TIn)) &&
                      packs_fit(out, cols, out_stride, sizeof(TOut));
  const int64_t per_row = packed ? cols / P : cols;
  const FastDivmod divmod(static_cast<uint32_t>(per_row));
  for_row_chunks(rows, per_row, [&](int64_t r0, int64_t n) {
    const int64_t work = n * per_row;
    TOut* o = out + r0 * out_stride;
    const TIn* i = x + r0 * x_stride;
    if (packed)
      launch_pointwise(unary_packs_kernel<TIn, TOut, Op>, work, device, stream, o, out_stride, i,
                       x_stride, divmod, static_cast<uint32_t>(work), uint32_t{0}, op);
    else
      launch_pointwise(unary_scalar_kernel<TIn, TOut, Op>, work, device, stream, o, out_stride, i,
                       x_stride, divmod, static_cast<uint32_t>(work), op);
  });
}

}  // namespace kernels
