// gemm.fp8_blockwise_mm, CUDA (sm90a): out[m, n] = sum_g scale_a[m, g] * scale_b[g, n / 128] *
// sum_{k in g} a[m, k] b[k, n] with groups g of 128 along K, bf16 out. CUTLASS 3.x's blockwise-
// scaled FP8 kernel (KernelTmaWarpSpecialized*FP8Blockwise, examples/67): fp8 WGMMAs over one
// 128-K group land in a fresh fp32 accumulator that is then scaled by the group's scale_a row
// entries and scale_b block and added into the fp32 total on the CUDA cores (DeepGEMM's
// promotion). scale_a (1x128 activation groups, M-major, 16-byte aligned columns: the layout
// per_token_group_quant_8bit writes with column_major_scales and scale_tma_aligned) comes in by
// TMA; scale_b (128x128 weight blocks, the transpose view of the checkpoint's contiguous
// weight_scale_inv [ceil(N/128), K/128]) by cp.async. Two tile configs, one module each (the
// op file picks by M):
//   kSmall (M <= 128): 64x128x128, ping-pong consumers, persistent;
//   kLarge:            128x128x128, cooperative consumers, persistent, clusters of 2 along N.
#pragma once

#include "fp8_cutlass.cuh"

namespace fp8_blockwise_mm_detail {

using namespace cute;

// Scale granularity (1, 128, 128): scale_a M-major, scale_b K-major (see above).
using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<1, 128, 128, cute::GMMA::Major::MN,
                                                              cute::GMMA::Major::K>;
using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());

template <class OutT, class Tile, class Cluster, class Schedule, class EpiSchedule>
struct Gemm {
  using Fp8 = cutlass::float_e4m3_t;
  static constexpr int kAlignAB = 16, kAlignD = 16 / sizeof(OutT);
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void,
      cutlass::layout::RowMajor, kAlignD, OutT, cutlass::layout::RowMajor, kAlignD, EpiSchedule,
      cutlass::epilogue::fusion::LinearCombination<OutT, float, void, float>>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Fp8,
      cute::tuple<cutlass::layout::RowMajor, LayoutSFA>, kAlignAB, Fp8,
      cute::tuple<cutlass::layout::ColumnMajor, LayoutSFB>, kAlignAB, float, Tile, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epilogue::SharedStorage))>,
      Schedule>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop,
                                                      Epilogue, cutlass::gemm::PersistentScheduler>;
  using Device = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

template <class OutT>
using Small = Gemm<OutT, Shape<_64, _128, _128>, Shape<_1, _1, _1>,
                   cutlass::gemm::KernelTmaWarpSpecializedPingpongFP8Blockwise,
                   cutlass::epilogue::TmaWarpSpecialized>;
template <class OutT>
using Large = Gemm<OutT, Shape<_128, _128, _128>, Shape<_1, _2, _1>,
                   cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8Blockwise,
                   cutlass::epilogue::TmaWarpSpecializedCooperative>;

enum Config { kSmall = 0, kLarge = 1 };

struct Problem : fp8_gemm::Operands {
  int64_t ld_scale_a, ld_scale_b;
};

template <class Config>
void launch(const char* op, const Problem& p, const kernels::Launch& ctx) {
  using Device = typename Config::Device;
  using Kernel = typename Config::Kernel;
  using OutT = typename Device::ElementD;
  using Fp8 = cutlass::float_e4m3_t;
  const int groups = p.k / 128, blocks_n = (p.n + 127) / 128;
  typename Kernel::StrideA stride_a = fp8_gemm::row_stride<typename Kernel::StrideA>(p.lda);
  typename Kernel::StrideB stride_b = fp8_gemm::row_stride<typename Kernel::StrideB>(p.ldb);
  typename Kernel::StrideD stride_d = fp8_gemm::row_stride<typename Kernel::StrideD>(p.n);
  // scale_a[m, g] at m + g * ld_scale_a; scale_b[g, j] at g + j * ld_scale_b. scale_a comes in by
  // TMA, whose 16-byte rule CUTLASS checks on the layout's extent too: its M is rounded up to 4
  // (rows that exist in the 16-byte aligned columns; the caller makes sure the last one's do).
  const int m_scale = (p.m + 3) / 4 * 4;
  const LayoutSFA layout_sfa = make_layout(
      make_shape(make_shape(_1{}, m_scale), make_shape(_128{}, groups), 1),
      make_stride(make_stride(_0{}, _1{}), make_stride(_0{}, static_cast<int32_t>(p.ld_scale_a)),
                  static_cast<int32_t>(p.ld_scale_a * groups)));
  const LayoutSFB layout_sfb = make_layout(
      make_shape(make_shape(_128{}, blocks_n), make_shape(_128{}, groups), 1),
      make_stride(make_stride(_0{}, static_cast<int32_t>(p.ld_scale_b)), make_stride(_0{}, _1{}),
                  static_cast<int32_t>(p.ld_scale_b * blocks_n)));
  typename Device::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGemm,
      {p.m, p.n, p.k, 1},
      {static_cast<const Fp8*>(p.a), stride_a, static_cast<const Fp8*>(p.b), stride_b, p.scale_a,
       layout_sfa, p.scale_b, layout_sfb},
      {{}, nullptr, stride_d, static_cast<OutT*>(p.out), stride_d},
      fp8_gemm::hardware(ctx)};
  args.epilogue.thread.alpha = 1.0f;
  args.epilogue.thread.beta = 0.0f;
  fp8_gemm::run<Device>(op, args, ctx);
}

}  // namespace fp8_blockwise_mm_detail

