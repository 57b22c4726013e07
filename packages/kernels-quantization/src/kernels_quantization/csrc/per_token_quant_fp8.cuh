// quantization.per_token_quant_fp8, CUDA: per row of x [T, K], s = max(absmax, 1e-10) / 448 and
// q = cvt_satfinite_rne(x / s) (fp8 e4m3), one read of x and one write of q.
//
//   - register kernel: the row read once into registers and quantized from them. A thread holds
//     pieces of 16 consecutive elements (two 16-byte loads for bf16/fp16, four for fp32), pieces
//     lane, lane + tpr, ... of the row, and writes each piece's codes with one 16-byte store
//     (rows whose q is only 8/4-byte aligned: per-vector stores). Many rows: 4 pieces per thread
//     (bf16 7168: 448 pieces, 128 threads, 8 x 16 B of loads in flight per thread, all issued
//     before the first maximum); few rows (decode, <= 2 per SM): one piece per thread (448
//     threads at 7168), the least serial work per thread. Rows of <= 32 threads: shuffles,
//     several rows per block; longer rows: shuffles plus one shared-memory step. The absmax of
//     16-bit inputs is taken in their own format (one AND and half a VIMNMX3.U16x2 per two
//     elements) and the division is Div's fast path alone (the row's own scale bounds every
//     quotient: quant::Q8::quantize_bounded): ~6 instructions per element instead of ~16, which
//     had left the SM's issue slots a limit at 8192 x 7168;
//   - loop kernel: rows longer than the register kernel holds (32768 bf16/fp16, 16384 fp32), or
//     not in whole vectors (misaligned views, odd widths: the scalar form); two passes, the
//     second re-reading the row from L1/L2.
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(3);

#include <kernels/rowwise.cuh>

#include "quant_common.cuh"

