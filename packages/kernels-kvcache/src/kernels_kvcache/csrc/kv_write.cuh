// kvcache: the row-scatter engine of the KV-cache writes (store_cache, reshape_and_cache_flash,
// set_mla_kv_buffer). Each token writes one or two parts (K and V, or MLA's nope and rope), each
// `heads` runs of `width` contiguous elements, from src + token * src_tok + head * src_head to
// dst + block * dst_block + offset * dst_tok + head * dst_head, where (block, offset) =
// divmod(slot, block_size) (block_size 1 for token-major caches). Pure data movement:
//
//   - a group of G threads (a power of two, 1..256, chosen at launch) per token, 256 threads per
//     block, so several tokens are in flight per CTA, the groups striding over the tokens in a
//     grid of at most the resident blocks (no partial last wave at prefill sizes); each thread
//     issues kUnroll 16-byte loads (kernels::Pack) before it stores any, the stores plain
//     (attention reads the cache next);
//   - the vector path needs 16-byte aligned sources, widths and strides in whole packs; anything
//     else runs the same body one element at a time;
//   - fp8 caches (float8_e4m3fn, or uint8 holding its bytes) store cvt_satfinite_rne(x / scale),
//     x / scale correctly rounded (__fdiv_rn, so the reference's torch division is matched bit for
//     bit), two values per __nv_cvt_float2_to_fp8x2; the scale is read on the device;
//   - slots are int32 or int64 with 64-bit offsets. Negative slots and the skip index are skipped
//     (the semantics); a slot >= the cache's slot count is skipped too: the torch reference raises
//     ValueError for it, which the GPU cannot do without a host sync, so the kernels never form
//     its address (no illegal access) and drop that row.
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(2);

#include <cuda_fp8.h>

#include <kernels/checks.h>
#include <kernels/dtype.h>
#include <kernels/launch.cuh>
#include <kernels/pdl.cuh>
#include <kernels/pointwise.cuh>
#include <kernels/tensor.h>
#include <kernels/vec.cuh>

#include <algorithm>
#include <cstdint>

namespace kv_write {

constexpr int kThreads = 256;
constexpr int kUnroll = 8;

// One part of a token's row: `per_head.divisor` packs per head, `items` packs in all. Strides are
// in elements (of T for the source, of the cache for the destination).
template <typename T, typename TC>
struct Part {
  const T* src = nullptr;
  TC* dst = nullptr;
  int64_t src_tok = 0;
  int64_t src_head = 0;
  int64_t dst_block = 0;
  int64_t dst_tok = 0;
  int64_t dst_head = 0;
  kernels::FastDivmod per_head;
  uint32_t items = 0;
  const float* scale = nullptr;  // fp8 caches only; null: 1.0
};

template <typename T, typename TC>
struct Params {
  Part<T, TC> a;
  Part<T, TC> b;  // items == 0 when absent
  const void* slots = nullptr;
  int64_t tokens = 0;
  int64_t limit = 0;    // slots in the cache: a slot >= limit is skipped
  int64_t skip = -1;    // one more slot value to skip (negative: none)
  int64_t block_size = 1;
  kernels::FastDivmod block_div;  // block_size, when limit < 2^31
  bool wide = false;              // limit >= 2^31 and block_size > 1: 64-bit division
  int group_shift = 0;            // log2(G)
};

// fp8 e4m3 bytes of kN values (kN = 1, 2, 4 or 8), stored with one access.
template <int kN>
struct Fp8Bytes;
template <>
struct Fp8Bytes<1> {
  static __device__ __forceinline__ void store(uint8_t* p, const float* v) {
    const __nv_fp8x2_storage_t two =
        __nv_cvt_float2_to_fp8x2(make_float2(v[0], 0.f), __NV_SATFINITE, __NV_E4M3);
    *p = static_cast<uint8_t>(two & 0xff);
  }
};
template <>
struct Fp8Bytes<4> {
  static __device__ __forceinline__ uint32_t word(const float* v) {
    const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(v[0], v[1]), __NV_SATFINITE, __NV_E4M3);
    const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(v[2], v[3]), __NV_SATFINITE, __NV_E4M3);
    return lo | (hi << 16);
  }
  static __device__ __forceinline__ void store(uint8_t* p, const float* v) {
    *reinterpret_cast<uint32_t*>(p) = word(v);
  }
};
template <>
struct Fp8Bytes<8> {
  static __device__ __forceinline__ void store(uint8_t* p, const float* v) {
    *reinterpret_cast<uint2*>(p) = make_uint2(Fp8Bytes<4>::word(v), Fp8Bytes<4>::word(v + 4));
  }
};

