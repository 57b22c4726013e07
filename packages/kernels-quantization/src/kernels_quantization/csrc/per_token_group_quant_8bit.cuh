// quantization.per_token_group_quant_8bit, CUDA: one scale per `group` consecutive elements of
// the last dim, a = max(eps, absmax), s = a / qmax (qmax 448 for fp8 e4m3, 127 for int8; rounded
// up to a power of two from the fp32 bits when ue8m0), q = cvt(x / s).
//
// Layout. A team of `tpg` lanes (a power of two <= 32: 16 for bf16 and group 128) owns a chunk of
// groups of one row. Each lane loads its 16-byte vectors of the chunk's groups at once, reduces
// each group's absmax with xor shuffles inside the team (fixed unrolled steps: 4 for 16 lanes),
// and writes its fp8/int8 packs (8 bytes per bf16 vector: 128 contiguous bytes per team and
// group). Lane 0 of the team writes the scales through the scale view's strides (row-major,
// column-major, TMA-aligned: one kernel for all three), or the int32 word of four UE8M0 exponent
// bytes (packed layout, bytes of groups >= G zero). Chunks are numbered row-major, or rows
// fastest when the scales are column-major (a block's scale stores are then contiguous).
// Two launch plans:
//   - throughput: chunks of 4 groups (bf16, group 128: 4 x 16 B in flight per lane), 256-thread
//     blocks, a grid-stride loop over at most one wave of resident blocks, trimmed so that every
//     block runs the same number of steps (no stream of tens of thousands of short blocks, and
//     PDL's two instructions once per block instead of once per 64 groups);
//   - decode (team threads <= 1024 per SM, vector rows, not packed): one group per team, one
//     16-byte load per lane, 128-thread blocks: T = 1 x 7168 is 7 blocks of 8 groups on 7 SMs
//     instead of one block doing all 56 groups, so each lane's serial work is 8 elements.
// Optional modes: fuse_silu_and_mul (x [..., 2K]: each lane also loads x2, K elements on, and
// quantizes silu(x1) * x2 computed in fp32 and rounded to T, as an unfused silu_and_mul writes
// it) and masked rows (x [E, T_pad, K]: a team whose row has t >= masked_m[e], read on the
// device after the PDL wait, skips its loads and stores).
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

// Launch plans (see launch()): a throughput plan of 256-thread blocks whose teams take chunks
// of 4 groups in a grid-stride loop over ~1 wave of resident blocks, and a decode plan (small
// problems) of 128-thread blocks whose teams take one group each, spread over as many SMs as
// possible.
constexpr int kBlock = 256;
constexpr int kDecodeBlock = 128;
constexpr int kChunk = 4;        // groups per team and step, throughput plan
constexpr int kDecodeChunk = 1;  // decode plan
// The decode plan serves problems of at most this many team threads per SM (half the 2048 an SM
// holds): all of them resident at once, each lane one 16-byte load.
constexpr int kDecodeThreadsPerSm = 1024;

