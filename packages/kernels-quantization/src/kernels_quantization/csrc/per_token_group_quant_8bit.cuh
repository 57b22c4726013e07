// quantization.per_token_group_quant_8bit, CUDA: one scale per `group` consecutive elements of
// the last dim, a = max(eps, absmax), s = a / qmax (qmax 448 for fp8 e4m3, 127 for int8; rounded
// up to a power of two from the fp32 bits when ue8m0), q = cvt(x / s).
//
// Layout (vector rows). A group is cut into pieces of 16 consecutive elements (two 16-byte loads
// for bf16/fp16, four for fp32); each piece's 16 fp8/int8 codes go out with one 16-byte store
// (8- or 4-byte stores where q's rows are not 16-byte aligned). A team of tpg lanes owns a
// group, lane l holding pieces l, l + tpg, ... in registers: bf16 g128 in the throughput plan is
// 4 lanes x 2 pieces (4 x 16 B of loads in flight per lane, all issued before the first maximum;
// 2 xor-shuffle steps for the group's absmax), in the decode plan 8 lanes x 1 piece. The absmax
// of 16-bit inputs stays in 16-bit form (one AND and half a VIMNMX3.U16x2 per two elements) and
// the division is Div's fast path alone (the group's own scale bounds every quotient, see
// quant::Q8::quantize_bounded): ~12 instructions per element all in, against ~18 in the kernel
// this replaced (per-element overflow checks and branches, 8 elements per lane to amortise each
// group's scale), whose issue slots, not bytes in flight, were the limit at 8192 x 7168.
// Lane 0 of the team writes the scale through the scale view's strides (row-major, column-major,
// TMA-aligned: one kernel for all three), or, packed, its UE8M0 byte of the int32 word (a byte
// store; the team of the row's last group also zeroes the word's bytes of groups >= G).
// Groups are numbered tile by tile: a tile is R consecutive rows, its groups in order, the R
// rows of each group fastest. Row-major scales: R = 1 (plain row-major order). Column-major
// scales: R = the groups a warp takes (kU x 32 / tpg; 8 for bf16 g128), so one warp holds one
// group of R consecutive rows and its scale stores are one run of R consecutive floats (32 B for
// R = 8), while a block reads R rows of x in runs of (its groups / R) x group elements (2 KB for
// bf16 g128) and the grid sweeps x tile after tile, as row-major does. (Numbering the rows
// fastest over all rows, as this kernel did, read x and wrote q in 256 / 128-byte pieces
// 14 KB apart and swept each group column over all rows before the next.) The last tile is
// padded to R rows; teams of rows >= M are idle.
// Launch plans, one-shot blocks (no grid-stride loop: the shape of the static per-tensor kernel,
// 92% of copy at 8192 x 7168):
//   - throughput: 256-thread blocks, bf16 g128: 64 groups (16 KB of x) per block;
//   - decode (team threads <= 1024 per SM): 128-thread blocks, one piece per lane, so that small
//     problems spread over as many SMs as possible (T = 1 x 7168: 56 groups x 8 lanes, 4 blocks).
// Optional modes: fuse_silu_and_mul (x [..., 2K]: each lane also loads x2, K elements on, and
// quantizes silu(x1) * x2 computed in fp32 and rounded to T, as an unfused silu_and_mul writes
// it) and masked rows (x [E, T_pad, K]: a team whose row has t >= masked_m[e], read on the
// device after the PDL wait, skips its loads and stores).
// Rows: the leading dims of x, q and s merged into (outer, inner) levels (kernels::row_layout),
// so row-strided and 3-D views run in place. The scalar form (kN = 1) serves inputs whose rows
// are not in whole 16-byte vectors (misaligned views): min(group, 32) lanes per group, the
// elements interleaved (coalesced scalar accesses), up to 8 per lane.
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
constexpr int kDecodeBlock = 128;
// Elements of a piece on the vector path: one 16-byte store of codes.
constexpr int kLaneElems = 16;
// Pieces per lane and group in the throughput plan (bf16 g128: 4 lanes x 2 pieces, 4 x 16 B of
// loads in flight per lane; fp32: 8 x 16 B).
constexpr int kMaxPieces = 2;
// Scalar (misaligned) form: up to 8 elements per lane and group, 4 groups per team.
constexpr int kScalarElems = 8;
constexpr int kScalarGroups = 4;
// The decode plan serves problems of at most this many team threads per SM (half the 2048 an SM
// holds): all of them resident at once.
constexpr int kDecodeThreadsPerSm = 1024;

