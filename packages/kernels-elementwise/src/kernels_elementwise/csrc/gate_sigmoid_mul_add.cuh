// elementwise.gate_sigmoid_mul_add, CUDA: a shared-expert gate.
//   g[t] = sigmoid(sum_k h[t, k] * w[k]);  out[t, :] = g[t] * shared[t, :] (+ routed[t, :])
// in fp32, rounded once. h [T, K], shared/routed/out [T, H], w [K]; rows may be strided.
//
// One block per token: the block streams its row of h against w (w stays in L1/L2: every block
// reads it), reduces the dot product across the block, then streams shared (+ routed) into out.
// The first slice of shared/routed is loaded before the reduction so those loads overlap it; for
// H <= 8192 bf16 that is the whole row. 16-byte packs when K, H, strides and pointers allow,
// scalars otherwise. Bytes: read h, w, shared (and routed) once, write out.
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(2);

#include <kernels/activation_math.cuh>
#include <kernels/checks.h>
#include <kernels/cuda_dtype.cuh>
#include <kernels/dtype.h>
#include <kernels/launch.cuh>
#include <kernels/pointwise.cuh>
#include <kernels/reduce.cuh>

namespace gate_sigmoid_mul_add_detail {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;  // accesses of each operand in flight per thread

struct Rows {
  int64_t h, shared, routed, out;  // row strides in elements
};

template <typename T, bool kPacked, bool kRouted>
__global__ void __launch_bounds__(kThreads)
    gate_kernel(T* __restrict__ out, const T* __restrict__ h, const T* __restrict__ w,
                const T* __restrict__ shared, const T* __restrict__ routed, Rows rows,
                int64_t k_accesses, int64_t h_accesses) {
  constexpr int W = kernels::pack_width<T, kPacked>;
  using Raw = kernels::Pack<T, W>;
  constexpr int64_t kChunk = kThreads * kUnroll;
  __shared__ float partial[32];
  const int64_t row = blockIdx.x;
  const int tid = threadIdx.x;
  h += row * rows.h;
  shared += row * rows.shared;
  out += row * rows.out;
  if constexpr (kRouted) routed += row * rows.routed;

  // The first output slice: issued now, consumed after the reduction.
  Raw sr[kUnroll], rr[kUnroll];
  auto load_outputs = [&](int64_t base) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t j = base + u * kThreads + tid;
      if (j < h_accesses) {
        sr[u].load_stream(shared + j * W);
        if constexpr (kRouted) rr[u].load_stream(routed + j * W);
      }
    }
  };
  load_outputs(0);

  float acc = 0.0f;
  for (int64_t base = 0; base < k_accesses; base += kChunk) {
    Raw hr[kUnroll], wr[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t j = base + u * kThreads + tid;
      if (j < k_accesses) {
        hr[u].load_stream(h + j * W);
        wr[u].load_cached(w + j * W);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t j = base + u * kThreads + tid;
      if (j < k_accesses) {
        float hv[W], wv[W];
        hr[u].unpack(hv);
        wr[u].unpack(wv);
#pragma unroll
        for (int e = 0; e < W; ++e) acc = fmaf(hv[e], wv[e], acc);
      }
    }
  }
  const float gate = kernels::math::sigmoid(kernels::block_sum(acc, partial));

  for (int64_t base = 0; base < h_accesses; base += kChunk) {
    if (base) load_outputs(base);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t j = base + u * kThreads + tid;
      if (j < h_accesses) {
        float s[W], r[W];
        sr[u].unpack(s);
        if constexpr (kRouted) {
          rr[u].unpack(r);
#pragma unroll
          for (int e = 0; e < W; ++e) s[e] = fmaf(gate, s[e], r[e]);
        } else {
#pragma unroll
          for (int e = 0; e < W; ++e) s[e] *= gate;
        }
        sr[u].pack(s);
        sr[u].store_stream(out + j * W);
      }
    }
  }
}

template <typename T, bool kPacked>
void launch(T* out, const T* h, const T* w, const T* shared, const T* routed, Rows rows,
            int64_t tokens, int64_t k, int64_t hidden, cudaStream_t stream) {
  constexpr int W = kernels::pack_width<T, kPacked>;
  const unsigned grid = static_cast<unsigned>(tokens);
  if (routed)
    gate_kernel<T, kPacked, true>
        <<<grid, kThreads, 0, stream>>>(out, h, w, shared, routed, rows, k / W, hidden / W);
  else
    gate_kernel<T, kPacked, false>
        <<<grid, kThreads, 0, stream>>>(out, h, w, shared, routed, rows, k / W, hidden / W);
}

