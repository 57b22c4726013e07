// gemm.fp8_scaled_mm, CUDA (sm90a): out = (a @ b) * scale_a[m] * scale_b[n] + bias[n], bf16 or
// fp16 out. CUTLASS 3.x warp-specialized TMA kernels (fp8 WGMMA, K tiles of 128) whose fp32
// accumulators are promoted every 128 K (CUTLASS's FP8 mainloop, mma_promotion_interval 4): the
// tensor cores' short fp8 accumulation never runs over more than one K tile. The epilogue is one
// visitor tree: scale_b (a row vector or a scalar), then scale_a (a column vector or a scalar),
// then bias (a row vector; null = 0), rounded once and stored by TMA. Two tile configs, one
// module each per out dtype (the op file picks by M; a CUTLASS instantiation takes minutes to
// compile, so each module holds one):
//   kSmall (M <= 64): 64x32x128, one consumer warpgroup (N/32 CTAs keep the weight stream wide);
//   kLarge:           128x128x128, cooperative consumers, persistent, clusters of 2 along M.
#pragma once

#include "fp8_cutlass.cuh"

namespace fp8_scaled_mm_detail {

using namespace cute;
namespace fusion = cutlass::epilogue::fusion;

template <class OutT, class Tile, class Cluster, class Schedule, class EpiSchedule,
          class Scheduler>
struct Gemm {
  using Fp8 = cutlass::float_e4m3_t;
  static constexpr int kAlignAB = 16, kAlignD = 16 / sizeof(OutT);
  // scale_a: a column vector, or a scalar where its stride flag is false; scale_b likewise along
  // N; bias: a row vector (a null pointer reads 0).
  using ScaleA = fusion::Sm90ColBroadcast<0, Tile, float, float, Stride<bool, _0, int64_t>, 1>;
  using ScaleB = fusion::Sm90RowBroadcast<0, Tile, float, float, Stride<_0, bool, int64_t>, 4>;
  using Bias = fusion::Sm90RowBroadcast<0, Tile, OutT, float, Stride<_0, _1, int64_t>, kAlignD>;
  using Mul = fusion::Sm90Compute<cutlass::multiplies, float, float,
                                  cutlass::FloatRoundStyle::round_to_nearest>;
  using MulAdd = fusion::Sm90Compute<cutlass::multiply_add, OutT, float,
                                     cutlass::FloatRoundStyle::round_to_nearest>;
  using Tree = fusion::Sm90EVT<MulAdd, ScaleA, fusion::Sm90EVT<Mul, ScaleB, fusion::Sm90AccFetch>,
                               Bias>;

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void,
      cutlass::layout::RowMajor, kAlignD, OutT, cutlass::layout::RowMajor, kAlignD, EpiSchedule,
      Tree>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Fp8, cutlass::layout::RowMajor,
      kAlignAB, Fp8, cutlass::layout::ColumnMajor, kAlignAB, float, Tile, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epilogue::SharedStorage))>,
      Schedule>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop,
                                                      Epilogue, Scheduler>;
  using Device = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

template <class OutT>
using Small = Gemm<OutT, Shape<_64, _32, _128>, Shape<_1, _1, _1>,
                   cutlass::gemm::KernelTmaWarpSpecialized, cutlass::epilogue::TmaWarpSpecialized,
                   void>;
template <class OutT>
using Large = Gemm<OutT, Shape<_128, _128, _128>, Shape<_2, _1, _1>,
                   cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                   cutlass::epilogue::TmaWarpSpecializedCooperative,
                   cutlass::gemm::PersistentScheduler>;

struct Problem {
  int m, n, k;
  int64_t lda, ldb;
  const void *a, *b, *bias;
  const float *scale_a, *scale_b;
  bool row_scale_a, col_scale_b;
  void* out;
};

template <class Config>
void launch(const char* op, const Problem& p, const kernels::Launch& ctx) {
  using Device = typename Config::Device;
  using Kernel = typename Config::Kernel;
  using OutT = typename Device::ElementD;
  using Fp8 = cutlass::float_e4m3_t;
  typename Kernel::StrideA stride_a = fp8_gemm::row_stride<typename Kernel::StrideA>(p.lda);
  typename Kernel::StrideB stride_b = fp8_gemm::row_stride<typename Kernel::StrideB>(p.ldb);
  typename Kernel::StrideD stride_d = fp8_gemm::row_stride<typename Kernel::StrideD>(p.n);
  typename Device::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGemm,
      {p.m, p.n, p.k, 1},
      {static_cast<const Fp8*>(p.a), stride_a, static_cast<const Fp8*>(p.b), stride_b},
      {{}, nullptr, stride_d, static_cast<OutT*>(p.out), stride_d},
      fp8_gemm::hardware(ctx)};
  args.epilogue.thread = {
      {p.scale_a, 0.0f, {p.row_scale_a, _0{}, int64_t{0}}},
      {{p.scale_b, 0.0f, {_0{}, p.col_scale_b, int64_t{0}}}, {}, {}},
      {static_cast<const OutT*>(p.bias), OutT(0), {}},
      {}};
  fp8_gemm::run<Device>(op, args, ctx);
}

