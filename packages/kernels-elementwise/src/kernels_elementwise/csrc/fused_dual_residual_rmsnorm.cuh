// elementwise.fused_dual_residual_rmsnorm, CUDA:
//   mid = residual + rms(x) * w1    (in fp32, rounded once to the dtype: the new residual)
//   out = rms(mid) * w2             (from the rounded mid, as a separate rmsnorm of it would)
// with rms(v) = v / sqrt(mean(v^2) + eps) and sums of squares in fp32.
//
// One op struct on the row engine of <kernels/rowwise.cuh>, with two statistics (rms of x, rms
// of mid). The register kernel holds the row from its one read of x and residual to the writes
// of mid and out (the minimum traffic); w2 is loaded with the row up to 4 vectors per thread; at
// 8 (x, residual and w1 already take 96 registers) it is loaded once mid is formed, before mid's
// stores (after them it would wait for them). At decode the engine splits a row over a
// thread-block cluster; both statistics are summed over it (mid from the full row's rms of x).
// The loop kernel re-reads x and mid.
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(8);

#include <kernels/rowwise.cuh>

#include <utility>

namespace dual_rms_detail {

struct Params {
  rowwise::RowShape shape;
  void* out;
  void* mid;
  const void* x;
  const void* residual;
  const void* w1;
  const void* w2;
  kernels::RowMap out_map, mid_map, x_map, res_map;
  uint32_t inner;
  float eps;
};

template <typename T, int kAccess>
struct DualRms : Params, rowwise::RowOp {
  static constexpr int kN = kAccess;
  static constexpr int kStats = 2;
  static constexpr int kLateFrom = 8;  // w2 (see the top)
  // fp32 rows at 8 vectors per thread (x, residual, w1, w2: 128 registers) spill; 4 do not.
  static constexpr int kMaxVectorsPerThread = sizeof(T) == 4 ? 4 : 8;
  using Pack = kernels::Pack<T, kN>;
  struct Row {
    T* out;
    T* mid;
    const T* x;
    const T* residual;
  };
  struct Regs {
    Pack r, w, v;  // residual, w1, w2
  };

  __device__ __forceinline__ Row row(int64_t r) const {
    return {static_cast<T*>(out) + rowwise::row_offset(out_map, r, inner),
            static_cast<T*>(mid) + rowwise::row_offset(mid_map, r, inner),
            static_cast<const T*>(x) + rowwise::row_offset(x_map, r, inner),
            static_cast<const T*>(residual) + rowwise::row_offset(res_map, r, inner)};
  }
  __device__ __forceinline__ const T* w1_at(int i) const { return static_cast<const T*>(w1) + i * kN; }
  __device__ __forceinline__ const T* w2_at(int i) const { return static_cast<const T*>(w2) + i * kN; }

  __device__ __forceinline__ void load_input(const Row& row, int i, Pack& a,
                                             kernels::Cache cache) const {
    a.load(row.x + i * kN, cache);
  }
  __device__ __forceinline__ void load(const Row& row, int i, Regs& g, bool late,
                                       kernels::Cache cache) const {
    g.r.load(row.residual + i * kN, cache);
    g.w.load_cached(w1_at(i));
    if (!late) g.v.load_cached(w2_at(i));
  }
  __device__ __forceinline__ void load_late(int s, const Row&, int i, Regs& g) const {
    if (s == 1) g.v.load_cached(w2_at(i));
  }
  // Pass 0: x; pass 1: x, residual, w1 (-> mid); pass 2: mid, w2.
    __device__ __forceinline__ void load_pass(int pass, const Row& row, int i, Pack& a,
                                            Regs& g) const {
    if (pass == 0) {
      a.load(row.x + i * kN);  // not streaming: the second pass reads it again
    } else if (pass == 1) {
      a.load(row.x + i * kN);
      g.r.load_stream(row.residual + i * kN);
      g.w.load_cached(w1_at(i));
    } else {
      a.load(row.mid + i * kN);
      g.v.load_cached(w2_at(i));
    }
  }
  // Before the second statistic: x becomes mid = round(r + x * rstd1 * w1), stored.
    __device__ __forceinline__ void update(int s, Pack& a, Regs& g, const float* stats) const {
    if (s != 1) return;
    float f[kN], b[kN], c[kN];
    a.unpack(f);
    g.r.unpack(b);
    g.w.unpack(c);
#pragma unroll
    for (int k = 0; k < kN; ++k) f[k] = b[k] + f[k] * stats[0] * c[k];
    a.pack(f);
  }
  __device__ __forceinline__ void store(int s, const Row& row, int i, const Pack& a) const {
    if (s == 1) a.store(row.mid + i * kN);
  }
  __device__ __forceinline__ float accumulate(int, const Pack& a, const float*, float acc,
                                              bool) const {
    float f[kN];
    a.unpack(f);
#pragma unroll
    for (int k = 0; k < kN; ++k) acc = fmaf(f[k], f[k], acc);
    return acc;
  }
  __device__ __forceinline__ float finish(int, float sum) const {
    return rsqrtf(sum * shape.inv_hidden + eps);
  }
    __device__ __forceinline__ Pack output(const Pack& a, const Regs& g, const float* stats) const {
    float f[kN], c[kN];
    a.unpack(f);
    g.v.unpack(c);
#pragma unroll
    for (int k = 0; k < kN; ++k) f[k] = f[k] * stats[1] * c[k];
    Pack y;
    y.pack(f);
    return y;
  }
};

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
  kernels::check_eps(kOp, eps);
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
  TVM_FFI_CHECK(kernels::data(out) != kernels::data(mid) || tokens * hidden == 0,
                ValueError)
      << kOp << ": out and mid must be different buffers";
  if (tokens == 0 || hidden == 0) return;
  const kernels::RowLayout rows = kernels::row_layout(kOp, "x", {&out, &mid, &x, &residual});

  detail::Params p{};
  p.shape.rows = rows.rows();
  p.shape.hidden = static_cast<int>(hidden);
  p.out = kernels::data(out);
  p.mid = kernels::data(mid);
  p.x = kernels::data(x);
  p.residual = kernels::data(residual);
  p.w1 = kernels::data(w1);
  p.w2 = kernels::data(w2);
  p.out_map = rows.map[0];
  p.mid_map = rows.map[1];
  p.x_map = rows.map[2];
  p.res_map = rows.map[3];
  p.inner = static_cast<uint32_t>(rows.inner);
  p.eps = static_cast<float>(eps);
  const int vec = 16 / (x.dtype().bits / 8);
  const bool vector = kernels::vectors_fit(hidden, vec, {p.x, p.residual, p.w1, p.w2, p.out, p.mid},
                                           {rows.map[0], rows.map[1], rows.map[2], rows.map[3]});
  // 2. Device guard, 3. the caller's stream: PDL where the grid is small (kernels::pdl_for_grid).
  kernels::DeviceGuard guard(x);
  const kernels::Launch ctx(kOp, x);
  // 4. Dispatch on dtype and launch (checked).
  KERNELS_DISPATCH_FLOAT(x.dtype(), kOp, T,
                         [&] { rowwise::launch_rows<detail::DualRms, T>(ctx, p, vector); });
}
