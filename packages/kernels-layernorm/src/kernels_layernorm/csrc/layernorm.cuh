// layernorm, CUDA: y = (x - mean) * rsqrt(var + eps) * w (+ b), mean and the biased variance in
// fp32 over the last dim, y rounded once. Two kernels, as for the RMSNorm family
// (kernels/rowwise.cuh has the thread layout):
//
//   layernorm_registers<T, kVectorsPerThread>: 16-byte vectors, the row in registers; the variance
//     is the exact two-pass sum of (x - mean)^2 over those registers (no E[x^2] - mean^2
//     cancellation).
//   layernorm_loop<T, kN>: any row (vectors for long rows, scalars for unaligned ones): three
//     passes over the row (mean, variance, output), the last two served from L2.
#pragma once

#include <tvm/ffi/optional.h>

#include <kernels/rowwise.cuh>

namespace layernorm_detail {

struct Params {
  const void* in;
  void* out;
  const void* weight;
  const void* bias;  // null: no bias
  rowwise::RowMap in_map, out_map;
  uint32_t inner;
  int64_t rows;
  int hidden;
  float eps;
  int tpr, tpr_shift, rows_per_block;
};

template <typename T, int kN>
__device__ __forceinline__ float sum(const rowwise::Pack<T, kN>& x, float acc) {
  float f[kN];
  x.to_floats(f);
#pragma unroll
  for (int k = 0; k < kN; ++k) acc += f[k];
  return acc;
}

template <typename T, int kN>
__device__ __forceinline__ float centered_squares(const rowwise::Pack<T, kN>& x, float mean,
                                                  float acc) {
  float f[kN];
  x.to_floats(f);
#pragma unroll
  for (int k = 0; k < kN; ++k) {
    const float d = f[k] - mean;
    acc = fmaf(d, d, acc);
  }
  return acc;
}

// y = (x - mean) * rstd * w (+ b), rounded once.
template <typename T, int kN>
__device__ __forceinline__ rowwise::Pack<T, kN> normalize(const rowwise::Pack<T, kN>& x,
                                                          const rowwise::Pack<T, kN>& w,
                                                          const rowwise::Pack<T, kN>& b,
                                                          bool has_bias, float mean, float rstd) {
  float a[kN], c[kN];
  x.to_floats(a);
  w.to_floats(c);
#pragma unroll
  for (int k = 0; k < kN; ++k) a[k] = (a[k] - mean) * rstd * c[k];
  if (has_bias) {
    b.to_floats(c);
#pragma unroll
    for (int k = 0; k < kN; ++k) a[k] += c[k];
  }
  rowwise::Pack<T, kN> y;
  y.from_floats(a);
  return y;
}

template <typename T, int kVectorsPerThread>
__global__ void __launch_bounds__(rowwise::kMaxBlock)
    layernorm_registers(bool pdl, const __grid_constant__ Params p) {
  constexpr int kN = 16 / sizeof(T);
  using Pack = rowwise::Pack<T, kN>;
  __shared__ float shared_mean[32], shared_var[32];
  const rowwise::RowThread th = rowwise::row_thread(p.tpr, p.tpr_shift, p.rows_per_block);
  const int vectors = th.row < p.rows ? p.hidden / kN : 0;
  const T* in = static_cast<const T*>(p.in) + rowwise::row_offset(p.in_map, th.row, p.inner);
  T* out = static_cast<T*>(p.out) + rowwise::row_offset(p.out_map, th.row, p.inner);
  const T* weight = static_cast<const T*>(p.weight);
  const T* bias = static_cast<const T*>(p.bias);
  const bool has_bias = bias != nullptr;

  if (pdl) kernels::pdl_wait();
  Pack x[kVectorsPerThread], w[kVectorsPerThread], b[kVectorsPerThread];
#pragma unroll
  for (int j = 0; j < kVectorsPerThread; ++j) {
    const int i = th.lane + j * p.tpr;
    if (i < vectors) {
      x[j].load_stream(in + i * kN);
    } else {
      x[j].zero();
    }
  }
#pragma unroll
  for (int j = 0; j < kVectorsPerThread; ++j) {
    const int i = th.lane + j * p.tpr;
    if (i < vectors) {
      w[j].load_shared(weight + i * kN);
      if (has_bias) b[j].load_shared(bias + i * kN);
    }
  }
  const float inv_hidden = 1.0f / static_cast<float>(p.hidden);
  float acc = 0.0f;
#pragma unroll
  for (int j = 0; j < kVectorsPerThread; ++j) acc = sum(x[j], acc);
  const float mean = rowwise::row_sum(acc, p.tpr, shared_mean) * inv_hidden;
  acc = 0.0f;
#pragma unroll
  for (int j = 0; j < kVectorsPerThread; ++j) {
    if (th.lane + j * p.tpr < vectors) acc = centered_squares(x[j], mean, acc);
  }
  const float var = rowwise::row_sum(acc, p.tpr, shared_var) * inv_hidden;
  if (pdl) kernels::pdl_launch_dependents();
  const float rstd = rsqrtf(var + p.eps);
#pragma unroll
  for (int j = 0; j < kVectorsPerThread; ++j) {
    const int i = th.lane + j * p.tpr;
    if (i < vectors) normalize(x[j], w[j], b[j], has_bias, mean, rstd).store(out + i * kN);
  }
}

template <typename T, int kN>
__global__ void __launch_bounds__(rowwise::kMaxBlock)
    layernorm_loop(bool pdl, const __grid_constant__ Params p) {
  using Pack = rowwise::Pack<T, kN>;
  __shared__ float shared_mean[32], shared_var[32];
  const rowwise::RowThread th = rowwise::row_thread(p.tpr, p.tpr_shift, p.rows_per_block);
  const int n = th.row < p.rows ? p.hidden / kN : 0;
  const T* in = static_cast<const T*>(p.in) + rowwise::row_offset(p.in_map, th.row, p.inner);
  T* out = static_cast<T*>(p.out) + rowwise::row_offset(p.out_map, th.row, p.inner);
  const T* weight = static_cast<const T*>(p.weight);
  const T* bias = static_cast<const T*>(p.bias);
  const bool has_bias = bias != nullptr;
  const int step = p.tpr;
  const float inv_hidden = 1.0f / static_cast<float>(p.hidden);

  if (pdl) kernels::pdl_wait();
  float acc = 0.0f;
  for (int base = th.lane; base < n; base += rowwise::kLoopBatch * step) {
    Pack x[rowwise::kLoopBatch];
#pragma unroll
    for (int u = 0; u < rowwise::kLoopBatch; ++u) {
      const int i = base + u * step;
      if (i < n) {
        x[u].load(in + i * kN);
      } else {
        x[u].zero();
      }
    }
#pragma unroll
    for (int u = 0; u < rowwise::kLoopBatch; ++u) acc = sum(x[u], acc);
  }
  const float mean = rowwise::row_sum(acc, p.tpr, shared_mean) * inv_hidden;
  acc = 0.0f;
  for (int base = th.lane; base < n; base += rowwise::kLoopBatch * step) {
    Pack x[rowwise::kLoopBatch];
#pragma unroll
    for (int u = 0; u < rowwise::kLoopBatch; ++u) {
      const int i = base + u * step;
      if (i < n) x[u].load(in + i * kN);
    }
#pragma unroll
    for (int u = 0; u < rowwise::kLoopBatch; ++u) {
      if (base + u * step < n) acc = centered_squares(x[u], mean, acc);
    }
  }
  const float var = rowwise::row_sum(acc, p.tpr, shared_var) * inv_hidden;
  if (pdl) kernels::pdl_launch_dependents();
  const float rstd = rsqrtf(var + p.eps);
  for (int base = th.lane; base < n; base += rowwise::kLoopBatch * step) {
    Pack x[rowwise::kLoopBatch], w[rowwise::kLoopBatch], b[rowwise::kLoopBatch];
#pragma unroll
    for (int u = 0; u < rowwise::kLoopBatch; ++u) {
      const int i = base + u * step;
      if (i < n) {
        x[u].load(in + i * kN);
        w[u].load_shared(weight + i * kN);
        if (has_bias) b[u].load_shared(bias + i * kN);
      }
    }
#pragma unroll
    for (int u = 0; u < rowwise::kLoopBatch; ++u) {
      const int i = base + u * step;
      if (i < n) normalize(x[u], w[u], b[u], has_bias, mean, rstd).store(out + i * kN);
    }
  }
}

template <typename T>
void launch_typed(const char* op, Params& p, bool vector, int device, cudaStream_t stream,
                  int enable_pdl) {
  constexpr int kVec = 16 / sizeof(T);
  const int vectors = p.hidden / kVec;
  if (vector && vectors <= rowwise::kRegisterMaxVectors) {
    return rowwise::launch_registers(
        op,
        {layernorm_registers<T, 1>, layernorm_registers<T, 2>, layernorm_registers<T, 4>,
         layernorm_registers<T, 8>},
        vectors, p, stream, enable_pdl, device);
  }
  if (vector) {
    return rowwise::launch_loop(op, layernorm_loop<T, kVec>, vectors, p, stream, enable_pdl,
                                device);
  }
  rowwise::launch_loop(op, layernorm_loop<T, 1>, p.hidden, p, stream, enable_pdl, device);
}

}  // namespace layernorm_detail

