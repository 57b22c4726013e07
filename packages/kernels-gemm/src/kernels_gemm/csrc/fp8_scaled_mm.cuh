// gemm.fp8_scaled_mm, CUDA (sm90a): out = (a @ b) * scale_a[m] * scale_b[n] + bias[n], bf16 or
// fp16 out. CUTLASS 3.x warp-specialized TMA kernels (fp8 WGMMA, K tiles of 128) whose fp32
// accumulators are promoted every 128 K (CUTLASS's FP8 mainloop, mma_promotion_interval 4: four
// K=32 MMAs per K tile; a K tile of 256 would need an interval of 8, so every tile here is 128
// deep): the tensor cores' short fp8 accumulation never runs over more than one K tile. The
// epilogue is one visitor tree: scale_b (a vector or a scalar), then scale_a (a vector or a
// scalar), then bias (a vector; null = 0), rounded once and stored by TMA. Four tile configs, one
// module each per out dtype (the op file picks by M; a CUTLASS instantiation takes minutes to
// compile, so each module holds one):
//   kM16  (M <= 16):       swap AB, 64x16x128 tiles of out^T, one consumer warpgroup,
//                          clusters of 2 along the weight (the token tile is multicast);
//   kM64  (16 < M <= 64):  swap AB, 64x64x128 tiles of out^T, likewise;
//   kM128 (64 < M <= 128): 64x128x128 ping-pong, persistent, clusters of 2 along M (the
//                          weight tile is multicast to both token halves);
//   kLarge (M > 128):      128x128x128 cooperative, persistent, clusters of 2 along M. Not
//                          ping-pong 128x128 (vLLM's choice, with fast accumulation): the FP8
//                          mainloop keeps an MMA and a promoted fp32 set, 2 x 128 registers per
//                          thread for a warpgroup's own 128x128 tile, past the 240 it may take.
// Swap AB (the decode path): out^T [N, M] = b^T a^T, so the weight's N rows fill the 64-row WGMMA
// M and the few tokens are the MMA's N; N/64 CTAs stream the weight through deep TMA pipelines
// (10 KB per stage at 64x16: ~20 stages). The same operands serve: the weight [N, K] and a [M, K]
// are both K-major, and out [M, N] row-major is out^T column-major with ld N. The epilogue's
// broadcasts swap with them: scale_b and bias become column vectors, scale_a a row vector.
#pragma once

#include "fp8_cutlass.cuh"