// One token's row: its slot, then every pack of its parts, kUnroll loads in flight per thread.
template <typename T, typename TC, int kN, typename Idx>
__device__ __forceinline__ void write_token(const Params<T, TC>& p, int64_t token, uint32_t lane,
                                            int g, bool pdl) {
  constexpr bool kFp8 = std::is_same_v<TC, uint8_t>;
  const int64_t slot = static_cast<int64_t>(static_cast<const Idx*>(p.slots)[token]);
  if (slot < 0 || slot == p.skip || slot >= p.limit) return;  // padding, skipped, out of range
  int64_t block = slot, offset = 0;
  if (p.block_size > 1) {
    if (p.wide) {
      block = slot / p.block_size;
      offset = slot - block * p.block_size;
    } else {
      uint32_t q, r;
      p.block_div.divmod(static_cast<uint32_t>(slot), q, r);
      block = q;
      offset = r;
    }
  }
  [[maybe_unused]] float scale_a = 1.f, scale_b = 1.f;
  if constexpr (kFp8) {
    if (p.a.scale) scale_a = *p.a.scale;
    if (p.b.scale) scale_b = *p.b.scale;
  }
  const T* src_a = p.a.src + token * p.a.src_tok;
  const T* src_b = p.b.src + token * p.b.src_tok;
  TC* dst_a = p.a.dst + block * p.a.dst_block + offset * p.a.dst_tok;
  TC* dst_b = p.b.dst + block * p.b.dst_block + offset * p.b.dst_tok;
  const uint32_t items = p.a.items + p.b.items;
  const uint32_t step = static_cast<uint32_t>(g) * kUnroll;
  for (uint32_t base = lane; base < items; base += step) {
    kernels::Pack<T, kN> v[kUnroll];
    TC* out[kUnroll];
    bool second[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const uint32_t j = base + u * g;
      if (j < items) {
        second[u] = j >= p.a.items;
        const uint32_t jj = second[u] ? j - p.a.items : j;
        uint32_t h, c;
        (second[u] ? p.b.per_head : p.a.per_head).divmod(jj, h, c);
        const T* s = second[u] ? src_b + h * p.b.src_head : src_a + h * p.a.src_head;
        out[u] = second[u] ? dst_b + h * p.b.dst_head : dst_a + h * p.a.dst_head;
        out[u] += static_cast<int64_t>(c) * kN;
        v[u].load_stream(s + static_cast<int64_t>(c) * kN);
      }
    }
    if (pdl) kernels::pdl_launch_dependents();
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const uint32_t j = base + u * g;
      if (j < items) {
        if constexpr (kFp8) {
          float f[kN];
          v[u].unpack(f);
          const float s = second[u] ? scale_b : scale_a;
#pragma unroll
          for (int e = 0; e < kN; ++e) f[e] = __fdiv_rn(f[e], s);
          Fp8Bytes<kN>::store(out[u], f);
        } else {
          v[u].store(out[u]);
        }
      }
    }
  }
}

// Groups of G threads stride over the tokens: the grid is at most the resident blocks, so the
// last wave is not a partial one at prefill sizes.
template <typename T, typename TC, int kN, typename Idx>
__global__ void __launch_bounds__(kThreads) write_rows_kernel(bool pdl, const Params<T, TC> p) {
  const int g = 1 << p.group_shift;
  const uint32_t lane = threadIdx.x & (g - 1);
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) >> p.group_shift;
  const int64_t stride = (static_cast<int64_t>(gridDim.x) * kThreads) >> p.group_shift;
  if (pdl) kernels::pdl_wait();
  for (int64_t token = first; token < p.tokens; token += stride)
    write_token<T, TC, kN, Idx>(p, token, lane, g, pdl);
}