namespace per_token_quant_fp8_detail {

struct Params {
  const void* x;
  uint8_t* q;
  float* s;
  int64_t x_stride, q_stride, s_stride;  // row strides in elements
  int64_t rows;
  int hidden;
  int tpr, tpr_shift, rows_per_block;
  bool q16;  // q and its row stride 16-byte aligned: 16-byte stores of whole pieces
};

constexpr float kEps = 1e-10f;
// Elements of a piece: one 16-byte store of codes.
constexpr int kPieceElems = 16;
// Pieces per thread at most: 4 (bf16/fp16: 8 vectors, 32 registers), 2 for fp32 (8 vectors).
template <typename T>
constexpr int kMaxPieces = sizeof(T) == 4 ? 2 : 4;

template <typename T, int kN, int kPPT>
__global__ void __launch_bounds__(rowwise::kMaxBlock)
    registers_kernel(bool pdl, const __grid_constant__ Params p) {
  using P = kernels::Pack<T, kN>;
  constexpr int kA = kPieceElems / kN;  // vectors per piece
  __shared__ uint32_t shared[32];
  const rowwise::RowThread th = rowwise::row_thread(p.tpr, p.tpr_shift, p.rows_per_block);
  const bool valid = th.row < p.rows;
  const int vectors = valid ? p.hidden / kN : 0;
  const T* x = static_cast<const T*>(p.x) + (valid ? th.row * p.x_stride : 0);

  if (pdl) kernels::pdl_wait();
  P v[kPPT][kA];
#pragma unroll
  for (int j = 0; j < kPPT; ++j) {
#pragma unroll
    for (int a = 0; a < kA; ++a) {
      const int i = (th.lane + j * p.tpr) * kA + a;
      if (i < vectors) {
        v[j][a].load_stream(x + i * kN);
      } else {
        v[j][a].zero();
      }
    }
  }
  quant::Absmax<T, kN> am;
#pragma unroll
  for (int j = 0; j < kPPT; ++j)
#pragma unroll
    for (int a = 0; a < kA; ++a) am.add(v[j][a]);
  uint32_t m = am.bits();
  m = p.tpr <= 32 ? quant::lanes_max(m, p.tpr) : quant::block_max(m, shared);
  if (pdl) kernels::pdl_launch_dependents();
  if (!valid) return;
  const float s = quant::dynamic_scale(m, kEps, quant::kFp8Max);
  if (th.lane == 0) p.s[th.row * p.s_stride] = s;
  const quant::Div div(s);
  uint8_t* q = p.q + th.row * p.q_stride;
#pragma unroll
  for (int j = 0; j < kPPT; ++j) {
    const int first = (th.lane + j * p.tpr) * kA;  // the piece's first vector
    if (first >= vectors) break;
    float f[kPieceElems];
    quant::unpack_piece(v[j], f);
    quant::Q8<kPieceElems> out;
    out.template quantize_bounded<false>(f, div);
    uint8_t* dst = q + first * kN;
    if (p.q16 && first + kA <= vectors) {
      out.store_stream(dst);
    } else {
      // A piece cut by the row's end, or q only kN-byte aligned: one store per vector.
#pragma unroll
      for (int a = 0; a < kA; ++a) {
        if (first + a < vectors) out.template store_part_stream<kN>(dst + a * kN, a);
      }
    }
  }
}

template <typename T, int kN>
__global__ void __launch_bounds__(rowwise::kMaxBlock)
    loop_kernel(bool pdl, const __grid_constant__ Params p) {
  using P = kernels::Pack<T, kN>;
  constexpr int kBatch = rowwise::kLoopBatch;
  __shared__ uint32_t shared[32];
  const rowwise::RowThread th = rowwise::row_thread(p.tpr, p.tpr_shift, p.rows_per_block);
  const bool valid = th.row < p.rows;
  const int n = valid ? p.hidden / kN : 0;
  const T* x = static_cast<const T*>(p.x) + (valid ? th.row * p.x_stride : 0);
  const int step = p.tpr;

  if (pdl) kernels::pdl_wait();
  uint32_t m = 0;
  for (int base = th.lane; base < n; base += kBatch * step) {
    P v[kBatch];
    m = quant::load_absmax(v, m, [&](int u, P& pack) {
      const int i = base + u * step;
      if (i >= n) return false;
      pack.load(x + i * kN);
      return true;
    });
  }
  m = p.tpr <= 32 ? quant::lanes_max(m, p.tpr) : quant::block_max(m, shared);
  if (pdl) kernels::pdl_launch_dependents();
  if (!valid) return;
  const float s = quant::dynamic_scale(m, kEps, quant::kFp8Max);
  if (th.lane == 0) p.s[th.row * p.s_stride] = s;
  const quant::Div div(s);
  uint8_t* q = p.q + th.row * p.q_stride;
  for (int base = th.lane; base < n; base += kBatch * step) {
    P v[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = base + u * step;
      if (i < n) v[u].load_stream(x + i * kN);
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = base + u * step;
      if (i < n) {
        float f[kN];
        v[u].unpack(f);
        quant::Q8<kN> out;
        out.template quantize_bounded<false>(f, div);
        out.store_stream(q + i * kN);
      }
    }
  }
}

template <typename T>
inline void launch(const kernels::Launch& ctx, Params p, bool vector) {
  constexpr int kVec = kernels::kVectorBytes / static_cast<int>(sizeof(T));
  constexpr int kMax = kMaxPieces<T>;
  const int vectors = p.hidden / kVec;
  const int64_t pieces = (int64_t{vectors} * kVec + kPieceElems - 1) / kPieceElems;
  rowwise::Plan plan;
  void (*kernel)(bool, Params) = nullptr;
  if (vector && pieces <= int64_t{rowwise::kMaxBlock} * kMax) {
    // Pieces are the plan's units; one per thread at decode (the least serial work per thread).
    plan = rowwise::plan_registers(pieces, p.rows, ctx.device, kMax, 1);
    switch (plan.vectors_per_thread) {
      case 1:
        kernel = registers_kernel<T, kVec, 1>;
        break;
      case 2:
        kernel = registers_kernel<T, kVec, 2>;
        break;
      default:
        kernel = registers_kernel<T, kVec, kMax>;
        break;
    }
  } else if (vector) {
    plan = rowwise::plan_loop(vectors, p.rows, ctx.device);
    kernel = loop_kernel<T, kVec>;
  } else {
    plan = rowwise::plan_loop(p.hidden, p.rows, ctx.device);
    kernel = loop_kernel<T, 1>;
  }
  p.tpr = plan.tpr;
  p.tpr_shift = plan.tpr_shift;
  p.rows_per_block = plan.rows_per_block;
  kernels::launch(ctx, kernel, plan.grid, plan.block, p);
}

inline bool is_fp8_e4m3fn(const tvm::ffi::TensorView& t) {
  return kernels::is_dtype(t.dtype(), kDLFloat8_e4m3fn, 8);
}

}  // namespace per_token_quant_fp8_detail