namespace fp8_scaled_mm_detail {

using namespace cute;
namespace fusion = cutlass::epilogue::fusion;

// The epilogue's operands along the tile's M (a column vector) and N (a row vector). A bool
// stride is a vector (true) or a scalar (false) chosen at run time.
template <class Tile, class T, class Stride, int kAlign>
using Col = fusion::Sm90ColBroadcast<0, Tile, T, float, Stride, kAlign>;
template <class Tile, class T, class Stride, int kAlign>
using Row = fusion::Sm90RowBroadcast<0, Tile, T, float, Stride, kAlign>;

template <class OutT, class Tile, class Cluster, class Schedule, class EpiSchedule,
          class Scheduler, bool kSwapAB>
struct Gemm {
  using Fp8 = cutlass::float_e4m3_t;
  static constexpr bool kSwap = kSwapAB;
  static constexpr int kAlignAB = 16, kAlignD = 16 / sizeof(OutT);
  using ColScale = Stride<bool, _0, int64_t>;
  using RowScale = Stride<_0, bool, int64_t>;
  // Tokens along the tile's M (rows), channels along N; swapped, the other way round.
  using ScaleA = cute::conditional_t<kSwap, Row<Tile, float, RowScale, 1>,
                                     Col<Tile, float, ColScale, 1>>;
  using ScaleB = cute::conditional_t<kSwap, Col<Tile, float, ColScale, 1>,
                                     Row<Tile, float, RowScale, 4>>;
  using Bias = cute::conditional_t<kSwap, Col<Tile, OutT, Stride<_1, _0, int64_t>, kAlignD>,
                                   Row<Tile, OutT, Stride<_0, _1, int64_t>, kAlignD>>;
  using Mul = fusion::Sm90Compute<cutlass::multiplies, float, float,
                                  cutlass::FloatRoundStyle::round_to_nearest>;
  using MulAdd = fusion::Sm90Compute<cutlass::multiply_add, OutT, float,
                                     cutlass::FloatRoundStyle::round_to_nearest>;
  using Tree = fusion::Sm90EVT<MulAdd, ScaleA, fusion::Sm90EVT<Mul, ScaleB, fusion::Sm90AccFetch>,
                               Bias>;
  // out [M, N] row-major; swapped, the kernel's D is out^T [N, M] column-major (same bytes).
  using LayoutD =
      cute::conditional_t<kSwap, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD, kAlignD, OutT,
      LayoutD, kAlignD, EpiSchedule, Tree>::CollectiveOp;
  // Both operands are K-major either way: a [M, K] (or the weight [N, K] when swapped) as a
  // row-major A, the weight (or a) as a column-major [K, *] B.
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

template <class OutT, class TokenTile>
using SwapAB = Gemm<OutT, Shape<_64, TokenTile, _128>, Shape<_2, _1, _1>,
                    cutlass::gemm::KernelTmaWarpSpecialized,
                    cutlass::epilogue::TmaWarpSpecialized, void, true>;
template <class OutT>
using M16 = SwapAB<OutT, _16>;
template <class OutT>
using M64 = SwapAB<OutT, _64>;
template <class OutT>
using M128 = Gemm<OutT, Shape<_64, _128, _128>, Shape<_2, _1, _1>,
                  cutlass::gemm::KernelTmaWarpSpecializedPingpong,
                  cutlass::epilogue::TmaWarpSpecialized, cutlass::gemm::PersistentScheduler,
                  false>;
template <class OutT>
using Large = Gemm<OutT, Shape<_128, _128, _128>, Shape<_2, _1, _1>,
                   cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                   cutlass::epilogue::TmaWarpSpecializedCooperative,
                   cutlass::gemm::PersistentScheduler, false>;

struct Problem : fp8_gemm::Operands {
  const void* bias;
  bool row_scale_a, col_scale_b;
};

// The packed stride of D with its one dynamic (leading) dimension set: mode 0 of a row-major
// (ld, _1, 0), mode 1 of a column-major (_1, ld, 0).
template <class Stride>
inline Stride leading_stride(int64_t ld) {
  Stride s{};
  if constexpr (cute::is_static_v<cute::remove_cvref_t<decltype(cute::get<0>(s))>>) {
    cute::get<1>(s) = ld;
  } else {
    cute::get<0>(s) = ld;
  }
  return s;
}

template <class Config>
void launch(const char* op, const Problem& p, const kernels::Launch& ctx) {
  using Device = typename Config::Device;
  using Kernel = typename Config::Kernel;
  using OutT = typename Device::ElementD;
  using Fp8 = cutlass::float_e4m3_t;
  constexpr bool kSwap = Config::kSwap;
  // Swapped: A is the weight [N, K], B is a [M, K], D is out^T [N, M].
  const void* mma_a = kSwap ? p.b : p.a;
  const void* mma_b = kSwap ? p.a : p.b;
  typename Kernel::StrideA stride_a =
      fp8_gemm::row_stride<typename Kernel::StrideA>(kSwap ? p.ldb : p.lda);
  typename Kernel::StrideB stride_b =
      fp8_gemm::row_stride<typename Kernel::StrideB>(kSwap ? p.lda : p.ldb);
  typename Kernel::StrideD stride_d = leading_stride<typename Kernel::StrideD>(p.n);
  typename Device::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGemm,
      {kSwap ? p.n : p.m, kSwap ? p.m : p.n, p.k, 1},
      {static_cast<const Fp8*>(mma_a), stride_a, static_cast<const Fp8*>(mma_b), stride_b},
      {{}, nullptr, stride_d, static_cast<OutT*>(p.out), stride_d},
      fp8_gemm::hardware(ctx)};
  using ScaleAStride = typename Config::ScaleA::StrideMNL;
  using ScaleBStride = typename Config::ScaleB::StrideMNL;
  ScaleAStride stride_sa{};
  ScaleBStride stride_sb{};
  if constexpr (kSwap) {
    cute::get<1>(stride_sa) = p.row_scale_a;
    cute::get<0>(stride_sb) = p.col_scale_b;
  } else {
    cute::get<0>(stride_sa) = p.row_scale_a;
    cute::get<1>(stride_sb) = p.col_scale_b;
  }
  args.epilogue.thread = {{p.scale_a, 0.0f, stride_sa},
                          {{p.scale_b, 0.0f, stride_sb}, {}, {}},
                          {static_cast<const OutT*>(p.bias), OutT(0), {}},
                          {}};
  fp8_gemm::run<Device>(op, args, ctx);
}

enum Config { kM16 = 0, kM64 = 1, kM128 = 2, kLarge = 3 };

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
  const detail::Problem p{fp8_gemm::operands(out, a, b, scale_a, scale_b), bias_ptr,
                         scale_a.numel() != 1 || m == 1, scale_b.numel() != 1 || n == 1};
  if constexpr (kConfig == detail::kM16) {
    detail::launch<detail::M16<OutT>>(kOp, p, ctx);
  } else if constexpr (kConfig == detail::kM64) {
    detail::launch<detail::M64<OutT>>(kOp, p, ctx);
  } else if constexpr (kConfig == detail::kM128) {
    detail::launch<detail::M128<OutT>>(kOp, p, ctx);
  } else {
    static_assert(kConfig == detail::kLarge, "fp8_scaled_mm: unknown tile config");
    detail::launch<detail::Large<OutT>>(kOp, p, ctx);
  }
}