// ------------------------------------------------------------------------------------------------
// Host side.

inline bool is_fp8(DLDataType t) {
  return kernels::is_dtype(t, kDLFloat8_e4m3fn, 8) || kernels::is_dtype(t, kDLUInt, 8);
}

inline bool is_index(DLDataType t) {
  return kernels::is_dtype(t, kDLInt, 32) || kernels::is_dtype(t, kDLInt, 64);
}

// A part as the host sees it, before the element type is fixed.
struct PartSpec {
  const void* src = nullptr;
  void* dst = nullptr;  // already offset to the part's first column
  int64_t src_tok = 0, src_head = 0;
  int64_t dst_block = 0, dst_tok = 0, dst_head = 0;
  int64_t heads = 0, width = 0;
  const float* scale = nullptr;
};

// Whether every access of `part` can be one pack of kN elements.
inline bool part_fits(const PartSpec& s, int64_t vec, int64_t src_bytes, int64_t dst_bytes) {
  if (s.heads == 0) return true;
  const auto aligned = [](const void* ptr, int64_t bytes) {
    return reinterpret_cast<uintptr_t>(ptr) % static_cast<uintptr_t>(bytes) == 0;
  };
  bool fit = s.width % vec == 0 && aligned(s.src, vec * src_bytes) &&
             aligned(s.dst, vec * dst_bytes);
  for (int64_t stride : {s.src_tok, s.src_head, s.dst_block, s.dst_tok, s.dst_head})
    fit = fit && stride % vec == 0;
  return fit;
}

template <typename T, typename TC>
Part<T, TC> make_part(const PartSpec& s, int kN) {
  Part<T, TC> p;
  if (s.heads == 0 || s.width == 0) return p;
  p.src = static_cast<const T*>(s.src);
  p.dst = static_cast<TC*>(s.dst);
  p.src_tok = s.src_tok;
  p.src_head = s.src_head;
  p.dst_block = s.dst_block;
  p.dst_tok = s.dst_tok;
  p.dst_head = s.dst_head;
  p.per_head = kernels::FastDivmod(static_cast<uint32_t>(s.width / kN));
  p.items = static_cast<uint32_t>(s.heads * (s.width / kN));
  p.scale = s.scale;
  return p;
}

template <auto kKernel, typename P>
inline void launch_resident(const kernels::Launch& ctx, int64_t needed, const P& p) {
  kernels::launch(ctx, kKernel, kernels::resident_grid<kKernel>(ctx.device, needed, kThreads),
                 kThreads, p);
}

// The launch: T the input element type, TC the cache's (T, or uint8_t for fp8 bytes).
template <typename T, typename TC>
void write_rows(const kernels::Launch& ctx, const PartSpec& a, const PartSpec& b,
                const tvm::ffi::TensorView& slots, int64_t tokens, int64_t limit, int64_t skip,
                int64_t block_size) {
  constexpr int kVec = kernels::kVectorBytes / static_cast<int>(sizeof(T));
  const bool vector = part_fits(a, kVec, sizeof(T), sizeof(TC)) &&
                      part_fits(b, kVec, sizeof(T), sizeof(TC));
  const int kN = vector ? kVec : 1;
  const int64_t items = a.heads * (a.width / kN) + b.heads * (b.width / kN);
  TVM_FFI_CHECK(items < (int64_t{1} << 31), ValueError)
      << ctx.op << ": a token's row is too wide (" << items << " accesses)";
  if (items == 0 || tokens == 0) return;
  Params<T, TC> p;
  p.a = make_part<T, TC>(a, kN);
  p.b = make_part<T, TC>(b, kN);
  p.slots = kernels::data<const void>(slots);
  p.tokens = tokens;
  p.limit = limit;
  p.skip = skip;
  p.block_size = block_size;
  p.wide = limit >= (int64_t{1} << 31);
  if (block_size > 1 && !p.wide) p.block_div = kernels::FastDivmod(static_cast<uint32_t>(block_size));
  // Threads per token: about kUnroll packs each, more (up to the row) while the grid is short
  // of one full wave of 2048 threads per SM (latency of small batches).
  const int g = kernels::threads_per_row(items, tokens, kUnroll, kThreads, ctx.device);
  int shift = 0;
  while ((1 << shift) < g) ++shift;
  p.group_shift = shift;
  const int64_t needed = (tokens * g + kThreads - 1) / kThreads;
  const bool idx64 = kernels::is_dtype(slots.dtype(), kDLInt, 64);
  if (vector && idx64)
    launch_resident<write_rows_kernel<T, TC, kVec, int64_t>>(ctx, needed, p);
  else if (vector)
    launch_resident<write_rows_kernel<T, TC, kVec, int32_t>>(ctx, needed, p);
  else if (idx64)
    launch_resident<write_rows_kernel<T, TC, 1, int64_t>>(ctx, needed, p);
  else
    launch_resident<write_rows_kernel<T, TC, 1, int32_t>>(ctx, needed, p);
}

