// quantization.per_token_group_quant_8bit, CUDA: one scale per `group` consecutive elements of
// the last dim, a = max(eps, absmax), s = a / qmax (qmax 448 for fp8 e4m3, 127 for int8; rounded
// up to a power of two from the fp32 bits when ue8m0), q = cvt(x / s).
//
// Layout. A team of `tpg` lanes (a power of two <= 32: 16 for bf16 and group 128) owns a quad:
// the groups 4j..4j+3 of one row (those below G). Each lane loads its 16-byte vectors of the four
// groups at once (bf16, group 128: 4 x 16 B in flight per thread), reduces each group's absmax
// with shuffles inside the team, and writes its fp8/int8 packs (8 bytes per bf16 vector). Lane 0
// of the team writes the scales: four fp32 values through the scale view's strides (row-major,
// column-major, TMA-aligned: one kernel for all three), or the one int32 word of four UE8M0
// exponent bytes (packed layout, bytes of groups >= G zero). Blocks of 256 threads (16 teams
// of 16) take consecutive quads of a row (row-major scales: a block reads 16 KB of contiguous
// input) or one quad of consecutive rows (column-major scales: the block's scale stores are
// contiguous; each team still reads 1 KB of contiguous input).
// Rows: the leading dims of x, q and s merged into (outer, inner) levels (kernels::row_layout),
// so row-strided and 3-D views run in place. The scalar form (kN = 1) serves inputs whose rows
// are not in whole 16-byte vectors (misaligned views): 32 lanes per group, up to 8 elements each.
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(2);

#include <kernels/checks.h>
#include <kernels/dtype.h>
#include <kernels/launch.cuh>
#include <kernels/pdl.cuh>
#include <kernels/pointwise.cuh>
#include <kernels/rowwise.cuh>
#include <kernels/tensor.h>
#include <kernels/vec.cuh>

#include "quant_common.cuh"

