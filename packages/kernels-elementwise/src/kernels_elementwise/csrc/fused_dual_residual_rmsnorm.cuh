// elementwise.fused_dual_residual_rmsnorm, CUDA:
//   mid = residual + rms(x) * w1    (in fp32, rounded once to the dtype: the new residual)
//   out = rms(mid) * w2             (from the rounded mid, as a separate rmsnorm of it would)
// with rms(v) = v / sqrt(mean(v^2) + eps) and sums of squares in fp32.
//
// On the row-wise plan of the norms (kernels/rowwise.cuh: threads per row, vectors per thread,
// PDL for small grids), with two kernels:
//   dual_registers<T, kVectorsPerThread>: 16-byte vectors, the row in registers from its one read
//     of x and residual to the writes of mid and out (the minimum traffic). w2 is loaded with the
//     row up to 4 vectors per thread; at 8 (x, residual and w1 already take 96 registers) it is
//     loaded once mid is formed, before mid's stores (after them it would wait for them).
//   dual_loop<T, kN>: any row (vectors for rows too long for registers, scalars when H, a pointer
//     or a row stride is not in whole 16-byte vectors): three passes, re-reading x and mid.
#pragma once

#include <kernels/rowwise.cuh>

#include <cmath>
#include <utility>

namespace dual_rms_detail {

struct Params {
  void* out;
  void* mid;
  const void* x;
  const void* residual;
  const void* w1;
  const void* w2;
  rowwise::RowMap out_map, mid_map, x_map, res_map;
  uint32_t inner;
  int64_t rows;
  int hidden;
  float eps;
  int tpr, tpr_shift, rows_per_block;
};

template <typename T>
struct RowPointers {
  T* out;
  T* mid;
  const T* x;
  const T* residual;
};

template <typename T>
__device__ __forceinline__ RowPointers<T> row_pointers(const Params& p, int64_t row) {
  return {static_cast<T*>(p.out) + rowwise::row_offset(p.out_map, row, p.inner),
          static_cast<T*>(p.mid) + rowwise::row_offset(p.mid_map, row, p.inner),
          static_cast<const T*>(p.x) + rowwise::row_offset(p.x_map, row, p.inner),
          static_cast<const T*>(p.residual) + rowwise::row_offset(p.res_map, row, p.inner)};
}

// mid = round(r + x * rstd * w), in fp32.
template <typename T, int kN>
__device__ __forceinline__ rowwise::Pack<T, kN> residual_add(const rowwise::Pack<T, kN>& x,
                                                             const rowwise::Pack<T, kN>& r,
                                                             const rowwise::Pack<T, kN>& w,
                                                             float rstd) {
  float a[kN], b[kN], c[kN];
  x.to_floats(a);
  r.to_floats(b);
  w.to_floats(c);
#pragma unroll
  for (int k = 0; k < kN; ++k) a[k] = b[k] + a[k] * rstd * c[k];
  rowwise::Pack<T, kN> m;
  m.from_floats(a);
  return m;
}

template <typename T, int kVectorsPerThread>
__global__ void __launch_bounds__(rowwise::kMaxBlock)
    dual_registers(bool pdl, const __grid_constant__ Params p) {
  constexpr int kN = 16 / sizeof(T);
  constexpr bool kEarlyW2 = kVectorsPerThread <= 4;
  using Pack = rowwise::Pack<T, kN>;
  __shared__ float shared_x[32], shared_mid[32];
  const rowwise::RowThread th = rowwise::row_thread(p.tpr, p.tpr_shift, p.rows_per_block);
  const int vectors = th.row < p.rows ? p.hidden / kN : 0;
  const RowPointers<T> ptr = row_pointers<T>(p, th.row);
  const T* w1 = static_cast<const T*>(p.w1);
  const T* w2 = static_cast<const T*>(p.w2);
  const float inv_hidden = 1.0f / static_cast<float>(p.hidden);

  if (pdl) kernels::pdl_wait();
  Pack x[kVectorsPerThread], r[kVectorsPerThread], w[kVectorsPerThread], v[kVectorsPerThread];
#pragma unroll
  for (int j = 0; j < kVectorsPerThread; ++j) {
    const int i = th.lane + j * p.tpr;
    if (i < vectors) {
      x[j].load_stream(ptr.x + i * kN);
    } else {
      x[j].zero();
    }
  }
#pragma unroll
  for (int j = 0; j < kVectorsPerThread; ++j) {
    const int i = th.lane + j * p.tpr;
    if (i < vectors) {
      r[j].load_stream(ptr.residual + i * kN);
      w[j].load_shared(w1 + i * kN);
      if constexpr (kEarlyW2) v[j].load_shared(w2 + i * kN);
    }
  }
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < kVectorsPerThread; ++j) ss = rowwise::sum_squares(x[j], ss);
  const float rstd1 = rsqrtf(rowwise::row_sum(ss, p.tpr, shared_x) * inv_hidden + p.eps);
  // mid replaces x in registers; lanes past the row keep zeros.
#pragma unroll
  for (int j = 0; j < kVectorsPerThread; ++j) {
    if (th.lane + j * p.tpr < vectors) x[j] = residual_add(x[j], r[j], w[j], rstd1);
  }
  if constexpr (!kEarlyW2) {
#pragma unroll
    for (int j = 0; j < kVectorsPerThread; ++j) {
      const int i = th.lane + j * p.tpr;
      if (i < vectors) v[j].load_shared(w2 + i * kN);
    }
  }
  float ss2 = 0.0f;
#pragma unroll
  for (int j = 0; j < kVectorsPerThread; ++j) {
    const int i = th.lane + j * p.tpr;
    if (i < vectors) x[j].store(ptr.mid + i * kN);
    ss2 = rowwise::sum_squares(x[j], ss2);
  }
  const float rstd2 = rsqrtf(rowwise::row_sum(ss2, p.tpr, shared_mid) * inv_hidden + p.eps);
  if (pdl) kernels::pdl_launch_dependents();
#pragma unroll
  for (int j = 0; j < kVectorsPerThread; ++j) {
    const int i = th.lane + j * p.tpr;
    if (i < vectors) rowwise::scale(x[j], v[j], rstd2, 0.0f).store(ptr.out + i * kN);
  }
}

