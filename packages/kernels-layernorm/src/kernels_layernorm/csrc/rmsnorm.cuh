// The RMSNorm family, CUDA: rmsnorm, gemma_rmsnorm, fused_add_rmsnorm, gemma_fused_add_rmsnorm
// and qk_rmsnorm: one op struct on the row engine of <kernels/rowwise.cuh> (a register-resident
// kernel, split over a thread-block cluster per row at decode; a looping one for rows too long for
// registers or not in whole 16-byte vectors).
//
// y = x * rsqrt(mean(x^2) + eps) * (w + weight_offset), statistics in fp32, y rounded once;
// weight_offset is 1 for the Gemma variants. The fused ops first form s = x + residual in fp32,
// round it to the dtype, store it into `residual`, and normalise that rounded s (so the fused op
// equals "residual += x; x = rmsnorm(residual)" run unfused, and y is a function of the stored
// residual alone). qk_rmsnorm is one launch over the heads of q, then the heads of k.
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(8);

#include <kernels/rowwise.cuh>

namespace rmsnorm_detail {

// One tensor of rows to normalise (qk_rmsnorm has two: q and k).
struct Segment {
  const void* in;
  void* out;
  void* res;  // fused ops only
  const void* weight;
  kernels::RowMap in_map, out_map, res_map;
  uint32_t inner;
};

struct Params {
  rowwise::RowShape shape;
  Segment seg[2];
  int64_t rows0;  // rows of seg[0]; rows from rows0 on belong to seg[1]
  float eps;
  float weight_offset;
};

// Rows of the fused ops up to this many vectors (512 bf16 values) take the loop kernel, which
// spares the one-vector instantiation per dtype (build time) at the cost of a second, L1-resident
// read of a short row; the fused ops serve residual streams (hidden >= 1024 in practice).
constexpr int kFusedLoopMaxVectors = 64;

template <typename T, int kAccess, bool kFused>
struct RmsNorm : Params, rowwise::RowOp {
  static constexpr int kN = kAccess;
  static constexpr int kStats = 1;
  static constexpr int kRegisterMinVectors = kFused ? kFusedLoopMaxVectors + 1 : 1;
  using Pack = kernels::Pack<T, kN>;
  struct Row {
    const T* in;
    T* out;
    T* res;
    const T* weight;
  };
  struct Regs {
    Pack w, r;
  };

  __device__ __forceinline__ Row row(int64_t r) const {
    const bool second = r >= rows0;
    if (second) r -= rows0;
    const Segment& s = seg[second ? 1 : 0];  // __grid_constant__: read in place, no local copy
    return {static_cast<const T*>(s.in) + rowwise::row_offset(s.in_map, r, s.inner),
            static_cast<T*>(s.out) + rowwise::row_offset(s.out_map, r, s.inner),
            static_cast<T*>(s.res) + rowwise::row_offset(s.res_map, r, s.inner),
            static_cast<const T*>(s.weight)};
  }

