// mamba.selective_state_update, CUDA: one Mamba-2 decode step of the SSM state, in place.
//
// A CTA of 128 threads per (row tile of head_dim, head, batch row), no shared memory and no
// barrier: TPR lanes share a state row [ds] (16-byte packs when ds, strides and pointer allow,
// elements otherwise; TPR = 32 for an fp32 ds=128 row, 16 for bf16), each thread owns kU rows of
// its tile. The state packs of all kU rows are the first loads a thread issues (right after the
// slot index), then B/C of its ds chunk, x, dt (and D, z for the row it outputs), so one memory
// round trip covers the whole tile; the next chunk's packs (ds > TPR packs) are loaded while the
// current one is stored. fp32 math (the "tied" path: one dt' and exp(dt' A) per head), the partial
// y reduced across the TPR lanes by shuffles, each row's output written by one lane. Rows whose
// state index is pad_slot_id (or out of range) are untouched, state and output alike.
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

constexpr int kThreads = 128;
constexpr int kU = 4;  // state rows per thread: kU 16-byte packs in flight before any math

struct Params {
  void* state;
  void* out;
  const void *x, *dt, *A, *B, *C, *D, *z, *dt_bias, *indices;
  int64_t heads, head_dim, dstate, slots, heads_per_group;
  int64_t ss_s, ss_h, ss_p, ss_n;
  int64_t xs_b, xs_h, xs_p, dts_b, dts_h, dts_p, as_h, as_p, as_n;
  int64_t bs_b, bs_g, bs_n, cs_b, cs_g, cs_n, Ds_h, Ds_p, zs_b, zs_h, zs_p, dbs_h, dbs_p;
  int64_t os_b, os_h, os_p;
  int64_t pad_slot_id;
  int tpr, tile_rows;
  int xcode, dtcode, acode, bcode, ccode, dcode, zcode, dbcode, ocode;
  bool indices64, softplus;
};

__device__ __forceinline__ float step_of(const Params& p, int64_t b, int64_t h, int64_t i) {
  float dt = mamba_common::load_any(p.dt, b * p.dts_b + h * p.dts_h + i * p.dts_p, p.dtcode);
  if (p.dt_bias) dt += mamba_common::load_any(p.dt_bias, h * p.dbs_h + i * p.dbs_p, p.dbcode);
  if (p.softplus) dt = dt > 20.0f ? dt : log1pf(expf(dt));
  return dt;
}