struct Params {
  const void* x;
  uint8_t* q;
  void* s;  // float, or int32 words when packed
  kernels::RowMap x_map, q_map, s_map;
  kernels::FastDivmod inner_div;  // rows -> (outer, inner) of the maps
  int64_t s_group_stride;  // elements of s between consecutive groups (packed: words)
  // Group number -> (tile of R = 2^tile_shift rows, group, row in the tile): split by R x G.
  kernels::FastDivmod split;
  int tile_shift;
  uint32_t rows;   // M over all leading dims
  uint32_t items;  // ceil(rows / R) x R x G
  int group;       // elements per group
  int groups;      // G
  int tpg, tpg_shift;  // lanes per group (a power of two <= 32)
  int ppl;             // pieces per lane and group used (<= kP)
  bool q16;        // q's rows (and so every group) 16-byte aligned: 16-byte code stores
  int64_t half;    // fuse_silu_and_mul: elements from x1 to x2 (K); 0 otherwise
  // Masked EP layout: rows are (expert, token) with t_pad tokens per expert; rows with
  // token >= masked_m[expert] are skipped (nullptr: no mask).
  const int32_t* masked_m;
  kernels::FastDivmod t_pad;
  float eps;
  float qmax;
  bool ue8m0;
  bool packed;
};

// silu(a) * b in fp32 (silu as torch computes it: a / (1 + exp(-a)), IEEE division), rounded to
// T: the value an unfused silu_and_mul writes and the quantization then reads.
template <typename T, int kN>
__device__ __forceinline__ void silu_mul(kernels::Pack<T, kN>& a, const kernels::Pack<T, kN>& b) {
  using Value = typename kernels::Pack<T, kN>::Value;
  Value fa[kN], fb[kN];
  a.unpack(fa);
  b.unpack(fb);
#pragma unroll
  for (int k = 0; k < kN; ++k) {
    const float v = static_cast<float>(fa[k]);
    fa[k] = __fmul_rn(__fdiv_rn(v, __fadd_rn(1.0f, expf(-v))), static_cast<float>(fb[k]));
  }
  a.pack(fa);
}

// Element offset of row `row` in a tensor with row map m (rows split by `inner`, see
// kernels::row_layout): the division once per row for x, q and s together.
struct RowPos {
  uint32_t outer, inner;
  __device__ __forceinline__ RowPos(uint32_t row, const kernels::FastDivmod& inner_div) {
    inner_div.divmod(row, outer, inner);
  }
  __device__ __forceinline__ int64_t offset(const kernels::RowMap& m) const {
    return static_cast<int64_t>(outer) * m.s0 + static_cast<int64_t>(inner) * m.s1;
  }
};

// kN: elements per access (a 16-byte vector, or 1: the scalar form); kA: accesses per piece (the
// vector form: kLaneElems / kN; the scalar form: 1); kP: pieces per lane and group (at most; p.ppl
// used); kU: groups per team.
//   vector: piece i of a group = its elements [16 i, 16 i + 16); lane l of the team holds pieces
//     l, l + tpg, ... (each warp-wide access is tpg-lane runs of 16-byte loads, 32 bytes apart,
//     the next access filling the gaps) and stores each as one 16-byte word of codes;
//   scalar: lane l holds elements l, l + tpg, ... (coalesced 2/4-byte accesses), one byte stores.
template <typename T, int kN, int kA, int kP, int kU, int kThreads, bool kInt8, bool kFused>
__global__ void __launch_bounds__(kThreads) group_kernel(bool pdl, const __grid_constant__ Params p) {
  using P = kernels::Pack<T, kN>;
  constexpr bool kVector = kN > 1;
  constexpr int kPieceElems = kA * kN;
  static_assert(!kVector || kPieceElems == kLaneElems, "16-element pieces on the vector path");
  static_assert(kVector || kA == 1, "one element per piece on the scalar path");
  const int tpg = p.tpg;
  const int lane = static_cast<int>(threadIdx.x) & (tpg - 1);
  const uint32_t tpw = 32u >> p.tpg_shift;  // teams per warp
  const uint32_t warp = blockIdx.x * static_cast<uint32_t>(kThreads / 32) + (threadIdx.x >> 5);
  const uint32_t first = warp * kU * tpw + ((threadIdx.x & 31u) >> p.tpg_shift);

  if (pdl) kernels::pdl_wait();
  bool valid[kU];
  uint32_t row[kU], grp[kU];
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    const uint32_t item = first + u * tpw;
    valid[u] = item < p.items;
    row[u] = 0;
    grp[u] = 0;
    if (valid[u]) {
      uint32_t tile, rest;
      p.split.divmod(item, tile, rest);
      row[u] = (tile << p.tile_shift) | (rest & ((1u << p.tile_shift) - 1u));
      grp[u] = rest >> p.tile_shift;
      valid[u] = row[u] < p.rows;  // the last tile's padding rows
      if (valid[u] && p.masked_m != nullptr) {
        uint32_t expert, token;
        p.t_pad.divmod(row[u], expert, token);
        valid[u] = static_cast<int>(token) < __ldg(p.masked_m + expert);
      }
    }
  }
  // Element offset of access a of piece j of this lane inside its group.
  const auto offset = [&](int j, int a) { return (lane + j * tpg) * kPieceElems + a * kN; };
  P v[kU][kP][kA];
  P w[kU][kFused ? kP : 1][kFused ? kA : 1];  // x2 of fuse_silu_and_mul
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    const RowPos pos(row[u], p.inner_div);
    const T* x = static_cast<const T*>(p.x) + pos.offset(p.x_map) +
                 static_cast<int64_t>(grp[u]) * p.group;