struct Params {
  const void* x;
  uint8_t* q;
  void* s;  // float, or int32 words when packed
  kernels::RowMap x_map, q_map, s_map;
  uint32_t inner;
  int64_t s_group_stride;  // elements of s between consecutive groups (packed: words)
  // Work item (a chunk of `chunk` groups of one row) -> (row, chunk): chunk-major over rows when
  // the scales are column-major (the teams of a block then write the scales of consecutive rows),
  // row-major otherwise.
  kernels::FastDivmod split;  // by chunks per row, or by rows when rows_fast
  bool rows_fast;
  uint32_t items;  // rows * chunks per row
  int group;       // elements per group
  int groups;      // G
  int tpg, tpg_shift;
  int vpt;         // accesses per lane and group (<= kMaxVPG)
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

template <typename T, int kN, int kMaxVPG, int kGroups, int kThreads, bool kInt8, bool kFused>
__global__ void __launch_bounds__(kThreads) group_kernel(bool pdl, const __grid_constant__ Params p) {
  using P = kernels::Pack<T, kN>;
  constexpr int kFusedVPG = kFused ? kMaxVPG : 1;
  const int lane = static_cast<int>(threadIdx.x) & (p.tpg - 1);
  const uint32_t teams = static_cast<uint32_t>(kThreads) >> p.tpg_shift;
  const uint32_t local = threadIdx.x >> p.tpg_shift;

  if (pdl) kernels::pdl_wait();
  bool signalled = !pdl;
  // Block-uniform loop: every lane of a warp runs the same steps (the shuffles need them all).
  for (uint32_t base = blockIdx.x * teams; base < p.items; base += gridDim.x * teams) {
    const uint32_t team = base + local;
    bool valid = team < p.items;
    uint32_t row = 0, chunk = 0;
    if (valid) {
      uint32_t hi, lo;
      p.split.divmod(team, hi, lo);
      row = p.rows_fast ? lo : hi;
      chunk = p.rows_fast ? hi : lo;
      if (p.masked_m != nullptr) {
        uint32_t expert, token;
        p.t_pad.divmod(row, expert, token);
        valid = static_cast<int>(token) < p.masked_m[expert];
      }
    }
    const int first = static_cast<int>(chunk) * kGroups;
    const int count = valid ? min(kGroups, p.groups - first) : 0;
    const T* x = static_cast<const T*>(p.x) + rowwise::row_offset(p.x_map, row, p.inner) +
                 static_cast<int64_t>(first) * p.group;

    P v[kGroups][kMaxVPG];
    P w[kGroups][kFusedVPG];  // x2 of fuse_silu_and_mul
#pragma unroll
    for (int u = 0; u < kGroups; ++u) {
#pragma unroll
      for (int j = 0; j < kMaxVPG; ++j) {
        const T* src = x + u * p.group + (lane + j * p.tpg) * kN;
        if (u < count && j < p.vpt) {
          v[u][j].load_stream(src);
          if constexpr (kFused) w[u][j].load_stream(src + p.half);
        } else {
          v[u][j].zero();
          if constexpr (kFused) w[u][j].zero();
        }
      }
    }
    if constexpr (kFused) {
#pragma unroll
      for (int u = 0; u < kGroups; ++u)
#pragma unroll
        for (int j = 0; j < kMaxVPG; ++j) silu_mul(v[u][j], w[u][j]);
    }
    uint32_t m[kGroups];
#pragma unroll
    for (int u = 0; u < kGroups; ++u) {
      m[u] = 0;
#pragma unroll
      for (int j = 0; j < kMaxVPG; ++j) {
        float f[kN];
        v[u][j].unpack(f);
        m[u] = quant::absmax_bits(f, m[u]);
      }
    }
    // Team maximum: fixed xor steps (unrolled), those at or above the team width skipped
    // (uniform branches).
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
      if (offset < p.tpg) {
#pragma unroll
        for (int u = 0; u < kGroups; ++u)
          m[u] = max(m[u], __shfl_xor_sync(0xffffffffu, m[u], offset));
      }
    }
    if (!signalled) {
      kernels::pdl_launch_dependents();
      signalled = true;
    }
    if (count == 0) continue;
    float s[kGroups];
#pragma unroll
    for (int u = 0; u < kGroups; ++u) {
      s[u] = quant::dynamic_scale(m[u], p.eps, p.qmax);
      if (p.ue8m0) s[u] = quant::ue8m0_round_up(s[u]);
    }
    if (lane == 0) {
      const int64_t sbase = rowwise::row_offset(p.s_map, row, p.inner);
      if (p.packed) {
        // Word j holds groups 4j..4j+3: the chunks are whole words (kGroups 4), or one byte of
        // a word (kGroups 1; the decode plan does not serve packed scales).
        uint32_t word = 0;
#pragma unroll
        for (int u = 0; u < kGroups; ++u)
          if (u < count) word |= quant::ue8m0_byte(s[u]) << (8 * u);
        static_cast<uint32_t*>(p.s)[sbase + static_cast<int64_t>(chunk) * p.s_group_stride] =
            word;
      } else {
        float* out = static_cast<float*>(p.s) + sbase;
#pragma unroll
        for (int u = 0; u < kGroups; ++u)
          if (u < count) out[static_cast<int64_t>(first + u) * p.s_group_stride] = s[u];
      }
    }
    uint8_t* q = p.q + rowwise::row_offset(p.q_map, row, p.inner) +
                 static_cast<int64_t>(first) * p.group;
#pragma unroll
    for (int u = 0; u < kGroups; ++u) {
      const quant::Div div(s[u]);
#pragma unroll
      for (int j = 0; j < kMaxVPG; ++j) {
        if (u < count && j < p.vpt) {
          float f[kN];
          v[u][j].unpack(f);
          quant::Q8<kN> out;
          out.template quantize<kInt8>(f, div);
          out.store_stream(q + u * p.group + (lane + j * p.tpg) * kN);
        }
      }
    }
  }
  if (!signalled) kernels::pdl_launch_dependents();
}

