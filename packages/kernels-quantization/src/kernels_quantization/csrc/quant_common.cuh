// Shared device pieces of the quantization kernels (not the hadamard transform):
//   - absmax as an unsigned maximum over |x|'s fp32 bits, so that NaN propagates (its bits are
//     above inf's) the way torch's amax does, where fmaxf would drop it;
//   - the dynamic scale max(absmax, eps) / qmax with the IEEE division the reference does, and
//     the UE8M0 round-up from the fp32 bits;
//   - the saturating round-to-nearest-even conversions to fp8 e4m3 (two at a time,
//     __nv_cvt_float2_to_fp8x2 with __NV_SATFINITE: +-448 above the range, NaN stays NaN) and int8
//     (round half to even, then saturate to [-128, 127]);
//   - Absmax<T, kN>: the running |x| maximum of packs, 16-bit inputs in their own format (one AND
//     and half a VIMNMX3.U16x2 per two elements);
//   - Q8<kN>: kN one-byte outputs stored with one access (16 bytes for a 16-element piece, 8 for a
//     bf16/fp16 vector, 4 for fp32, 1 on the scalar path); quantize_bounded, for dynamic scales
//     (every quotient finite), drops Div's per-element overflow check.
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(2);

#include <cuda_fp8.h>

#include <kernels/vec.cuh>

#include <cstdint>
#include <type_traits>

namespace quant {

constexpr float kFp8Max = 448.0f;
constexpr float kInt8Max = 127.0f;

// |x| as bits: monotone in |x| for every non-NaN value, NaN above +inf.
__device__ __forceinline__ uint32_t abs_bits(float v) { return __float_as_uint(v) & 0x7fffffffu; }

// Running absmax (as bits) over the values of one pack.
template <int kN>
__device__ __forceinline__ uint32_t absmax_bits(const float (&v)[kN], uint32_t acc) {
#pragma unroll
  for (int k = 0; k < kN; ++k) acc = max(acc, abs_bits(v[k]));
  return acc;
}

// Loads kU packs, load(u, pack) returning false past the end (that pack is zeroed), and folds
// their absmax into m: every load issued before the first maximum.
template <int kU, typename P, typename Load>
__device__ __forceinline__ uint32_t load_absmax(P (&packs)[kU], uint32_t m, const Load& load) {
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    if (!load(u, packs[u])) packs[u].zero();
  }
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    float f[P::size];
    packs[u].unpack(f);
    m = absmax_bits(f, m);
  }
  return m;
}

// s = max(absmax, eps) / qmax (NaN stays NaN: the maximum is taken on the bits).
__device__ __forceinline__ float dynamic_scale(uint32_t absmax, float eps, float qmax) {
  return __fdiv_rn(__uint_as_float(max(absmax, __float_as_uint(eps))), qmax);
}

// 2^ceil(log2 s) for positive s, from the bits: the exponent goes up by one when any mantissa bit
// is set and the mantissa is cleared; inf and NaN pass through.
__device__ __forceinline__ float ue8m0_round_up(float s) {
  const uint32_t bits = __float_as_uint(s);
  const uint32_t exponent = (bits >> 23) & 0xffu;
  if (exponent == 0xffu) return s;
  const uint32_t mantissa = bits & 0x7fffffu;
  return __uint_as_float((exponent + (mantissa != 0u ? 1u : 0u)) << 23);
}

// The biased exponent byte of a packed UE8M0 scale, clamped to [0, 254].
__device__ __forceinline__ uint32_t ue8m0_byte(float s) {
  return min((__float_as_uint(s) >> 23) & 0xffu, 254u);
}

__device__ __forceinline__ uint32_t fp8x2(float a, float b) {
  return static_cast<uint32_t>(
      __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3));
}

__device__ __forceinline__ uint32_t fp8x1(float a) {
  return static_cast<uint32_t>(__nv_cvt_float_to_fp8(a, __NV_SATFINITE, __NV_E4M3));
}

