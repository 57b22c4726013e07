// moe.moe_sum_reduce, CUDA: out[t, :] = scale * sum_j w[t, j] * x[t, j, :] (w = 1 when absent),
// fp32 accumulation in j order (each term rounded like the reference: w * x, then the add),
// rounded once to the dtype of x.
//
// One thread per (token, 16-byte column pack): it issues the k loads of its column (k known at
// compile time for 1, 2, 4, 8 and 9: all k loads in flight before the first add; other k in
// batches of 8), then reduces and stores one pack. Blocks of 256 threads over the flat
// (token, pack) index: 32-bit, split by kernels::FastDivmod (IMAD.HI, add, shift: the 64-bit
// divide of the index put ~25 instructions and an I2F / MUFU.RCP / F2I chain ahead of every
// thread's loads), in launches of fewer than 2^31 items (token chunks); 64-bit offsets.
// Scalars (one element per thread) when H, the strides or the pointers do not allow 16-byte
// packs. PDL for small grids (decode).
//
// Cache policy: plain loads and stores (LDG.E.128 / STG.E.128) once x is at least
// kPlainMinBytes, evict-first (ld.global.cs / st.global.cs) below. The peers at ~102% of copy
// (sglang-kernel: __ldg and plain stores; Inductor: plain tl.load) use no evict-first hint; in
// the row engine the same switch took rmsnorm to 0.956-0.974 of its time at 8192-32768 rows
// while costing 1.09-1.14 at 64 rows (docs/benchmarks/README.md, 2026-12-03), hence the
// threshold (T = 8192 here reads 64-580 MB of x, T = 1 at most 129 KB).
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(2);

#include <kernels/checks.h>
#include <kernels/dtype.h>
#include <kernels/launch.cuh>
#include <kernels/pdl.cuh>
#include <kernels/pointwise.cuh>
#include <kernels/tensor.h>
#include <kernels/vec.cuh>

#include "moe_common.cuh"

namespace moe_sum_reduce_detail {

constexpr int kThreads = 256;
constexpr int kBatch = 8;  // loads in flight per thread for a runtime k
// x of at least this many bytes streams with plain accesses (kernels::Cache::kPlain).
constexpr int64_t kPlainMinBytes = int64_t{8} << 20;

struct Params {
  const void* x;
  void* out;
  const void* w;  // [T, k] weights or null
  int64_t x_s0, x_s1, out_s0, w_s0, w_s1;  // strides in elements
  uint32_t work;                           // tokens * columns (< 2^31)
  kernels::FastDivmod columns;             // packs (or elements) per row
  int k;
  int w_code;
  int w_bytes;  // bytes per weight
  float scale;
};

// 16 bytes with a plain (weak, default-policy) access: LDG.E.128 / STG.E.128, what Inductor's
// tl.load / tl.store give. In this kernel Pack::load's and store's uint4 dereferences came out as
// two LDG.E.64 and four STG.E, and __ldca / __stwb as LDG.E.128.STRONG.SM.
__device__ __forceinline__ uint4 load_plain(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ void store_plain(uint4* p, const uint4& v) {
  asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z),
               "r"(v.w)
               : "memory");
}

// A pack of x / out with the policy's access: evict-first (Pack::load_stream / store_stream)
// or plain. Scalars are plain either way.
template <kernels::Cache kCache, typename T, int kW>
__device__ __forceinline__ void load_pack(kernels::Pack<T, kW>& r, const T* p) {
  if constexpr (kW == 1 || kCache == kernels::Cache::kStream) {
    r.load_stream(p);
  } else {
#pragma unroll
    for (int a = 0; a < kernels::Pack<T, kW>::kAccesses; ++a)
      r.set(a, load_plain(reinterpret_cast<const uint4*>(p) + a));
  }
}

template <kernels::Cache kCache, typename T, int kW>
__device__ __forceinline__ void store_pack(const kernels::Pack<T, kW>& o, T* p) {
  if constexpr (kW == 1 || kCache == kernels::Cache::kStream) {
    o.store_stream(p);
  } else {
#pragma unroll
    for (int a = 0; a < kernels::Pack<T, kW>::kAccesses; ++a)
      store_plain(reinterpret_cast<uint4*>(p) + a, o.get(a));
  }
}

