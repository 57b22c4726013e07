// lplb: the interior-point method of solve_lp as device code, run by one CTA per problem (shared
// by csrc/solve_lp.cuh and csrc/lplb_dispatch.cuh).
//
// min c^T x s.t. A x = b, x >= 0: Mehrotra predictor-corrector on the normal equations
// A diag(x/s) A^T dy = r, step for step the algorithm of kernels_lplb.reference.solve_lp (same
// starting point, stopping tests, certificates and step rule), in float64 arithmetic like the
// reference (Hopper runs fp64 at half the fp32 rate, and these solves are latency-bound: fp64 is
// what makes tol = 1e-6 reachable on the badly conditioned late normal matrices). A stays in the
// caller's storage type (fp32 or fp64: shared memory when it fits, else global memory through L1).
// The normal matrix M (m x (m+1) doubles) and the vectors live in shared memory.
//
// Per iteration the work is: M = A diag(d) A^T, a warp per row i of M with the row's entries in
// registers (lane l: columns l + 32 s), walking row i of A 32 columns at a time and adding only the
// terms of its nonzeros (found by a ballot; A of the load-balancing LP has 3-4 nonzeros in most
// rows, so that is a few thousand fmas instead of m^2 n / 2; dense A costs what it did). Then a
// right-looking LDL^T (M = L D L^T, L unit lower, the column below each pivot kept unscaled, so one
// __syncthreads per column; each warp updates four rows per round with the pivot column in
// registers): a pivot <= 1e-12 x the largest diagonal entry marks a dependent row and gets
// 1/d = 0 (the reference's 1e64 pivot, LIPSOL's rule). Triangular solves run on one warp, the
// right-hand side in registers (a shuffle per column). A x: a warp per row; A^T y: a thread per
// column with four interleaved partial sums. Every sum has a fixed order: deterministic.

#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(4);

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

namespace lplb_ipm {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kConverged = 0, kMaxIters = 1, kInfeasible = 2;
constexpr double kPivotFloor = 1e-12;
constexpr double kStepFraction = 0.99;
constexpr double kBlowup = 1e10;
constexpr double kRaySize = 1e4;
constexpr int kVectorsN = 10;   // doubles per variable in the workspace
constexpr int kVectorsM = 7;    // doubles per constraint
constexpr int kReduceSlots = 16;

// Odd row strides spread the rows of A and M over the shared-memory banks.
__host__ __device__ inline int64_t odd_stride(int64_t n) { return n % 2 ? n : n + 1; }

// Bytes of the fp64 workspace (M, the vectors, the reduction scratch) for an m x n problem.
__host__ __device__ inline int64_t work_bytes(int64_t m, int64_t n) {
  return (m * odd_stride(m) + kVectorsN * n + kVectorsM * m + kWarps * kReduceSlots) * 8;
}

// The workspace, carved out of shared memory (8-byte aligned base).
struct Work {
  int m, n, ld;
  double* M;  // [m][ld], lower triangle used
  double *x, *s, *c, *d, *rc, *aty, *dx, *ds, *rxs, *vn;  // [n]
  double *b, *y, *ax, *rb, *dy, *vm, *invd;               // [m]
  double* red;                                            // [kWarps][kReduceSlots]

  __device__ void carve(double* base, int m_, int n_) {
    m = m_;
    n = n_;
    ld = static_cast<int>(odd_stride(m_));
    M = base;
    double* p = base + static_cast<int64_t>(m_) * ld;
    double** vn_list[kVectorsN] = {&x, &s, &c, &d, &rc, &aty, &dx, &ds, &rxs, &vn};
    for (int i = 0; i < kVectorsN; ++i, p += n_) *vn_list[i] = p;
    double** vm_list[kVectorsM] = {&b, &y, &ax, &rb, &dy, &vm, &invd};
    for (int i = 0; i < kVectorsM; ++i, p += m_) *vm_list[i] = p;
    red = p;
  }
};

__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// K block-wide reductions at once: slots [0, S) are sums, [S, K) maxima (fmax: NaN-free; callers
// flag non-finite values separately). Every thread gets every result; two barriers.
template <int K, int S>
__device__ __forceinline__ void block_reduce(double (&v)[K], double* red) {
  static_assert(K <= kReduceSlots, "too many reduction slots");
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int k = 0; k < K; ++k) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const double other = __shfl_xor_sync(0xffffffffu, v[k], o);
      v[k] = k < S ? v[k] + other : fmax(v[k], other);
    }
  }
  if (lane == 0) {
#pragma unroll
    for (int k = 0; k < K; ++k) red[warp * kReduceSlots + k] = v[k];
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < K; ++k) {
    double acc = red[k];
    for (int w = 1; w < kWarps; ++w) {
      const double o = red[w * kReduceSlots + k];
      acc = k < S ? acc + o : fmax(acc, o);
    }
    v[k] = acc;
  }
  __syncthreads();
}

