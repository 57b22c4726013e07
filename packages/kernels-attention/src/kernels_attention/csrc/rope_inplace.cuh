// attention.rope_inplace, CUDA: rotary embedding in place on q [T, Hq, D] and k [T, Hk, D] from a
// cos/sin cache [max_pos, R] (cos in columns [0, R/2), sin in [R/2, R); float32 or bfloat16).
// NeoX rotates the pairs (i, i + R/2), GPT-J the pairs (2i, 2i + 1):
//   x1' = x1 cos_i - x2 sin_i,  x2' = x2 cos_i + x1 sin_i   (fp32, rounded once)
// Channels >= R are neither read nor written (partial rotary).
//
// Work unit: one 16-byte pack of a head's rotary channels (NeoX: a pack of the first half and the
// matching pack of the second half, so the thread holds both members of every pair; GPT-J: one
// pack, whose pairs are adjacent), or one element (NeoX) / one pair (GPT-J) on the scalar path.
// A thread owns one unit position u of one token and up to kMaxHeads heads of that token (q's
// heads, then k's): it reads the token's position and the cos/sin values of u once, keeps them in
// registers, issues the loads of all its heads, then rotates and stores them. A flat index split
// by FastDivmod into (token, head group, u) keeps a warp's accesses on consecutive packs of the
// same heads. Llama 32q + 8kv, D = R = 128, bf16 NeoX: 8 units per head, 4 heads per thread
// (2 x 4 x 16 = 128 bytes of q/k in flight per thread); decode-sized grids use one head per
// thread. q and k may be any strided views (a fused qkv buffer: row stride != H*D).
//
// Positions outside [0, max_pos) are skipped: that token's q and k are left untouched (no host
// synchronisation to raise an error; the torch backend raises ValueError).
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(2);

#include <kernels/checks.h>
#include <kernels/cuda_dtype.cuh>
#include <kernels/dtype.h>
#include <kernels/pointwise.cuh>
#include <kernels/tensor.h>
#include <kernels/vec.cuh>