// q: [T, K] float8_e4m3fn, s: [T, 1] float32 (any row stride), x: [T, K] fp32/fp16/bf16; x and q
// with a contiguous last dim and any row stride.
inline void per_token_quant_fp8(tvm::ffi::TensorView q, tvm::ffi::TensorView s,
                                tvm::ffi::TensorView x) {
  namespace detail = per_token_quant_fp8_detail;
  constexpr const char* kOp = "quantization.per_token_quant_fp8";
  // 1. Validate.
  rowwise::check_rows(kOp, "x", x);
  kernels::check_ndim(kOp, "x", x, 2);
  kernels::check_ndim(kOp, "q", q, 2);
  kernels::check_same_shape(kOp, "q", q, "x", x);
  TVM_FFI_CHECK(detail::is_fp8_e4m3fn(q), TypeError) << kOp << ": q must have dtype float8_e4m3fn";
  kernels::check_last_dim_contiguous(kOp, "q", q);
  TVM_FFI_CHECK(kernels::is_dtype(s.dtype(), kDLFloat, 32), TypeError)
      << kOp << ": s must have dtype float32";
  TVM_FFI_CHECK(s.ndim() == 2 && s.size(0) == x.size(0) && s.size(1) == 1, ValueError)
      << kOp << ": s must have shape [" << x.size(0) << ", 1], got " << kernels::shape_string(s);
  kernels::check_no_overlap(kOp, "q", q, "x", x);
  kernels::check_no_overlap(kOp, "s", s, "x", x);
  kernels::check_no_overlap(kOp, "s", s, "q", q);
  kernels::check_device(kOp, "x", x, kDLCUDA);
  kernels::check_same_device(kOp, "q", q, "x", x);
  kernels::check_same_device(kOp, "s", s, "x", x);
  const int64_t rows = x.size(0), hidden = x.size(1);
  if (rows == 0 || hidden == 0) return;
  TVM_FFI_CHECK(rows < (int64_t{1} << 31), ValueError) << kOp << ": too many rows (" << rows << ")";

  detail::Params p{};
  p.x = kernels::data(x);
  p.q = kernels::data<uint8_t>(q);
  p.s = kernels::data<float>(s);
  p.x_stride = rows > 1 ? x.stride(0) : 0;
  p.q_stride = rows > 1 ? q.stride(0) : 0;
  p.s_stride = rows > 1 ? s.stride(0) : 0;
  p.rows = rows;
  p.hidden = static_cast<int>(hidden);
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(x);
  const kernels::Launch ctx(kOp, x);
  // 4. Dispatch on dtype and launch (checked).
  KERNELS_DISPATCH_FLOAT(x.dtype(), kOp, T, [&] {
    constexpr int kVec = kernels::kVectorBytes / static_cast<int>(sizeof(T));
    const bool vector = kernels::vectors_fit(hidden, kVec, {p.x}, {kernels::RowMap{p.x_stride, 0}}) &&
                        reinterpret_cast<uintptr_t>(p.q) % kVec == 0 && p.q_stride % kVec == 0;
    p.q16 = reinterpret_cast<uintptr_t>(p.q) % 16 == 0 && p.q_stride % 16 == 0;
    detail::launch<T>(ctx, p, vector);
  });
}
