// elementwise.fused_dual_residual_rmsnorm, CUDA:
//   mid = residual + rms(x) * w1    (in fp32, rounded once to the dtype: the new residual)
//   out = rms(mid) * w2             (from the rounded mid, as a separate rmsnorm of it would)
// with rms(v) = v / sqrt(mean(v^2) + eps) and sums of squares in fp32.
//
// One block per token. Rows up to 4096 16-byte packs (H <= 32768 bf16) stay in registers: the
// block loads x, residual and w1 once, reduces sum(x^2), writes mid, reduces sum(mid^2) from the
// rounded values it keeps, loads w2 meanwhile, and writes out. Bytes: read x and residual, write
// mid and out (w1, w2 are read by every block, from L2). Wider rows, and rows whose H, strides or
// pointers are not in whole 16-byte packs (one element per access then), take a three-pass loop
// that re-reads x and mid.
#pragma once

#include <kernels/checks.h>
#include <kernels/cuda_dtype.cuh>
#include <kernels/dtype.h>
#include <kernels/launch.cuh>
#include <kernels/pointwise.cuh>
#include <kernels/reduce.cuh>

#include <cmath>

namespace dual_rms_detail {

struct Args {
  int64_t out, mid, x, residual;  // row strides in elements
  int64_t accesses;               // per row
  float inv_hidden;
  float eps;
};

// Each thread owns accesses tid + k * blockDim.x, k < kAcc, for the whole row.
template <typename T, bool kPacked, int kAcc, int kMaxThreads>
__global__ void __launch_bounds__(kMaxThreads)
    cached_kernel(T* __restrict__ out, T* __restrict__ mid, const T* __restrict__ x,
                  const T* __restrict__ residual, const T* __restrict__ w1,
                  const T* __restrict__ w2, Args a) {
  using A = kernels::Access<T, kPacked>;
  using Raw = typename A::Raw;
  constexpr int W = A::width;
  __shared__ float partial[32];
  const int64_t row = blockIdx.x;
  const int tid = threadIdx.x, threads = blockDim.x;
  x += row * a.x;
  residual += row * a.residual;
  mid += row * a.mid;
  out += row * a.out;

  Raw xr[kAcc], rr[kAcc], wr[kAcc];
#pragma unroll
  for (int k = 0; k < kAcc; ++k) {
    const int64_t j = tid + k * threads;
    if (j < a.accesses) {
      xr[k] = A::load_stream(x + j * W);
      rr[k] = A::load_stream(residual + j * W);
      wr[k] = A::load_cached(w1 + j * W);
    }
  }
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < kAcc; ++k) {
    if (tid + k * threads < a.accesses) {
      float v[W];
      A::to_floats(xr[k], v);
#pragma unroll
      for (int e = 0; e < W; ++e) ss = fmaf(v[e], v[e], ss);
    }
  }
  const float inv1 = rsqrtf(kernels::block_sum(ss, partial) * a.inv_hidden + a.eps);

  float ss2 = 0.0f;
#pragma unroll
  for (int k = 0; k < kAcc; ++k) {
    const int64_t j = tid + k * threads;
    if (j < a.accesses) {
      float v[W], r[W], w[W];
      A::to_floats(xr[k], v);
      A::to_floats(rr[k], r);
      A::to_floats(wr[k], w);
#pragma unroll
      for (int e = 0; e < W; ++e) v[e] = r[e] + v[e] * inv1 * w[e];
      xr[k] = A::from_floats(v);  // mid, rounded: stored and reused below
      A::store_stream(mid + j * W, xr[k]);
      A::to_floats(xr[k], v);
#pragma unroll
      for (int e = 0; e < W; ++e) ss2 = fmaf(v[e], v[e], ss2);
      wr[k] = A::load_cached(w2 + j * W);
    }
  }
  const float inv2 = rsqrtf(kernels::block_sum(ss2, partial) * a.inv_hidden + a.eps);

#pragma unroll
  for (int k = 0; k < kAcc; ++k) {
    const int64_t j = tid + k * threads;
    if (j < a.accesses) {
      float m[W], w[W];
      A::to_floats(xr[k], m);
      A::to_floats(wr[k], w);
#pragma unroll
      for (int e = 0; e < W; ++e) m[e] = m[e] * inv2 * w[e];
      A::store_stream(out + j * W, A::from_floats(m));
    }
  }
}

constexpr int kLoopThreads = 256;