inline int64_t row_stride(const tvm::ffi::TensorView& t) {
  return t.size(0) == 1 ? 0 : t.stride(0);
}

}  // namespace gate_sigmoid_mul_add_detail

// out: [T, H] (may alias routed). h: [T, K]. w: [K]. shared: [T, H]. routed: [T, H] or None.
// One dtype for all; last dims contiguous, row strides arbitrary.
inline void gate_sigmoid_mul_add(tvm::ffi::TensorView out, tvm::ffi::TensorView h,
                                 tvm::ffi::TensorView w, tvm::ffi::TensorView shared,
                                 tvm::ffi::Optional<tvm::ffi::TensorView> routed) {
  namespace detail = gate_sigmoid_mul_add_detail;
  constexpr const char* kOp = "elementwise.gate_sigmoid_mul_add";
  // 1. Validate.
  kernels::check_ndim(kOp, "h", h, 2);
  kernels::check_ndim(kOp, "w", w, 1);
  kernels::check_ndim(kOp, "shared", shared, 2);
  kernels::check_same_shape(kOp, "out", out, "shared", shared);
  const int64_t tokens = h.size(0), k = h.size(1), hidden = shared.size(1);
  TVM_FFI_CHECK(w.size(0) == k && shared.size(0) == tokens, ValueError)
      << kOp << ": h " << kernels::shape_string(h) << ", w " << kernels::shape_string(w)
      << " and shared " << kernels::shape_string(shared) << " must be [T, K], [K] and [T, H]";
  TVM_FFI_CHECK(tokens < (int64_t{1} << 31), ValueError) << kOp << ": more than 2^31 - 1 rows";
  for (const auto& [name, t] : {std::pair<const char*, const tvm::ffi::TensorView*>{"h", &h},
                                {"w", &w},
                                {"shared", &shared},
                                {"out", &out}}) {
    kernels::check_same_dtype(kOp, name, *t, "h", h);
    kernels::check_device(kOp, name, *t, kDLCUDA);
    kernels::check_same_device(kOp, name, *t, "h", h);
    kernels::check_last_dim_contiguous(kOp, name, *t);
  }
  const bool has_routed = routed.has_value();
  const tvm::ffi::TensorView rt = has_routed ? routed.value() : shared;
  kernels::check_same_shape(kOp, "routed", rt, "shared", shared);
  kernels::check_same_dtype(kOp, "routed", rt, "h", h);
  kernels::check_same_device(kOp, "routed", rt, "h", h);
  kernels::check_last_dim_contiguous(kOp, "routed", rt);
  if (tokens == 0 || hidden == 0) return;
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(h);
  cudaStream_t stream = kernels::current_stream(h);
  // 4. Dispatch on dtype and launch.
  const detail::Rows rows{detail::row_stride(h), detail::row_stride(shared),
                          detail::row_stride(rt), detail::row_stride(out)};
  KERNELS_DISPATCH_FLOAT(h.dtype(), kOp, T, [&] {
    T* o = kernels::data<T>(out);
    const T* hp = kernels::data<const T>(h);
    const T* wp = kernels::data<const T>(w);
    const T* sp = kernels::data<const T>(shared);
    const T* rp = has_routed ? kernels::data<const T>(rt) : nullptr;
    const bool packed = kernels::packs_fit(hp, k, rows.h, sizeof(T)) && kernels::is_aligned(wp) &&
                        kernels::packs_fit(sp, hidden, rows.shared, sizeof(T)) &&
                        kernels::packs_fit(o, hidden, rows.out, sizeof(T)) &&
                        (!rp || kernels::packs_fit(rp, hidden, rows.routed, sizeof(T)));
    if (packed)
      detail::launch<T, true>(o, hp, wp, sp, rp, rows, tokens, k, hidden, stream);
    else
      detail::launch<T, false>(o, hp, wp, sp, rp, rows, tokens, k, hidden, stream);
  });
  kernels::check_launch(kOp);
}
