// diffusion.timestep_embedding, CUDA: out [N, dim] = [sin a, cos a] (or [cos a, sin a] with
// flip), a = scale * (t * f_i), f_i = exp(-ln(max_period) * i / (half - shift)), half = dim / 2,
// an odd dim's last column zero. fp32 in the order of the reference on CUDA (the exponent as an
// fp32 product, times the fp32 reciprocal of half - shift as torch divides a tensor by a scalar,
// expf), accurate sin/cos (below), rounded once to out's dtype.
//
// sin/cos: sincos_fast is the fast path of CUDA's sincosf written out (quadrant j = rint(a * 2/pi),
// a 3-constant Cody-Waite reduction, the same minimax polynomials; <= 1.5 ulp, 9e-8 absolute on
// [-105615, 105615], checked against float64 on 2M+ arguments), without its per-element slow-path
// branch and with j rounded by a magic-number add (two FADDs on the FMA pipe instead of F2I + I2F
// on the quarter-rate conversion pipe). A lane's row takes it when |t| times the lane's largest
// |scale * f| is below 105614 (t <= 1000 with frequencies <= 1: always); any other (larger
// angles, inf, nan) calls sincosf, whose Payne-Hanek reduction stays exact there (__sinf/__cosf
// would not).
//
// A lane owns W consecutive frequencies (W = a 16-byte pack of out when half and dim are whole
// packs and out is aligned, else 1) of rows n0, n0 + sweep, n0 + 2 sweep, ...: it computes its W
// frequencies once (expf, in registers) and per row W (sin, cos) pairs, written as one 16-byte
// streaming store into each half of the row, so a warp's stores are two coalesced sweeps. The
// lanes (sweep rows x per_row, one FastDivmod per thread, none in the loop) are about
// kThreadsPerSm per SM, one resident wave: up to that size one row per lane (decode shapes as
// before), above it each lane loops over ceil(N / sweep) rows (16384 x 512 fp32: 8), prefetching
// the next row's t. PDL (the grid is about one wave).
// t: float32, float16, bfloat16, float64, int32 or int64, read and converted to fp32.
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(2);

#include <kernels/checks.h>
#include <kernels/cuda_dtype.cuh>
#include <kernels/dtype.h>
#include <kernels/launch.cuh>
#include <kernels/pdl.cuh>
#include <kernels/pointwise.cuh>

#include <cmath>