#pragma unroll
    for (int j = 0; j < kP; ++j) {
#pragma unroll
      for (int a = 0; a < kA; ++a) {
        if (valid[u] && j < p.ppl) {
          v[u][j][a].load_stream(x + offset(j, a));
          if constexpr (kFused) w[u][j][a].load_stream(x + offset(j, a) + p.half);
        } else {
          v[u][j][a].zero();
          if constexpr (kFused) w[u][j][a].zero();
        }
      }
    }
  }
  if constexpr (kFused) {
#pragma unroll
    for (int u = 0; u < kU; ++u)
#pragma unroll
      for (int j = 0; j < kP; ++j)
#pragma unroll
        for (int a = 0; a < kA; ++a) silu_mul(v[u][j][a], w[u][j][a]);
  }
  uint32_t m[kU];
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    quant::Absmax<T, kN> am;
#pragma unroll
    for (int j = 0; j < kP; ++j)
#pragma unroll
      for (int a = 0; a < kA; ++a) am.add(v[u][j][a]);
    m[u] = am.bits();
  }
  // Team maximum: fixed xor steps (unrolled), those at or above the team width skipped
  // (uniform branches).
#pragma unroll
  for (int step = 16; step > 0; step >>= 1) {
    if (step < tpg) {
#pragma unroll
      for (int u = 0; u < kU; ++u) m[u] = max(m[u], __shfl_xor_sync(0xffffffffu, m[u], step));
    }
  }
  if (pdl) kernels::pdl_launch_dependents();
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    if (!valid[u]) continue;
    float s = quant::dynamic_scale(m[u], p.eps, p.qmax);
    if (p.ue8m0) s = quant::ue8m0_round_up(s);
    const int g = static_cast<int>(grp[u]);
    const RowPos pos(row[u], p.inner_div);
    if (lane == 0) {
      const int64_t sbase = pos.offset(p.s_map);
      if (p.packed) {
        // Byte g % 4 of word g / 4 (little-endian); the row's last group zeroes the bytes of
        // the groups >= G of its word.
        uint8_t* b = static_cast<uint8_t*>(p.s) +
                     4 * (sbase + static_cast<int64_t>(g >> 2) * p.s_group_stride) + (g & 3);
        b[0] = static_cast<uint8_t>(quant::ue8m0_byte(s));
        if (g == p.groups - 1) {
          if ((g & 3) < 3) b[1] = 0;
          if ((g & 3) < 2) b[2] = 0;
          if ((g & 3) < 1) b[3] = 0;
        }
      } else {
        static_cast<float*>(p.s)[sbase + static_cast<int64_t>(g) * p.s_group_stride] = s;
      }
    }
    const quant::Div div(s);
    uint8_t* q = p.q + pos.offset(p.q_map) + static_cast<int64_t>(g) * p.group;
#pragma unroll
    for (int j = 0; j < kP; ++j) {
      if (j >= p.ppl) break;
      float f[kPieceElems];
      quant::unpack_piece(v[u][j], f);
      quant::Q8<kPieceElems> out;
      out.template quantize_bounded<kInt8>(f, div);
      uint8_t* dst = q + offset(j, 0);
      if constexpr (!kVector) {
        out.store(dst);
      } else if (p.q16) {
        out.store_stream(dst);
      } else {
        // kN-byte stores (q's rows only kN-byte aligned).
#pragma unroll
        for (int a = 0; a < kA; ++a) out.template store_part_stream<kN>(dst + a * kN, a);
      }
    }
  }
}