// out[i] = sum_j A[i, j] v[j] (a warp per row). Ends with a barrier.
template <typename T>
__device__ __forceinline__ void matvec(const T* a, int64_t lda, int m, int n, const double* v,
                                       double* out) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int i = warp; i < m; i += kWarps) {
    const T* row = a + i * lda;
    double acc = 0.0;
    for (int j = lane; j < n; j += 32) acc += static_cast<double>(row[j]) * v[j];
    acc = warp_sum(acc);
    if (lane == 0) out[i] = acc;
  }
  __syncthreads();
}

// out[j] = sum_i A[i, j] v[i] (a thread per column, four interleaved partial sums over i mod 4
// for a quarter-length dependent chain). Ends with a barrier.
template <typename T>
__device__ __forceinline__ void matTvec(const T* a, int64_t lda, int m, int n, const double* v,
                                        double* out) {
  for (int j = threadIdx.x; j < n; j += kThreads) {
    double acc[4] = {0.0, 0.0, 0.0, 0.0};
    int i = 0;
    for (; i + 4 <= m; i += 4) {
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[q] += static_cast<double>(a[(i + q) * lda + j]) * v[i + q];
    }
#pragma unroll
    for (int q = 0; q < 3; ++q)
      if (i + q < m) acc[q] += static_cast<double>(a[(i + q) * lda + j]) * v[i + q];
    out[j] = (acc[0] + acc[1]) + (acc[2] + acc[3]);
  }
  __syncthreads();
}

// Row i of M = A diag(d) A^T, columns [k0, min(i, k0 + 32 kSlots - 1)], by one warp: lane l
// accumulates M[i][k0 + l + 32 s] in registers. The warp walks row i of A 32 columns at a time,
// finds its nonzeros by a ballot and adds only their terms (A of the load-balancing LP has a few
// nonzeros per row but for the z column), four nonzeros per step for independent loads; each
// entry's sum still runs over j in increasing order, fma(a_ij d_j, a_kj, acc) like the dense loop.
template <typename T, int kSlots>
__device__ __forceinline__ void normal_row(const T* a, int64_t lda, const Work& w, int i, int k0) {
  const int n = w.n, lane = threadIdx.x % 32;
  const T* ri = a + static_cast<int64_t>(i) * lda;
  double acc[kSlots];
#pragma unroll
  for (int s = 0; s < kSlots; ++s) acc[s] = 0.0;
  for (int j0 = 0; j0 < n; j0 += 32) {
    const int jl = j0 + lane;
    const double aij = jl < n ? static_cast<double>(ri[jl]) : 0.0;
    const double sij = aij * (jl < n ? w.d[jl] : 0.0);
    unsigned mask = __ballot_sync(0xffffffffu, aij != 0.0);
    while (mask) {
      int bit[4];
      double coef[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {  // missing nonzeros: column j0 with coefficient 0
        bit[u] = mask ? __ffs(mask) - 1 : 0;
        mask &= mask - 1;
        coef[u] = __shfl_sync(0xffffffffu, sij, bit[u]);
      }
      const bool full[4] = {true, bit[1] != 0, bit[2] != 0, bit[3] != 0};
      double akj[4][kSlots];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
#pragma unroll
        for (int s = 0; s < kSlots; ++s) {
          const int k = k0 + s * 32 + lane;
          akj[u][s] = k <= i ? static_cast<double>(a[k * lda + j0 + bit[u]]) : 0.0;
        }
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        if (!full[u]) break;
#pragma unroll
        for (int s = 0; s < kSlots; ++s) acc[s] = fma(coef[u], akj[u][s], acc[s]);
      }
    }
  }
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const int k = k0 + s * 32 + lane;
    if (k <= i) w.M[i * w.ld + k] = acc[s];
  }
}