// Any row. Each thread re-reads only what it read or wrote itself (same indices), so out may be x
// and mid may be residual without a barrier.
template <typename T, int kN>
__global__ void __launch_bounds__(rowwise::kMaxBlock)
    dual_loop(bool pdl, const __grid_constant__ Params p) {
  constexpr int kBatch = rowwise::kLoopBatch;
  using Pack = rowwise::Pack<T, kN>;
  __shared__ float shared_x[32], shared_mid[32];
  const rowwise::RowThread th = rowwise::row_thread(p.tpr, p.tpr_shift, p.rows_per_block);
  const int n = th.row < p.rows ? p.hidden / kN : 0;
  const RowPointers<T> ptr = row_pointers<T>(p, th.row);
  const T* w1 = static_cast<const T*>(p.w1);
  const T* w2 = static_cast<const T*>(p.w2);
  const float inv_hidden = 1.0f / static_cast<float>(p.hidden);
  const int step = p.tpr;

  if (pdl) kernels::pdl_wait();
  float ss = 0.0f;
  for (int base = th.lane; base < n; base += kBatch * step) {
    Pack x[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = base + u * step;
      if (i < n) {
        x[u].load(ptr.x + i * kN);  // not streaming: the second pass reads it again
      } else {
        x[u].zero();
      }
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) ss = rowwise::sum_squares(x[u], ss);
  }
  const float rstd1 = rsqrtf(rowwise::row_sum(ss, p.tpr, shared_x) * inv_hidden + p.eps);
  float ss2 = 0.0f;
  for (int base = th.lane; base < n; base += kBatch * step) {
    Pack x[kBatch], r[kBatch], w[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = base + u * step;
      if (i < n) {
        x[u].load(ptr.x + i * kN);
        r[u].load_stream(ptr.residual + i * kN);
        w[u].load_shared(w1 + i * kN);
      }
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = base + u * step;
      if (i < n) {
        const Pack m = residual_add(x[u], r[u], w[u], rstd1);
        m.store(ptr.mid + i * kN);
        ss2 = rowwise::sum_squares(m, ss2);
      }
    }
  }
  const float rstd2 = rsqrtf(rowwise::row_sum(ss2, p.tpr, shared_mid) * inv_hidden + p.eps);
  if (pdl) kernels::pdl_launch_dependents();
  for (int base = th.lane; base < n; base += kBatch * step) {
    Pack m[kBatch], w[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = base + u * step;
      if (i < n) {
        m[u].load(ptr.mid + i * kN);
        w[u].load_shared(w2 + i * kN);
      }
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = base + u * step;
      if (i < n) rowwise::scale(m[u], w[u], rstd2, 0.0f).store(ptr.out + i * kN);
    }
  }
}