// Column-major scales: tiles of the rows one warp's kU x (32 / tpg) groups cover (a power of
// two, at most 32); row-major: one-row tiles.
template <typename T, int kN, int kA, int kP, int kU, int kThreads, bool kInt8, bool kFused>
inline void launch_plan(const kernels::Launch& ctx, Params p, bool rows_fast) {
  p.tile_shift = rows_fast ? rowwise::log2_exact(kU * (32 >> p.tpg_shift)) : 0;
  const uint32_t tile_rows = 1u << p.tile_shift;
  p.split = kernels::FastDivmod(tile_rows * static_cast<uint32_t>(p.groups));
  p.items = kernels::ceil_div(p.rows, tile_rows) * tile_rows * static_cast<uint32_t>(p.groups);
  const unsigned groups_per_block = static_cast<unsigned>(kThreads / p.tpg * kU);
  kernels::launch(ctx, group_kernel<T, kN, kA, kP, kU, kThreads, kInt8, kFused>,
                  kernels::ceil_div(p.items, groups_per_block), kThreads, p);
}

template <typename T, bool kInt8, bool kFused>
inline void launch(const kernels::Launch& ctx, Params p, bool vector, bool rows_fast) {
  constexpr int kVec = kernels::kVectorBytes / static_cast<int>(sizeof(T));
  constexpr int kA = kLaneElems / kVec;  // 16-byte loads per piece: 2 (bf16/fp16) or 4 (fp32)
  if (vector) {
    const int pieces = p.group / kLaneElems;  // 1 .. 16
    const int sms = kernels::sm_count(ctx.device);
    // Decode: one piece per lane (the most lanes per group, the least serial work per lane).
    if (int64_t{p.rows} * p.groups * pieces <= int64_t{kDecodeThreadsPerSm} * sms) {
      p.ppl = 1;
      p.tpg = pieces;
      p.tpg_shift = rowwise::log2_exact(p.tpg);
      launch_plan<T, kVec, kA, kMaxPieces, 1, kDecodeBlock, kInt8, kFused>(ctx, p, rows_fast);
      return;
    }
    p.ppl = pieces < kMaxPieces ? pieces : kMaxPieces;
    p.tpg = pieces / p.ppl;
    p.tpg_shift = rowwise::log2_exact(p.tpg);
    launch_plan<T, kVec, kA, kMaxPieces, 1, kBlock, kInt8, kFused>(ctx, p, rows_fast);
    return;
  }
  p.tpg = p.group < 32 ? p.group : 32;
  p.tpg_shift = rowwise::log2_exact(p.tpg);
  p.ppl = p.group / p.tpg;
  p.q16 = false;
  launch_plan<T, 1, 1, kScalarElems, kScalarGroups, kBlock, kInt8, kFused>(ctx, p, rows_fast);
}

}  // namespace per_token_group_quant_8bit_detail