// Dispatch on the input dtype and the cache kind (same dtype, or fp8 bytes).
inline void dispatch(const kernels::Launch& ctx, DLDataType dtype, bool fp8, const PartSpec& a,
                     const PartSpec& b, const tvm::ffi::TensorView& slots, int64_t tokens,
                     int64_t limit, int64_t skip, int64_t block_size) {
  KERNELS_DISPATCH_FLOAT(dtype, ctx.op, T, [&] {
    if (fp8)
      write_rows<T, uint8_t>(ctx, a, b, slots, tokens, limit, skip, block_size);
    else
      write_rows<T, T>(ctx, a, b, slots, tokens, limit, skip, block_size);
  });
}

// Shared argument checks.
inline void check_input(const char* op, const char* arg, const tvm::ffi::TensorView& t,
                        const tvm::ffi::TensorView& like, int ndim) {
  kernels::check_ndim(op, arg, t, ndim);
  kernels::check_device(op, arg, t, kDLCUDA);
  kernels::check_same_device(op, arg, t, "the first input", like);
  kernels::check_last_dim_contiguous(op, arg, t);
}

inline void check_slots(const char* op, const char* arg, const tvm::ffi::TensorView& slots,
                        const tvm::ffi::TensorView& like, int64_t n) {
  kernels::check_ndim(op, arg, slots, 1);
  TVM_FFI_CHECK(is_index(slots.dtype()), TypeError)
      << op << ": " << arg << " must be int32 or int64";
  TVM_FFI_CHECK(slots.size(0) == n, ValueError)
      << op << ": " << arg << " must have one slot per input row (" << n << "), got shape "
      << kernels::shape_string(slots);
  TVM_FFI_CHECK(slots.size(0) <= 1 || slots.stride(0) == 1, ValueError)
      << op << ": " << arg << " must be contiguous";
  kernels::check_device(op, arg, slots, kDLCUDA);
  kernels::check_same_device(op, arg, slots, "the first input", like);
}

inline const float* scale_ptr(const char* op, const char* arg,
                              const tvm::ffi::Optional<tvm::ffi::TensorView>& scale,
                              const tvm::ffi::TensorView& like) {
  if (!scale.has_value()) return nullptr;
  const tvm::ffi::TensorView s = scale.value();
  TVM_FFI_CHECK(kernels::is_dtype(s.dtype(), kDLFloat, 32) && s.numel() == 1, ValueError)
      << op << ": " << arg << " must hold exactly one fp32 value (shape [1]), got shape "
      << kernels::shape_string(s);
  kernels::check_device(op, arg, s, kDLCUDA);
  kernels::check_same_device(op, arg, s, "the first input", like);
  return kernels::data<const float>(s);
}

inline int64_t elem_bytes(DLDataType t) { return (t.bits * t.lanes + 7) / 8; }

}  // namespace kv_write