namespace per_token_group_quant_8bit_detail {

constexpr int kBlock = 256;
constexpr int kGroupsPerQuad = 4;

struct Params {
  const void* x;
  uint8_t* q;
  void* s;  // float, or int32 words when packed
  kernels::RowMap x_map, q_map, s_map;
  uint32_t inner;
  int64_t s_group_stride;  // elements of s between consecutive groups (packed: words)
  // Team index -> (row, quad): quad-major over rows when the scales are column-major (the teams
  // of a block then write the scales of consecutive rows: 64 contiguous bytes per block and
  // quad instead of one scattered word per team), row-major otherwise.
  kernels::FastDivmod split;  // by quads per row, or by rows when rows_fast
  bool rows_fast;
  uint32_t quads;  // all rows
  int group;       // elements per group
  int groups;      // G
  int tpg, tpg_shift;
  int vpt;  // accesses per lane and group (<= kMaxVPG)
  float eps;
  float qmax;
  bool ue8m0;
  bool packed;
};

template <typename T, int kN, int kMaxVPG, bool kInt8>
__global__ void __launch_bounds__(kBlock) group_kernel(bool pdl, const __grid_constant__ Params p) {
  using P = kernels::Pack<T, kN>;
  const int lane = static_cast<int>(threadIdx.x) & (p.tpg - 1);
  const uint32_t team = blockIdx.x * (kBlock >> p.tpg_shift) + (threadIdx.x >> p.tpg_shift);
  const bool valid = team < p.quads;
  uint32_t row = 0, quad = 0;
  if (valid) {
    uint32_t hi, lo;
    p.split.divmod(team, hi, lo);
    row = p.rows_fast ? lo : hi;
    quad = p.rows_fast ? hi : lo;
  }
  const int first = static_cast<int>(quad) * kGroupsPerQuad;
  const int count = valid ? min(kGroupsPerQuad, p.groups - first) : 0;
  const T* x = static_cast<const T*>(p.x) + rowwise::row_offset(p.x_map, row, p.inner) +
               static_cast<int64_t>(first) * p.group;

  if (pdl) kernels::pdl_wait();
  P v[kGroupsPerQuad][kMaxVPG];
#pragma unroll
  for (int u = 0; u < kGroupsPerQuad; ++u) {
#pragma unroll
    for (int j = 0; j < kMaxVPG; ++j) {
      if (u < count && j < p.vpt) {
        v[u][j].load_stream(x + u * p.group + (lane + j * p.tpg) * kN);
      } else {
        v[u][j].zero();
      }
    }
  }
  uint32_t m[kGroupsPerQuad];
#pragma unroll
  for (int u = 0; u < kGroupsPerQuad; ++u) {
    m[u] = 0;
#pragma unroll
    for (int j = 0; j < kMaxVPG; ++j) {
      float f[kN];
      v[u][j].unpack(f);
      m[u] = quant::absmax_bits(f, m[u]);
    }
  }
  for (int offset = p.tpg >> 1; offset > 0; offset >>= 1) {
#pragma unroll
    for (int u = 0; u < kGroupsPerQuad; ++u)
      m[u] = max(m[u], __shfl_xor_sync(0xffffffffu, m[u], offset));
  }
  if (pdl) kernels::pdl_launch_dependents();
  if (!valid) return;
  float s[kGroupsPerQuad];
#pragma unroll
  for (int u = 0; u < kGroupsPerQuad; ++u) {
    s[u] = quant::dynamic_scale(m[u], p.eps, p.qmax);
    if (p.ue8m0) s[u] = quant::ue8m0_round_up(s[u]);
  }
  if (lane == 0) {
    const int64_t base = rowwise::row_offset(p.s_map, row, p.inner);
    if (p.packed) {
      uint32_t word = 0;
#pragma unroll
      for (int u = 0; u < kGroupsPerQuad; ++u)
        if (u < count) word |= quant::ue8m0_byte(s[u]) << (8 * u);
      static_cast<uint32_t*>(p.s)[base + static_cast<int64_t>(quad) * p.s_group_stride] = word;
    } else {
      float* out = static_cast<float*>(p.s) + base;
#pragma unroll
      for (int u = 0; u < kGroupsPerQuad; ++u)
        if (u < count) out[static_cast<int64_t>(first + u) * p.s_group_stride] = s[u];
    }
  }
  // Built after the scale stores so the scales leave before the reciprocals are computed.
  quant::Div div[kGroupsPerQuad] = {quant::Div(s[0]), quant::Div(s[1]), quant::Div(s[2]),
                                    quant::Div(s[3])};
  uint8_t* q = p.q + rowwise::row_offset(p.q_map, row, p.inner) +
               static_cast<int64_t>(first) * p.group;
#pragma unroll
  for (int u = 0; u < kGroupsPerQuad; ++u) {
#pragma unroll
    for (int j = 0; j < kMaxVPG; ++j) {
      if (u < count && j < p.vpt) {
        float f[kN];
        v[u][j].unpack(f);
        quant::Q8<kN> out;
        out.template quantize<kInt8>(f, div[u]);
        out.store_stream(q + u * p.group + (lane + j * p.tpg) * kN);
      }
    }
  }
}

template <typename T, bool kInt8>
inline void launch(const kernels::Launch& ctx, Params p, bool vector) {
  constexpr int kVec = kernels::kVectorBytes / static_cast<int>(sizeof(T));
  constexpr int kVectorVPG = sizeof(T) == 4 ? 2 : 1;  // fp32, group 256: 32 lanes x 2
  constexpr int kScalarVPG = 8;  // group 256: 32 lanes x 8 elements
  const int accesses = vector ? p.group / kVec : p.group;
  p.tpg = accesses < 32 ? accesses : 32;
  p.tpg_shift = rowwise::log2_exact(p.tpg);
  p.vpt = accesses / p.tpg;
  void (*kernel)(bool, Params) = vector ? group_kernel<T, kVec, kVectorVPG, kInt8>
                                        : group_kernel<T, 1, kScalarVPG, kInt8>;
  const unsigned teams = static_cast<unsigned>(kBlock / p.tpg);
  kernels::launch(ctx, kernel, kernels::ceil_div(p.quads, teams), kBlock, p);
}

}  // namespace per_token_group_quant_8bit_detail