// One right-looking elimination step at column j over the columns k in [k0, k0 + 32 kSlots):
// lane l's column entries M[k][j] sit in registers, and each warp updates four of its rows per
// round (loads, then fmas, then stores: independent, so their latencies overlap).
template <int kSlots>
__device__ __forceinline__ void eliminate(Work& w, int j, double invd, int k0) {
  const int m = w.m, ld = w.ld, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  double mk[kSlots];
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const int k = k0 + s * 32 + lane;
    mk[s] = k < m ? w.M[k * ld + j] : 0.0;
  }
  for (int i0 = (k0 > j + 1 ? k0 : j + 1) + warp; i0 < m; i0 += 4 * kWarps) {
    double lij[4], cur[4][kSlots];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int i = i0 + u * kWarps;
      lij[u] = i < m ? w.M[i * ld + j] : 0.0;
#pragma unroll
      for (int s = 0; s < kSlots; ++s) {
        const int k = k0 + s * 32 + lane;
        cur[u][s] = i < m && k <= i ? w.M[i * ld + k] : 0.0;
      }
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int i = i0 + u * kWarps;
      const double l = lij[u] * invd;
#pragma unroll
      for (int s = 0; s < kSlots; ++s) {
        const int k = k0 + s * 32 + lane;
        if (i < m && k <= i) w.M[i * ld + k] = cur[u][s] - l * mk[s];
      }
    }
  }
}

// M = A diag(d) A^T (lower triangle; a warp per row), then its LDL^T factorisation in place with
// the pivot floor (a barrier per column).
template <typename T, int kSlots>
__device__ void factor_normal_slots(const T* a, int64_t lda, Work& w) {
  const int m = w.m, ld = w.ld, warp = threadIdx.x / 32;
  constexpr int kSpan = 32 * kSlots;
  for (int i = warp; i < m; i += kWarps)
    for (int k0 = 0; k0 <= i; k0 += kSpan) normal_row<T, kSlots>(a, lda, w, i, k0);
  __syncthreads();
  double top = 0.0;
  for (int i = threadIdx.x; i < m; i += kThreads) top = fmax(top, w.M[i * ld + i]);
  double r[1] = {top};
  block_reduce<1, 0>(r, w.red);
  const double floor = kPivotFloor * fmax(r[0], 1e-300);
  for (int j = 0; j < m; ++j) {
    const double pivot = w.M[j * ld + j];
    const double invd = pivot <= floor ? 0.0 : 1.0 / pivot;
    if (threadIdx.x == 0) w.invd[j] = invd;
    for (int k0 = j + 1; k0 < m; k0 += kSpan) eliminate<kSlots>(w, j, invd, k0);
    __syncthreads();
  }
}

template <typename T>
__device__ void factor_normal(const T* a, int64_t lda, Work& w) {
  if (w.m <= 32)
    factor_normal_slots<T, 1>(a, lda, w);
  else if (w.m <= 64)
    factor_normal_slots<T, 2>(a, lda, w);
  else if (w.m <= 128)
    factor_normal_slots<T, 4>(a, lda, w);
  else
    factor_normal_slots<T, 6>(a, lda, w);
}

// r <- M^{-1} r with the factors of factor_normal, by warp 0 with r in registers: lane l holds
// r[l + 32 s] in slot s, and the value finished at step k reaches the other lanes by a shuffle
// (no shared-memory round trip or __syncwarp on the sequential chain). The same operations in
// the same order as the column-oriented substitution: L z = r, z /= d, L^T w = z.
template <int kSlots>
__device__ __forceinline__ void solve_normal_warp(const Work& w, double* r) {
  const int m = w.m, ld = w.ld, lane = threadIdx.x;
  double v[kSlots];
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const int i = s * 32 + lane;
    v[s] = i < m ? r[i] : 0.0;
  }
