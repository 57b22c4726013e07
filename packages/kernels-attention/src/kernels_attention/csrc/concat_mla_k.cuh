// attention.concat_mla_k, CUDA: k[t, h, :Dn] = k_nope[t, h], k[t, h, Dn:] = k_rope[t, 0] (the
// rope part broadcast over the H heads). A pure copy: bytes move as they are (fp32, fp16, bf16,
// fp8), in chunks of the widest access in {16, 8, 4, 2, 1} bytes that every base pointer, row
// width (Dn and Dr in bytes) and stride allows.
//
// One thread per output chunk, a flat index split by FastDivmod into (token, head, chunk); a
// chunk below Dn is read from k_nope (streamed), above it from k_rope (read through L1/L2: the H
// heads of a token read the same Dr bytes). DeepSeek's bf16 128 + 64: 24 chunks of 16 bytes per
// (token, head), so a warp writes 512 contiguous bytes of k. Non-contiguous inputs (transposed
// BMM outputs, the nope part of the kv_b projection) only change the strides; H needs no
// particular value (12, 96, 128). Blocks of 128 threads, PDL for small grids (pointwise engine).
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(2);

#include <kernels/checks.h>
#include <kernels/dtype.h>
#include <kernels/pointwise.cuh>
#include <kernels/tensor.h>

namespace concat_mla_k_detail {

// Strides in bytes.
struct Layout {
  int64_t k_t, k_h, nope_t, nope_h, rope_t;
};

template <int kBytes>
struct Chunk;
template <>
struct Chunk<16> {
  using Type = uint4;
};
template <>
struct Chunk<8> {
  using Type = uint2;
};
template <>
struct Chunk<4> {
  using Type = uint32_t;
};
template <>
struct Chunk<2> {
  using Type = uint16_t;
};
template <>
struct Chunk<1> {
  using Type = uint8_t;
};

template <int kBytes>
__global__ void __launch_bounds__(kernels::kPointwiseThreads)
    concat_kernel(bool pdl, char* __restrict__ k, const char* __restrict__ nope,
                  const char* __restrict__ rope, Layout s, kernels::FastDivmod per_row,
                  kernels::FastDivmod heads, uint32_t nope_chunks, uint32_t total) {
  using C = typename Chunk<kBytes>::Type;
  const uint32_t i = blockIdx.x * kernels::kPointwiseThreads + threadIdx.x;
  if (pdl) kernels::pdl_wait();
  if (i >= total) return;
  uint32_t row, c, t, h;
  per_row.divmod(i, row, c);
  heads.divmod(row, t, h);
  C v;
  if (c < nope_chunks) {
    v = __ldcs(reinterpret_cast<const C*>(nope + t * s.nope_t + h * s.nope_h) + c);
  } else {
    v = __ldg(reinterpret_cast<const C*>(rope + t * s.rope_t) + (c - nope_chunks));
  }
  if (pdl) kernels::pdl_launch_dependents();
  __stcs(reinterpret_cast<C*>(k + t * s.k_t + h * s.k_h) + c, v);
}

// uint8/uint16 have no __ldcs/__stcs overloads: plain accesses for chunks below 4 bytes.
template <int kBytes>
__global__ void __launch_bounds__(kernels::kPointwiseThreads)
    concat_small_kernel(bool pdl, char* __restrict__ k, const char* __restrict__ nope,
                        const char* __restrict__ rope, Layout s, kernels::FastDivmod per_row,
                        kernels::FastDivmod heads, uint32_t nope_chunks, uint32_t total) {
  using C = typename Chunk<kBytes>::Type;
  const uint32_t i = blockIdx.x * kernels::kPointwiseThreads + threadIdx.x;
  if (pdl) kernels::pdl_wait();
  if (i >= total) return;
  uint32_t row, c, t, h;
  per_row.divmod(i, row, c);
  heads.divmod(row, t, h);
  const C v = c < nope_chunks
                  ? reinterpret_cast<const C*>(nope + t * s.nope_t + h * s.nope_h)[c]
                  : reinterpret_cast<const C*>(rope + t * s.rope_t)[c - nope_chunks];
  if (pdl) kernels::pdl_launch_dependents();
  reinterpret_cast<C*>(k + t * s.k_t + h * s.k_h)[c] = v;
}

// The stride of dim `d` in bytes, 0 where the dim has one element (its stride is never used).
inline int64_t byte_stride(const tvm::ffi::TensorView& t, int d, int64_t elem) {
  return t.size(d) == 1 ? 0 : t.stride(d) * elem;
}

}  // namespace concat_mla_k_detail