__device__ __forceinline__ uint32_t int8x1(float a) {
  // Round half to even in fp32, then saturate (NaN becomes 0: torch leaves it undefined).
  const int v = __float2int_rn(a);
  return static_cast<uint32_t>(min(max(v, -128), 127)) & 0xffu;
}

// x / s rounded as the IEEE division (__fdiv_rn), the reference's operation, at the cost of a
// multiply and two FMAs per element: with r = RN(1/s) (one __frcp_rn per scale), q0 = RN(x r),
// the exact remainder e = x - q0 s (one FMA) and q = RN(q0 + e r) is the correctly rounded
// quotient (Markstein's theorem; the same sequence as the division's own fast path) whenever s
// and the quotient stay in the normal range. Where they may not (s subnormal, huge, inf or NaN;
// a quotient that overflows or is NaN, e.g. a static scale and an inf input) the division itself
// runs. Quotients that underflow in fp32 quantize to 0 either way.
struct Div {
  float s, r;
  bool fast;
  __device__ __forceinline__ explicit Div(float scale) : s(scale) {
    r = __frcp_rn(scale);
    fast = scale >= 0x1p-126f && scale < 0x1p126f;
  }
  // The fast path alone (s in the fast range): correctly rounded unless the quotient overflows.
  __device__ __forceinline__ float quick(float x) const {
    const float q0 = __fmul_rn(x, r);
    return __fmaf_rn(__fmaf_rn(-q0, s, x), r, q0);
  }
  __device__ __forceinline__ float operator()(float x) const {
    if (fast) {
      const float q = quick(x);
      if (abs_bits(q) < 0x7f800000u) return q;
    }
    return __fdiv_rn(x, s);
  }
};

// Running maximum of |x| (as fp32 bits, NaN above +inf) over packs of T. Vectors of 16-bit types
// stay in their own format: |x| of two elements with one AND, two running maxima per word with one
// VIMNMX3.U16x2 per two words (the 16-bit bits of |x| order like |x| too, NaN above inf); the
// fp32 bits at the end. Everything else goes through fp32, element by element.
template <typename T, int kN, bool kHalves = (sizeof(T) == 2 && kN > 1)>
struct Absmax {
  uint32_t acc = 0;
  __device__ __forceinline__ void add(const kernels::Pack<T, kN>& p) {
    if constexpr (kHalves) {
#pragma unroll
      for (int i = 0; i < kernels::Pack<T, kN>::kWords; ++i) acc = __vmaxu2(acc, p.w[i] & 0x7fff7fffu);
    } else {
      float f[kN];
      p.unpack(f);
      acc = absmax_bits(f, acc);
    }
  }
  // The maximum as fp32 bits.
  __device__ __forceinline__ uint32_t bits() const {
    if constexpr (kHalves) {
      const uint32_t h = max(acc & 0xffffu, acc >> 16);
      if constexpr (std::is_same_v<T, __nv_bfloat16>) {
        return h << 16;
      } else {
        return __float_as_uint(__half2float(__ushort_as_half(static_cast<unsigned short>(h))));
      }
    } else {
      return acc;
    }
  }
};

// kN one-byte codes (fp8 e4m3 or int8), little-endian in words.
template <int kN>
struct Q8 {
  static constexpr int kWords = (kN + 3) / 4;
  uint32_t w[kWords];

  // Codes of the quotients q (already divided).
  template <bool kInt8>
  __device__ __forceinline__ void encode(const float (&q)[kN]) {
#pragma unroll
    for (int i = 0; i < kWords; ++i) w[i] = 0;
    if constexpr (kInt8) {
#pragma unroll
      for (int k = 0; k < kN; ++k) w[k / 4] |= int8x1(q[k]) << (8 * (k % 4));
    } else if constexpr (kN == 1) {
      w[0] = fp8x1(q[0]);
    } else {
#pragma unroll
      for (int k = 0; k < kN; k += 2) w[k / 4] |= fp8x2(q[k], q[k + 1]) << (8 * (k % 4));
    }
  }