// q: [..., K] float8_e4m3fn or int8 (contiguous last dim); s: [..., M, G] fp32 (packed:
// [..., M, ceil(G/4)] int32) with any strides (row-major, column-major or TMA-aligned views);
// x: [..., K] fp32/fp16/bf16 (fuse_silu_and_mul: [..., 2K], q = quant(silu(x1) * x2)), contiguous
// last dim, K % group_size == 0. masked_m: optional int32 [E] on x's device, x [E, T_pad, K]:
// rows t >= masked_m[e] of q and s are left untouched.
inline void per_token_group_quant_8bit(tvm::ffi::TensorView q, tvm::ffi::TensorView s,
                                       tvm::ffi::TensorView x, int64_t group_size, double eps,
                                       bool scale_ue8m0, bool pack_ue8m0, bool fuse_silu_and_mul,
                                       tvm::ffi::Optional<tvm::ffi::TensorView> masked_m) {
  namespace detail = per_token_group_quant_8bit_detail;
  constexpr const char* kOp = "quantization.per_token_group_quant_8bit";
  // 1. Validate.
  rowwise::check_rows(kOp, "x", x);
  bool q_shape_ok = q.ndim() == x.ndim();
  for (int d = 0; q_shape_ok && d + 1 < x.ndim(); ++d) q_shape_ok = q.size(d) == x.size(d);
  q_shape_ok = q_shape_ok && x.size(-1) == (fuse_silu_and_mul ? 2 : 1) * q.size(-1);
  TVM_FFI_CHECK(q_shape_ok, ValueError)
      << kOp << ": q must have the shape of x" << (fuse_silu_and_mul ? " with half its last dim" : "")
      << ", got q " << kernels::shape_string(q) << " and x " << kernels::shape_string(x);
  const bool int8 = kernels::is_dtype(q.dtype(), kDLInt, 8);
  TVM_FFI_CHECK(int8 || kernels::is_dtype(q.dtype(), kDLFloat8_e4m3fn, 8), TypeError)
      << kOp << ": q must have dtype float8_e4m3fn or int8";
  kernels::check_last_dim_contiguous(kOp, "q", q);
  TVM_FFI_CHECK(group_size == 16 || group_size == 32 || group_size == 64 || group_size == 128 ||
                    group_size == 256,
                ValueError)
      << kOp << ": group_size must be one of 16, 32, 64, 128, 256, got " << group_size;
  const int64_t k = q.size(-1);
  TVM_FFI_CHECK(k % group_size == 0, ValueError)
      << kOp << ": the last dim of q (" << k << ") must be a multiple of group_size ("
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
  const bool masked = masked_m.has_value();
  int64_t t_pad = 1;
  if (masked) {
    const tvm::ffi::TensorView mm = masked_m.value();
    TVM_FFI_CHECK(x.ndim() == 3, ValueError)
        << kOp << ": masked_m needs x of shape [E, T_pad, K], got " << kernels::shape_string(x);
    TVM_FFI_CHECK(mm.ndim() == 1 && mm.size(0) == x.size(0), ValueError)
        << kOp << ": masked_m must have shape [" << x.size(0) << "] (one count per expert), got "
        << kernels::shape_string(mm);
    TVM_FFI_CHECK(kernels::is_dtype(mm.dtype(), kDLInt, 32), TypeError)
        << kOp << ": masked_m must have dtype int32";
    TVM_FFI_CHECK(mm.size(0) <= 1 || mm.stride(0) == 1, ValueError)
        << kOp << ": masked_m must be contiguous";
    kernels::check_same_device(kOp, "masked_m", mm, "x", x);
    t_pad = x.size(1);
  }
  // Rows are merged over x's, q's and s's leading dims; q and s share x's (x's last dim is
  // 2K when fused, which only its row strides see).
  const kernels::RowLayout rows = kernels::row_layout(kOp, "x", {&x, &q, &s});
  kernels::check_device(kOp, "x", x, kDLCUDA);
  kernels::check_same_device(kOp, "q", q, "x", x);
  kernels::check_same_device(kOp, "s", s, "x", x);
  if (rows.rows() == 0 || k == 0 || t_pad == 0) return;
  // Group numbers over rows padded to whole tiles (at most 32 rows) stay below 2^31.
  TVM_FFI_CHECK((rows.rows() + 31) * groups < (int64_t{1} << 31), ValueError)
      << kOp << ": x " << kernels::shape_string(x) << " has too many groups";

  detail::Params p{};
  p.x = kernels::data(x);
  p.q = kernels::data<uint8_t>(q);
  p.s = kernels::data(s);
  p.x_map = rows.map[0];
  p.q_map = rows.map[1];
  p.s_map = rows.map[2];
  p.inner_div = kernels::FastDivmod(static_cast<uint32_t>(rows.inner));
  p.s_group_stride = s.size(-1) > 1 ? s.stride(-1) : 0;
  // Column-major scales (M, dim -2 of s, is the stride-1 dim): tiles of rows, rows fastest.
  const bool rows_fast = s.ndim() >= 2 && s.size(-2) > 1 && s.stride(-2) == 1 && rows.rows() > 1;
  p.rows = static_cast<uint32_t>(rows.rows());
  p.group = static_cast<int>(group_size);
  p.groups = static_cast<int>(groups);
  p.half = fuse_silu_and_mul ? k : 0;
  p.masked_m = masked ? static_cast<const int32_t*>(kernels::data(masked_m.value())) : nullptr;
  p.t_pad = kernels::FastDivmod(static_cast<uint32_t>(t_pad));
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
    // x2 starts K elements after x1: a whole number of vectors (K is a multiple of the group).
    const bool vector = kernels::vectors_fit(k, kVec, {p.x}, {p.x_map}) &&
                        reinterpret_cast<uintptr_t>(p.q) % kVec == 0 &&
                        p.q_map.s0 % kVec == 0 && p.q_map.s1 % kVec == 0;
    p.q16 = reinterpret_cast<uintptr_t>(p.q) % 16 == 0 && p.q_map.s0 % 16 == 0 &&
            p.q_map.s1 % 16 == 0;
    if (int8) {
      if (fuse_silu_and_mul) {
        detail::launch<T, true, true>(ctx, p, vector, rows_fast);
      } else {
        detail::launch<T, true, false>(ctx, p, vector, rows_fast);
      }
    } else {
      if (fuse_silu_and_mul) {
        detail::launch<T, false, true>(ctx, p, vector, rows_fast);
      } else {
        detail::launch<T, false, false>(ctx, p, vector, rows_fast);
      }
    }
  });
}
