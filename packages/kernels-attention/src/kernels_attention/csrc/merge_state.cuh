// attention.merge_state, CUDA: merge two partial attention states by their natural-log LSE.
//   m = max(s_a, s_b), wa = exp(s_a - m), wb = exp(s_b - m)
//   v = (wa v_a + wb v_b) / (wa + wb), s = m + ln(wa + wb)
// in fp32, v rounded once. +inf LSE counts as -inf (an empty segment); both -inf give v = 0 and
// s = -inf; NaN propagates.
//
// One thread per 16-byte pack of v (8 bf16/fp16, 4 fp32; one element on the scalar path), a flat
// index split by FastDivmod into (token, head, pack), so D = 128 bf16 is 16 threads per
// (token, head) and MLA's D = 512 is 64, with no limit on H or D. Each thread reads the two LSEs
// of its (token, head) (the threads of a row hit the same words: one L1 transaction) and its
// packs of v_a and v_b (streamed), writes its pack of v; the row's first thread writes s. Bytes:
// v_a, v_b, s_a, s_b read once, v and s written once. Blocks of 128, PDL for small grids (the
// pointwise engine's launch). Every tensor has its own (token, head) strides: [H, T] LSE storage
// seen transposed, out as a view of a wider buffer.
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(2);

#include <kernels/checks.h>
#include <kernels/dtype.h>
#include <kernels/pointwise.cuh>
#include <kernels/tensor.h>

#include <cmath>
#include <utility>

namespace merge_state_detail {

// (token, head) strides in elements of each tensor.
struct Strides {
  int64_t t, h;
};
struct Layout {
  Strides out, out_lse, v_a, s_a, v_b, s_b;
};

__device__ __forceinline__ int64_t at(const Strides& s, uint32_t t, uint32_t h) {
  return static_cast<int64_t>(t) * s.t + static_cast<int64_t>(h) * s.h;
}

template <typename T, int kN>
__global__ void __launch_bounds__(kernels::kPointwiseThreads)
    merge_kernel(bool pdl, T* __restrict__ out, float* __restrict__ out_lse,
                 const T* __restrict__ v_a, const float* __restrict__ s_a,
                 const T* __restrict__ v_b, const float* __restrict__ s_b, Layout l,
                 kernels::FastDivmod per_row, kernels::FastDivmod heads, uint32_t total) {
  const uint32_t i = blockIdx.x * kernels::kPointwiseThreads + threadIdx.x;
  if (pdl) kernels::pdl_wait();
  if (i >= total) return;
  uint32_t row, c, t, h;
  per_row.divmod(i, row, c);
  heads.divmod(row, t, h);
  float la = s_a[at(l.s_a, t, h)];
  float lb = s_b[at(l.s_b, t, h)];
  kernels::Pack<T, kN> a, b;
  a.load_stream(v_a + at(l.v_a, t, h) + c * kN);
  b.load_stream(v_b + at(l.v_b, t, h) + c * kN);
  if (pdl) kernels::pdl_launch_dependents();
  const float kInf = __int_as_float(0x7f800000);
  if (la == kInf) la = -kInf;
  if (lb == kInf) lb = -kInf;
  float v[kN];
  float lse;
  if (la == -kInf && lb == -kInf) {
#pragma unroll
    for (int e = 0; e < kN; ++e) v[e] = 0.0f;
    lse = -kInf;
  } else {
    const float m = fmaxf(la, lb);  // NaN in one LSE: reaches wa or wb below
    const float wa = expf(la - m), wb = expf(lb - m);
    const float total_w = wa + wb;
    // One division per thread: v = fa * (wa / total) + fb * (wb / total), within 2 ulp of fp32
    // of the reference's (wa fa + wb fb) / total.
    const float inv = 1.0f / total_w;
    const float ca = wa * inv, cb = wb * inv;
    float fa[kN], fb[kN];
    a.unpack(fa);
    b.unpack(fb);
#pragma unroll
    for (int e = 0; e < kN; ++e) v[e] = fmaf(fa[e], ca, fb[e] * cb);
    lse = m + logf(total_w);
  }
  kernels::Pack<T, kN> o;
  o.pack(v);
  o.store_stream(out + at(l.out, t, h) + c * kN);
  if (c == 0) out_lse[at(l.out_lse, t, h)] = lse;
}

inline Strides strides(const tvm::ffi::TensorView& x) {
  return {x.size(0) == 1 ? 0 : x.stride(0), x.size(1) == 1 ? 0 : x.stride(1)};
}

// Whether `out` is `in` itself (same address and strides: each thread reads its pack before
// writing it, so an in-place merge is safe) or disjoint from it.
inline void check_same_or_disjoint(const char* op, const char* a, const tvm::ffi::TensorView& x,
                                   const char* b, const tvm::ffi::TensorView& y) {
  bool same = kernels::data(x) == kernels::data(y) && x.ndim() == y.ndim();
  for (int d = 0; same && d < x.ndim(); ++d) same = x.stride(d) == y.stride(d);
  if (!same) kernels::check_no_overlap(op, a, x, b, y);
}

}  // namespace merge_state_detail

