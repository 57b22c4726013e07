// mamba.selective_state_update, CUDA: one Mamba-2 decode step of the SSM state, in place.
//
// Design (bandwidth: the state is the only large tensor, read once and written once).
// A CTA of 64..256 threads per (row tile of head_dim, head, batch row). TPR lanes share a state
// row [ds] (16-byte packs when ds, strides and pointer allow, elements otherwise; TPR = 16 for a
// bf16 ds=128 row, 32 for fp32), each thread owns kU = 4 rows of the tile. In order:
// 1. the slot index (the one dependent load before the state), then every state pack of the
//    thread's first chunk: kU x 16 bytes in flight per thread before anything else;
// 2. the small inputs, staged once per CTA in shared memory as fp32 and issued as one batch
//    (mamba_common::load_raw: no branch between a load and its use, so they overlap the state
//    loads instead of forming a chain): per tile row dt' (bias, softplus), exp(dt' A) (per-head A),
//    x, D x, silu(z); per slab of ds (<= 1024) B and C of the head's group. One barrier;
// 3. per chunk: B/C from shared memory (LDS.128), fp32 update, 16-byte store, the next chunk's
//    packs loaded (ds > TPR packs);
// 4. y: the partial sums reduced across the TPR lanes by shuffles, (y + D x) silu(z), one lane
//    per row writes it.
// Rows whose state index is pad_slot_id (or out of range) are untouched, state and output alike.
// A with strides along hd/ds (not per head) takes exp(dt' A) per element (the slow general path).
//
// Why the previous kernel ran at 22% of copy: every small input went through load_any (a branch
// on the dtype code whose conversion consumes the load), so a thread ran ~20 dependent memory
// round trips (x, dt, dt_bias, A, D, z, then 2 x 8 scalar B/C loads per chunk) for 64 bytes of
// state: latency-bound, ~0.5-1 us per trip and ~5 waves of CTAs at B=64.
// Arithmetic (H200, 132 SMs, [64, 80, 64, 128] bf16): 256 threads, tile 64 rows = one CTA per
// (b, h): 5120 CTAs of 16 KB read + 16 KB written; 64 registers (launch bounds; no spills on the
// per-head-A paths) -> 4 resident CTAs = 1024 threads per SM, ~9.7 waves. 64 B in flight per
// thread -> 64 KB per SM (40-64 KB needed), and a CTA's chain is index -> state loads (small
// loads overlapped) -> barrier -> math -> stores: ~1.5 us, so 4 x 16 KB per 1.5 us per SM
// (~5.6 TB/s over 132 SMs) exceeds the copy rate: the state moves at copy speed: 168 MB /
// 4.26 TB/s = 39 us (fp32: 10240 CTAs of 32 rows, 336 MB, 79 us); target >= 85% -> <= 46 us.
// B = 1: 64-thread CTAs (tile 16 rows: 320 CTAs of 4 KB; fp32 640 of 4 KB) spread the 1.3 MB
// read over every SM in one round trip: ~launch + 2 trips, ~3 us.
// Measured on the H200 (2026-12-03): 145.2 us at B = 64 bf16 (27.6% of copy), 216 us fp32,
// 9.65 us at B = 1 -- but for the per-element-A path (kHeadA = false): ncu showed that the
// benchmark's A was dense (2026-12-04). That path pays an exp and a dtype-dispatched load of A
// per state element (96 registers, 2 CTAs per SM, one issue per 2.1 cycles per scheduler). The
// per-head path modelled above has not been timed yet.
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(2);

#include <kernels/checks.h>
#include <kernels/dtype.h>
#include <kernels/launch.cuh>
#include <kernels/tensor.h>
#include <kernels/vec.cuh>

#include "mamba_common.cuh"