namespace timestep_embedding_detail {

using kernels::FastDivmod;
using kernels::kPointwiseThreads;

// Lanes per SM: 8 blocks of kPointwiseThreads (launch bounds keep the registers at <= 64). A
// lane's frequencies are amortized over its rows; stores need no occupancy to stay in flight.
constexpr int kThreadsPerSm = 1024;

struct Problem {
  FastDivmod per_row;  // lanes per row
  uint32_t lanes;      // sweep * per_row
  uint32_t rows;
  uint32_t sweep;      // rows one pass of the lanes covers (a lane's row step)
  int64_t t_stride;
  int64_t out_stride;  // elements between rows of out
  int64_t t_step;      // sweep * t_stride
  int64_t row_step;    // sweep * out_stride
  int half;
  bool odd;           // a zero column at dim - 1
  bool flip;
  float log_period;   // fp32(-ln(max_period))
  float inv_denom;    // 1 / fp32(half - shift), in fp32 (as torch divides by a scalar on CUDA)
  float scale;
};

template <typename TT>
__device__ __forceinline__ float read_t(const TT* p) {
  if constexpr (std::is_same_v<TT, __half> || std::is_same_v<TT, __nv_bfloat16>) {
    return kernels::to_float(*p);
  } else {
    return static_cast<float>(*p);
  }
}

// Largest |a| of sincosf's fast path: its 3-constant reduction stays accurate below this.
constexpr float kFastTrigLimit = 105615.0f;

// The pair (first, second) = (sin a, cos a), or (cos a, sin a) with flip, for
// |a| < kFastTrigLimit: CUDA's sincosf fast path (constants and operation order read from its
// SASS). The quadrant j = rint(a * 2/pi) is rounded as (a * 2/pi + 1.5 * 2^23) - 1.5 * 2^23, whose
// low bits are j (|a * 2/pi| < 2^22); __fmul_rn/__fadd_rn keep those steps unfused. With
// S(m) = sin(r + m pi/2) = (m odd ? cos r : sin r), negated if m & 2: sin a = S(j) and
// cos a = S(j + 1), so flip is a quadrant offset (first = S(j + flip), second = S(j + 1 - flip)),
// carried in bits 30-31 (no select of whole results).
__device__ __forceinline__ void sincos_fast(float a, bool flip, float& first, float& second) {
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23
  const float qm = __fadd_rn(__fmul_rn(a, 0.636619772f), kMagic);
  const float j = __fadd_rn(qm, -kMagic);
  float r = fmaf(j, -1.57079625129699707031f, a);  // pi/2 in three parts
  r = fmaf(j, -7.54978941586159635335e-8f, r);
  r = fmaf(j, -5.39030295347423839267e-15f, r);
  const float r2 = r * r;
  float ps = fmaf(r2, -1.95746586541645228863e-4f, 8.33270326256752014160e-3f);
  ps = fmaf(r2, ps, -1.66666626930236816406e-1f);
  const float sr = fmaf(fmaf(r2, r, 0.0f), ps, r);  // sin r
  float pc = fmaf(r2, 2.42795795202255249023e-5f, -1.38878601137548685074e-3f);
  pc = fmaf(r2, pc, 4.16667275130748748779e-2f);
  pc = fmaf(r2, pc, -4.99999970197677612305e-1f);
  const float cr = fmaf(r2, pc, 1.0f);  // cos r
  const uint32_t qb = __float_as_uint(qm);
  const uint32_t m1 = (qb << 30) + (flip ? 1u << 30 : 0u);  // bit 31: m & 2
  const uint32_t m2 = (qb << 30) + (flip ? 0u : 1u << 30);
  const bool odd = (qb ^ static_cast<uint32_t>(flip)) & 1u;  // j + flip odd
  first = __uint_as_float(__float_as_uint(odd ? cr : sr) ^ (m1 & 0x80000000u));
  second = __uint_as_float(__float_as_uint(odd ? sr : cr) ^ (m2 & 0x80000000u));
}

// The halves of W angles: the fast path when `fast` (all |a| < kFastTrigLimit, one branch per
// row of a lane), else sincosf (exact reduction for large arguments, inf and nan).
template <int W>
__device__ __forceinline__ void sincos_all(bool fast, const float (&a)[W], bool flip,
                                           float (&first)[W], float (&second)[W]) {
  if (fast) {
#pragma unroll
    for (int k = 0; k < W; ++k) sincos_fast(a[k], flip, first[k], second[k]);
  } else {
#pragma unroll
    for (int k = 0; k < W; ++k) {
      float s, c;
      sincosf(a[k], &s, &c);
      first[k] = flip ? c : s;
      second[k] = flip ? s : c;
    }
  }
}

template <typename T, typename TT, bool kPacked>
__global__ void __launch_bounds__(kPointwiseThreads, kThreadsPerSm / kPointwiseThreads)
    timestep_embedding_kernel(bool pdl, T* __restrict__ out, const TT* __restrict__ t,
                              Problem p) {
  constexpr int W = kernels::pack_width<T, kPacked>;
  const uint32_t i = blockIdx.x * kPointwiseThreads + threadIdx.x;
  if (pdl) kernels::pdl_wait();
  if (i >= p.lanes) return;
  uint32_t n, c;
  p.per_row.divmod(i, n, c);
  const TT* tp = t + n * p.t_stride;
  float tn = read_t(tp);
  if (pdl) kernels::pdl_launch_dependents();
  T* row = out + n * p.out_stride;
  const int f0 = static_cast<int>(c) * W;
  const bool has_freqs = f0 < p.half;  // false only for dim 1
  const bool zero_column = p.odd && c == 0;
  float freq[W];
  float fmax = 0.0f;
#pragma unroll
  for (int k = 0; k < W; ++k) {
    const float exponent = p.log_period * static_cast<float>(f0 + k);
    freq[k] = expf(exponent * p.inv_denom);
    fmax = fmaxf(fmax, freq[k]);
  }
  // |a| = |scale * (t * f)| <= bound * |t| * (1 + 2^-22) in fp32 for every f of the lane, so
  // bound * |t| < kFastTrigLimit - 1 (a margin of 1e-5 relative) keeps every |a| in the fast
  // path's range; nan and inf fail the test.
  const float bound = fabsf(p.scale) * fmax;
  for (;;) {
    n += p.sweep;  // < 2^32: rows < 2^31, sweep <= rows
    const bool more = n < p.rows;
    tp += p.t_step;
    float t_next = 0.0f;
    if (more) t_next = read_t(tp);
    if (has_freqs) {
      float a[W], first[W], second[W];
#pragma unroll
      for (int k = 0; k < W; ++k) a[k] = p.scale * (tn * freq[k]);
      sincos_all(fabsf(tn) * bound < kFastTrigLimit - 1.0f, a, p.flip, first, second);
      kernels::Pack<T, W> y;
      y.pack(first);
      y.store_stream(row + f0);
      y.pack(second);
      y.store_stream(row + p.half + f0);
    }
    if (zero_column) {
      float z[1] = {0.0f};
      kernels::Pack<T, 1> y;
      y.pack(z);
      y.store(row + 2 * p.half);
    }
    if (!more) break;
    row += p.row_step;
    tn = t_next;
  }
}

template <typename T, typename TT>
void run(T* out, const TT* t, int64_t rows, int64_t dim, int64_t t_stride, int64_t out_stride,
         bool flip, double shift, double scale, double max_period, const kernels::Launch& ctx) {
  constexpr int P = kernels::Pack<T>::size;
  const int64_t half = dim / 2;
  const bool packed = half % P == 0 && dim % P == 0 && out_stride % P == 0 &&
                      kernels::is_aligned(out) && half > 0;
  const int64_t per_row = half == 0 ? 1 : (packed ? half / P : half);
  // Rows per pass: about kThreadsPerSm lanes per SM (at least one row), then evened out so the
  // last pass is not a short one (16384 rows of 64 lanes on 132 SMs: 2112 -> 8 passes of 2048).
  const int64_t target = static_cast<int64_t>(kernels::sm_count(ctx.device)) * kThreadsPerSm;
  int64_t sweep = std::max<int64_t>(1, target / per_row);
  if (sweep >= rows) {
    sweep = rows;
  } else {
    const int64_t passes = (rows + sweep - 1) / sweep;
    sweep = (rows + passes - 1) / passes;
  }
  Problem p;
  p.per_row = FastDivmod(static_cast<uint32_t>(per_row));
  p.lanes = static_cast<uint32_t>(sweep * per_row);  // <= max(target, per_row) < 2^31
  p.rows = static_cast<uint32_t>(rows);
  p.sweep = static_cast<uint32_t>(sweep);
  p.t_stride = t_stride;
  p.out_stride = out_stride;
  p.t_step = sweep * t_stride;
  p.row_step = sweep * out_stride;
  p.half = static_cast<int>(half);
  p.odd = dim % 2 != 0;
  p.flip = flip;
  p.log_period = static_cast<float>(-std::log(max_period));
  p.inv_denom = 1.0f / static_cast<float>(static_cast<double>(half) - shift);
  p.scale = static_cast<float>(scale);
  auto kernel =
      packed ? timestep_embedding_kernel<T, TT, true> : timestep_embedding_kernel<T, TT, false>;
  kernels::launch_pointwise(ctx, kernel, p.lanes, out, t, p);
}

// Runs body.template operator()<TT>() with TT the C++ type of t's dtype.
template <typename F>
void dispatch_t(DLDataType d, const char* op, F&& body) {
  using kernels::is_dtype;
  if (is_dtype(d, kDLFloat, 32)) return body(static_cast<const float*>(nullptr));
  if (is_dtype(d, kDLFloat, 16)) return body(static_cast<const __half*>(nullptr));
  if (is_dtype(d, kDLBfloat, 16)) return body(static_cast<const __nv_bfloat16*>(nullptr));
  if (is_dtype(d, kDLFloat, 64)) return body(static_cast<const double*>(nullptr));
  if (is_dtype(d, kDLInt, 32)) return body(static_cast<const int32_t*>(nullptr));
  if (is_dtype(d, kDLInt, 64)) return body(static_cast<const int64_t*>(nullptr));
  TVM_FFI_THROW(TypeError) << op << ": t must have dtype float32, float16, bfloat16, float64, "
                           << "int32 or int64";
}

}  // namespace timestep_embedding_detail