// q: x's shape, float8_e4m3fn or int8 (contiguous last dim); s: [..., M, G] fp32 (packed:
// [..., M, ceil(G/4)] int32) with any strides (row-major, column-major or TMA-aligned views);
// x: [..., K] fp32/fp16/bf16, contiguous last dim, K % group_size == 0.
inline void per_token_group_quant_8bit(tvm::ffi::TensorView q, tvm::ffi::TensorView s,
                                       tvm::ffi::TensorView x, int64_t group_size, double eps,
                                       bool scale_ue8m0, bool pack_ue8m0) {
  namespace detail = per_token_group_quant_8bit_detail;
  constexpr const char* kOp = "quantization.per_token_group_quant_8bit";
  // 1. Validate.
  rowwise::check_rows(kOp, "x", x);
  kernels::check_same_shape(kOp, "q", q, "x", x);
  const bool int8 = kernels::is_dtype(q.dtype(), kDLInt, 8);
  TVM_FFI_CHECK(int8 || kernels::is_dtype(q.dtype(), kDLFloat8_e4m3fn, 8), TypeError)
      << kOp << ": q must have dtype float8_e4m3fn or int8";
  kernels::check_last_dim_contiguous(kOp, "q", q);
  TVM_FFI_CHECK(group_size == 16 || group_size == 32 || group_size == 64 || group_size == 128 ||
                    group_size == 256,
                ValueError)
      << kOp << ": group_size must be one of 16, 32, 64, 128, 256, got " << group_size;
  const int64_t k = x.size(-1);
  TVM_FFI_CHECK(k % group_size == 0, ValueError)
      << kOp << ": the last dim of x (" << k << ") must be a multiple of group_size ("
      << group_size << ")";
  TVM_FFI_CHECK(std::isfinite(eps) && eps > 0.0, ValueError)
      << kOp << ": eps must be a finite number > 0, got " << eps;
  TVM_FFI_CHECK(!pack_ue8m0 || scale_ue8m0, ValueError)
      << kOp << ": pack_ue8m0 needs scale_ue8m0";
  const int64_t groups = k / group_size;
  const int64_t width = pack_ue8m0 ? (groups + 3) / 4 : groups;
  bool shape_ok = s.ndim() == x.ndim() && s.size(-1) == width;
  for (int d = 0; shape_ok && d + 1 < x.ndim(); ++d) shape_ok = s.size(d) == x.size(d);
  TVM_FFI_CHECK(shape_ok, ValueError)
      << kOp << ": s must have shape [..., " << width << "] with the leading dims of x "
      << kernels::shape_string(x) << ", got " << kernels::shape_string(s);
  TVM_FFI_CHECK(pack_ue8m0 ? kernels::is_dtype(s.dtype(), kDLInt, 32)
                           : kernels::is_dtype(s.dtype(), kDLFloat, 32),
                TypeError)
      << kOp << ": s must have dtype " << (pack_ue8m0 ? "int32 (packed UE8M0)" : "float32");
  kernels::check_no_overlap(kOp, "q", q, "x", x);
  kernels::check_no_overlap(kOp, "s", s, "x", x);
  kernels::check_no_overlap(kOp, "s", s, "q", q);
  const kernels::RowLayout rows = kernels::row_layout(kOp, "x", {&x, &q, &s});
  kernels::check_device(kOp, "x", x, kDLCUDA);
  kernels::check_same_device(kOp, "q", q, "x", x);
  kernels::check_same_device(kOp, "s", s, "x", x);
  if (rows.rows() == 0 || k == 0) return;
  const int64_t quads = rows.rows() * ((groups + 3) / 4);
  TVM_FFI_CHECK(quads < (int64_t{1} << 31), ValueError)
      << kOp << ": x " << kernels::shape_string(x) << " has too many groups";

  detail::Params p{};
  p.x = kernels::data(x);
  p.q = kernels::data<uint8_t>(q);
  p.s = kernels::data(s);
  p.x_map = rows.map[0];
  p.q_map = rows.map[1];
  p.s_map = rows.map[2];
  p.inner = static_cast<uint32_t>(rows.inner);
  p.s_group_stride = s.size(-1) > 1 ? s.stride(-1) : 0;
  // Column-major scales (M, dim -2 of s, is the stride-1 dim): walk the rows fastest.
  p.rows_fast = s.ndim() >= 2 && s.size(-2) > 1 && s.stride(-2) == 1 && rows.rows() > 1;
  p.split = kernels::FastDivmod(
      static_cast<uint32_t>(p.rows_fast ? rows.rows() : (groups + 3) / 4));
  p.quads = static_cast<uint32_t>(quads);
  p.group = static_cast<int>(group_size);
  p.groups = static_cast<int>(groups);
  p.eps = static_cast<float>(eps);
  p.qmax = int8 ? quant::kInt8Max : quant::kFp8Max;
  p.ue8m0 = scale_ue8m0;
  p.packed = pack_ue8m0;
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(x);
  const kernels::Launch ctx(kOp, x);
  // 4. Dispatch on dtype and launch (checked).
  KERNELS_DISPATCH_FLOAT(x.dtype(), kOp, T, [&] {
    constexpr int kVec = kernels::kVectorBytes / static_cast<int>(sizeof(T));
    const bool vector = kernels::vectors_fit(k, kVec, {p.x}, {p.x_map}) &&
                        reinterpret_cast<uintptr_t>(p.q) % kVec == 0 &&
                        p.q_map.s0 % kVec == 0 && p.q_map.s1 % kVec == 0;
    if (int8) {
      detail::launch<T, true>(ctx, p, vector);
    } else {
      detail::launch<T, false>(ctx, p, vector);
    }
  });
}