  // q = cvt(v / s) with the reference's IEEE division.
  template <bool kInt8>
  __device__ __forceinline__ void quantize(const float (&v)[kN], const Div& s) {
    float q[kN];
#pragma unroll
    for (int k = 0; k < kN; ++k) q[k] = s(v[k]);
    encode<kInt8>(q);
  }

  // The same for a dynamic scale, one that bounds its values (|v| <= s * qmax: the absmax of v
  // went into s): in the fast range the quotients are finite, so Div's per-element overflow
  // check is left out and the range test is one branch per call (uniform over a row or group).
  template <bool kInt8>
  __device__ __forceinline__ void quantize_bounded(const float (&v)[kN], const Div& s) {
    float q[kN];
    if (s.fast) {
#pragma unroll
      for (int k = 0; k < kN; ++k) q[k] = s.quick(v[k]);
    } else {
#pragma unroll
      for (int k = 0; k < kN; ++k) q[k] = __fdiv_rn(v[k], s.s);
    }
    encode<kInt8>(q);
  }
  // Store at p (kN-byte aligned).
  __device__ __forceinline__ void store(uint8_t* p) const {
    if constexpr (kN == 16) {
      *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
    } else if constexpr (kN == 8) {
      *reinterpret_cast<uint2*>(p) = make_uint2(w[0], w[1]);
    } else if constexpr (kN == 4) {
      *reinterpret_cast<uint32_t*>(p) = w[0];
    } else {
      static_assert(kN == 1, "1, 4, 8 or 16 codes");
      *p = static_cast<uint8_t>(w[0]);
    }
  }
  __device__ __forceinline__ void store_stream(uint8_t* p) const {
    if constexpr (kN == 16) {
      __stcs(reinterpret_cast<uint4*>(p), make_uint4(w[0], w[1], w[2], w[3]));
    } else if constexpr (kN == 8) {
      __stcs(reinterpret_cast<uint2*>(p), make_uint2(w[0], w[1]));
    } else if constexpr (kN == 4) {
      __stcs(reinterpret_cast<unsigned int*>(p), w[0]);
    } else {
      *p = static_cast<uint8_t>(w[0]);
    }
  }
  // Codes [a * kPart, (a + 1) * kPart) alone (kPart = 8 or 4), streamed to p (kPart-byte
  // aligned): a piece written one input vector at a time where q is not 16-byte aligned.
  template <int kPart>
  __device__ __forceinline__ void store_part_stream(uint8_t* p, int a) const {
    static_assert(kPart == 8 || kPart == 4, "8 or 4 codes");
    if constexpr (kPart == 8) {
      __stcs(reinterpret_cast<uint2*>(p), make_uint2(w[2 * a], w[2 * a + 1]));
    } else {
      __stcs(reinterpret_cast<unsigned int*>(p), w[a]);
    }
  }
};

// The kA packs of one piece as its kA * P::size values, in order.
template <typename P, int kA>
__device__ __forceinline__ void unpack_piece(const P (&v)[kA], float (&f)[kA * P::size]) {
#pragma unroll
  for (int a = 0; a < kA; ++a) {
    float part[P::size];
    v[a].unpack(part);
#pragma unroll
    for (int k = 0; k < P::size; ++k) f[a * P::size + k] = part[k];
  }
}

// The unsigned maximum over `width` (a power of two <= 32) aligned lanes of a warp.
template <int kWidth>
__device__ __forceinline__ uint32_t lanes_max(uint32_t v) {
#pragma unroll
  for (int offset = kWidth / 2; offset > 0; offset >>= 1)
    v = max(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

__device__ __forceinline__ uint32_t lanes_max(uint32_t v, int width) {
  for (int offset = width >> 1; offset > 0; offset >>= 1)
    v = max(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Block-wide unsigned maximum; every thread gets it. `shared` holds 32 words; one call site per
// array (no trailing barrier). blockDim.x a multiple of 32.
__device__ __forceinline__ uint32_t block_max(uint32_t v, uint32_t* shared) {
  v = lanes_max<32>(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x >> 5) ? shared[lane] : 0u;
  return lanes_max<32>(v);
}

}  // namespace quant
