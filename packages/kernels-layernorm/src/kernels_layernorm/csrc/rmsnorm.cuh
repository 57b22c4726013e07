// The RMSNorm family, CUDA: rmsnorm, gemma_rmsnorm, fused_add_rmsnorm, gemma_fused_add_rmsnorm
// and qk_rmsnorm, all on two kernels (see kernels/rowwise.cuh for the thread layout):
//
//   rmsnorm_registers<T, kVectorsPerThread, kFused>: 16-byte vectors; the row stays in registers
//     from its one read to the write (the minimum traffic). Rows up to kRegisterMaxVectors.
//   rmsnorm_loop<T, kN, kFused>: any row: 16-byte vectors (kN = 16 / sizeof(T)) for rows too long
//     for registers (and the fused ops' rows of at most 64 vectors), scalars (kN = 1) when the
//     hidden size, a pointer or a row stride is not a multiple of 16 bytes. The normalisation
//     pass reads the row again (from L1/L2).
//
// y = x * rsqrt(mean(x^2) + eps) * (w + weight_offset), statistics in fp32, y rounded once;
// weight_offset is 1 for the Gemma variants. The fused ops first form s = x + residual in fp32,
// round it to the dtype, store it into `residual`, and normalise that rounded s (so the fused op
// equals "residual += x; x = rmsnorm(residual)" run unfused, and y is a function of the stored
// residual alone). qk_rmsnorm is one launch over the heads of q, then the heads of k.
#pragma once

#include <kernels/rowwise.cuh>

namespace rmsnorm_detail {

// One tensor of rows to normalise (qk_rmsnorm has two: q and k).
struct Segment {
  const void* in;
  void* out;
  void* res;  // fused ops only
  const void* weight;
  rowwise::RowMap in_map, out_map, res_map;
  uint32_t inner;
};

struct Params {
  Segment seg[2];
  int64_t rows0;  // rows of seg[0]; rows from rows0 on belong to seg[1]
  int64_t rows;   // all rows
  int hidden;
  float eps;
  float weight_offset;
  int tpr, tpr_shift, rows_per_block;
};

template <typename T>
struct RowPointers {
  const T* in;
  T* out;
  T* res;
  const T* weight;
};

__device__ __forceinline__ int64_t local_row(const Params& p, int64_t row, bool& second) {
  second = row >= p.rows0;
  return second ? row - p.rows0 : row;
}

template <typename T>
__device__ __forceinline__ RowPointers<T> row_pointers(const Params& p, int64_t row) {
  bool second;
  const int64_t r = local_row(p, row, second);
  const Segment& s = p.seg[second ? 1 : 0];  // __grid_constant__: read in place, no local copy
  return {static_cast<const T*>(s.in) + rowwise::row_offset(s.in_map, r, s.inner),
          static_cast<T*>(s.out) + rowwise::row_offset(s.out_map, r, s.inner),
          static_cast<T*>(s.res) + rowwise::row_offset(s.res_map, r, s.inner),
          static_cast<const T*>(s.weight)};
}

// x = round(x + r), computed in fp32.
template <typename T, int kN>
__device__ __forceinline__ void add_round(rowwise::Pack<T, kN>& x, const rowwise::Pack<T, kN>& r) {
  float a[kN], b[kN];
  x.to_floats(a);
  r.to_floats(b);
#pragma unroll
  for (int k = 0; k < kN; ++k) a[k] += b[k];
  x.from_floats(a);
}

template <typename T, int kVectorsPerThread, bool kFused>
__global__ void __launch_bounds__(rowwise::kMaxBlock)
    rmsnorm_registers(bool pdl, const __grid_constant__ Params p) {
  constexpr int kN = 16 / sizeof(T);
  using Pack = rowwise::Pack<T, kN>;
  __shared__ float shared[32];
  const rowwise::RowThread th = rowwise::row_thread(p.tpr, p.tpr_shift, p.rows_per_block);
  const int vectors = th.row < p.rows ? p.hidden / kN : 0;
  const RowPointers<T> ptr = row_pointers<T>(p, th.row);

  if (pdl) kernels::pdl_wait();
  Pack x[kVectorsPerThread];
#pragma unroll
  for (int j = 0; j < kVectorsPerThread; ++j) {
    const int i = th.lane + j * p.tpr;
    if (i < vectors) {
      x[j].load_stream(ptr.in + i * kN);
    } else {
      x[j].zero();
    }
  }
  // The weight loads go out with the row's: issued after the fused ops' residual stores, they
  // would wait for them (the compiler cannot prove that weight and residual do not overlap),
  // which cost a whole memory round trip at decode.
  Pack w[kVectorsPerThread];
#pragma unroll
  for (int j = 0; j < kVectorsPerThread; ++j) {
    const int i = th.lane + j * p.tpr;
    if (i < vectors) w[j].load_shared(ptr.weight + i * kN);
  }
  if constexpr (kFused) {
    Pack r[kVectorsPerThread];
#pragma unroll
    for (int j = 0; j < kVectorsPerThread; ++j) {
      const int i = th.lane + j * p.tpr;
      if (i < vectors) r[j].load_stream(ptr.res + i * kN);
    }
#pragma unroll
    for (int j = 0; j < kVectorsPerThread; ++j) {
      const int i = th.lane + j * p.tpr;
      if (i < vectors) {
        add_round(x[j], r[j]);
        x[j].store(ptr.res + i * kN);
      }
    }
  }
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < kVectorsPerThread; ++j) ss = rowwise::sum_squares(x[j], ss);
  ss = rowwise::row_sum(ss, p.tpr, shared);
  if (pdl) kernels::pdl_launch_dependents();
  const float rstd = rsqrtf(ss / static_cast<float>(p.hidden) + p.eps);
#pragma unroll
  for (int j = 0; j < kVectorsPerThread; ++j) {
    const int i = th.lane + j * p.tpr;
    if (i < vectors) rowwise::scale(x[j], w[j], rstd, p.weight_offset).store(ptr.out + i * kN);
  }
}