template <typename S, int kN, bool kTied>
__global__ void __launch_bounds__(kThreads) ssu_kernel(const Params p) {
  using Pk = kernels::Pack<S, kN>;
  const int64_t b = blockIdx.z, h = blockIdx.y;
  int64_t slot = b;
  if (p.indices != nullptr) {
    slot = mamba_common::load_index(p.indices, b, p.indices64);
    if (slot == p.pad_slot_id || slot < 0 || slot >= p.slots) return;  // uniform over the CTA
  }
  const int tpr = p.tpr;
  const int lane = threadIdx.x % tpr, sub = threadIdx.x / tpr;
  const int rows_per_pass = kThreads / tpr;
  const int64_t chunks = p.dstate / kN;
  S* st = static_cast<S*>(p.state) + slot * p.ss_s + h * p.ss_h;
  int64_t rows[kU];
  bool valid[kU];
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    rows[u] = static_cast<int64_t>(blockIdx.x) * p.tile_rows + sub + u * rows_per_pass;
    valid[u] = rows[u] < p.head_dim;
  }
  // 1. The state packs of the first chunk: the bytes that matter go out first.
  Pk raw[kU];
  if (lane < chunks) {
#pragma unroll
    for (int u = 0; u < kU; ++u)
      if (valid[u]) raw[u].load_stream(st + rows[u] * p.ss_p + lane * kN * p.ss_n);
  }
  // 2. The per-row inputs (x, dt; D and z only in the lane that writes the row's output).
  float xv[kU], dtv[kU], dv[kU], zv[kU], acc[kU];
  float tied_da = 0.0f;
  if constexpr (kTied) {
    const float dt = step_of(p, b, h, 0);
    tied_da = expf(dt * mamba_common::load_any(p.A, h * p.as_h, p.acode));
#pragma unroll
    for (int u = 0; u < kU; ++u) dtv[u] = dt;
  }
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    const int64_t r = valid[u] ? rows[u] : 0;
    xv[u] = mamba_common::load_any(p.x, b * p.xs_b + h * p.xs_h + r * p.xs_p, p.xcode);
    if constexpr (!kTied) dtv[u] = step_of(p, b, h, r);
    dv[u] = 0.0f;
    zv[u] = 0.0f;
    if (lane == u % tpr) {
      if (p.D) dv[u] = mamba_common::load_any(p.D, h * p.Ds_h + r * p.Ds_p, p.dcode);
      if (p.z) zv[u] = mamba_common::load_any(p.z, b * p.zs_b + h * p.zs_h + r * p.zs_p, p.zcode);
    }
    acc[u] = 0.0f;
  }
  const int64_t g = h / p.heads_per_group;
  // 3. Stream the chunks: update in fp32, store, load the next chunk's packs.
  for (int64_t c = lane; c < chunks; c += tpr) {
    float bv[kN], cv[kN];
#pragma unroll
    for (int i = 0; i < kN; ++i) {
      const int64_t n = c * kN + i;
      bv[i] = mamba_common::load_any(p.B, b * p.bs_b + g * p.bs_g + n * p.bs_n, p.bcode);
      cv[i] = mamba_common::load_any(p.C, b * p.cs_b + g * p.cs_g + n * p.cs_n, p.ccode);
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      if (!valid[u]) continue;
      float s[kN];
      raw[u].unpack(s);
#pragma unroll
      for (int i = 0; i < kN; ++i) {
        float da;
        if constexpr (kTied) {
          da = tied_da;
        } else {
          da = expf(dtv[u] * mamba_common::load_any(
                                 p.A, h * p.as_h + rows[u] * p.as_p + (c * kN + i) * p.as_n,
                                 p.acode));
        }
        s[i] = s[i] * da + (dtv[u] * bv[i]) * xv[u];
        acc[u] += s[i] * cv[i];
      }
      raw[u].pack(s);
      raw[u].store_stream(st + rows[u] * p.ss_p + c * kN * p.ss_n);
    }
    const int64_t next = c + tpr;
    if (next < chunks) {
#pragma unroll
      for (int u = 0; u < kU; ++u)
        if (valid[u]) raw[u].load_stream(st + rows[u] * p.ss_p + next * kN * p.ss_n);
    }
  }
  // 4. y = sum over ds (shuffles across the row's lanes) + D x, times silu(z); one lane per row.
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    for (int o = tpr / 2; o > 0; o /= 2) acc[u] += __shfl_xor_sync(0xffffffffu, acc[u], o);
  }
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    if (!valid[u] || lane != u % tpr) continue;
    float y = acc[u] + xv[u] * dv[u];
    if (p.z) y *= zv[u] / (1.0f + expf(-zv[u]));
    mamba_common::store_any(p.out, b * p.os_b + h * p.os_h + rows[u] * p.os_p, p.ocode, y);
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
// Any strides and float dtypes (stride-0 "tied" A/dt/dt_bias take the scalar path).
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
  const bool tied = p.as_p == 0 && p.as_n == 0 && p.dts_p == 0 && (!p.dt_bias || p.dbs_p == 0);
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(x);
  const kernels::Launch ctx(kOp, x);
  // 4. Dispatch on the state dtype, packing and tying; launch (checked).
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
    p.tile_rows = (detail::kThreads / tpr) * detail::kU;
    const dim3 grid(kernels::ceil_div(hd, p.tile_rows), static_cast<unsigned>(heads),
                    static_cast<unsigned>(batch));
    auto go = [&](auto kernel) { kernel<<<grid, detail::kThreads, 0, ctx.stream>>>(p); };
    if (vec) {
      tied ? go(detail::ssu_kernel<S, kN, true>) : go(detail::ssu_kernel<S, kN, false>);
    } else {
      tied ? go(detail::ssu_kernel<S, 1, true>) : go(detail::ssu_kernel<S, 1, false>);
    }
  });
  kernels::check_launch(kOp);
}