  __device__ __forceinline__ void load_input(const Row& row, int i, Pack& x,
                                             kernels::Cache cache) const {
    x.load(row.in + i * kN, cache);
  }
  __device__ __forceinline__ void load(const Row& row, int i, Regs& g, bool,
                                       kernels::Cache cache) const {
    g.w.load_cached(row.weight + i * kN);
    if constexpr (kFused) g.r.load(row.res + i * kN, cache);
  }
  // Pass 0: the row (and residual); pass 1: what to normalise (the stored sum) and the weight.
  // Not streaming: the second pass reads the row again.
  __device__ __forceinline__ void load_pass(int pass, const Row& row, int i, Pack& x,
                                            Regs& g) const {
    if (pass == 0) {
      x.load(row.in + i * kN);
      if constexpr (kFused) g.r.load(row.res + i * kN);
    } else {
      x.load((kFused ? row.res : row.in) + i * kN);
      g.w.load_cached(row.weight + i * kN);
    }
  }
  // Pre-reduce (fused ops): x = round(x + residual), stored into residual.
  __device__ __forceinline__ void update(int, Pack& x, Regs& g, const float*) const {
    if constexpr (kFused) {
      float a[kN], b[kN];
      x.unpack(a);
      g.r.unpack(b);
#pragma unroll
      for (int k = 0; k < kN; ++k) a[k] += b[k];
      x.pack(a);
    }
  }
  __device__ __forceinline__ void store(int, const Row& row, int i, const Pack& x) const {
    if constexpr (kFused) x.store(row.res + i * kN);
  }
  // Statistic: the sum of squares (lanes past the row hold zeros) -> rstd.
  __device__ __forceinline__ float accumulate(int, const Pack& x, const float*, float acc,
                                              bool) const {
    float f[kN];
    x.unpack(f);
#pragma unroll
    for (int k = 0; k < kN; ++k) acc = fmaf(f[k], f[k], acc);
    return acc;
  }
  __device__ __forceinline__ float finish(int, float sum) const {
    return rsqrtf(sum * shape.inv_hidden + eps);
  }
  // y = x * rstd * (w + offset), rounded once.
  __device__ __forceinline__ Pack output(const Pack& x, const Regs& g, const float* stats) const {
    float a[kN], b[kN];
    x.unpack(a);
    g.w.unpack(b);
#pragma unroll
    for (int k = 0; k < kN; ++k) a[k] = a[k] * stats[0] * (b[k] + weight_offset);
    Pack y;
    y.pack(a);
    return y;
  }
};

template <typename T, int kN>
using Plain = RmsNorm<T, kN, false>;
template <typename T, int kN>
using Fused = RmsNorm<T, kN, true>;

inline int vector_elems(const tvm::ffi::TensorView& t) { return 16 / (t.dtype().bits / 8); }

inline bool vectors_fit(const Segment& s, int64_t hidden, int vec) {
  return kernels::vectors_fit(hidden, vec, {s.in, s.out, s.res, s.weight},
                              {s.in_map, s.out_map, s.res_map});
}

// 2. Device guard, 3. the caller's stream, 4. dispatch on dtype and launch (checked).
template <bool kFused>
void launch(const char* op, const Params& p, const tvm::ffi::TensorView& like, bool vector,
            int64_t enable_pdl) {
  kernels::DeviceGuard guard(like);
  const kernels::Launch ctx(op, like, enable_pdl);
  KERNELS_DISPATCH_FLOAT(like.dtype(), op, T, [&] {
    if constexpr (kFused) {
      rowwise::launch_rows<Fused, T>(ctx, p, vector);
    } else {
      rowwise::launch_rows<Plain, T>(ctx, p, vector);
    }
  });
}

inline Params params(const kernels::RowLayout& rows, int64_t hidden, double eps,
                     float weight_offset) {
  Params p{};
  p.shape.rows = p.rows0 = rows.rows();
  p.shape.hidden = static_cast<int>(hidden);
  p.eps = static_cast<float>(eps);
  p.weight_offset = weight_offset;
  return p;
}

inline void rmsnorm_entry(const char* op, tvm::ffi::TensorView out, tvm::ffi::TensorView input,
                          tvm::ffi::TensorView weight, double eps, int64_t enable_pdl,
                          float weight_offset) {
  // 1. Validate.
  rowwise::check_rows(op, "input", input);
  rowwise::check_rows(op, "out", out);
  kernels::check_same_shape(op, "out", out, "input", input);
  kernels::check_same_dtype(op, "out", out, "input", input);
  const int64_t hidden = input.size(-1);
  rowwise::check_vector_arg(op, "weight", weight, hidden, "input", input);
  kernels::check_eps(op, eps);
  const kernels::RowLayout rows = kernels::row_layout(op, "input", {&input, &out});
  kernels::check_device(op, "input", input, kDLCUDA);
  kernels::check_same_device(op, "out", out, "input", input);
  kernels::check_same_device(op, "weight", weight, "input", input);
  if (rows.rows() == 0) return;

  Params p = params(rows, hidden, eps, weight_offset);
  p.seg[0] = {kernels::data(input), kernels::data(out), nullptr, kernels::data(weight),
              rows.map[0], rows.map[1], {}, static_cast<uint32_t>(rows.inner)};
  launch<false>(op, p, input, vectors_fit(p.seg[0], hidden, vector_elems(input)), enable_pdl);
}

inline void fused_add_rmsnorm_entry(const char* op, tvm::ffi::TensorView input,
                                    tvm::ffi::TensorView residual, tvm::ffi::TensorView weight,
                                    double eps, int64_t enable_pdl, float weight_offset) {
  // 1. Validate.
  rowwise::check_rows(op, "input", input);
  rowwise::check_rows(op, "residual", residual);
  kernels::check_same_shape(op, "residual", residual, "input", input);
  kernels::check_same_dtype(op, "residual", residual, "input", input);
  const int64_t hidden = input.size(-1);
  rowwise::check_vector_arg(op, "weight", weight, hidden, "input", input);
  kernels::check_eps(op, eps);
  kernels::check_no_overlap(op, "input", input, "residual", residual);
  const kernels::RowLayout rows = kernels::row_layout(op, "input", {&input, &residual});
  kernels::check_device(op, "input", input, kDLCUDA);
  kernels::check_same_device(op, "residual", residual, "input", input);
  kernels::check_same_device(op, "weight", weight, "input", input);
  if (rows.rows() == 0) return;

  Params p = params(rows, hidden, eps, weight_offset);
  p.seg[0] = {kernels::data(input), kernels::data(input), kernels::data(residual),
              kernels::data(weight), rows.map[0], rows.map[0], rows.map[1],
              static_cast<uint32_t>(rows.inner)};
  launch<true>(op, p, input, vectors_fit(p.seg[0], hidden, vector_elems(input)), enable_pdl);
}

// One of q and k of qk_rmsnorm, normalised in place.
inline Segment head_segment(const char* op, const char* arg, const tvm::ffi::TensorView& t,
                            const tvm::ffi::TensorView& weight, int64_t& rows) {
  const kernels::RowLayout layout = kernels::row_layout(op, arg, {&t});
  rows = layout.rows();
  return {kernels::data(t), kernels::data(t), nullptr, kernels::data(weight), layout.map[0],
          layout.map[0], {}, static_cast<uint32_t>(layout.inner)};
}

}  // namespace rmsnorm_detail

