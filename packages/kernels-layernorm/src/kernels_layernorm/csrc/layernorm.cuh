// layernorm, CUDA: y = (x - mean) * rsqrt(var + eps) * w (+ b), mean and the biased variance in
// fp32 over the last dim, y rounded once. One op struct on the row engine of
// <kernels/rowwise.cuh>: two statistics, the mean and then the exact two-pass sum of
// (x - mean)^2 (no E[x^2] - mean^2 cancellation), over registers in the register kernel (at
// decode split over a thread-block cluster per row: each statistic summed over the cluster before
// the next) and over re-reads of the row (from L2) in the loop kernel.
//
// weight and bias (optional, weight's dtype) have the input's dtype or, for fp16/bf16 input,
// float32 (FlashInfer's callers pass fp32 parameters); fp32 weights are read as fp32.
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(10);

#include <type_traits>

#include <tvm/ffi/optional.h>

#include <kernels/rowwise.cuh>

namespace layernorm_detail {

struct Params {
  rowwise::RowShape shape;
  const void* in;
  void* out;
  const void* weight;
  const void* bias;  // null: no bias
  kernels::RowMap in_map, out_map;
  uint32_t inner;
  float eps;
};

// T: input and output; W: weight and bias (T or float).
template <typename T, typename W, int kAccess>
struct LayerNorm : Params, rowwise::RowOp {
  static constexpr int kN = kAccess;
  static constexpr int kStats = 2;
  // fp32 weights of a 16-bit row take twice the registers: at most 4 vectors per thread
  // (x, w and b of 8 vectors would exceed the 128 registers of a 512-thread block).
  static constexpr int kMaxVectorsPerThread = sizeof(W) > sizeof(T) ? 4 : 8;
  using Pack = kernels::Pack<T, kN>;
  using WPack = kernels::Pack<W, kN>;
  struct Row {
    const T* in;
    T* out;
  };
  // The 8-vector kernel (the many-rows plan of long rows) of 16-bit rows reads the weight and
  // bias in output(), after the row's statistics, from the L1 every row of the SM shares, where
  // that pays (rowwise::late_loads_pay) -- instead of holding them beside x from the row's loads
  // on: 124 registers in bf16, 64 late. In fp16 holding them spills (128 registers and 96 bytes
  // of stack; 107 late: no more rows in flight), so there the late kernel runs past two waves, on
  // any DRAM. Measured (A/B against holding them, 2026-12-05, time ratios): fp16 8192 / 32768 x
  // 4096-8192 H200 0.79-0.84, H100 0.88-0.94; 1024 rows 1.03-1.07 (H200) if late. fp32 (121
  // registers, 62 late) holds them: on the H100 late loads gave 0.97 at 1024 x 4096 but 1.02-1.05
  // at 1024 x 7168 / 8192, and they were not measured on the H200.
  static constexpr int kLateFrom = std::is_same_v<T, float> ? rowwise::RowOp::kLateFrom : 8;
  static constexpr bool kLateByLaunch = true;
  bool late_rows(int64_t rows, int tpr, int device) const {
    if constexpr (std::is_same_v<T, __half>) {
      return rowwise::rows_past_held_waves(rows, tpr, device, 2);
    } else {
      return rowwise::late_loads_pay(rows, tpr, device);
    }
  }
  struct Regs {
    WPack w, b;
    int i;      // the access, for output()'s late loads
    bool late;  // a constant once inlined: the kernel's kLate
  };

  __device__ __forceinline__ Row row(int64_t r) const {
    return {static_cast<const T*>(in) + rowwise::row_offset(in_map, r, inner),
            static_cast<T*>(out) + rowwise::row_offset(out_map, r, inner)};
  }

