// diffusion.layernorm_scale_shift, CUDA: y = LN(x) * (1 + scale) + shift over x [B, L, H], with
// LN(x) = (x - mean) * rsqrt(var + eps) (* weight) (+ bias), the mean and the biased variance in
// fp32 (the exact two-pass sum of squared deviations), y rounded once. scale and shift are
// [B, H] / [B, 1, H] (per sample: L stride 0, read through the read-only path, L2-resident) or
// [B, L, H] (per token: streamed). One op struct on the row engine of <kernels/rowwise.cuh>
// (like layernorm.cuh): row(r) splits the row into (b, l) with a FastDivmod for the pointers of
// x, out, scale and shift, each with its own B and L strides (last dims contiguous).
//
// scale and shift share a dtype M: x's or float32; weight and bias (optional, either alone)
// have M's dtype too. The register budget (vectors per thread) shrinks with the operands held
// beside x: 8 for scale and shift of x's width, 4 for fp32 ones; weight and bias are read at the
// output (L1/L2-resident). The 8-vector kernel (the many-rows plan of long rows) of 16-bit x
// and per-sample modulation may hold none of them: it reads scale and shift at the output too
// where that pays (see kLateFrom).
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(10);

#include <type_traits>

#include <tvm/ffi/optional.h>

#include <kernels/pointwise.cuh>
#include <kernels/rowwise.cuh>

namespace layernorm_scale_shift_detail {

// Element strides of one [B, L, H] operand (L stride 0: per sample).
struct Strides {
  int64_t b;
  int64_t l;
};

struct Params {
  rowwise::RowShape shape;
  const void* in;
  void* out;
  const void* scale;
  const void* shift;
  const void* weight;  // null: none (affine ops only)
  const void* bias;    // null: none (affine ops only)
  Strides in_s, out_s, scale_s, shift_s;
  kernels::FastDivmod length;  // L
  float eps;
};

// T: x and out; M: scale, shift, weight and bias (T or float); kAffine: weight or bias given.
template <typename T, typename M, bool kAffine, int kAccess>
struct ScaleShift : Params, rowwise::RowOp {
  static constexpr int kN = kAccess;
  static constexpr int kStats = 2;
  // 32-bit registers per 16-byte vector of x held until the output: x, scale and shift (weight
  // and bias are loaded by output() itself, from L1/L2: held beside fp32 scale and shift they
  // spilled). 12 (x's width): 8 vectors per thread; 20 (fp32 modulation of a 16-bit x): 4.
  static constexpr int kModWords = 4 * static_cast<int>(sizeof(M) / sizeof(T));
  static constexpr int kCost = 4 + 2 * kModWords;
  static constexpr int kMaxVectorsPerThread = kCost <= 12 ? 8 : 4;
  // Per sample and where it pays (rowwise::late_loads_pay), the 8-vector kernel reads scale and
  // shift in output(), after the row's statistics, from the L1 every row of the SM shares,
  // instead of holding them beside x from the row's loads on (bf16: 123-126 registers, 16 warps
  // an SM; 64-74 late). Measured (bf16, A/B against holding them, 2026-12-05, time ratios):
  // [1, 32760, 3072] per sample H200 0.91, H100 1.005; [1, 4096, 3072] H200 0.98, H100 1.02; per
  // token (late loads after an L1 prefetch issued with the row's loads) [1, 16384, 3072] H200
  // 1.07, so per-token rows keep them. fp32 x holds them, as layernorm's fp32 rows do (late
  // loads not measured on the H200 there).
  static constexpr int kLateFrom = std::is_same_v<T, float> ? rowwise::RowOp::kLateFrom : 8;
  static constexpr bool kLateByLaunch = true;
  bool late_rows(int64_t rows, int tpr, int device) const {
    return scale_s.l == 0 && shift_s.l == 0 && rowwise::late_loads_pay(rows, tpr, device);
  }
  using Pack = kernels::Pack<T, kN>;
  using MPack = kernels::Pack<M, kN>;
  struct Row {
    const T* in;
    T* out;
    const M* scale;
    const M* shift;
  };
  struct Regs {
    MPack scale, shift;
    const M* scale_row;  // with `late`: output()'s loads
    const M* shift_row;
    int i;      // the access index, for output()'s loads
    bool late;  // a constant once inlined: the kernel's kLate
  };

  __device__ __forceinline__ Row row(int64_t r) const {
    uint32_t b = 0, l = 0;
    if (r < shape.rows) length.divmod(static_cast<uint32_t>(r), b, l);
    return {static_cast<const T*>(in) + b * in_s.b + l * in_s.l,
            static_cast<T*>(out) + b * out_s.b + l * out_s.l,
            static_cast<const M*>(scale) + b * scale_s.b + l * scale_s.l,
            static_cast<const M*>(shift) + b * shift_s.b + l * shift_s.l};
  }