namespace rope_inplace_detail {

constexpr int kMaxHeads = 4;

struct Params {
  void* q;
  void* k;
  int64_t q_t, q_h, k_t, k_h;  // strides in elements
  const void* cache;
  int64_t cache_t;  // row stride of the cache in elements
  const void* positions;
  int64_t pos_stride;
  int64_t max_pos;
  int half;         // R / 2
  int hq, heads;    // q heads, q + k heads
  int per_thread;   // heads per thread (1 .. kMaxHeads)
  bool pos64;
};

// n consecutive cache values as floats. Vector path: 4, 8, 16 or 32 bytes, aligned to
// min(16, bytes) (the launcher checks the cache's base, row stride and R/2).
template <typename C, int kN, bool kVec>
__device__ __forceinline__ void load_cache(const C* p, float (&f)[kN]) {
  constexpr int kBytes = kN * static_cast<int>(sizeof(C));
  if constexpr (kVec && kBytes % 16 == 0) {
    kernels::Pack<C, kN> pk;
    pk.load_cached(p);
    pk.unpack(f);
  } else if constexpr (kVec && (kBytes == 8 || kBytes == 4)) {
    constexpr int kWords = kBytes / 4;
    uint32_t w[kWords];
    if constexpr (kWords == 2) {
      const uint2 r = __ldg(reinterpret_cast<const uint2*>(p));
      w[0] = r.x;
      w[1] = r.y;
    } else {
      w[0] = __ldg(reinterpret_cast<const unsigned int*>(p));
    }
#pragma unroll
    for (int i = 0; i < kWords; ++i)
      kernels::Words<C>::unpack(w[i], f + i * kernels::Words<C>::kPerWord);
  } else {
#pragma unroll
    for (int i = 0; i < kN; ++i) f[i] = kernels::to_float(p[i]);
  }
}

// kW: elements per unit and half (NeoX) or per unit (GPT-J); kP: elements per memory access.
template <typename T, typename C, bool kNeox, bool kVec>
__global__ void __launch_bounds__(kernels::kPointwiseThreads)
    rope_kernel(bool pdl, Params p, kernels::FastDivmod per_token, kernels::FastDivmod units,
                uint32_t total) {
  constexpr int kW = kVec ? kernels::kVectorBytes / static_cast<int>(sizeof(T)) : (kNeox ? 1 : 2);
  constexpr int kP = kVec ? kW : 1;
  constexpr int kA = kW / kP;               // accesses per unit half
  constexpr int kCos = kNeox ? kW : kW / 2;  // cos (and sin) values per unit
  constexpr int kHalves = kNeox ? 2 : 1;
  using Raw = kernels::Pack<T, kP>;

  const uint32_t i = blockIdx.x * kernels::kPointwiseThreads + threadIdx.x;
  if (pdl) kernels::pdl_wait();
  if (i >= total) return;
  uint32_t t, r, g, u;
  per_token.divmod(i, t, r);
  units.divmod(r, g, u);
  const int64_t pos = p.pos64
                          ? static_cast<const int64_t*>(p.positions)[t * p.pos_stride]
                          : static_cast<const int32_t*>(p.positions)[t * p.pos_stride];

  // q/k loads are issued before the position is known (they overlap its latency); nothing is
  // stored for a token whose position is out of range.
  T* base[kMaxHeads];
  Raw x[kMaxHeads][kHalves][kA];
  const int first = static_cast<int>(g) * p.per_thread;
  const int64_t offset = static_cast<int64_t>(u) * kW;
#pragma unroll
  for (int j = 0; j < kMaxHeads; ++j) {
    const int h = first + j;
    base[j] = nullptr;
    if (j < p.per_thread && h < p.heads) {
      base[j] = h < p.hq ? static_cast<T*>(p.q) + t * p.q_t + h * p.q_h + offset
                         : static_cast<T*>(p.k) + t * p.k_t + (h - p.hq) * p.k_h + offset;
#pragma unroll
      for (int s = 0; s < kHalves; ++s)
#pragma unroll
        for (int a = 0; a < kA; ++a) x[j][s][a].load_stream(base[j] + s * p.half + a * kP);
    }
  }
  if (pdl) kernels::pdl_launch_dependents();
  if (pos < 0 || pos >= p.max_pos) return;  // skipped: this token's q and k stay as they were

  const C* row = static_cast<const C*>(p.cache) + pos * p.cache_t + static_cast<int64_t>(u) * kCos;
  float cs[kCos], sn[kCos];
  load_cache<C, kCos, kVec>(row, cs);
  load_cache<C, kCos, kVec>(row + p.half, sn);

#pragma unroll
  for (int j = 0; j < kMaxHeads; ++j) {
    if (base[j] == nullptr) continue;
    float v[kHalves][kW];
#pragma unroll
    for (int s = 0; s < kHalves; ++s)
#pragma unroll
      for (int a = 0; a < kA; ++a) {
        float f[kP];
        x[j][s][a].unpack(f);
#pragma unroll
        for (int e = 0; e < kP; ++e) v[s][a * kP + e] = f[e];
      }
    if constexpr (kNeox) {
#pragma unroll
      for (int e = 0; e < kW; ++e) {
        const float x1 = v[0][e], x2 = v[kHalves - 1][e];
        v[0][e] = x1 * cs[e] - x2 * sn[e];
        v[kHalves - 1][e] = x2 * cs[e] + x1 * sn[e];
      }
    } else {
#pragma unroll
      for (int e = 0; e < kW / 2; ++e) {
        const float x1 = v[0][2 * e], x2 = v[0][2 * e + 1];
        v[0][2 * e] = x1 * cs[e] - x2 * sn[e];
        v[0][2 * e + 1] = x2 * cs[e] + x1 * sn[e];
      }
    }
#pragma unroll
    for (int s = 0; s < kHalves; ++s)
#pragma unroll
      for (int a = 0; a < kA; ++a) {
        float f[kP];
#pragma unroll
        for (int e = 0; e < kP; ++e) f[e] = v[s][a * kP + e];
        x[j][s][a].pack(f);
        x[j][s][a].store_stream(base[j] + s * p.half + a * kP);
      }
  }
}

// Threads in flight below which a thread takes one head (decode: more threads, shorter ones).
inline int heads_per_thread(int64_t units_total, int device) {
  const int64_t resident = static_cast<int64_t>(kernels::sm_count(device)) * 2048;
  return units_total <= 2 * resident ? 1 : kMaxHeads;
}

template <typename T, typename C, bool kNeox>
void launch(const kernels::Launch& ctx, Params p, int64_t tokens, bool vec) {
  const int kW = vec ? kernels::kVectorBytes / static_cast<int>(sizeof(T)) : (kNeox ? 1 : 2);
  const int64_t unit_count = kNeox ? p.half / kW : 2 * p.half / kW;
  p.per_thread = heads_per_thread(tokens * p.heads * unit_count, ctx.device);
  const int64_t groups = (p.heads + p.per_thread - 1) / p.per_thread;
  const int64_t per_token = groups * unit_count;
  TVM_FFI_CHECK(per_token < (int64_t{1} << 31), ValueError)
      << ctx.op << ": too many heads x rotary channels per token";
  const kernels::FastDivmod token_div(static_cast<uint32_t>(per_token));
  const kernels::FastDivmod unit_div(static_cast<uint32_t>(unit_count));
  auto kernel = vec ? rope_kernel<T, C, kNeox, true> : rope_kernel<T, C, kNeox, false>;
  const int64_t pos_elem = p.pos64 ? 8 : 4;
  kernels::for_row_chunks(tokens, per_token, [&](int64_t t0, int64_t n) {
    Params c = p;
    c.q = static_cast<T*>(p.q) + t0 * p.q_t;
    if (p.k) c.k = static_cast<T*>(p.k) + t0 * p.k_t;
    c.positions = static_cast<const char*>(p.positions) + t0 * p.pos_stride * pos_elem;
    const int64_t work = n * per_token;
    kernels::launch_pointwise(ctx, kernel, work, c, token_div, unit_div,
                              static_cast<uint32_t>(work));
  });
}

inline int64_t stride_of(const tvm::ffi::TensorView& t, int d) {
  return t.size(d) == 1 ? 0 : t.stride(d);
}

}  // namespace rope_inplace_detail