// out, input: [..., H] (leading dims mergeable into (tokens, heads), last dim contiguous, same
// dtype); weight, bias (optional): [H]. out may be input.
inline void layernorm(tvm::ffi::TensorView out, tvm::ffi::TensorView input,
                      tvm::ffi::TensorView weight, tvm::ffi::Optional<tvm::ffi::TensorView> bias,
                      double eps, int64_t enable_pdl) {
  constexpr const char* kOp = "layernorm.layernorm";
  // 1. Validate.
  rowwise::check_rows(kOp, "input", input);
  rowwise::check_rows(kOp, "out", out);
  kernels::check_same_shape(kOp, "out", out, "input", input);
  kernels::check_same_dtype(kOp, "out", out, "input", input);
  const int64_t hidden = input.size(-1);
  rowwise::check_vector_arg(kOp, "weight", weight, hidden, "input", input);
  if (bias.has_value()) rowwise::check_vector_arg(kOp, "bias", *bias, hidden, "input", input);
  rowwise::check_eps(kOp, eps);
  const bool empty = input.numel() == 0;
  const tvm::ffi::TensorView* tensors[] = {&input, &out};
  const rowwise::RowLayout rows =
      empty ? rowwise::RowLayout{0, 1, {}} : rowwise::row_layout(kOp, "input", tensors, 2);
  kernels::check_device(kOp, "input", input, kDLCUDA);
  kernels::check_same_device(kOp, "out", out, "input", input);
  kernels::check_same_device(kOp, "weight", weight, "input", input);
  if (bias.has_value()) kernels::check_same_device(kOp, "bias", *bias, "input", input);
  if (empty) return;

  layernorm_detail::Params p{};
  p.in = rowwise::data(input);
  p.out = rowwise::data(out);
  p.weight = rowwise::data(weight);
  p.bias = bias.has_value() ? rowwise::data(*bias) : nullptr;
  p.in_map = rows.map[0];
  p.out_map = rows.map[1];
  p.inner = static_cast<uint32_t>(rows.inner);
  p.rows = rows.rows();
  p.hidden = static_cast<int>(hidden);
  p.eps = static_cast<float>(eps);
  const int vec = 16 / (input.dtype().bits / 8);
  const bool vector =
      rowwise::vectors_fit(hidden, vec, {p.in, p.out, p.weight, p.bias}, {rows.map[0], rows.map[1]});

  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(input);
  const int device = input.device().device_id;
  cudaStream_t stream = kernels::current_stream(input);
  // 4. Dispatch on dtype and launch.
  KERNELS_DISPATCH_FLOAT(input.dtype(), kOp, T, [&] {
    layernorm_detail::launch_typed<T>(kOp, p, vector, device, stream, static_cast<int>(enable_pdl));
  });
}