template <typename T, int kW, int kK, kernels::Cache kCache>
__global__ void __launch_bounds__(kThreads) sum_kernel(bool pdl, Params p) {
  using Raw = kernels::Pack<T, kW>;
  if (pdl) kernels::pdl_wait();
  const uint32_t item = blockIdx.x * kThreads + threadIdx.x;
  if (item >= p.work) return;
  uint32_t t32, c32;
  p.columns.divmod(item, t32, c32);
  const int64_t t = t32, c = c32;
  const T* x = static_cast<const T*>(p.x) + t * p.x_s0 + c * kW;
  const int k = kK > 0 ? kK : p.k;
  float acc[kW];
#pragma unroll
  for (int e = 0; e < kW; ++e) acc[e] = 0.0f;
  auto add = [&](const Raw& r, float wj) {
    float v[kW];
    r.unpack(v);
    if (p.w) {
#pragma unroll
      for (int e = 0; e < kW; ++e) acc[e] = __fadd_rn(acc[e], __fmul_rn(v[e], wj));
    } else {
#pragma unroll
      for (int e = 0; e < kW; ++e) acc[e] = __fadd_rn(acc[e], v[e]);
    }
  };
  const void* w = p.w ? static_cast<const void*>(static_cast<const char*>(p.w) +
                                                  t * p.w_s0 * p.w_bytes)
                      : nullptr;
  if constexpr (kK > 0) {
    Raw r[kK];
#pragma unroll
    for (int j = 0; j < kK; ++j) load_pack<kCache>(r[j], x + j * p.x_s1);
    float wv[kK];
    if (w) moe_common::load_floats<kK>(wv, w, p.w_code, p.w_s1, kK);
#pragma unroll
    for (int j = 0; j < kK; ++j) add(r[j], w ? wv[j] : 1.0f);
  } else {
    for (int j0 = 0; j0 < k; j0 += kBatch) {
      const int n = min(kBatch, k - j0);
      Raw r[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u)
        if (u < n) load_pack<kCache>(r[u], x + (j0 + u) * p.x_s1);
      float wv[kBatch];
      if (w)
        moe_common::load_floats<kBatch>(
            wv, static_cast<const char*>(w) + j0 * p.w_s1 * p.w_bytes, p.w_code, p.w_s1, n);
#pragma unroll
      for (int u = 0; u < kBatch; ++u)
        if (u < n) add(r[u], w ? wv[u] : 1.0f);
    }
  }
  if (pdl) kernels::pdl_launch_dependents();
#pragma unroll
  for (int e = 0; e < kW; ++e) acc[e] *= p.scale;
  Raw o;
  o.pack(acc);
  store_pack<kCache>(o, static_cast<T*>(p.out) + t * p.out_s0 + c * kW);
}

template <typename T, int kW, kernels::Cache kCache>
void launch(const kernels::Launch& ctx, const Params& p) {
  const unsigned grid = kernels::ceil_div(p.work, kThreads);
  switch (p.k) {
    case 1: kernels::launch(ctx, sum_kernel<T, kW, 1, kCache>, grid, kThreads, p); break;
    case 2: kernels::launch(ctx, sum_kernel<T, kW, 2, kCache>, grid, kThreads, p); break;
    case 4: kernels::launch(ctx, sum_kernel<T, kW, 4, kCache>, grid, kThreads, p); break;
    case 8: kernels::launch(ctx, sum_kernel<T, kW, 8, kCache>, grid, kThreads, p); break;
    case 9: kernels::launch(ctx, sum_kernel<T, kW, 9, kCache>, grid, kThreads, p); break;
    default: kernels::launch(ctx, sum_kernel<T, kW, 0, kCache>, grid, kThreads, p); break;
  }
}

}  // namespace moe_sum_reduce_detail

