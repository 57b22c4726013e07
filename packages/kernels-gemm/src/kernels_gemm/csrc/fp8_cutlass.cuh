// The CUTLASS 3.x (sm90a) pieces the fp8 GEMMs share: headers, fp8 operand checks and a run that
// takes no workspace and launches on the caller's stream. The CUTLASS headers come from the
// nvidia-cutlass distribution (ModuleSpec.dist_include_dirs in the op files).
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(2);

#include <kernels/checks.h>
#include <kernels/dtype.h>
#include <kernels/launch.cuh>
#include <kernels/tensor.h>

#include <cstdint>
#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/operations.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>

namespace fp8_gemm {

inline bool is_fp8(const tvm::ffi::TensorView& t) {
  return kernels::is_dtype(t.dtype(), kDLFloat8_e4m3fn, 8);
}

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// a [M, K] fp8 with stride 1 along K, b [K, N] fp8 with stride 1 along K (w.t() of a row-major
// [N, K] weight), out [M, N] contiguous: the TMA operands. K and N multiples of 16, every row
// start 16-byte aligned.
inline void check_operands(const char* op, const tvm::ffi::TensorView& out,
                           const tvm::ffi::TensorView& a, const tvm::ffi::TensorView& b) {
  kernels::check_ndim(op, "a", a, 2);
  kernels::check_ndim(op, "b", b, 2);
  kernels::check_ndim(op, "out", out, 2);
  TVM_FFI_CHECK(is_fp8(a), TypeError) << op << ": a must have dtype float8_e4m3fn";
  TVM_FFI_CHECK(is_fp8(b), TypeError) << op << ": b must have dtype float8_e4m3fn";
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  TVM_FFI_CHECK(b.size(0) == k, ValueError)
      << op << ": a [M, K] and b [K, N] must share K, got a " << kernels::shape_string(a)
      << " and b " << kernels::shape_string(b);
  TVM_FFI_CHECK(out.size(0) == m && out.size(1) == n, ValueError)
      << op << ": out must have shape [" << m << ", " << n << "], got "
      << kernels::shape_string(out);
  TVM_FFI_CHECK(k % 16 == 0 && n % 16 == 0, ValueError)
      << op << ": the CUDA path needs K and N multiples of 16, got K=" << k << ", N=" << n;
  TVM_FFI_CHECK(a.stride(1) == 1 && a.stride(0) % 16 == 0 && a.stride(0) >= k, ValueError)
      << op << ": a must be row-major with a row stride that is a multiple of 16";
  TVM_FFI_CHECK(b.stride(0) == 1 && b.stride(1) % 16 == 0 && b.stride(1) >= k, ValueError)
      << op << ": b must be column-major (w.t()) with a column stride that is a multiple of 16";
  kernels::check_contiguous(op, "out", out);
  TVM_FFI_CHECK(aligned16(a.data_ptr()) && aligned16(b.data_ptr()) && aligned16(out.data_ptr()),
                ValueError)
      << op << ": a, b and out must start on 16-byte boundaries";
  TVM_FFI_CHECK(m < (int64_t{1} << 31) && n < (int64_t{1} << 31) && k < (int64_t{1} << 31),
                ValueError)
      << op << ": M, N and K must each be below 2^31";
  kernels::check_device(op, "a", a, kDLCUDA);
  kernels::check_same_device(op, "b", b, "a", a);
  kernels::check_same_device(op, "out", out, "a", a);
}

// What every fp8 GEMM launch reads of its checked operands: sizes, the leading strides of a
// (row-major) and b (column-major), the pointers and the fp32 scales. A GEMM's Problem derives
// from it and adds its own fields.
struct Operands {
  int m, n, k;
  int64_t lda, ldb;
  const void *a, *b;
  const float *scale_a, *scale_b;
  void* out;
};

inline Operands operands(const tvm::ffi::TensorView& out, const tvm::ffi::TensorView& a,
                         const tvm::ffi::TensorView& b, const tvm::ffi::TensorView& scale_a,
                         const tvm::ffi::TensorView& scale_b) {
  return {static_cast<int>(a.size(0)),
          static_cast<int>(b.size(1)),
          static_cast<int>(a.size(1)),
          a.stride(0),
          b.stride(1),
          a.data_ptr(),
          b.data_ptr(),
          static_cast<const float*>(scale_a.data_ptr()),
          static_cast<const float*>(scale_b.data_ptr()),
          out.data_ptr()};
}

// The stride of a row-major [rows, cols] operand (CUTLASS's (ld, _1, 0) packed form with ld set).
template <class Stride>
inline Stride row_stride(int64_t ld) {
  Stride s{};
  cute::get<0>(s) = ld;
  return s;
}

// can_implement, initialize (TMA descriptors, kernel attributes) and run on the caller's stream.
// The kernels the op files choose take no workspace: no allocation here.
template <class Gemm>
inline void run(const char* op, const typename Gemm::Arguments& args, const kernels::Launch& ctx) {
  Gemm gemm;
  cutlass::Status status = Gemm::can_implement(args);
  TVM_FFI_CHECK(status == cutlass::Status::kSuccess, ValueError)
      << op << ": the CUTLASS kernel cannot take this problem (" << cutlassGetStatusString(status)
      << ")";
  TVM_FFI_CHECK(Gemm::get_workspace_size(args) == 0, RuntimeError)
      << op << ": internal error: the chosen CUTLASS kernel needs a workspace";
  status = gemm.initialize(args, nullptr, ctx.stream);
  TVM_FFI_CHECK(status == cutlass::Status::kSuccess, RuntimeError)
      << op << ": CUTLASS initialize failed (" << cutlassGetStatusString(status) << ")";
  status = gemm.run(ctx.stream);
  kernels::check_launch(op);
  TVM_FFI_CHECK(status == cutlass::Status::kSuccess, RuntimeError)
      << op << ": CUTLASS launch failed (" << cutlassGetStatusString(status) << ")";
}

inline cutlass::KernelHardwareInfo hardware(const kernels::Launch& ctx) {
  cutlass::KernelHardwareInfo hw;
  hw.device_id = ctx.device;
  hw.sm_count = kernels::sm_count(ctx.device);
  return hw;
}

}  // namespace fp8_gemm