namespace selective_state_update_detail {

constexpr int kMaxThreads = 256;
constexpr int kU = 4;         // state rows per thread: kU 16-byte packs in flight before any math
constexpr int kSlab = 1024;   // ds elements of B and C staged in shared memory at a time
constexpr int kRowFields = 5;  // per staged row: dt', exp(dt' A), x, D x, silu(z)

struct Params {
  void* state;
  void* out;
  const void *x, *dt, *A, *B, *C, *D, *z, *dt_bias, *indices;
  int64_t heads, head_dim, dstate, slots, heads_per_group, slab;
  int64_t ss_s, ss_h, ss_p, ss_n;
  int64_t xs_b, xs_h, xs_p, dts_b, dts_h, dts_p, as_h, as_p, as_n;
  int64_t bs_b, bs_g, bs_n, cs_b, cs_g, cs_n, Ds_h, Ds_p, zs_b, zs_h, zs_p, dbs_h, dbs_p;
  int64_t os_b, os_h, os_p;
  int64_t pad_slot_id;
  int tpr, tile_rows;
  int xcode, dtcode, acode, bcode, ccode, dcode, zcode, dbcode, ocode;
  bool indices64, softplus;
};

// Dynamic shared memory: kRowFields x tile_rows fp32 (tile_rows % 4 == 0), then B and C slabs.
inline size_t smem_bytes(int tile_rows, int64_t slab) {
  return sizeof(float) * (static_cast<size_t>(kRowFields) * tile_rows + 2 * slab);
}

template <typename S, int kN, bool kHeadA>
__global__ void __launch_bounds__(kMaxThreads, kHeadA ? 4 : 2) ssu_kernel(const Params p) {
  using Pk = kernels::Pack<S, kN>;
  using mamba_common::load_raw;
  using mamba_common::Raw;
  using mamba_common::raw_float;
  extern __shared__ __align__(16) float smem[];
  const int64_t b = blockIdx.z, h = blockIdx.y;
  int64_t slot = b;
  if (p.indices != nullptr) {
    slot = mamba_common::load_index(p.indices, b, p.indices64);
    if (slot == p.pad_slot_id || slot < 0 || slot >= p.slots) return;  // uniform over the CTA
  }
  const int nthreads = blockDim.x, tid = threadIdx.x;
  const int tpr = p.tpr, tile_rows = p.tile_rows;
  const int lane = tid % tpr, sub = tid / tpr;
  const int rows_per_pass = nthreads / tpr;
  const int64_t chunks = p.dstate / kN;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * tile_rows;
  // Row u of the thread: first_row + u * rows_per_pass, at sp + u * step (+ chunk offset).
  const int64_t first_row = row0 + sub;
  const int64_t step = rows_per_pass * p.ss_p;
  S* const sp = static_cast<S*>(p.state) + slot * p.ss_s + h * p.ss_h + first_row * p.ss_p;
  int nvalid = 0;  // rows u < nvalid lie inside head_dim
#pragma unroll
  for (int u = 0; u < kU; ++u) nvalid += first_row + u * rows_per_pass < p.head_dim ? 1 : 0;
  // 1. The state packs of the first chunk: the bytes that matter go out first.
  Pk raw[kU];
  if (lane < chunks) {
#pragma unroll
    for (int u = 0; u < kU; ++u)
      if (u < nvalid) raw[u].load_stream(sp + u * step + lane * kN * p.ss_n);
  }
  // 2. The small inputs, staged in shared memory as fp32 (one batch of loads per thread).
  float* s_dt = smem;
  float* s_da = smem + tile_rows;
  float* s_x = smem + 2 * tile_rows;
  float* s_dx = smem + 3 * tile_rows;
  float* s_g = smem + 4 * tile_rows;
  float* s_b = smem + kRowFields * tile_rows;
  float* s_c = s_b + p.slab;
  for (int r = tid; r < tile_rows; r += nthreads) {
    const int64_t i = row0 + r < p.head_dim ? row0 + r : p.head_dim - 1;
    const Raw rx = load_raw(p.x, b * p.xs_b + h * p.xs_h + i * p.xs_p, p.xcode);
    const Raw rdt = load_raw(p.dt, b * p.dts_b + h * p.dts_h + i * p.dts_p, p.dtcode);
    Raw rdb{0, 0}, rd{0, 0}, rz{0, 0}, ra{0, 0};
    if (p.dt_bias) rdb = load_raw(p.dt_bias, h * p.dbs_h + i * p.dbs_p, p.dbcode);
    if (p.D) rd = load_raw(p.D, h * p.Ds_h + i * p.Ds_p, p.dcode);
    if (p.z) rz = load_raw(p.z, b * p.zs_b + h * p.zs_h + i * p.zs_p, p.zcode);
    if constexpr (kHeadA) ra = load_raw(p.A, h * p.as_h, p.acode);
    float dt = raw_float(rdt, p.dtcode);
    if (p.dt_bias) dt += raw_float(rdb, p.dbcode);
    if (p.softplus) dt = dt > 20.0f ? dt : log1pf(expf(dt));
    const float xv = raw_float(rx, p.xcode);
    s_dt[r] = dt;
    s_da[r] = kHeadA ? expf(dt * raw_float(ra, p.acode)) : 0.0f;
    s_x[r] = xv;
    s_dx[r] = p.D ? xv * raw_float(rd, p.dcode) : 0.0f;
    s_g[r] = p.z ? mamba_common::silu(raw_float(rz, p.zcode)) : 1.0f;
  }
  const int64_t g = h / p.heads_per_group;
  const int64_t boff = b * p.bs_b + g * p.bs_g, coff = b * p.cs_b + g * p.cs_g;
  float dtx[kU], dtv[kU], dav[kU], acc[kU];  // dt' x, dt' (general A only), exp(dt' A)
#pragma unroll
  for (int u = 0; u < kU; ++u) acc[u] = 0.0f;
  int64_t c = lane;  // the thread's current chunk
  for (int64_t e0 = 0; e0 < p.dstate; e0 += p.slab) {
    const int64_t ne = p.dstate - e0 < p.slab ? p.dstate - e0 : p.slab;
    if (e0 > 0) __syncthreads();  // every read of the previous slab done
    for (int64_t n = tid; n < ne; n += nthreads) {
      const Raw rb = load_raw(p.B, boff + (e0 + n) * p.bs_n, p.bcode);
      const Raw rc = load_raw(p.C, coff + (e0 + n) * p.cs_n, p.ccode);
      s_b[n] = raw_float(rb, p.bcode);
      s_c[n] = raw_float(rc, p.ccode);
    }
    __syncthreads();
    if (e0 == 0) {
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int rl = sub + u * rows_per_pass;
        dtx[u] = s_dt[rl] * s_x[rl];
        dtv[u] = kHeadA ? 0.0f : s_dt[rl];
        dav[u] = s_da[rl];
      }
    }
    // 3. Stream the slab's chunks: update in fp32, store, load the next chunk's packs.
    const int64_t cend = (e0 + ne) / kN;
    for (; c < cend; c += tpr) {
      float bv[kN], cv[kN];
      const int64_t off = c * kN - e0;
      if constexpr (kN % 4 == 0) {
#pragma unroll
        for (int i = 0; i < kN; i += 4) {
          const float4 vb = *reinterpret_cast<const float4*>(s_b + off + i);
          const float4 vc = *reinterpret_cast<const float4*>(s_c + off + i);
          bv[i] = vb.x, bv[i + 1] = vb.y, bv[i + 2] = vb.z, bv[i + 3] = vb.w;
          cv[i] = vc.x, cv[i + 1] = vc.y, cv[i + 2] = vc.z, cv[i + 3] = vc.w;
        }
      } else {
#pragma unroll
        for (int i = 0; i < kN; ++i) bv[i] = s_b[off + i], cv[i] = s_c[off + i];
      }
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        if (u >= nvalid) continue;
        float s[kN];
        raw[u].unpack(s);
#pragma unroll
        for (int i = 0; i < kN; ++i) {
          float da = dav[u];
          if constexpr (!kHeadA) {
            da = expf(dtv[u] * mamba_common::load_any(
                                   p.A,
                                   h * p.as_h + (first_row + u * rows_per_pass) * p.as_p +
                                       (c * kN + i) * p.as_n,
                                   p.acode));
          }
          s[i] = s[i] * da + bv[i] * dtx[u];
          acc[u] += s[i] * cv[i];
        }
        raw[u].pack(s);
        raw[u].store_stream(sp + u * step + c * kN * p.ss_n);
      }
      const int64_t next = c + tpr;
      if (next < chunks) {
#pragma unroll
        for (int u = 0; u < kU; ++u)
          if (u < nvalid) raw[u].load_stream(sp + u * step + next * kN * p.ss_n);
      }
    }
  }
  // 4. y = sum over ds (shuffles across the row's lanes) + D x, times silu(z); one lane per row.
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    for (int o = tpr / 2; o > 0; o /= 2) acc[u] += __shfl_xor_sync(0xffffffffu, acc[u], o);
  }
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    if (u >= nvalid || lane != u % tpr) continue;
    const int rl = sub + u * rows_per_pass;
    const float y = (acc[u] + s_dx[rl]) * s_g[rl];
    const int64_t row = first_row + u * rows_per_pass;
    mamba_common::store_any(p.out, b * p.os_b + h * p.os_h + row * p.os_p, p.ocode, y);
  }
}