#pragma unroll 2
  for (int k = 0; k < m; ++k) {  // forward: r[i] -= (M[i][k] / d_k) r[k] for i > k
    double own = 0.0;
#pragma unroll
    for (int s = 0; s < kSlots; ++s)
      if (s == (k >> 5)) own = v[s];
    const double zk = __shfl_sync(0xffffffffu, own, k & 31) * w.invd[k];
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      const int i = s * 32 + lane;
      if (i > k && i < m) v[s] -= w.M[i * ld + k] * zk;
    }
  }
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const int i = s * 32 + lane;
    if (i < m) v[s] *= w.invd[i];
  }
#pragma unroll 2
  for (int k = m - 1; k > 0; --k) {  // backward: r[i] -= (M[k][i] / d_i) r[k] for i < k
    double own = 0.0;
#pragma unroll
    for (int s = 0; s < kSlots; ++s)
      if (s == (k >> 5)) own = v[s];
    const double wk = __shfl_sync(0xffffffffu, own, k & 31);
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      const int i = s * 32 + lane;
      if (i < k) v[s] -= w.M[k * ld + i] * w.invd[i] * wk;
    }
  }
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const int i = s * 32 + lane;
    if (i < m) r[i] = v[s];
  }
}

// Larger m: the same substitution with r in shared memory (__syncwarp per column).
__device__ __forceinline__ void solve_normal_smem(const Work& w, double* r) {
  const int m = w.m, ld = w.ld, lane = threadIdx.x;
  for (int k = 0; k < m; ++k) {
    const double zk = r[k] * w.invd[k];
    for (int i = k + 1 + lane; i < m; i += 32) r[i] -= w.M[i * ld + k] * zk;
    __syncwarp();
  }
  for (int i = lane; i < m; i += 32) r[i] *= w.invd[i];
  __syncwarp();
  for (int k = m - 1; k > 0; --k) {
    const double wk = r[k];
    for (int i = lane; i < k; i += 32) r[i] -= w.M[k * ld + i] * w.invd[i] * wk;
    __syncwarp();
  }
}

// r <- M^{-1} r (warp 0; barriers around).
inline __device__ __noinline__ void solve_normal(Work& w, double* r) {
  if (threadIdx.x < 32) {
    if (w.m <= 64)
      solve_normal_warp<2>(w, r);
    else if (w.m <= 128)
      solve_normal_warp<4>(w, r);
    else if (w.m <= 192)
      solve_normal_warp<6>(w, r);
    else
      solve_normal_smem(w, r);
  }
  __syncthreads();
}

// The Newton direction (dx, dy, ds) with complementarity right-hand side w.rxs.
template <typename T>
__device__ void newton(const T* a, int64_t lda, Work& w) {
  for (int j = threadIdx.x; j < w.n; j += kThreads) w.vn[j] = w.rxs[j] / w.s[j] + w.d[j] * w.rc[j];
  __syncthreads();
  matvec(a, lda, w.m, w.n, w.vn, w.vm);
  for (int i = threadIdx.x; i < w.m; i += kThreads) w.dy[i] = -w.rb[i] - w.vm[i];
  __syncthreads();
  solve_normal(w, w.dy);
  matTvec(a, lda, w.m, w.n, w.dy, w.vn);
  for (int j = threadIdx.x; j < w.n; j += kThreads) {
    w.ds[j] = -w.rc[j] - w.vn[j];
    w.dx[j] = w.rxs[j] / w.s[j] + w.d[j] * (w.rc[j] + w.vn[j]);
  }
  __syncthreads();
}

// (alpha_p, alpha_d): the largest steps in [0, 1] keeping x and s >= 0.
__device__ __forceinline__ void max_steps(const Work& w, double& ap, double& ad) {
  double v[2] = {-INFINITY, -INFINITY};  // maxima of -ratio
  for (int j = threadIdx.x; j < w.n; j += kThreads) {
    if (w.dx[j] < 0) v[0] = fmax(v[0], w.x[j] / w.dx[j]);
    if (w.ds[j] < 0) v[1] = fmax(v[1], w.s[j] / w.ds[j]);
  }
  block_reduce<2, 0>(v, const_cast<double*>(w.red));
  ap = fmin(-v[0], 1.0);
  ad = fmin(-v[1], 1.0);
}