enum Config { kSmall = 0, kLarge = 1 };


}  // namespace fp8_scaled_mm_detail

// Exported as fp8_scaled_mm<OutT, Config> (OutT cutlass::bfloat16_t or cutlass::half_t, out's
// dtype). out [M, N] contiguous; a [M, K] fp8 row-major; b [K, N] fp8 column-major; scale_a
// fp32 [M, 1] or [1]; scale_b fp32 [N], [1, N] or [1]; bias [N] of out's dtype or None. K and N
// multiples of 16; 16-byte aligned a, b, out, scale_b and bias. M, N, K > 0 (Python handles 0).
template <class OutT, int kConfig>
void fp8_scaled_mm(tvm::ffi::TensorView out, tvm::ffi::TensorView a, tvm::ffi::TensorView b,
                          tvm::ffi::TensorView scale_a, tvm::ffi::TensorView scale_b,
                          tvm::ffi::Optional<tvm::ffi::TensorView> bias) {
  namespace detail = fp8_scaled_mm_detail;
  constexpr const char* kOp = "gemm.fp8_scaled_mm";
  // 1. Validate.
  fp8_gemm::check_operands(kOp, out, a, b);
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  constexpr bool kBf16 = std::is_same_v<OutT, cutlass::bfloat16_t>;
  TVM_FFI_CHECK(kernels::is_dtype(out.dtype(), kBf16 ? kDLBfloat : kDLFloat, 16), TypeError)
      << kOp << ": out must have dtype " << (kBf16 ? "bfloat16" : "float16")
      << " for this kernel";
  TVM_FFI_CHECK(kernels::is_dtype(scale_a.dtype(), kDLFloat, 32) &&
                    kernels::is_dtype(scale_b.dtype(), kDLFloat, 32),
                TypeError)
      << kOp << ": scale_a and scale_b must have dtype float32";
  TVM_FFI_CHECK(scale_a.numel() == 1 || scale_a.numel() == m, ValueError)
      << kOp << ": scale_a must have M (" << m << ") elements or one, got "
      << kernels::shape_string(scale_a);
  TVM_FFI_CHECK(scale_b.numel() == 1 || scale_b.numel() == n, ValueError)
      << kOp << ": scale_b must have N (" << n << ") elements or one, got "
      << kernels::shape_string(scale_b);
  kernels::check_contiguous(kOp, "scale_a", scale_a);
  kernels::check_contiguous(kOp, "scale_b", scale_b);
  TVM_FFI_CHECK(fp8_gemm::aligned16(scale_b.data_ptr()), ValueError)
      << kOp << ": scale_b must start on a 16-byte boundary";
  kernels::check_same_device(kOp, "scale_a", scale_a, "a", a);
  kernels::check_same_device(kOp, "scale_b", scale_b, "a", a);
  const void* bias_ptr = nullptr;
  if (bias.has_value()) {
    const tvm::ffi::TensorView bv = *bias;
    kernels::check_ndim(kOp, "bias", bv, 1);
    TVM_FFI_CHECK(bv.size(0) == n, ValueError)
        << kOp << ": bias must have shape [" << n << "], got " << kernels::shape_string(bv);
    kernels::check_same_dtype(kOp, "bias", bv, "out", out);
    kernels::check_contiguous(kOp, "bias", bv);
    kernels::check_same_device(kOp, "bias", bv, "a", a);
    TVM_FFI_CHECK(fp8_gemm::aligned16(bv.data_ptr()), ValueError)
        << kOp << ": bias must start on a 16-byte boundary";
    bias_ptr = bv.data_ptr();
  }
  if (m == 0 || n == 0 || k == 0) return;  // Python fills out for K = 0
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(a);
  const kernels::Launch ctx(kOp, a);
  // 4. Launch the module's config.
  detail::Problem p{};
  p.m = static_cast<int>(m);
  p.n = static_cast<int>(n);
  p.k = static_cast<int>(k);
  p.lda = a.stride(0);
  p.ldb = b.stride(1);
  p.a = a.data_ptr();
  p.b = b.data_ptr();
  p.bias = bias_ptr;
  p.scale_a = static_cast<const float*>(scale_a.data_ptr());
  p.scale_b = static_cast<const float*>(scale_b.data_ptr());
  p.row_scale_a = scale_a.numel() != 1 || m == 1;
  p.col_scale_b = scale_b.numel() != 1 || n == 1;
  p.out = out.data_ptr();
  if constexpr (kConfig == detail::kSmall) {
    detail::launch<detail::Small<OutT>>(kOp, p, ctx);
  } else {
    detail::launch<detail::Large<OutT>>(kOp, p, ctx);
  }
}