// Any width: x is read twice and mid once more; each thread re-reads only what it wrote, with
// coherent loads (no __restrict__ on what this kernel writes or may alias: out may be x).
template <typename T, bool kPacked>
__global__ void __launch_bounds__(kLoopThreads)
    loop_kernel(T* out, T* mid, const T* x, const T* residual, const T* __restrict__ w1,
                const T* __restrict__ w2, Args a) {
  using A = kernels::Access<T, kPacked>;
  constexpr int W = A::width;
  __shared__ float partial[32];
  const int64_t row = blockIdx.x;
  x += row * a.x;
  residual += row * a.residual;
  mid += row * a.mid;
  out += row * a.out;

  float ss = 0.0f;
  for (int64_t j = threadIdx.x; j < a.accesses; j += kLoopThreads) {
    float v[W];
    A::to_floats(A::load(x + j * W), v);
#pragma unroll
    for (int e = 0; e < W; ++e) ss = fmaf(v[e], v[e], ss);
  }
  const float inv1 = rsqrtf(kernels::block_sum(ss, partial) * a.inv_hidden + a.eps);

  float ss2 = 0.0f;
  for (int64_t j = threadIdx.x; j < a.accesses; j += kLoopThreads) {
    float v[W], r[W], w[W];
    A::to_floats(A::load(x + j * W), v);
    A::to_floats(A::load(residual + j * W), r);
    A::to_floats(A::load_cached(w1 + j * W), w);
#pragma unroll
    for (int e = 0; e < W; ++e) v[e] = r[e] + v[e] * inv1 * w[e];
    const auto m = A::from_floats(v);
    A::store_stream(mid + j * W, m);
    A::to_floats(m, v);
#pragma unroll
    for (int e = 0; e < W; ++e) ss2 = fmaf(v[e], v[e], ss2);
  }
  const float inv2 = rsqrtf(kernels::block_sum(ss2, partial) * a.inv_hidden + a.eps);

  for (int64_t j = threadIdx.x; j < a.accesses; j += kLoopThreads) {
    float m[W], w[W];
    A::to_floats(A::load(mid + j * W), m);
    A::to_floats(A::load_cached(w2 + j * W), w);
#pragma unroll
    for (int e = 0; e < W; ++e) m[e] = m[e] * inv2 * w[e];
    A::store_stream(out + j * W, A::from_floats(m));
  }
}

inline unsigned threads_for(int64_t accesses, int acc) {
  const int64_t per = (accesses + acc - 1) / acc;
  return static_cast<unsigned>((per + 31) / 32 * 32);
}

// Packed rows: the fewest accesses per thread that keep a block at <= 256 threads (one row of
// H = 4096 bf16: 2 packs x 256 threads; H = 7168: 4 x 224), then 8 per thread up to 512 threads,
// then the loop kernel. Scalar rows (H or a stride not in whole packs) take the loop kernel.
template <typename T>
void launch_packed(T* out, T* mid, const T* x, const T* residual, const T* w1, const T* w2,
                   Args a, int64_t tokens, cudaStream_t stream) {
  const unsigned grid = static_cast<unsigned>(tokens);
  const int64_t n = a.accesses;
  if (n <= 256)
    cached_kernel<T, true, 1, 256>
        <<<grid, threads_for(n, 1), 0, stream>>>(out, mid, x, residual, w1, w2, a);
  else if (n <= 512)
    cached_kernel<T, true, 2, 256>
        <<<grid, threads_for(n, 2), 0, stream>>>(out, mid, x, residual, w1, w2, a);
  else if (n <= 1024)
    cached_kernel<T, true, 4, 256>
        <<<grid, threads_for(n, 4), 0, stream>>>(out, mid, x, residual, w1, w2, a);
  else if (n <= 2048)
    cached_kernel<T, true, 8, 256>
        <<<grid, threads_for(n, 8), 0, stream>>>(out, mid, x, residual, w1, w2, a);
  else if (n <= 4096)
    cached_kernel<T, true, 8, 512>
        <<<grid, threads_for(n, 8), 0, stream>>>(out, mid, x, residual, w1, w2, a);
  else
    loop_kernel<T, true><<<grid, kLoopThreads, 0, stream>>>(out, mid, x, residual, w1, w2, a);
}

inline int64_t row_stride(const tvm::ffi::TensorView& t) {
  return t.size(0) == 1 ? 0 : t.stride(0);
}

}  // namespace dual_rms_detail