// Rows of the fused ops up to this many vectors (512 bf16 values) take the loop kernel.
constexpr int kFusedLoopMaxVectors = 64;

template <typename T, int kN, bool kFused>
__global__ void __launch_bounds__(rowwise::kMaxBlock)
    rmsnorm_loop(bool pdl, const __grid_constant__ Params p) {
  using Pack = rowwise::Pack<T, kN>;
  __shared__ float shared[32];
  const rowwise::RowThread th = rowwise::row_thread(p.tpr, p.tpr_shift, p.rows_per_block);
  const int n = th.row < p.rows ? p.hidden / kN : 0;
  const RowPointers<T> ptr = row_pointers<T>(p, th.row);
  const int step = p.tpr;

  if (pdl) kernels::pdl_wait();
  float ss = 0.0f;
  for (int base = th.lane; base < n; base += rowwise::kLoopBatch * step) {
    Pack x[rowwise::kLoopBatch];
#pragma unroll
    for (int u = 0; u < rowwise::kLoopBatch; ++u) {
      const int i = base + u * step;
      if (i < n) {
        x[u].load(ptr.in + i * kN);  // not streaming: the second pass reads the row again
      } else {
        x[u].zero();
      }
    }
    if constexpr (kFused) {
      Pack r[rowwise::kLoopBatch];
#pragma unroll
      for (int u = 0; u < rowwise::kLoopBatch; ++u) {
        const int i = base + u * step;
        if (i < n) r[u].load(ptr.res + i * kN);
      }
#pragma unroll
      for (int u = 0; u < rowwise::kLoopBatch; ++u) {
        const int i = base + u * step;
        if (i < n) {
          add_round(x[u], r[u]);
          x[u].store(ptr.res + i * kN);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < rowwise::kLoopBatch; ++u) ss = rowwise::sum_squares(x[u], ss);
  }
  ss = rowwise::row_sum(ss, p.tpr, shared);
  if (pdl) kernels::pdl_launch_dependents();
  const float rstd = rsqrtf(ss / static_cast<float>(p.hidden) + p.eps);
  // The fused ops normalise the rounded sum this thread stored in the first pass (same indices,
  // same thread: no barrier needed).
  const T* src = kFused ? ptr.res : ptr.in;
  for (int base = th.lane; base < n; base += rowwise::kLoopBatch * step) {
    Pack x[rowwise::kLoopBatch], w[rowwise::kLoopBatch];
#pragma unroll
    for (int u = 0; u < rowwise::kLoopBatch; ++u) {
      const int i = base + u * step;
      if (i < n) {
        x[u].load(src + i * kN);
        w[u].load_shared(ptr.weight + i * kN);
      }
    }
#pragma unroll
    for (int u = 0; u < rowwise::kLoopBatch; ++u) {
      const int i = base + u * step;
      if (i < n) rowwise::scale(x[u], w[u], rstd, p.weight_offset).store(ptr.out + i * kN);
    }
  }
}

// The register kernel's instantiations by vectors per thread (1, 2, 4, 8). The fused ops have no
// one-vector kernel: their short rows take the loop kernel (see launch_typed).
template <typename T, bool kFused>
std::array<rowwise::RowKernel<Params>, 4> register_kernels() {
  if constexpr (kFused) {
    return {nullptr, rmsnorm_registers<T, 2, true>, rmsnorm_registers<T, 4, true>,
            rmsnorm_registers<T, 8, true>};
  } else {
    return {rmsnorm_registers<T, 1, false>, rmsnorm_registers<T, 2, false>,
            rmsnorm_registers<T, 4, false>, rmsnorm_registers<T, 8, false>};
  }
}

template <typename T, bool kFused>
void launch_typed(const char* op, Params& p, bool vector, int device, cudaStream_t stream,
                  int enable_pdl) {
  constexpr int kVec = 16 / sizeof(T);
  const int vectors = p.hidden / kVec;
  // The fused ops serve residual streams (hidden >= 1024 in practice): rows of at most
  // kFusedLoopMaxVectors take the loop kernel, which spares the one-vector instantiation per
  // dtype (build time) at the cost of a second, L1-resident read of a short row.
  if (vector && vectors <= rowwise::kRegisterMaxVectors &&
      (!kFused || vectors > kFusedLoopMaxVectors)) {
    return rowwise::launch_registers(op, register_kernels<T, kFused>(), vectors, p, stream,
                                     enable_pdl, device);
  }
  if (vector) {
    return rowwise::launch_loop(op, rmsnorm_loop<T, kVec, kFused>, vectors, p, stream, enable_pdl,
                                device);
  }
  rowwise::launch_loop(op, rmsnorm_loop<T, 1, kFused>, p.hidden, p, stream, enable_pdl, device);
}

template <bool kFused>
void launch(const char* op, Params& p, const tvm::ffi::TensorView& like, bool vector,
            int64_t enable_pdl) {
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(like);
  const int device = like.device().device_id;
  cudaStream_t stream = kernels::current_stream(like);
  // 4. Dispatch on dtype and launch.
  KERNELS_DISPATCH_FLOAT(like.dtype(), op, T, [&] {
    launch_typed<T, kFused>(op, p, vector, device, stream, static_cast<int>(enable_pdl));
  });
}

inline int vector_elems(const tvm::ffi::TensorView& t) { return 16 / (t.dtype().bits / 8); }

// Rows of [..., H] tensors sharing one shape; empty tensors have none.
inline rowwise::RowLayout layout_of(const char* op, const char* what,
                                    const tvm::ffi::TensorView& a, const tvm::ffi::TensorView& b) {
  if (a.numel() == 0) return rowwise::RowLayout{0, 1, {}};
  const tvm::ffi::TensorView* tensors[] = {&a, &b};
  return rowwise::row_layout(op, what, tensors, 2);
}

inline bool vectors_fit(const Segment& s, int64_t hidden, int vec) {
  return rowwise::vectors_fit(hidden, vec, {s.in, s.out, s.res, s.weight},
                              {s.in_map, s.out_map, s.res_map});
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
  rowwise::check_eps(op, eps);
  const rowwise::RowLayout rows = layout_of(op, "input", input, out);
  kernels::check_device(op, "input", input, kDLCUDA);
  kernels::check_same_device(op, "out", out, "input", input);
  kernels::check_same_device(op, "weight", weight, "input", input);
  if (rows.rows() == 0) return;

  Params p{};
  Segment& s = p.seg[0];
  s.in = rowwise::data(input);
  s.out = rowwise::data(out);
  s.res = nullptr;
  s.weight = rowwise::data(weight);
  s.in_map = rows.map[0];
  s.out_map = rows.map[1];
  s.inner = static_cast<uint32_t>(rows.inner);
  p.rows0 = p.rows = rows.rows();
  p.hidden = static_cast<int>(hidden);
  p.eps = static_cast<float>(eps);
  p.weight_offset = weight_offset;
  launch<false>(op, p, input, vectors_fit(s, hidden, vector_elems(input)), enable_pdl);
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
  rowwise::check_eps(op, eps);
  const rowwise::RowLayout rows = layout_of(op, "input", input, residual);
  kernels::check_device(op, "input", input, kDLCUDA);
  kernels::check_same_device(op, "residual", residual, "input", input);
  kernels::check_same_device(op, "weight", weight, "input", input);
  if (rows.rows() == 0) return;

  Params p{};
  Segment& s = p.seg[0];
  s.in = rowwise::data(input);
  s.out = rowwise::data(input);
  s.res = rowwise::data(residual);
  s.weight = rowwise::data(weight);
  s.in_map = s.out_map = rows.map[0];
  s.res_map = rows.map[1];
  s.inner = static_cast<uint32_t>(rows.inner);
  p.rows0 = p.rows = rows.rows();
  p.hidden = static_cast<int>(hidden);
  p.eps = static_cast<float>(eps);
  p.weight_offset = weight_offset;
  launch<true>(op, p, input, vectors_fit(s, hidden, vector_elems(input)), enable_pdl);
}

// One of q and k of qk_rmsnorm, normalised in place.
inline Segment head_segment(const char* op, const char* arg, const tvm::ffi::TensorView& t,
                            const tvm::ffi::TensorView& weight, int64_t& rows) {
  const tvm::ffi::TensorView* tensors[] = {&t};
  const rowwise::RowLayout layout =
      t.numel() ? rowwise::row_layout(op, arg, tensors, 1) : rowwise::RowLayout{0, 1, {}};
  rows = layout.rows();
  Segment s{};
  s.in = rowwise::data(t);
  s.out = rowwise::data(t);
  s.res = nullptr;
  s.weight = rowwise::data(weight);
  s.in_map = s.out_map = layout.map[0];
  s.inner = static_cast<uint32_t>(layout.inner);
  return s;
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

// input, residual: [..., H], both updated in place; weight: [H].
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
  rowwise::check_eps(kOp, eps);
  rmsnorm_detail::Params p{};
  int64_t q_rows = 0, k_rows = 0;
  p.seg[0] = rmsnorm_detail::head_segment(kOp, "q", q, q_weight, q_rows);
  p.seg[1] = rmsnorm_detail::head_segment(kOp, "k", k, k_weight, k_rows);
  kernels::check_device(kOp, "q", q, kDLCUDA);
  kernels::check_same_device(kOp, "k", k, "q", q);
  kernels::check_same_device(kOp, "q_weight", q_weight, "q", q);
  kernels::check_same_device(kOp, "k_weight", k_weight, "q", q);
  if (q_rows + k_rows == 0) return;

  p.rows0 = q_rows;
  p.rows = q_rows + k_rows;
  TVM_FFI_CHECK(p.rows < (int64_t{1} << 32), ValueError) << kOp << ": too many heads";
  p.hidden = static_cast<int>(head_dim);
  p.eps = static_cast<float>(eps);
  p.weight_offset = 0.0f;
  const int vec = rmsnorm_detail::vector_elems(q);
  const bool vector = rmsnorm_detail::vectors_fit(p.seg[0], head_dim, vec) &&
                      rmsnorm_detail::vectors_fit(p.seg[1], head_dim, vec);
  rmsnorm_detail::launch<false>(kOp, p, q, vector, enable_pdl);
}