// out: [N, dim] float32, float16 or bfloat16 (rows may be strided, last dim contiguous).
// t: [N], any stride.
inline void timestep_embedding(tvm::ffi::TensorView out, tvm::ffi::TensorView t, int64_t dim,
                               bool flip_sin_to_cos, double downscale_freq_shift, double scale,
                               double max_period) {
  namespace detail = timestep_embedding_detail;
  constexpr const char* kOp = "diffusion.timestep_embedding";
  // 1. Validate.
  kernels::check_ndim(kOp, "t", t, 1);
  kernels::check_ndim(kOp, "out", out, 2);
  TVM_FFI_CHECK(dim >= 1 && out.size(0) == t.size(0) && out.size(1) == dim, ValueError)
      << kOp << ": out must have shape [N, dim] = [" << t.size(0) << ", " << dim << "], got "
      << kernels::shape_string(out);
  kernels::check_last_dim_contiguous(kOp, "out", out);
  TVM_FFI_CHECK(dim / 2 == 0 || static_cast<double>(dim / 2) != downscale_freq_shift, ValueError)
      << kOp << ": dim // 2 - downscale_freq_shift must not be 0";
  TVM_FFI_CHECK(std::isfinite(max_period) && max_period > 0, ValueError)
      << kOp << ": max_period must be > 0, got " << max_period;
  TVM_FFI_CHECK(dim < (int64_t{1} << 30), ValueError)
      << kOp << ": dim must be below 2^30, got " << dim;
  kernels::check_device(kOp, "t", t, kDLCUDA);
  kernels::check_same_device(kOp, "out", out, "t", t);
  const int64_t rows = t.size(0);
  TVM_FFI_CHECK(rows < (int64_t{1} << 31), ValueError) << kOp << ": too many timesteps";
  if (rows == 0) return;
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(t);
  const kernels::Launch ctx(kOp, t);
  // 4. Dispatch on dtypes and launch (checked).
  const int64_t t_stride = t.stride(0), out_stride = rows == 1 ? dim : out.stride(0);
  KERNELS_DISPATCH_FLOAT(out.dtype(), kOp, T, [&] {
    detail::dispatch_t(t.dtype(), kOp, [&](auto tag) {
      using TT = std::remove_const_t<std::remove_pointer_t<decltype(tag)>>;
      detail::run<T, TT>(kernels::data<T>(out), kernels::data<const TT>(t), rows, dim, t_stride,
                         out_stride, flip_sin_to_cos, downscale_freq_shift, scale, max_period,
                         ctx);
    });
  });
}