// out, input: [..., H] (leading dims mergeable into (tokens, heads), last dim contiguous, same
// dtype); weight: [H]. out may be input.
inline void rmsnorm(tvm::ffi::TensorView out, tvm::ffi::TensorView input,
                    tvm::ffi::TensorView weight, double eps, int64_t enable_pdl) {
  rmsnorm_detail::rmsnorm_entry("layernorm.rmsnorm", out, input, weight, eps, enable_pdl, 0.0f);
}

inline void gemma_rmsnorm(tvm::ffi::TensorView out, tvm::ffi::TensorView input,
                          tvm::ffi::TensorView weight, double eps, int64_t enable_pdl) {
  rmsnorm_detail::rmsnorm_entry("layernorm.gemma_rmsnorm", out, input, weight, eps, enable_pdl,
                                1.0f);
}

// input, residual: [..., H], both updated in place, not overlapping; weight: [H].
inline void fused_add_rmsnorm(tvm::ffi::TensorView input, tvm::ffi::TensorView residual,
                              tvm::ffi::TensorView weight, double eps, int64_t enable_pdl) {
  rmsnorm_detail::fused_add_rmsnorm_entry("layernorm.fused_add_rmsnorm", input, residual, weight,
                                          eps, enable_pdl, 0.0f);
}

inline void gemma_fused_add_rmsnorm(tvm::ffi::TensorView input, tvm::ffi::TensorView residual,
                                    tvm::ffi::TensorView weight, double eps, int64_t enable_pdl) {
  rmsnorm_detail::fused_add_rmsnorm_entry("layernorm.gemma_fused_add_rmsnorm", input, residual,
                                          weight, eps, enable_pdl, 1.0f);
}

// q: [T, Hq, D], k: [T, Hk, D] (any strides with a contiguous last dim: head-strided views of a
// fused qkv buffer are fine), normalised per head in place; q_weight, k_weight: [D].
inline void qk_rmsnorm(tvm::ffi::TensorView q, tvm::ffi::TensorView k,
                       tvm::ffi::TensorView q_weight, tvm::ffi::TensorView k_weight, double eps,
                       int64_t enable_pdl) {
  namespace detail = rmsnorm_detail;
  constexpr const char* kOp = "layernorm.qk_rmsnorm";
  // 1. Validate.
  rowwise::check_rows(kOp, "q", q);
  rowwise::check_rows(kOp, "k", k);
  kernels::check_same_dtype(kOp, "k", k, "q", q);
  TVM_FFI_CHECK(q.ndim() == 3 && k.ndim() == 3, ValueError)
      << kOp << ": q and k must be [T, heads, head_dim], got " << kernels::shape_string(q)
      << " and " << kernels::shape_string(k);
  const int64_t head_dim = q.size(-1);
  TVM_FFI_CHECK(k.size(0) == q.size(0) && k.size(-1) == head_dim, ValueError)
      << kOp << ": q " << kernels::shape_string(q) << " and k " << kernels::shape_string(k)
      << " must have the same tokens and head_dim";
  rowwise::check_vector_arg(kOp, "q_weight", q_weight, head_dim, "q", q);
  rowwise::check_vector_arg(kOp, "k_weight", k_weight, head_dim, "q", q);
  kernels::check_eps(kOp, eps);
  int64_t q_rows = 0, k_rows = 0;
  const detail::Segment qs = detail::head_segment(kOp, "q", q, q_weight, q_rows);
  const detail::Segment ks = detail::head_segment(kOp, "k", k, k_weight, k_rows);
  kernels::check_device(kOp, "q", q, kDLCUDA);
  kernels::check_same_device(kOp, "k", k, "q", q);
  kernels::check_same_device(kOp, "q_weight", q_weight, "q", q);
  kernels::check_same_device(kOp, "k_weight", k_weight, "q", q);
  if (q_rows + k_rows == 0) return;

  detail::Params p{};
  p.seg[0] = qs;
  p.seg[1] = ks;
  p.rows0 = q_rows;
  p.shape.rows = q_rows + k_rows;
  TVM_FFI_CHECK(p.shape.rows < (int64_t{1} << 32), ValueError) << kOp << ": too many heads";
  p.shape.hidden = static_cast<int>(head_dim);
  p.eps = static_cast<float>(eps);
  p.weight_offset = 0.0f;
  const int vec = detail::vector_elems(q);
  const bool vector =
      detail::vectors_fit(qs, head_dim, vec) && detail::vectors_fit(ks, head_dim, vec);
  detail::launch<false>(kOp, p, q, vector, enable_pdl);
}