// q [T, Hq, D], k [T, Hk, D] or None (rotated in place; one dtype: float32, float16, bfloat16;
// last dim contiguous, other strides arbitrary; q and k must not share elements);
// cos_sin_cache [max_pos, R] float32 or bfloat16, last dim contiguous, R even in [2, D];
// positions [T] int32 or int64.
inline void rope_inplace(tvm::ffi::TensorView q, tvm::ffi::Optional<tvm::ffi::TensorView> k,
                         tvm::ffi::TensorView cos_sin_cache, tvm::ffi::TensorView positions,
                         bool is_neox) {
  namespace detail = rope_inplace_detail;
  constexpr const char* kOp = "attention.rope_inplace";
  // 1. Validate.
  kernels::check_ndim(kOp, "q", q, 3);
  kernels::check_last_dim_contiguous(kOp, "q", q);
  const int64_t tokens = q.size(0), dim = q.size(2);
  const bool has_k = k.has_value();
  const tvm::ffi::TensorView kt = has_k ? k.value() : q;
  if (has_k) {
    kernels::check_ndim(kOp, "k", kt, 3);
    kernels::check_same_dtype(kOp, "k", kt, "q", q);
    TVM_FFI_CHECK(kt.size(0) == tokens && kt.size(2) == dim, ValueError)
        << kOp << ": k [T, Hk, D] must share T = " << tokens << " and D = " << dim
        << " with q, got k shape " << kernels::shape_string(kt);
    kernels::check_last_dim_contiguous(kOp, "k", kt);
    kernels::check_same_device(kOp, "k", kt, "q", q);
  }
  kernels::check_ndim(kOp, "cos_sin_cache", cos_sin_cache, 2);
  const bool cache_f32 = kernels::is_dtype(cos_sin_cache.dtype(), kDLFloat, 32);
  TVM_FFI_CHECK(cache_f32 || kernels::is_dtype(cos_sin_cache.dtype(), kDLBfloat, 16), TypeError)
      << kOp << ": cos_sin_cache must be float32 or bfloat16";
  kernels::check_last_dim_contiguous(kOp, "cos_sin_cache", cos_sin_cache);
  kernels::check_same_device(kOp, "cos_sin_cache", cos_sin_cache, "q", q);
  const int64_t rot = cos_sin_cache.size(1);
  TVM_FFI_CHECK(rot >= 2 && rot % 2 == 0 && rot <= dim, ValueError)
      << kOp << ": the rotary dim R (cos_sin_cache width) must be even and in [2, D = " << dim
      << "], got " << rot;
  kernels::check_ndim(kOp, "positions", positions, 1);
  const bool pos64 = kernels::is_dtype(positions.dtype(), kDLInt, 64);
  TVM_FFI_CHECK(pos64 || kernels::is_dtype(positions.dtype(), kDLInt, 32), TypeError)
      << kOp << ": positions must be int32 or int64";
  TVM_FFI_CHECK(positions.size(0) == tokens, ValueError)
      << kOp << ": positions must have one entry per token (T = " << tokens << "), got shape "
      << kernels::shape_string(positions);
  kernels::check_same_device(kOp, "positions", positions, "q", q);
  const int64_t hq = q.size(1), hk = has_k ? kt.size(1) : 0;
  TVM_FFI_CHECK(hq + hk < (int64_t{1} << 30), ValueError) << kOp << ": too many heads";
  kernels::check_device(kOp, "q", q, kDLCUDA);
  if (tokens == 0 || hq + hk == 0 || cos_sin_cache.size(0) == 0) return;

  detail::Params p{};
  p.q = kernels::data(q);
  p.k = has_k ? kernels::data(kt) : nullptr;
  p.q_t = detail::stride_of(q, 0);
  p.q_h = detail::stride_of(q, 1);
  p.k_t = has_k ? detail::stride_of(kt, 0) : 0;
  p.k_h = has_k ? detail::stride_of(kt, 1) : 0;
  p.cache = kernels::data(cos_sin_cache);
  p.cache_t = detail::stride_of(cos_sin_cache, 0);
  p.positions = kernels::data(positions);
  p.pos_stride = positions.stride(0);
  p.pos64 = pos64;
  p.max_pos = cos_sin_cache.size(0);
  p.half = static_cast<int>(rot / 2);
  p.hq = static_cast<int>(hq);
  p.heads = static_cast<int>(hq + hk);
  // 16-byte packs of q/k: aligned bases, every stride and the pair distance (NeoX R/2, GPT-J the
  // rotary width R) whole packs; cache rows and R/2 16-byte aligned for its vector loads.
  const int64_t vec = kernels::kVectorBytes / (q.dtype().bits / 8);
  const int64_t cache_elem = cache_f32 ? 4 : 2;
  const bool cache_vec = kernels::is_aligned(p.cache) && (p.cache_t * cache_elem) % 16 == 0 &&
                         (p.half * cache_elem) % 16 == 0;
  const bool vec_ok = cache_vec && (is_neox ? p.half % vec == 0 : rot % vec == 0) &&
                      kernels::vectors_fit(vec, vec, {p.q, p.k},
                                           {kernels::RowMap{p.q_t, p.q_h},
                                            kernels::RowMap{p.k_t, p.k_h}});
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(q);
  const kernels::Launch ctx(kOp, q);
  // 4. Dispatch on dtypes and pairing, launch (checked).
  KERNELS_DISPATCH_FLOAT(q.dtype(), kOp, T, [&] {
    auto go = [&](auto cache_tag) {
      using C = decltype(cache_tag);
      if (is_neox)
        detail::launch<T, C, true>(ctx, p, tokens, vec_ok);
      else
        detail::launch<T, C, false>(ctx, p, tokens, vec_ok);
    };
    if (cache_f32)
      go(float{});
    else
      go(kernels::bf16_t{});
  });
}