  __device__ __forceinline__ void load_input(const Row& row, int i, Pack& x,
                                             kernels::Cache cache) const {
    x.load(row.in + i * kN, cache);
  }
  __device__ __forceinline__ void load_weights(int i, Regs& g) const {
    g.w.load_cached(static_cast<const W*>(weight) + i * kN);
    if (bias != nullptr) g.b.load_cached(static_cast<const W*>(bias) + i * kN);
  }
  __device__ __forceinline__ void load(const Row&, int i, Regs& g, bool late,
                                       kernels::Cache) const {
    g.i = i;
    g.late = late;
    if (!late) load_weights(i, g);
  }
  // Passes 0 and 1 (mean, variance) read the row; pass 2 the row, weight and bias.
  __device__ __forceinline__ void load_pass(int pass, const Row& row, int i, Pack& x,
                                            Regs& g) const {
    x.load(row.in + i * kN);
    g.late = false;
    if (pass == kStats) load_weights(i, g);
  }
  // The mean, then rstd from the centred squares (rowwise::layernorm_accumulate).
  __device__ __forceinline__ float accumulate(int s, const Pack& x, const float* stats, float acc,
                                              bool valid) const {
    return rowwise::layernorm_accumulate(s, x, stats, acc, valid);
  }
  __device__ __forceinline__ float finish(int s, float sum) const {
    return rowwise::layernorm_finish(s, sum, shape, eps);
  }
  __device__ __forceinline__ Pack output(const Pack& x, const Regs& regs, const float* stats) const {
    Regs late;
    if (regs.late) load_weights(regs.i, late);
    const Regs& g = regs.late ? late : regs;
    float a[kN], c[kN];
    x.unpack(a);
    g.w.unpack(c);
#pragma unroll
    for (int k = 0; k < kN; ++k) a[k] = (a[k] - stats[0]) * stats[1] * c[k];
    if (bias != nullptr) {
      g.b.unpack(c);
#pragma unroll
      for (int k = 0; k < kN; ++k) a[k] += c[k];
    }
    Pack y;
    y.pack(a);
    return y;
  }
};

template <typename T, int kN>
using Same = LayerNorm<T, T, kN>;
template <typename T, int kN>
using Fp32Weights = LayerNorm<T, float, kN>;

}  // namespace layernorm_detail

// out, input: [..., H] (leading dims mergeable into (tokens, heads), last dim contiguous, same
// dtype); weight, bias (optional): [H], input's dtype or float32, bias's dtype weight's. out may
// be input.
inline void layernorm(tvm::ffi::TensorView out, tvm::ffi::TensorView input,
                      tvm::ffi::TensorView weight, tvm::ffi::Optional<tvm::ffi::TensorView> bias,
                      double eps, int64_t enable_pdl) {
  namespace detail = layernorm_detail;
  constexpr const char* kOp = "layernorm.layernorm";
  // 1. Validate.
  rowwise::check_rows(kOp, "input", input);
  rowwise::check_rows(kOp, "out", out);
  kernels::check_same_shape(kOp, "out", out, "input", input);
  kernels::check_same_dtype(kOp, "out", out, "input", input);
  const int64_t hidden = input.size(-1);
  const bool fp32_weight = kernels::is_dtype(weight.dtype(), kDLFloat, 32);
  rowwise::check_vector_shape(kOp, "weight", weight, hidden, "input");
  TVM_FFI_CHECK(weight.dtype() == input.dtype() || fp32_weight, TypeError)
      << kOp << ": weight must have input's dtype or float32";
  if (bias.has_value()) {
    rowwise::check_vector_shape(kOp, "bias", *bias, hidden, "input");
    kernels::check_same_dtype(kOp, "bias", *bias, "weight", weight);
  }
  kernels::check_eps(kOp, eps);
  const kernels::RowLayout rows = kernels::row_layout(kOp, "input", {&input, &out});
  kernels::check_device(kOp, "input", input, kDLCUDA);
  kernels::check_same_device(kOp, "out", out, "input", input);
  kernels::check_same_device(kOp, "weight", weight, "input", input);
  if (bias.has_value()) kernels::check_same_device(kOp, "bias", *bias, "input", input);
  if (rows.rows() == 0) return;

  detail::Params p{};
  p.shape.rows = rows.rows();
  p.shape.hidden = static_cast<int>(hidden);
  p.in = kernels::data(input);
  p.out = kernels::data(out);
  p.weight = kernels::data(weight);
  p.bias = bias.has_value() ? kernels::data(*bias) : nullptr;
  p.in_map = rows.map[0];
  p.out_map = rows.map[1];
  p.inner = static_cast<uint32_t>(rows.inner);
  p.eps = static_cast<float>(eps);
  const int vec = 16 / (input.dtype().bits / 8);
  const bool vector = kernels::vectors_fit(hidden, vec, {p.in, p.out, p.weight, p.bias},
                                           {rows.map[0], rows.map[1]});
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(input);
  const kernels::Launch ctx(kOp, input, enable_pdl);
  // 4. Dispatch on dtype and launch (checked).
  KERNELS_DISPATCH_FLOAT(input.dtype(), kOp, T, [&] {
    if (fp32_weight && !std::is_same_v<T, float>) {
      rowwise::launch_rows<detail::Fp32Weights, T>(ctx, p, vector);
    } else {
      rowwise::launch_rows<detail::Same, T>(ctx, p, vector);
    }
  });
}