// out [T, H, D] and out_lse [T, H] fp32 (written); v_a, v_b [T, H, D] float32/float16/bfloat16;
// s_a, s_b [T, H] float32. The last dim of the v tensors contiguous, other strides arbitrary.
// out may be v_a or v_b itself; out_lse must not overlap s_a or s_b.
inline void merge_state(tvm::ffi::TensorView out, tvm::ffi::TensorView out_lse,
                        tvm::ffi::TensorView v_a, tvm::ffi::TensorView s_a,
                        tvm::ffi::TensorView v_b, tvm::ffi::TensorView s_b) {
  namespace detail = merge_state_detail;
  constexpr const char* kOp = "attention.merge_state";
  // 1. Validate.
  kernels::check_ndim(kOp, "v_a", v_a, 3);
  kernels::check_same_shape(kOp, "v_b", v_b, "v_a", v_a);
  kernels::check_same_shape(kOp, "out", out, "v_a", v_a);
  kernels::check_ndim(kOp, "s_a", s_a, 2);
  kernels::check_same_shape(kOp, "s_b", s_b, "s_a", s_a);
  kernels::check_same_shape(kOp, "out_lse", out_lse, "s_a", s_a);
  TVM_FFI_CHECK(s_a.size(0) == v_a.size(0) && s_a.size(1) == v_a.size(1), ValueError)
      << kOp << ": s_a " << kernels::shape_string(s_a) << " must be [T, H] of v_a "
      << kernels::shape_string(v_a);
  kernels::check_same_dtype(kOp, "v_b", v_b, "v_a", v_a);
  kernels::check_same_dtype(kOp, "out", out, "v_a", v_a);
  for (const auto& [name, t] :
       {std::pair<const char*, const tvm::ffi::TensorView*>{"s_a", &s_a}, {"s_b", &s_b},
        {"out_lse", &out_lse}}) {
    TVM_FFI_CHECK(kernels::is_dtype(t->dtype(), kDLFloat, 32), TypeError)
        << kOp << ": " << name << " must be float32";
  }
  kernels::check_last_dim_contiguous(kOp, "v_a", v_a);
  kernels::check_last_dim_contiguous(kOp, "v_b", v_b);
  kernels::check_last_dim_contiguous(kOp, "out", out);
  for (const auto& [name, t] :
       {std::pair<const char*, const tvm::ffi::TensorView*>{"v_b", &v_b}, {"s_a", &s_a},
        {"s_b", &s_b}, {"out", &out}, {"out_lse", &out_lse}}) {
    kernels::check_same_device(kOp, name, *t, "v_a", v_a);
  }
  detail::check_same_or_disjoint(kOp, "out", out, "v_a", v_a);
  detail::check_same_or_disjoint(kOp, "out", out, "v_b", v_b);
  kernels::check_no_overlap(kOp, "out_lse", out_lse, "s_a", s_a);
  kernels::check_no_overlap(kOp, "out_lse", out_lse, "s_b", s_b);
  kernels::check_no_overlap(kOp, "out_lse", out_lse, "out", out);
  kernels::check_device(kOp, "v_a", v_a, kDLCUDA);
  const int64_t tokens = v_a.size(0), heads = v_a.size(1), dim = v_a.size(2);
  if (tokens == 0 || heads == 0) return;
  TVM_FFI_CHECK(dim > 0, ValueError) << kOp << ": v_a's head dim D must be at least 1";

  const detail::Layout l{detail::strides(out), detail::strides(out_lse), detail::strides(v_a),
                         detail::strides(s_a),  detail::strides(v_b),     detail::strides(s_b)};
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(v_a);
  const kernels::Launch ctx(kOp, v_a);
  // 4. Dispatch on dtype and launch (checked), in token slices of fewer than 2^31 threads.
  KERNELS_DISPATCH_FLOAT(v_a.dtype(), kOp, T, [&] {
    constexpr int P = kernels::Pack<T>::size;
    T* o = kernels::data<T>(out);
    const T* a = kernels::data<const T>(v_a);
    const T* b = kernels::data<const T>(v_b);
    const bool packed =
        kernels::vectors_fit(dim, P, {o, a, b},
                             {kernels::RowMap{l.out.t, l.out.h}, kernels::RowMap{l.v_a.t, l.v_a.h},
                              kernels::RowMap{l.v_b.t, l.v_b.h}});
    const int64_t per_row = packed ? dim / P : dim;
    TVM_FFI_CHECK(heads * per_row < (int64_t{1} << 31), ValueError)
        << kOp << ": a token of v_a has too many elements (" << heads * dim << ")";
    const kernels::FastDivmod row_div(static_cast<uint32_t>(per_row));
    const kernels::FastDivmod head_div(static_cast<uint32_t>(heads));
    float* lse = kernels::data<float>(out_lse);
    const float* la = kernels::data<const float>(s_a);
    const float* lb = kernels::data<const float>(s_b);
    kernels::for_row_chunks(tokens, heads * per_row, [&](int64_t t0, int64_t n) {
      const int64_t work = n * heads * per_row;
      auto kernel = packed ? detail::merge_kernel<T, P> : detail::merge_kernel<T, 1>;
      kernels::launch_pointwise(ctx, kernel, work, o + t0 * l.out.t, lse + t0 * l.out_lse.t,
                                a + t0 * l.v_a.t, la + t0 * l.s_a.t, b + t0 * l.v_b.t,
                                lb + t0 * l.s_b.t, l, row_div, head_div,
                                static_cast<uint32_t>(work));
    });
  });
}
