// lplb.solve_lp, CUDA: P independent dense LPs min c^T x, A x = b, x >= 0, one CTA of 256 threads
// per problem running the interior-point method of csrc/ipm.cuh (the reference's algorithm, fp64
// arithmetic). Shared memory holds the fp64 normal matrix and vectors, ((m (m+1|1)) + 10 n + 7 m)
// x 8 bytes, and A itself (m x (n|1) elements of its dtype) when both fit in the opt-in limit
// (227 KB on Hopper); otherwise A is read from global memory (L1/L2 resident). A problem whose
// normal matrix does not fit is a ValueError here (Python sends it to the reference first).
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(4);

#include "ipm.cuh"

#include <kernels/checks.h>
#include <kernels/dtype.h>
#include <kernels/launch.cuh>
#include <kernels/tensor.h>

namespace solve_lp_detail {

namespace ipm = lplb_ipm;

template <typename T>
struct Params {
  const T* a;
  const T* b;
  const T* c;
  float* x;
  int32_t* status;
  int m, n, max_iters;
  double tol;
};

template <typename T, bool kSmemA>
__global__ void __launch_bounds__(ipm::kThreads, 1) solve_lp_kernel(Params<T> p) {
  extern __shared__ double smem[];
  const int64_t problem = blockIdx.x;
  const int m = p.m, n = p.n, tid = threadIdx.x;
  const T* a = p.a + problem * m * n;
  const T* b = p.b + problem * m;
  const T* c = p.c + problem * n;
  float* x = p.x + problem * n;
  ipm::Work w;
  w.carve(smem, m, n);
  if (m == 0 || n == 0) {  // no variables: feasible iff b == 0; no rows: x = 0 iff c >= 0
    double bad[1] = {0.0};
    for (int i = tid; i < m; i += ipm::kThreads)
      if (!(static_cast<double>(b[i]) == 0.0)) bad[0] = 1.0;
    for (int j = tid; j < n; j += ipm::kThreads) {
      if (!(static_cast<double>(c[j]) >= 0.0)) bad[0] = 1.0;
      x[j] = 0.0f;
    }
    ipm::block_reduce<1, 0>(bad, w.red);
    if (tid == 0) p.status[problem] = bad[0] != 0.0 ? ipm::kInfeasible : ipm::kConverged;
    return;
  }
  const T* a_use = a;
  int64_t lda = n;
  if constexpr (kSmemA) {
    T* a_smem = reinterpret_cast<T*>(smem + ipm::work_bytes(m, n) / 8);
    lda = ipm::odd_stride(n);
    for (int64_t e = tid; e < static_cast<int64_t>(m) * n; e += ipm::kThreads) {
      const int64_t i = e / n, j = e - i * n;
      a_smem[i * lda + j] = a[e];
    }
    a_use = a_smem;
  }
  for (int i = tid; i < m; i += ipm::kThreads) {
    w.b[i] = static_cast<double>(b[i]);
    w.y[i] = 0.0;
  }
  for (int j = tid; j < n; j += ipm::kThreads) w.c[j] = static_cast<double>(c[j]);
  __syncthreads();
  const int status = ipm::solve(a_use, lda, w, p.max_iters, p.tol);
  for (int j = tid; j < n; j += ipm::kThreads) x[j] = static_cast<float>(w.x[j]);
  if (tid == 0) p.status[problem] = status;
}

inline int max_smem(int device) {
  int bytes = 0;
  cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  return bytes;
}

template <typename T, bool kSmemA>
void launch(const kernels::Launch& ctx, const Params<T>& p, int64_t problems, int64_t smem) {
  constexpr auto kernel = solve_lp_kernel<T, kSmemA>;
  kernels::allow_dynamic_smem<kernel>(ctx.op, ctx.device, smem);
  kernel<<<static_cast<unsigned>(problems), ipm::kThreads, static_cast<size_t>(smem),
           ctx.stream>>>(p);
  kernels::check_launch(ctx.op, cudaGetLastError());
}

}  // namespace solve_lp_detail