// k [T, H, Dn+Dr] (written), k_nope [T, H, Dn], k_rope [T, 1, Dr]: one dtype (1, 2 or 4 bytes),
// last dims contiguous, other strides arbitrary; k must not overlap the inputs.
inline void concat_mla_k(tvm::ffi::TensorView k, tvm::ffi::TensorView k_nope,
                         tvm::ffi::TensorView k_rope) {
  namespace detail = concat_mla_k_detail;
  constexpr const char* kOp = "attention.concat_mla_k";
  // 1. Validate.
  kernels::check_ndim(kOp, "k", k, 3);
  kernels::check_ndim(kOp, "k_nope", k_nope, 3);
  kernels::check_ndim(kOp, "k_rope", k_rope, 3);
  const int64_t tokens = k.size(0), heads = k.size(1), width = k.size(2);
  const int64_t dn = k_nope.size(2), dr = k_rope.size(2);
  TVM_FFI_CHECK(k_nope.size(0) == tokens && k_nope.size(1) == heads, ValueError)
      << kOp << ": k_nope " << kernels::shape_string(k_nope) << " must share T and H with k "
      << kernels::shape_string(k);
  TVM_FFI_CHECK(k_rope.size(0) == tokens && k_rope.size(1) == 1, ValueError)
      << kOp << ": k_rope must be [T, 1, Dr] with T = " << tokens << ", got "
      << kernels::shape_string(k_rope);
  TVM_FFI_CHECK(dn + dr == width, ValueError)
      << kOp << ": k's last dim " << width << " must be Dn + Dr = " << dn << " + " << dr;
  kernels::check_same_dtype(kOp, "k_nope", k_nope, "k", k);
  kernels::check_same_dtype(kOp, "k_rope", k_rope, "k", k);
  const int bits = k.dtype().bits * k.dtype().lanes;
  TVM_FFI_CHECK(bits == 8 || bits == 16 || bits == 32, TypeError)
      << kOp << ": unsupported dtype (expected 1, 2 or 4 bytes per element)";
  kernels::check_last_dim_contiguous(kOp, "k", k);
  kernels::check_last_dim_contiguous(kOp, "k_nope", k_nope);
  kernels::check_last_dim_contiguous(kOp, "k_rope", k_rope);
  kernels::check_same_device(kOp, "k_nope", k_nope, "k", k);
  kernels::check_same_device(kOp, "k_rope", k_rope, "k", k);
  kernels::check_no_overlap(kOp, "k", k, "k_nope", k_nope);
  kernels::check_no_overlap(kOp, "k", k, "k_rope", k_rope);
  kernels::check_device(kOp, "k", k, kDLCUDA);
  if (tokens == 0 || heads == 0 || width == 0) return;

  const int64_t elem = bits / 8;
  const detail::Layout s{detail::byte_stride(k, 0, elem), detail::byte_stride(k, 1, elem),
                         detail::byte_stride(k_nope, 0, elem), detail::byte_stride(k_nope, 1, elem),
                         detail::byte_stride(k_rope, 0, elem)};
  char* kp = kernels::data<char>(k);
  const char* np = kernels::data<const char>(k_nope);
  const char* rp = kernels::data<const char>(k_rope);
  // The widest chunk every address of every row start is a multiple of.
  const uint64_t all = reinterpret_cast<uintptr_t>(kp) | reinterpret_cast<uintptr_t>(np) |
                       reinterpret_cast<uintptr_t>(rp) | static_cast<uint64_t>(dn * elem) |
                       static_cast<uint64_t>(dr * elem) | static_cast<uint64_t>(s.k_t) |
                       static_cast<uint64_t>(s.k_h) | static_cast<uint64_t>(s.nope_t) |
                       static_cast<uint64_t>(s.nope_h) | static_cast<uint64_t>(s.rope_t);
  int chunk = 16;
  while (chunk > 1 && all % chunk) chunk /= 2;
  const int64_t nope_chunks = dn * elem / chunk;
  const int64_t per_row = nope_chunks + dr * elem / chunk;
  TVM_FFI_CHECK(heads * per_row < (int64_t{1} << 31), ValueError)
      << kOp << ": a token of k has too many elements (" << heads * width << ")";
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(k);
  const kernels::Launch ctx(kOp, k);
  // 4. Launch per chunk width (checked), in token slices of fewer than 2^31 chunks.
  const kernels::FastDivmod row_div(static_cast<uint32_t>(per_row));
  const kernels::FastDivmod head_div(static_cast<uint32_t>(heads));
  kernels::for_row_chunks(tokens, heads * per_row, [&](int64_t t0, int64_t n) {
    const int64_t work = n * heads * per_row;
    auto go = [&](auto kernel) {
      kernels::launch_pointwise(ctx, kernel, work, kp + t0 * s.k_t, np + t0 * s.nope_t,
                                rp + t0 * s.rope_t, s, row_div, head_div,
                                static_cast<uint32_t>(nope_chunks), static_cast<uint32_t>(work));
    };
    switch (chunk) {
      case 16: go(detail::concat_kernel<16>); break;
      case 8: go(detail::concat_kernel<8>); break;
      case 4: go(detail::concat_kernel<4>); break;
      case 2: go(detail::concat_small_kernel<2>); break;
      default: go(detail::concat_small_kernel<1>); break;
    }
  });
}