// Exported as fp8_blockwise_mm<Config>. out [M, N] bf16 contiguous; a [M, K] fp8 row-major; b [K, N] fp8 column-major; scale_a fp32
// [M, K/128] with stride 1 along M and a column stride that is a multiple of 4 (>= M); scale_b
// fp32 [K/128, ceil(N/128)] with stride 1 along K/128. K a multiple of 128, N of 16.
template <int kConfig>
void fp8_blockwise_mm(tvm::ffi::TensorView out, tvm::ffi::TensorView a,
                             tvm::ffi::TensorView b, tvm::ffi::TensorView scale_a,
                             tvm::ffi::TensorView scale_b) {
  namespace detail = fp8_blockwise_mm_detail;
  constexpr const char* kOp = "gemm.fp8_blockwise_mm";
  // 1. Validate.
  fp8_gemm::check_operands(kOp, out, a, b);
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  TVM_FFI_CHECK(k % 128 == 0, ValueError)
      << kOp << ": K must be a multiple of 128, got " << k;
  const int64_t groups = k / 128, blocks_n = (n + 127) / 128;
  TVM_FFI_CHECK(kernels::is_dtype(out.dtype(), kDLBfloat, 16), TypeError)
      << kOp << ": out must have dtype bfloat16";
  TVM_FFI_CHECK(kernels::is_dtype(scale_a.dtype(), kDLFloat, 32) &&
                    kernels::is_dtype(scale_b.dtype(), kDLFloat, 32),
                TypeError)
      << kOp << ": scale_a and scale_b must have dtype float32";
  kernels::check_ndim(kOp, "scale_a", scale_a, 2);
  kernels::check_ndim(kOp, "scale_b", scale_b, 2);
  TVM_FFI_CHECK(scale_a.size(0) == m && scale_a.size(1) == groups, ValueError)
      << kOp << ": scale_a must have shape [" << m << ", " << groups << "], got "
      << kernels::shape_string(scale_a);
  TVM_FFI_CHECK(scale_b.size(0) == groups && scale_b.size(1) == blocks_n, ValueError)
      << kOp << ": scale_b must have shape [" << groups << ", " << blocks_n << "], got "
      << kernels::shape_string(scale_b);
  const int64_t ld_sa = groups > 1 ? scale_a.stride(1) : ((m + 3) / 4) * 4;
  TVM_FFI_CHECK((m == 1 || scale_a.stride(0) == 1) && ld_sa >= m && ld_sa % 4 == 0, ValueError)
      << kOp << ": scale_a must be column-major with 16-byte aligned columns (stride 1 along M, "
      << "a multiple of 4 along K/128: per_token_group_quant_8bit's column_major_scales and "
      << "scale_tma_aligned layout)";
  const int64_t ld_sb = blocks_n > 1 ? scale_b.stride(1) : groups;
  TVM_FFI_CHECK((groups == 1 || scale_b.stride(0) == 1) && ld_sb >= groups, ValueError)
      << kOp << ": scale_b must have stride 1 along K/128 (the transpose view of a contiguous "
      << "[ceil(N/128), K/128] weight_scale_inv)";
  TVM_FFI_CHECK(fp8_gemm::aligned16(scale_a.data_ptr()) && fp8_gemm::aligned16(scale_b.data_ptr()),
                ValueError)
      << kOp << ": scale_a and scale_b must start on 16-byte boundaries";
  TVM_FFI_CHECK(ld_sa * groups < (int64_t{1} << 31) && ld_sb * blocks_n < (int64_t{1} << 31),
                ValueError)
      << kOp << ": the scale tensors are too large (2^31 elements)";
  kernels::check_same_device(kOp, "scale_a", scale_a, "a", a);
  kernels::check_same_device(kOp, "scale_b", scale_b, "a", a);
  if (m == 0 || n == 0 || k == 0) return;  // Python fills out for K = 0
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(a);
  const kernels::Launch ctx(kOp, a);
  // 4. Launch the module's config.
  const detail::Problem p{fp8_gemm::operands(out, a, b, scale_a, scale_b), ld_sa, ld_sb};
  if constexpr (kConfig == detail::kSmall) {
    detail::launch<detail::Small<cutlass::bfloat16_t>>(kOp, p, ctx);
  } else {
    detail::launch<detail::Large<cutlass::bfloat16_t>>(kOp, p, ctx);
  }
}