inline void take(const char* op, const char* name, const tvm::ffi::TensorView& t,
                 const tvm::ffi::TensorView& like, std::initializer_list<int64_t> shape,
                 const void*& ptr, int& code, int64_t* strides) {
  TVM_FFI_CHECK(t.ndim() == static_cast<int>(shape.size()), ValueError)
      << op << ": " << name << " must have " << shape.size() << " dims, got "
      << kernels::shape_string(t);
  int d = 0;
  for (int64_t n : shape) {
    TVM_FFI_CHECK(t.size(d) == n, ValueError)
        << op << ": " << name << " has the wrong shape " << kernels::shape_string(t);
    strides[d] = t.size(d) == 1 ? 0 : t.stride(d);
    ++d;
  }
  kernels::check_same_device(op, name, t, "x", like);
  code = mamba_common::float_code(op, name, t);
  ptr = kernels::data(t);
}

}  // namespace selective_state_update_detail

// out, x, dt, z [B, nh, hd]; state [S, nh, hd, ds] (float32, float16 or bfloat16); A [nh, hd, ds];
// B, C [B, ng, ds]; D, dt_bias [nh, hd] or None; state_batch_indices [B] int32/int64 or None.
// Any strides and float dtypes (a per-head A, stride 0 along hd and ds, takes exp once per row).
inline void selective_state_update(
    tvm::ffi::TensorView out, tvm::ffi::TensorView state, tvm::ffi::TensorView x,
    tvm::ffi::TensorView dt, tvm::ffi::TensorView A, tvm::ffi::TensorView B,
    tvm::ffi::TensorView C, tvm::ffi::Optional<tvm::ffi::TensorView> D,
    tvm::ffi::Optional<tvm::ffi::TensorView> z, tvm::ffi::Optional<tvm::ffi::TensorView> dt_bias,
    bool dt_softplus, tvm::ffi::Optional<tvm::ffi::TensorView> state_batch_indices,
    int64_t pad_slot_id) {
  namespace detail = selective_state_update_detail;
  constexpr const char* kOp = "mamba.selective_state_update";
  // 1. Validate.
  kernels::check_device(kOp, "x", x, kDLCUDA);
  kernels::check_ndim(kOp, "state", state, 4);
  kernels::check_ndim(kOp, "x", x, 3);
  kernels::check_ndim(kOp, "B", B, 3);
  kernels::check_same_device(kOp, "state", state, "x", x);
  const int64_t batch = x.size(0), heads = state.size(1), hd = state.size(2), ds = state.size(3);
  const int64_t groups = B.size(1);
  TVM_FFI_CHECK(groups >= 1 && heads % groups == 0, ValueError)
      << kOp << ": B must be [B, ng, ds] with ng dividing nh = " << heads;
  detail::Params p{};
  int64_t s3[3], s2[2];
  detail::take(kOp, "x", x, x, {batch, heads, hd}, p.x, p.xcode, s3);
  p.xs_b = s3[0], p.xs_h = s3[1], p.xs_p = s3[2];
  const void* optr;
  detail::take(kOp, "out", out, x, {batch, heads, hd}, optr, p.ocode, s3);
  p.out = kernels::data(out);
  p.os_b = s3[0], p.os_h = s3[1], p.os_p = s3[2];
  detail::take(kOp, "dt", dt, x, {batch, heads, hd}, p.dt, p.dtcode, s3);
  p.dts_b = s3[0], p.dts_h = s3[1], p.dts_p = s3[2];
  detail::take(kOp, "A", A, x, {heads, hd, ds}, p.A, p.acode, s3);
  p.as_h = s3[0], p.as_p = s3[1], p.as_n = s3[2];
  detail::take(kOp, "B", B, x, {batch, groups, ds}, p.B, p.bcode, s3);
  p.bs_b = s3[0], p.bs_g = s3[1], p.bs_n = s3[2];
  detail::take(kOp, "C", C, x, {batch, groups, ds}, p.C, p.ccode, s3);
  p.cs_b = s3[0], p.cs_g = s3[1], p.cs_n = s3[2];
  if (D.has_value()) {
    detail::take(kOp, "D", D.value(), x, {heads, hd}, p.D, p.dcode, s2);
    p.Ds_h = s2[0], p.Ds_p = s2[1];
  }
  if (z.has_value()) {
    detail::take(kOp, "z", z.value(), x, {batch, heads, hd}, p.z, p.zcode, s3);
    p.zs_b = s3[0], p.zs_h = s3[1], p.zs_p = s3[2];
  }
  if (dt_bias.has_value()) {
    detail::take(kOp, "dt_bias", dt_bias.value(), x, {heads, hd}, p.dt_bias, p.dbcode, s2);
    p.dbs_h = s2[0], p.dbs_p = s2[1];
  }
  if (state_batch_indices.has_value()) {
    const tvm::ffi::TensorView v = state_batch_indices.value();
    kernels::check_ndim(kOp, "state_batch_indices", v, 1);
    TVM_FFI_CHECK(v.size(0) == batch && (v.stride(0) == 1 || batch <= 1), ValueError)
        << kOp << ": state_batch_indices must be a contiguous [" << batch << "] vector";
    kernels::check_same_device(kOp, "state_batch_indices", v, "x", x);
    p.indices64 = mamba_common::index_is64(kOp, "state_batch_indices", v);
    p.indices = kernels::data(v);
  } else {
    TVM_FFI_CHECK(state.size(0) >= batch, ValueError)
        << kOp << ": without state_batch_indices state needs >= B = " << batch << " rows";
  }
  TVM_FFI_CHECK(batch <= 65535 && heads <= 65535, ValueError)
      << kOp << ": B and nh must be <= 65535";
  if (x.numel() == 0 || ds == 0) return;
  p.state = kernels::data(state);
  p.heads = heads;
  p.head_dim = hd;
  p.dstate = ds;
  p.slots = state.size(0);
  p.heads_per_group = heads / groups;
  p.ss_s = state.stride(0), p.ss_h = state.stride(1), p.ss_p = state.stride(2);
  p.ss_n = state.stride(3);
  p.pad_slot_id = pad_slot_id;
  p.softplus = dt_softplus;
  // exp(dt' A) once per row when A is a per-head scalar (Mamba-2: a stride-0 expansion).
  const bool head_a = p.as_p == 0 && p.as_n == 0;
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(x);
  const kernels::Launch ctx(kOp, x);
  // 4. Dispatch on the state dtype, packing and A; pick the CTA size; launch (checked).
  KERNELS_DISPATCH_FLOAT(state.dtype(), kOp, S, [&] {
    constexpr int kN = kernels::kVectorBytes / static_cast<int>(sizeof(S));
    const int64_t es = sizeof(S);
    const bool vec = (p.ss_n == 1 || ds == 1) && ds % kN == 0 && kernels::is_aligned(p.state) &&
                     (p.ss_p * es) % 16 == 0 && (p.ss_h * es) % 16 == 0 &&
                     (p.ss_s * es) % 16 == 0;
    const int64_t chunks = vec ? ds / kN : ds;
    int tpr = 1;
    while (tpr < 32 && tpr < chunks) tpr *= 2;
    p.tpr = tpr;
    p.slab = ds < detail::kSlab ? ds : detail::kSlab;  // a multiple of the pack when vec
    // The largest CTA (<= 256 threads) whose tile is not mostly past head_dim and that still
    // gives >= 4 CTAs per SM (132 SMs); 64 threads at least (two warps).
    auto tile_of = [&](int threads) { return (threads / tpr) * detail::kU; };
    auto ctas_of = [&](int threads) {
      return kernels::ceil_div(hd, static_cast<int64_t>(tile_of(threads))) * heads * batch;
    };
    int threads = detail::kMaxThreads;
    while (threads > 64 && (ctas_of(threads) < 4 * 132 || tile_of(threads / 2) >= hd)) {
      threads /= 2;
    }
    p.tile_rows = tile_of(threads);
    const size_t smem = detail::smem_bytes(p.tile_rows, p.slab);
    const dim3 grid(kernels::ceil_div(hd, static_cast<int64_t>(p.tile_rows)),
                    static_cast<unsigned>(heads), static_cast<unsigned>(batch));
    auto go = [&](auto kernel) { kernel<<<grid, threads, smem, ctx.stream>>>(p); };
    if (vec) {
      head_a ? go(detail::ssu_kernel<S, kN, true>) : go(detail::ssu_kernel<S, kN, false>);
    } else {
      head_a ? go(detail::ssu_kernel<S, 1, true>) : go(detail::ssu_kernel<S, 1, false>);
    }
  });
  kernels::check_launch(kOp);
}