// Solves the problem whose A (row stride lda), b and c (in w.b, w.c) are loaded; leaves x in
// w.x and returns the status. m >= 1 and n >= 1.
template <typename T>
__device__ int solve(const T* a, int64_t lda, Work& w, int max_iters, double tol) {
  const int m = w.m, n = w.n, tid = threadIdx.x;
  // Mehrotra's starting point: least-norm x and least-squares (y, s), shifted to the interior.
  for (int j = tid; j < n; j += kThreads) w.d[j] = 1.0;
  __syncthreads();
  factor_normal(a, lda, w);
  for (int i = tid; i < m; i += kThreads) w.dy[i] = w.b[i];
  __syncthreads();
  solve_normal(w, w.dy);
  matTvec(a, lda, m, n, w.dy, w.x);
  // Dependent rows are dropped by the floor: if b is not in the range of A, A x = b has no
  // solution at all (the reference's `inconsistent`): report it instead of stalling.
  matvec(a, lda, m, n, w.x, w.ax);
  double dep[3] = {0.0, 0.0, 0.0};  // dependent row, max |A x0 - b|, |b|_inf
  for (int i = tid; i < m; i += kThreads) {
    if (w.invd[i] == 0.0) dep[0] = 1.0;
    dep[1] = fmax(dep[1], fabs(w.ax[i] - w.b[i]));
    if (isnan(w.ax[i])) dep[1] = INFINITY;
    dep[2] = fmax(dep[2], fabs(w.b[i]));
  }
  block_reduce<3, 0>(dep, w.red);
  if (dep[0] != 0.0 && !(dep[1] <= sqrt(tol) * (1.0 + dep[2]))) return kInfeasible;
  matvec(a, lda, m, n, w.c, w.y);
  solve_normal(w, w.y);
  matTvec(a, lda, m, n, w.y, w.aty);
  double r[4] = {0.0, 0.0, -INFINITY, -INFINITY};  // -min x, -min s
  for (int j = tid; j < n; j += kThreads) {
    w.s[j] = w.c[j] - w.aty[j];
    r[2] = fmax(r[2], -w.x[j]);
    r[3] = fmax(r[3], -w.s[j]);
  }
  block_reduce<4, 2>(r, w.red);
  const double shift_x = fmax(1.5 * r[2], 0.0), shift_s = fmax(1.5 * r[3], 0.0);
  double q[2] = {0.0, 0.0};  // x.s, sum s
  for (int j = tid; j < n; j += kThreads) {
    w.x[j] += shift_x;
    w.s[j] += shift_s;
    q[0] += w.x[j] * w.s[j];
    q[1] += w.s[j];
  }
  block_reduce<2, 2>(q, w.red);
  const double xs = q[0];
  double sx[1] = {0.0};
  for (int j = tid; j < n; j += kThreads) {
    w.x[j] += 0.5 * xs / fmax(q[1], 1e-300);
    sx[0] += w.x[j];
  }
  block_reduce<1, 1>(sx, w.red);
  double norms[2] = {0.0, 0.0};
  for (int i = tid; i < m; i += kThreads) norms[0] = fmax(norms[0], fabs(w.b[i]));
  for (int j = tid; j < n; j += kThreads) {
    w.s[j] += 0.5 * xs / fmax(sx[0], 1e-300);
    norms[1] = fmax(norms[1], fabs(w.c[j]));
  }
  block_reduce<2, 0>(norms, w.red);
  const double b_norm = norms[0], c_norm = norms[1];
  const double scale = 1.0 + fmax(b_norm, c_norm);
  for (int j = tid; j < n; j += kThreads) {
    if (!(w.x[j] > 1e-8 * scale)) w.x[j] = scale;
    if (!(w.s[j] > 1e-8 * scale)) w.s[j] = scale;
  }
  __syncthreads();

  for (int iteration = 0;; ++iteration) {
    matvec(a, lda, m, n, w.x, w.ax);
    matTvec(a, lda, m, n, w.y, w.aty);
    // sums: c.x, b.y, x.s; maxima: |rb|, |rc|, -min x, |y|, |x|, |s|, |Ax|, A^T y, non-finite
    double v[12] = {0.0, 0.0, 0.0, 0.0, 0.0, -INFINITY, 0.0, 0.0, 0.0, 0.0, -INFINITY, 0.0};
    for (int i = tid; i < m; i += kThreads) {
      const double rb = w.ax[i] - w.b[i];
      w.rb[i] = rb;
      v[1] += w.b[i] * w.y[i];
      v[3] = fmax(v[3], fabs(rb));
      v[6] = fmax(v[6], fabs(w.y[i]));
      v[9] = fmax(v[9], fabs(w.ax[i]));
      if (!isfinite(w.y[i])) v[11] = 1.0;
    }
    for (int j = tid; j < n; j += kThreads) {
      const double rc = w.aty[j] + w.s[j] - w.c[j];
      w.rc[j] = rc;
      v[0] += w.c[j] * w.x[j];
      v[2] += w.x[j] * w.s[j];
      v[4] = fmax(v[4], fabs(rc));
      v[5] = fmax(v[5], -w.x[j]);
      v[7] = fmax(v[7], fabs(w.x[j]));
      v[8] = fmax(v[8], fabs(w.s[j]));
      v[10] = fmax(v[10], w.aty[j]);
      if (!isfinite(w.x[j]) || !isfinite(w.s[j])) v[11] = 1.0;
    }
    block_reduce<12, 3>(v, w.red);
    const double cx = v[0], by = v[1];
    const bool primal_ok = v[3] <= tol * (1.0 + b_norm);
    const bool dual_ok = v[4] <= tol * (1.0 + c_norm);
    const bool gap_ok = fabs(cx - by) <= tol * (1.0 + fabs(cx));
    if (primal_ok && dual_ok && gap_ok && -v[5] >= -tol && v[11] == 0.0) return kConverged;
    // A certificate only counts once the iterates diverge along it (see the reference).
    const bool y_big = v[6] > kRaySize * scale, x_big = v[7] > kRaySize * scale;
    const bool farkas = y_big && by > 0 && v[10] / by <= tol && !primal_ok;
    const bool ray = x_big && cx < 0 && v[9] <= tol * fabs(cx) && !dual_ok;
    const bool blown = v[11] != 0.0 || fmax(fmax(v[7], v[8]), v[6]) > kBlowup * scale;
    if (farkas || ray || blown) return kInfeasible;
    if (iteration >= max_iters) return kMaxIters;

    const double mu = v[2] / n;
    for (int j = tid; j < n; j += kThreads) {
      w.d[j] = w.x[j] / w.s[j];
      w.rxs[j] = -w.x[j] * w.s[j];
    }
    __syncthreads();
    factor_normal(a, lda, w);
    newton(a, lda, w);  // predictor
    double ap, ad;
    max_steps(w, ap, ad);
    double aff[1] = {0.0};
    for (int j = tid; j < n; j += kThreads)
      aff[0] += (w.x[j] + ap * w.dx[j]) * (w.s[j] + ad * w.ds[j]);
    block_reduce<1, 1>(aff, w.red);
    const double ratio = fmin(aff[0] / n / mu, 1.0);
    const double sigma_mu = ratio * ratio * ratio * mu;
    for (int j = tid; j < n; j += kThreads)
      w.rxs[j] = -w.x[j] * w.s[j] - w.dx[j] * w.ds[j] + sigma_mu;
    __syncthreads();
    newton(a, lda, w);  // corrector
    max_steps(w, ap, ad);
    ap *= kStepFraction;
    ad *= kStepFraction;
    for (int j = tid; j < n; j += kThreads) {
      w.x[j] += ap * w.dx[j];
      w.s[j] += ad * w.ds[j];
    }
    for (int i = tid; i < m; i += kThreads) w.y[i] += ad * w.dy[i];
    __syncthreads();
  }
}

}  // namespace lplb_ipm