template <typename T>
void launch_typed(const char* op, Params& p, bool vector, int device, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  constexpr int kAuto = -1;  // PDL where the grid is small (kernels::pdl_for_grid)
  const int vectors = p.hidden / kVec;
  if (vector && vectors <= rowwise::kRegisterMaxVectors) {
    return rowwise::launch_registers(op,
                                     {dual_registers<T, 1>, dual_registers<T, 2>,
                                      dual_registers<T, 4>, dual_registers<T, 8>},
                                     vectors, p, stream, kAuto, device);
  }
  if (vector) {
    return rowwise::launch_loop(op, dual_loop<T, kVec>, vectors, p, stream, kAuto, device);
  }
  rowwise::launch_loop(op, dual_loop<T, 1>, p.hidden, p, stream, kAuto, device);
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
  TVM_FFI_CHECK(tokens < (int64_t{1} << 31) && hidden < (int64_t{1} << 30), ValueError)
      << kOp << ": x " << kernels::shape_string(x) << " is too large (at most 2^31 - 1 rows of "
      << "at most 2^30 elements)";
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
  TVM_FFI_CHECK(rowwise::data(out) != rowwise::data(mid) || tokens * hidden == 0,
                ValueError)
      << kOp << ": out and mid must be different buffers";
  if (tokens == 0 || hidden == 0) return;
  const tvm::ffi::TensorView* tensors[] = {&out, &mid, &x, &residual};
  const rowwise::RowLayout rows = rowwise::row_layout(kOp, "x", tensors, 4);

  detail::Params p{};
  p.out = rowwise::data(out);
  p.mid = rowwise::data(mid);
  p.x = rowwise::data(x);
  p.residual = rowwise::data(residual);
  p.w1 = rowwise::data(w1);
  p.w2 = rowwise::data(w2);
  p.out_map = rows.map[0];
  p.mid_map = rows.map[1];
  p.x_map = rows.map[2];
  p.res_map = rows.map[3];
  p.inner = static_cast<uint32_t>(rows.inner);
  p.rows = rows.rows();
  p.hidden = static_cast<int>(hidden);
  p.eps = static_cast<float>(eps);
  const int vec = 16 / (x.dtype().bits / 8);
  const bool vector = rowwise::vectors_fit(hidden, vec, {p.x, p.residual, p.w1, p.w2, p.out, p.mid},
                                           {rows.map[0], rows.map[1], rows.map[2], rows.map[3]});

  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(x);
  const int device = x.device().device_id;
  cudaStream_t stream = kernels::current_stream(x);
  // 4. Dispatch on dtype and launch.
  KERNELS_DISPATCH_FLOAT(x.dtype(), kOp, T,
                         [&] { detail::launch_typed<T>(kOp, p, vector, device, stream); });
}