  __device__ __forceinline__ void load_input(const Row& row, int i, Pack& x,
                                             kernels::Cache cache) const {
    x.load(row.in + i * kN, cache);
  }
  // Access i of scale and shift: per sample (L stride 0, every token of the sample reads it)
  // through the read-only path, per token streamed.
  __device__ __forceinline__ void load_operands(const M* scale_row, const M* shift_row, int i,
                                                MPack& scale, MPack& shift) const {
    if (scale_s.l == 0) {
      scale.load_cached(scale_row + i * kN);
    } else {
      scale.load_stream(scale_row + i * kN);
    }
    if (shift_s.l == 0) {
      shift.load_cached(shift_row + i * kN);
    } else {
      shift.load_stream(shift_row + i * kN);
    }
  }
  __device__ __forceinline__ void load(const Row& row, int i, Regs& g, bool late,
                                       kernels::Cache) const {
    if (!late) {
      load_operands(row.scale, row.shift, i, g.scale, g.shift);
    } else {
      g.scale_row = row.scale;
      g.shift_row = row.shift;
      // The access's addresses consumed here, with the row's loads (an empty asm, no code):
      // without it nvcc held more across the statistics (sm_90a: fp16 128 registers, not 64).
      asm volatile("" ::"l"(row.scale + i * kN), "l"(row.shift + i * kN));
    }
    g.i = i;
    g.late = late;
  }
  // Passes 0 and 1 (mean, variance) read the row; pass 2 the row and the operands.
  __device__ __forceinline__ void load_pass(int pass, const Row& row, int i, Pack& x,
                                            Regs& g) const {
    x.load(row.in + i * kN);
    if (pass == kStats) load_operands(row.scale, row.shift, i, g.scale, g.shift);
    g.i = i;
    g.late = false;
  }
  // The mean, then rstd from the centred squares (rowwise::layernorm_accumulate).
  __device__ __forceinline__ float accumulate(int s, const Pack& x, const float* stats, float acc,
                                              bool valid) const {
    return rowwise::layernorm_accumulate(s, x, stats, acc, valid);
  }
  __device__ __forceinline__ float finish(int s, float sum) const {
    return rowwise::layernorm_finish(s, sum, shape, eps);
  }
  __device__ __forceinline__ Pack output(const Pack& x, const Regs& g, const float* stats) const {
    MPack scale = g.scale, shift = g.shift;
    if (g.late) {  // per sample (late_rows)
      scale.load_cached(g.scale_row + g.i * kN);
      shift.load_cached(g.shift_row + g.i * kN);
    }
    Pack xr = x;
    if constexpr (kN * sizeof(T) % kernels::kVectorBytes == 0) {
      if (g.late) {
        // x unpacked again from its packed words (opaque to nvcc), not kept as the fp32 values
        // of the statistics' passes (bf16: 91 registers instead of 64 otherwise).
#pragma unroll
        for (int k = 0; k < Pack::kWords; ++k) asm volatile("" : "+r"(xr.w[k]));
      }
    }
    float a[kN], c[kN];
    xr.unpack(a);
#pragma unroll
    for (int k = 0; k < kN; ++k) a[k] = (a[k] - stats[0]) * stats[1];
    if constexpr (kAffine) {
      MPack wb;
      if (weight != nullptr) {
        wb.load_cached(static_cast<const M*>(weight) + g.i * kN);
        wb.unpack(c);
#pragma unroll
        for (int k = 0; k < kN; ++k) a[k] *= c[k];
      }
      if (bias != nullptr) {
        wb.load_cached(static_cast<const M*>(bias) + g.i * kN);
        wb.unpack(c);
#pragma unroll
        for (int k = 0; k < kN; ++k) a[k] += c[k];
      }
    }
    scale.unpack(c);
#pragma unroll
    for (int k = 0; k < kN; ++k) a[k] *= 1.0f + c[k];
    shift.unpack(c);
#pragma unroll
    for (int k = 0; k < kN; ++k) a[k] += c[k];
    Pack y;
    y.pack(a);
    return y;
  }
};

template <typename T, int kN>
using Plain = ScaleShift<T, T, false, kN>;
template <typename T, int kN>
using Affine = ScaleShift<T, T, true, kN>;
template <typename T, int kN>
using Fp32Plain = ScaleShift<T, float, false, kN>;
template <typename T, int kN>
using Fp32Affine = ScaleShift<T, float, true, kN>;

// [B, L, H] strides; [B, H] and [B, 1, H] get L stride 0. Size-1 dims are never stepped over.
inline Strides strides_of(const tvm::ffi::TensorView& t) {
  if (t.ndim() == 2) return {t.size(0) == 1 ? 0 : t.stride(0), 0};
  return {t.size(0) == 1 ? 0 : t.stride(0), t.size(1) == 1 ? 0 : t.stride(1)};
}

inline void check_modulation(const char* op, const char* arg, const tvm::ffi::TensorView& v,
                             const tvm::ffi::TensorView& x) {
  const int64_t batch = x.size(0), length = x.size(1), hidden = x.size(2);
  const bool ok = (v.ndim() == 2 && v.size(0) == batch && v.size(1) == hidden) ||
                  (v.ndim() == 3 && v.size(0) == batch &&
                   (v.size(1) == 1 || v.size(1) == length) && v.size(2) == hidden);
  TVM_FFI_CHECK(ok, ValueError) << op << ": " << arg
                                << " must have shape [B, H], [B, 1, H] or [B, L, H] for x "
                                << kernels::shape_string(x) << ", got "
                                << kernels::shape_string(v);
  kernels::check_last_dim_contiguous(op, arg, v);
}

}  // namespace layernorm_scale_shift_detail