// out: [T, H], x: [T, k, H] (one dtype, last dims contiguous, other strides arbitrary),
// topk_weights: [T, k] float32/float16/bfloat16 or None.
inline void moe_sum_reduce(tvm::ffi::TensorView out, tvm::ffi::TensorView x,
                           tvm::ffi::Optional<tvm::ffi::TensorView> topk_weights,
                           double routed_scaling_factor) {
  namespace detail = moe_sum_reduce_detail;
  constexpr const char* kOp = "moe.moe_sum_reduce";
  // 1. Validate.
  kernels::check_ndim(kOp, "x", x, 3);
  kernels::check_ndim(kOp, "out", out, 2);
  const int64_t tokens = x.size(0), k = x.size(1), hidden = x.size(2);
  TVM_FFI_CHECK(out.size(0) == tokens && out.size(1) == hidden, ValueError)
      << kOp << ": out must have shape [" << tokens << ", " << hidden << "] [T, H], got "
      << kernels::shape_string(out);
  kernels::check_same_dtype(kOp, "out", out, "x", x);
  kernels::check_device(kOp, "x", x, kDLCUDA);
  kernels::check_same_device(kOp, "out", out, "x", x);
  kernels::check_last_dim_contiguous(kOp, "x", x);
  kernels::check_last_dim_contiguous(kOp, "out", out);
  TVM_FFI_CHECK(k < (int64_t{1} << 31), ValueError) << kOp << ": k too large";
  TVM_FFI_CHECK(hidden < (int64_t{1} << 31), ValueError) << kOp << ": hidden size too large";
  detail::Params p{};
  const bool weighted = topk_weights.has_value();
  if (weighted) {
    const tvm::ffi::TensorView w = topk_weights.value();
    kernels::check_ndim(kOp, "topk_weights", w, 2);
    TVM_FFI_CHECK(w.size(0) == tokens && w.size(1) == k, ValueError)
        << kOp << ": topk_weights must have shape [" << tokens << ", " << k << "] [T, k], got "
        << kernels::shape_string(w);
    kernels::check_same_device(kOp, "topk_weights", w, "x", x);
    p.w_code = moe_common::float_code(kOp, "topk_weights", w.dtype());
    p.w_bytes = p.w_code == moe_common::kF32 ? 4 : 2;
    p.w = kernels::data<const void>(w);
    p.w_s0 = w.stride(0);
    p.w_s1 = w.stride(1);
  }
  if (tokens == 0 || hidden == 0) return;
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(x);
  const kernels::Launch ctx(kOp, x);
  // 4. Dispatch on dtype and launch.
  p.x = kernels::data<const void>(x);
  p.out = kernels::data<void>(out);
  p.x_s0 = tokens == 1 ? 0 : x.stride(0);  // a size-1 dim's stride is arbitrary
  p.x_s1 = k == 1 ? 0 : x.stride(1);
  p.out_s0 = tokens == 1 ? 0 : out.stride(0);
  p.k = static_cast<int>(k);
  p.scale = static_cast<float>(routed_scaling_factor);
  KERNELS_DISPATCH_FLOAT(x.dtype(), kOp, T, [&] {
    constexpr int kW = kernels::kVectorBytes / static_cast<int>(sizeof(T));
    const bool packed = kernels::vectors_fit(hidden, kW, {p.x, p.out},
                                             {kernels::RowMap{p.x_s0, p.x_s1},
                                              kernels::RowMap{p.out_s0, 0}});
    const int64_t columns = packed ? hidden / kW : hidden;
    p.columns = kernels::FastDivmod(static_cast<uint32_t>(columns));
    // The scalar path's loads and stores are plain whatever the policy: one instantiation.
    const bool plain = tokens * k * hidden * static_cast<int64_t>(sizeof(T)) >=
                       detail::kPlainMinBytes;
    kernels::for_row_chunks(tokens, columns, [&](int64_t t0, int64_t n) {
      detail::Params c = p;
      c.x = static_cast<const T*>(p.x) + t0 * p.x_s0;
      c.out = static_cast<T*>(p.out) + t0 * p.out_s0;
      if (p.w) c.w = static_cast<const char*>(p.w) + t0 * p.w_s0 * p.w_bytes;
      c.work = static_cast<uint32_t>(n * columns);
      if (!packed)
        detail::launch<T, 1, kernels::Cache::kPlain>(ctx, c);
      else if (plain)
        detail::launch<T, kW, kernels::Cache::kPlain>(ctx, c);
      else
        detail::launch<T, kW, kernels::Cache::kStream>(ctx, c);
    });
  });
}