// x [P, n] float32, status [P] int32 (outputs); A [P, m, n], b [P, m], c [P, n]: one dtype,
// float32 or float64, contiguous, on one CUDA device.
inline void solve_lp(tvm::ffi::TensorView x, tvm::ffi::TensorView status, tvm::ffi::TensorView a,
                     tvm::ffi::TensorView b, tvm::ffi::TensorView c, int64_t max_iters,
                     double tol) {
  namespace d = solve_lp_detail;
  namespace ipm = lplb_ipm;
  constexpr const char* kOp = "lplb.solve_lp";
  // 1. Validate.
  kernels::check_ndim(kOp, "A", a, 3);
  kernels::check_ndim(kOp, "b", b, 2);
  kernels::check_ndim(kOp, "c", c, 2);
  kernels::check_ndim(kOp, "x", x, 2);
  kernels::check_ndim(kOp, "status", status, 1);
  const int64_t problems = a.size(0), m = a.size(1), n = a.size(2);
  TVM_FFI_CHECK(b.size(0) == problems && b.size(1) == m, ValueError)
      << kOp << ": b must have shape [" << problems << ", " << m << "], got "
      << kernels::shape_string(b);
  TVM_FFI_CHECK(c.size(0) == problems && c.size(1) == n, ValueError)
      << kOp << ": c must have shape [" << problems << ", " << n << "], got "
      << kernels::shape_string(c);
  TVM_FFI_CHECK(x.size(0) == problems && x.size(1) == n, ValueError)
      << kOp << ": x must have shape [" << problems << ", " << n << "], got "
      << kernels::shape_string(x);
  TVM_FFI_CHECK(status.size(0) == problems, ValueError)
      << kOp << ": status must have shape [" << problems << "], got "
      << kernels::shape_string(status);
  kernels::check_same_dtype(kOp, "b", b, "A", a);
  kernels::check_same_dtype(kOp, "c", c, "A", a);
  TVM_FFI_CHECK(kernels::is_dtype(x.dtype(), kDLFloat, 32), TypeError)
      << kOp << ": x must be float32";
  TVM_FFI_CHECK(kernels::is_dtype(status.dtype(), kDLInt, 32), TypeError)
      << kOp << ": status must be int32";
  const tvm::ffi::TensorView* all[] = {&x, &status, &a, &b, &c};
  const char* names[] = {"x", "status", "A", "b", "c"};
  for (int i = 0; i < 5; ++i) {
    kernels::check_contiguous(kOp, names[i], *all[i]);
    kernels::check_device(kOp, names[i], *all[i], kDLCUDA);
    kernels::check_same_device(kOp, names[i], *all[i], "A", a);
  }
  TVM_FFI_CHECK(max_iters >= 0 && max_iters < (int64_t{1} << 30), ValueError)
      << kOp << ": max_iters must be in [0, 2^30), got " << max_iters;
  TVM_FFI_CHECK(tol > 0.0 && std::isfinite(tol), ValueError)
      << kOp << ": tol must be a finite float > 0, got " << tol;
  TVM_FFI_CHECK(problems < (int64_t{1} << 31) && m < (int64_t{1} << 20) &&
                    n < (int64_t{1} << 20),
                ValueError)
      << kOp << ": the CUDA kernel takes P < 2^31 problems, m and n < 2^20, got "
      << kernels::shape_string(a);
  if (problems == 0) return;
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(a);
  const kernels::Launch ctx(kOp, a);
  const int64_t limit = d::max_smem(ctx.device);
  const int64_t work = ipm::work_bytes(m, n);
  TVM_FFI_CHECK(work <= limit, ValueError)
      << kOp << ": m = " << m << ", n = " << n << " needs " << work
      << " bytes of shared memory for the fp64 normal matrix and vectors; this device allows "
      << limit << " (use backend='torch')";
  // 4. Dispatch on dtype and launch: one CTA per problem.
  const bool wide = kernels::is_dtype(a.dtype(), kDLFloat, 64);
  TVM_FFI_CHECK(wide || kernels::is_dtype(a.dtype(), kDLFloat, 32), TypeError)
      << kOp << ": A must be float32 or float64";
  auto run = [&](auto tag) {
    using T = decltype(tag);
    d::Params<T> p{kernels::data<const T>(a), kernels::data<const T>(b),
                   kernels::data<const T>(c),  kernels::data<float>(x),
                   kernels::data<int32_t>(status), static_cast<int>(m), static_cast<int>(n),
                   static_cast<int>(max_iters), tol};
    const int64_t with_a = work + m * ipm::odd_stride(n) * static_cast<int64_t>(sizeof(T));
    if (with_a <= limit)
      d::launch<T, true>(ctx, p, problems, with_a);
    else
      d::launch<T, false>(ctx, p, problems, work);
  };
  if (wide)
    run(double{});
  else
    run(float{});
}