// out, x: [B, L, H] (one dtype, last dim contiguous, any B/L strides); scale, shift: [B, H],
// [B, 1, H] or [B, L, H], one dtype, x's or float32; weight, bias (optional): [H], scale's dtype.
// out may be x.
inline void layernorm_scale_shift(tvm::ffi::TensorView out, tvm::ffi::TensorView x,
                                  tvm::ffi::TensorView scale, tvm::ffi::TensorView shift,
                                  tvm::ffi::Optional<tvm::ffi::TensorView> weight,
                                  tvm::ffi::Optional<tvm::ffi::TensorView> bias, double eps) {
  namespace detail = layernorm_scale_shift_detail;
  constexpr const char* kOp = "diffusion.layernorm_scale_shift";
  // 1. Validate.
  rowwise::check_rows(kOp, "x", x);
  rowwise::check_rows(kOp, "out", out);
  kernels::check_ndim(kOp, "x", x, 3);
  kernels::check_same_shape(kOp, "out", out, "x", x);
  kernels::check_same_dtype(kOp, "out", out, "x", x);
  detail::check_modulation(kOp, "scale", scale, x);
  detail::check_modulation(kOp, "shift", shift, x);
  kernels::check_same_dtype(kOp, "shift", shift, "scale", scale);
  const bool fp32_mod = kernels::is_dtype(scale.dtype(), kDLFloat, 32);
  TVM_FFI_CHECK(scale.dtype() == x.dtype() || fp32_mod, TypeError)
      << kOp << ": scale and shift must have x's dtype or float32";
  const int64_t hidden = x.size(2), rows = x.size(0) * x.size(1);
  if (weight.has_value()) {
    rowwise::check_vector_shape(kOp, "weight", *weight, hidden, "x");
    kernels::check_same_dtype(kOp, "weight", *weight, "scale", scale);
  }
  if (bias.has_value()) {
    rowwise::check_vector_shape(kOp, "bias", *bias, hidden, "x");
    kernels::check_same_dtype(kOp, "bias", *bias, "scale", scale);
  }
  kernels::check_eps(kOp, eps);
  TVM_FFI_CHECK(rows < (int64_t{1} << 31), ValueError)
      << kOp << ": x " << kernels::shape_string(x) << " has too many rows (at most 2^31)";
  kernels::check_device(kOp, "x", x, kDLCUDA);
  kernels::check_same_device(kOp, "out", out, "x", x);
  kernels::check_same_device(kOp, "scale", scale, "x", x);
  kernels::check_same_device(kOp, "shift", shift, "x", x);
  if (weight.has_value()) kernels::check_same_device(kOp, "weight", *weight, "x", x);
  if (bias.has_value()) kernels::check_same_device(kOp, "bias", *bias, "x", x);
  if (rows == 0 || hidden == 0) return;

  detail::Params p{};
  p.shape.rows = rows;
  p.shape.hidden = static_cast<int>(hidden);
  p.in = kernels::data(x);
  p.out = kernels::data(out);
  p.scale = kernels::data(scale);
  p.shift = kernels::data(shift);
  p.weight = weight.has_value() ? kernels::data(*weight) : nullptr;
  p.bias = bias.has_value() ? kernels::data(*bias) : nullptr;
  p.in_s = detail::strides_of(x);
  p.out_s = detail::strides_of(out);
  p.scale_s = detail::strides_of(scale);
  p.shift_s = detail::strides_of(shift);
  p.length = kernels::FastDivmod(static_cast<uint32_t>(x.size(1)));
  p.eps = static_cast<float>(eps);
  const int vec = 16 / (x.dtype().bits / 8);
  auto map = [](const detail::Strides& s) { return kernels::RowMap{s.b, s.l}; };
  const bool vector =
      kernels::vectors_fit(hidden, vec, {p.in, p.out, p.scale, p.shift, p.weight, p.bias},
                           {map(p.in_s), map(p.out_s), map(p.scale_s), map(p.shift_s)});
  const bool affine = p.weight != nullptr || p.bias != nullptr;
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(x);
  const kernels::Launch ctx(kOp, x);
  // 4. Dispatch on dtype and launch (checked).
  KERNELS_DISPATCH_FLOAT(x.dtype(), kOp, T, [&] {
    if (fp32_mod && !std::is_same_v<T, float>) {
      if (affine) {
        rowwise::launch_rows<detail::Fp32Affine, T>(ctx, p, vector);
      } else {
        rowwise::launch_rows<detail::Fp32Plain, T>(ctx, p, vector);
      }
    } else if (affine) {
      rowwise::launch_rows<detail::Affine, T>(ctx, p, vector);
    } else {
      rowwise::launch_rows<detail::Plain, T>(ctx, p, vector);
    }
  });
}