// out, mid: [T, H] (mid may alias residual, out may alias x; out and mid must differ).
// x, residual: [T, H]. w1, w2: [H]. One dtype for all; last dims contiguous, rows strided.
inline void fused_dual_residual_rmsnorm(tvm::ffi::TensorView out, tvm::ffi::TensorView mid,
                                        tvm::ffi::TensorView x, tvm::ffi::TensorView residual,
                                        tvm::ffi::TensorView w1, tvm::ffi::TensorView w2,
                                        double eps) {
  namespace detail = dual_rms_detail;
  constexpr const char* kOp = "elementwise.fused_dual_residual_rmsnorm";
  // 1. Validate.
  kernels::check_ndim(kOp, "x", x, 2);
  kernels::check_ndim(kOp, "w1", w1, 1);
  kernels::check_ndim(kOp, "w2", w2, 1);
  kernels::check_same_shape(kOp, "residual", residual, "x", x);
  kernels::check_same_shape(kOp, "out", out, "x", x);
  kernels::check_same_shape(kOp, "mid", mid, "x", x);
  const int64_t tokens = x.size(0), hidden = x.size(1);
  TVM_FFI_CHECK(w1.size(0) == hidden && w2.size(0) == hidden, ValueError)
      << kOp << ": w1 " << kernels::shape_string(w1) << " and w2 " << kernels::shape_string(w2)
      << " must be [H] for x " << kernels::shape_string(x);
  TVM_FFI_CHECK(tokens < (int64_t{1} << 31), ValueError) << kOp << ": more than 2^31 - 1 rows";
  TVM_FFI_CHECK(std::isfinite(eps) && eps >= 0.0, ValueError)
      << kOp << ": eps must be finite and >= 0, got " << eps;
  for (const auto& [name, t] : {std::pair<const char*, const tvm::ffi::TensorView*>{"out", &out},
                                {"mid", &mid},
                                {"residual", &residual},
                                {"w1", &w1},
                                {"w2", &w2},
                                {"x", &x}}) {
    kernels::check_same_dtype(kOp, name, *t, "x", x);
    kernels::check_device(kOp, name, *t, kDLCUDA);
    kernels::check_same_device(kOp, name, *t, "x", x);
    kernels::check_last_dim_contiguous(kOp, name, *t);
  }
  TVM_FFI_CHECK(kernels::data_at(out) != kernels::data_at(mid) || tokens * hidden == 0,
                ValueError)
      << kOp << ": out and mid must be different buffers";
  if (tokens == 0 || hidden == 0) return;
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(x);
  cudaStream_t stream = kernels::current_stream(x);
  // 4. Dispatch on dtype and launch.
  KERNELS_DISPATCH_FLOAT(x.dtype(), kOp, T, [&] {
    T* o = reinterpret_cast<T*>(kernels::data_at(out));
    T* m = reinterpret_cast<T*>(kernels::data_at(mid));
    const T* xp = reinterpret_cast<const T*>(kernels::data_at(x));
    const T* rp = reinterpret_cast<const T*>(kernels::data_at(residual));
    const T* w1p = reinterpret_cast<const T*>(kernels::data_at(w1));
    const T* w2p = reinterpret_cast<const T*>(kernels::data_at(w2));
    detail::Args a{detail::row_stride(out), detail::row_stride(mid), detail::row_stride(x),
                   detail::row_stride(residual), 0, static_cast<float>(1.0 / hidden),
                   static_cast<float>(eps)};
    const bool packed =
        kernels::packs_fit(o, hidden, a.out, sizeof(T)) &&
        kernels::packs_fit(m, hidden, a.mid, sizeof(T)) &&
        kernels::packs_fit(xp, hidden, a.x, sizeof(T)) &&
        kernels::packs_fit(rp, hidden, a.residual, sizeof(T)) && kernels::is_aligned(w1p) &&
        kernels::is_aligned(w2p);
    if (packed) {
      a.accesses = hidden / kernels::Pack<T>::size;
      detail::launch_packed<T>(o, m, xp, rp, w1p, w2p, a, tokens, stream);
    } else {
      a.accesses = hidden;
      detail::loop_kernel<T, false><<<static_cast<unsigned>(tokens), detail::kLoopThreads, 0,
                                      stream>>>(o, m, xp, rp, w1p, w2p, a);
    }
  });
  kernels::check_launch(kOp);
}