// Resident blocks of `kernel` per SM, cached per kernel (the occupancy query runs once each).
inline int blocks_per_sm(void (*kernel)(bool, Params), int threads) {
  static void (*keys[32])(bool, Params) = {};
  static int values[32] = {};
  for (int i = 0; i < 32; ++i) {
    if (keys[i] == kernel) return values[i];
    if (keys[i] != nullptr) continue;
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, 0) != cudaSuccess) {
      cudaGetLastError();
      n = 0;
    }
    keys[i] = kernel;
    values[i] = n > 0 ? n : 1;
    return values[i];
  }
  return 1;
}

template <typename T, bool kInt8, bool kFused>
inline void launch(const kernels::Launch& ctx, Params p, bool vector, int64_t rows) {
  constexpr int kVec = kernels::kVectorBytes / static_cast<int>(sizeof(T));
  constexpr int kVectorVPG = sizeof(T) == 4 ? 2 : 1;  // fp32, group 256: 32 lanes x 2
  constexpr int kScalarVPG = 8;  // group 256: 32 lanes x 8 elements
  const int accesses = vector ? p.group / kVec : p.group;
  p.tpg = accesses < 32 ? accesses : 32;
  p.tpg_shift = rowwise::log2_exact(p.tpg);
  p.vpt = accesses / p.tpg;
  const int sms = kernels::sm_count(ctx.device);
  // Decode plan: one group per team, 128-thread blocks, every team thread resident at once;
  // the work spreads over up to ~half of the SMs' thread slots instead of a few 256-thread blocks.
  const bool decode = vector && !p.packed &&
                      rows * p.groups * p.tpg <= static_cast<int64_t>(kDecodeThreadsPerSm) * sms;
  if (decode) {
    void (*kernel)(bool, Params) =
        group_kernel<T, kVec, kVectorVPG, kDecodeChunk, kDecodeBlock, kInt8, kFused>;
    p.split = kernels::FastDivmod(
        static_cast<uint32_t>(p.rows_fast ? rows : p.groups));
    p.items = static_cast<uint32_t>(rows * p.groups);
    const unsigned teams = static_cast<unsigned>(kDecodeBlock / p.tpg);
    kernels::launch(ctx, kernel, kernels::ceil_div(p.items, teams), kDecodeBlock, p);
    return;
  }
  void (*kernel)(bool, Params) =
      vector ? group_kernel<T, kVec, kVectorVPG, kChunk, kBlock, kInt8, kFused>
             : group_kernel<T, 1, kScalarVPG, kChunk, kBlock, kInt8, kFused>;
  const int64_t chunks = (p.groups + kChunk - 1) / kChunk;
  p.split = kernels::FastDivmod(static_cast<uint32_t>(p.rows_fast ? rows : chunks));
  p.items = static_cast<uint32_t>(rows * chunks);
  const unsigned teams = static_cast<unsigned>(kBlock / p.tpg);
  // Grid-stride over at most one wave of resident blocks: no stream of short blocks to schedule,
  // and a PDL launch (auto: up to kernels::kPdlMaxWaves waves) costs two instructions per block,
  // not per chunk. The grid is trimmed so that every block runs the same number of steps (8192 x
  // 7168: 7168 blocks' worth of chunks, a wave of 792: 10 steps each over 717 blocks, instead
  // of 792 blocks of which some run 10 steps and most 9).
  const unsigned needed = kernels::ceil_div(p.items, teams);
  const unsigned wave = static_cast<unsigned>(sms * blocks_per_sm(kernel, kBlock));
  const unsigned steps = kernels::ceil_div(needed, wave);
  kernels::launch(ctx, kernel, kernels::ceil_div(needed, steps), kBlock, p);
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
  TVM_FFI_CHECK(rows.rows() * groups < (int64_t{1} << 31), ValueError)
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
    if (int8) {
      if (fuse_silu_and_mul) {
        detail::launch<T, true, true>(ctx, p, vector, rows.rows());
      } else {
        detail::launch<T, true, false>(ctx, p, vector, rows.rows());
      }
    } else {
      if (fuse_silu_and_mul) {
        detail::launch<T, false, true>(ctx, p, vector, rows.rows());
      } else {
        detail::launch<T, false, false>(ctx, p, vector, rows.rows());
      }
    }
  });
}
