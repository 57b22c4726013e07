// speculative.segment_packbits, CUDA: segment b, x[in[b]:in[b+1]], packs to ceil(len/8) bytes at
// y[out[b]:out[b+1]] ("little": element 8j+t is bit t of byte j; "big": bit 7-t; bits past the
// segment end are 0). One thread per 4 output bytes (32 input bools: two 16-byte loads when the
// segment is aligned, bytes otherwise; issued before the segment search at the offset whole-byte
// segments give them, so one memory round trip suffices there; eight bools pack by one 64-bit
// multiply of their nonzero flags), blocks of 256 threads over y. Up to 1024 segments (offsets
// below 2^31), every block stages both pointer arrays in shared memory as int32 (one round of
// coalesced loads, all issued before the first store) and each thread finds its segment by a
// power-of-two search of one shared load a step; beyond that a block first finds its edge segments
// by one binary search each over the global pointers, then each thread narrows within them. The
// pointers are preconditions: a segment whose pointers are inconsistent (negative length, bytes not
// ceil(len/8), input past nnz, output past len(y)) is skipped, so the kernel only ever reads
// x[0:nnz] and writes y[0:len(y)]. No host synchronisation. Under PDL the next kernel is released
// once a block's loads are issued (back-to-back calls overlap its launch with this grid's search
// and stores). H200 (A/B, 2026-12-04, these three changes together): 1 / 16 / 64 / 256 x 4096
// bits 1.31 / 1.98 / 2.15 / 3.53 -> 1.23 / 1.42 / 1.52 / 2.54 us, 64 x 2^20 44.8 -> 30.6.
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(2);

#include <kernels/launch.cuh>
#include <kernels/pdl.cuh>

#include <string>
#include <type_traits>

#include "speculative_common.cuh"

namespace segment_packbits_detail {

constexpr int kThreads = 256;
constexpr int kBytesPerThread = 4;
constexpr int64_t kBytesPerBlock = kThreads * kBytesPerThread;

struct Params {
  uint8_t* y;
  int64_t y_len;
  const uint8_t* x;
  int64_t nnz;
  speculative_detail::IndexRef in, out;
  int64_t segments;  // B
  bool big;
};

// Pointers up to this many segments are staged in shared memory by every block (one round of
// coalesced loads instead of a chain of dependent global loads in the searches).
constexpr int kStagedSegments = 1024;
constexpr int kStagedPerThread = (kStagedSegments + 1 + kThreads - 1) / kThreads;

// A pointer staged as int32: values outside [0, limit] become -1 or limit + 1, which keeps every
// comparison the kernel makes (out[b] <= o for 0 <= o < len(y), and the consistency checks of
// Segment::load) as it was, so a bad int64 pointer cannot wrap into a valid-looking one.
__device__ __forceinline__ int32_t staged_offset(int64_t v, int64_t limit) {
  return static_cast<int32_t>(v < 0 ? -1 : (v > limit ? limit + 1 : v));
}

// The two pointer arrays: staged in shared memory (int32), or read from global memory.
struct StagedPtrs {
  const int32_t* in;
  const int32_t* out;
  __device__ __forceinline__ int64_t in_at(int64_t i) const { return in[i]; }
  __device__ __forceinline__ int64_t out_at(int64_t i) const { return out[i]; }
};
struct GlobalPtrs {
  speculative_detail::IndexRef in, out;
  __device__ __forceinline__ int64_t in_at(int64_t i) const { return in[i]; }
  __device__ __forceinline__ int64_t out_at(int64_t i) const { return out[i]; }
};

// Largest b in [lo, hi] with out[b] <= o (lo - 1 when none), out assumed non-decreasing.
template <typename Ptrs>
__device__ __forceinline__ int64_t find_segment(const Ptrs& ptr, int64_t o, int64_t lo,
                                                int64_t hi) {
  int64_t ans = lo - 1;
  while (lo <= hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (ptr.out_at(mid) <= o) {
      ans = mid;
      lo = mid + 1;
    } else {
      hi = mid - 1;
    }
  }
  return ans;
}

// find_segment over the staged pointers of all n >= 1 segments: power-of-two steps, one shared
// load and one compare each (no lo/hi/ans bookkeeping in 64 bits), the same count in every thread.
__device__ __forceinline__ int find_staged_segment(const int32_t* out, int n, int32_t o) {
  int b = -1;  // out[b] <= o holds for every b taken
  for (int step = 1 << (31 - __clz(n)); step > 0; step >>= 1) {
    if (b + step < n && out[b + step] <= o) b += step;
  }
  return b;
}

// Bit 7 of each byte of w set where that byte is nonzero, every other bit clear.
__device__ __forceinline__ uint32_t nonzero_bytes(uint32_t w) {
  return (((w & 0x7f7f7f7fu) + 0x7f7f7f7fu) | w) & 0x80808080u;
}

// Eight input bytes (lo: elements 0-3, hi: 4-7) as one little-order byte: bit t = element t != 0.
// Flag t sits at bit 8t + 7 of the 64-bit hi:lo; the multiplier's terms 2^(7k), k < 8, put the 64
// products on distinct bits (no carries), and only k = 7 - t reaches bits 56-63, at bit 56 + t.
// Only the high word of the product is formed: about ten integer instructions for eight elements
// instead of a select and a shift per element.
__device__ __forceinline__ uint32_t pack8_little(uint32_t lo, uint32_t hi) {
  constexpr uint32_t kLo = 0x10204081u, kHi = 0x00020408u;  // sum of 2^(7k), k = 0..7
  const uint32_t f_lo = nonzero_bytes(lo), f_hi = nonzero_bytes(hi);
  return (__umulhi(f_lo, kLo) + f_lo * kHi + f_hi * kLo) >> 24;
}

// Four packed bytes in big order: each byte's bits reversed in place.
__device__ __forceinline__ uint32_t reverse_bits_per_byte(uint32_t w) {
  return __byte_perm(__brev(w), 0, 0x0123);
}

__device__ __forceinline__ uint32_t pack8(uint64_t v, bool big) {
  const uint32_t r = pack8_little(static_cast<uint32_t>(v), static_cast<uint32_t>(v >> 32));
  return big ? __brev(r) >> 24 : r;
}

// One segment's pointers, checked against the sizes.
struct Segment {
  int64_t b = -1, in0 = 0, in1 = 0, out0 = 0, out1 = 0;
  bool ok = false;
  template <typename Ptrs>
  __device__ __forceinline__ void load(const Params& p, const Ptrs& ptr, int64_t seg) {
    b = seg;
    in0 = ptr.in_at(seg);
    in1 = ptr.in_at(seg + 1);
    out0 = ptr.out_at(seg);
    out1 = ptr.out_at(seg + 1);
    const int64_t len = in1 - in0;
    ok = in0 >= 0 && len >= 0 && in1 <= p.nnz && out0 >= 0 && out1 <= p.y_len &&
         out1 - out0 == (len + 7) / 8;
  }
};

__device__ __forceinline__ uint32_t pack_byte(const Params& p, const Segment& s, int64_t o) {
  const int64_t first = s.in0 + 8 * (o - s.out0);
  const int64_t count = s.in1 - first < 8 ? s.in1 - first : 8;
  uint64_t v = 0;
  if (count == 8 && (reinterpret_cast<uintptr_t>(p.x + first) & 7u) == 0) {
    v = *reinterpret_cast<const uint64_t*>(p.x + first);
  } else {
    for (int t = 0; t < count; ++t) v |= static_cast<uint64_t>(p.x[first + t]) << (8 * t);
  }
  return pack8(v, p.big);
}

template <bool kStaged>
__global__ void __launch_bounds__(kThreads) packbits_kernel(bool pdl, Params p) {
  __shared__ int32_t staged[2][kStaged ? kStagedSegments + 1 : 1];
  const int64_t block0 = static_cast<int64_t>(blockIdx.x) * kBytesPerBlock;
  if (pdl) kernels::pdl_wait();
  // The thread's 32 input bytes are loaded before its segment is known, at the offset they have
  // when every earlier segment's length is a multiple of 8 (in[b] == 8 out[b], as in tree masks):
  // the pointer loads and the search then overlap the data load instead of preceding it. A guess
  // the pointers do not confirm is loaded again below.
  const int64_t o0 = block0 + static_cast<int64_t>(threadIdx.x) * kBytesPerThread;
  const int64_t guess = 8 * o0;
  uint4 a{}, c{};
  const bool guessed =
      guess + 32 <= p.nnz && (reinterpret_cast<uintptr_t>(p.x + guess) & 15u) == 0;
  if (guessed) {
    a = *reinterpret_cast<const uint4*>(p.x + guess);
    c = *reinterpret_cast<const uint4*>(p.x + guess + 16);
  }
  using Ptrs = std::conditional_t<kStaged, StagedPtrs, GlobalPtrs>;
  Ptrs ptr;
  if constexpr (kStaged) {
    // Every pointer load is issued before the first shared store (a store between them made
    // each wait for the previous load: two memory round trips instead of one).
    int64_t in_v[kStagedPerThread], out_v[kStagedPerThread];
#pragma unroll
    for (int k = 0; k < kStagedPerThread; ++k) {
      const int i = threadIdx.x + k * kThreads;
      if (i <= p.segments) {
        in_v[k] = p.in[i];
        out_v[k] = p.out[i];
      }
    }
    // The next kernel's blocks may start now: its pdl_wait still waits for this whole grid, and
    // its launch and block start then overlap this grid's search, packing and stores.
    if (pdl) kernels::pdl_launch_dependents();
#pragma unroll
    for (int k = 0; k < kStagedPerThread; ++k) {
      const int i = threadIdx.x + k * kThreads;
      if (i <= p.segments) {
        staged[0][i] = staged_offset(in_v[k], p.nnz);
        staged[1][i] = staged_offset(out_v[k], p.y_len);
      }
    }
    ptr = StagedPtrs{staged[0], staged[1]};
    __syncthreads();
  } else {
    if (pdl) kernels::pdl_launch_dependents();
    ptr = GlobalPtrs{p.in, p.out};
  }
  // Staged pointers: every thread searches all segments itself (a few shared-memory steps), no
  // serial edge search by one thread and no second barrier on the latency path. Global pointers:
  // the block's edges first, so each thread's search stays within the block's segments.
  int64_t lo = 0, hi = p.segments - 1;
  if constexpr (!kStaged) {
    __shared__ int64_t edge[2];
    if (threadIdx.x < 2) {
      const int64_t last = block0 + kBytesPerBlock - 1;
      edge[threadIdx.x] = find_segment(ptr, threadIdx.x == 0 ? block0 : last, 0, p.segments - 1);
    }
    __syncthreads();
    lo = edge[0] < 0 ? 0 : edge[0];
    hi = edge[1];
  }
  if (hi >= 0 && o0 < p.y_len) {
    Segment s;
    int64_t seg;
    if constexpr (kStaged) {
      seg = find_staged_segment(staged[1], static_cast<int>(p.segments),
                                static_cast<int32_t>(o0));
    } else {
      seg = find_segment(ptr, o0, lo, hi);
    }
    s.load(p, ptr, seg < lo ? lo : seg);
    // Fast path: the 4 bytes are whole bytes of one valid segment, 16-byte aligned input.
    const int64_t first = s.in0 + 8 * (o0 - s.out0);
    if (s.ok && o0 >= s.out0 && o0 + kBytesPerThread <= s.out1 && first + 32 <= s.in1 &&
        (reinterpret_cast<uintptr_t>(p.x + first) & 15u) == 0 &&
        (reinterpret_cast<uintptr_t>(p.y + o0) & 3u) == 0) {
      if (!guessed || first != guess) {
        a = *reinterpret_cast<const uint4*>(p.x + first);
        c = *reinterpret_cast<const uint4*>(p.x + first + 16);
      }
      const uint32_t word = pack8_little(a.x, a.y) | (pack8_little(a.z, a.w) << 8) |
                            (pack8_little(c.x, c.y) << 16) | (pack8_little(c.z, c.w) << 24);
      *reinterpret_cast<uint32_t*>(p.y + o0) = p.big ? reverse_bits_per_byte(word) : word;
    } else {
#pragma unroll
      for (int k = 0; k < kBytesPerThread; ++k) {
        const int64_t o = o0 + k;
        if (o >= p.y_len) break;
        // Advance past segments that end at or before o (empty ones included).
        while (s.b < hi && ptr.out_at(s.b + 1) <= o) s.load(p, ptr, s.b + 1);
        if (s.ok && o >= s.out0 && o < s.out1) p.y[o] = static_cast<uint8_t>(pack_byte(p, s, o));
      }
    }
  }
}

}  // namespace segment_packbits_detail

// y uint8 [len] (contiguous), x bool [nnz] (contiguous), input_indptr / output_indptr int32 or
// int64 [B+1] (any stride), bitorder "little" or "big".
inline void segment_packbits(tvm::ffi::TensorView y, tvm::ffi::TensorView x,
                             tvm::ffi::TensorView input_indptr, tvm::ffi::TensorView output_indptr,
                             tvm::ffi::String bitorder) {
  namespace detail = segment_packbits_detail;
  constexpr const char* kOp = "speculative.segment_packbits";
  // 1. Validate.
  kernels::check_ndim(kOp, "x", x, 1);
  kernels::check_ndim(kOp, "y", y, 1);
  kernels::check_device(kOp, "x", x, kDLCUDA);
  kernels::check_same_device(kOp, "y", y, "x", x);
  TVM_FFI_CHECK(kernels::is_dtype(x.dtype(), kDLBool, 8) || kernels::is_dtype(x.dtype(), kDLUInt, 8),
                TypeError)
      << kOp << ": x must be bool";
  TVM_FFI_CHECK(kernels::is_dtype(y.dtype(), kDLUInt, 8), TypeError) << kOp << ": y must be uint8";
  kernels::check_contiguous(kOp, "x", x);
  kernels::check_contiguous(kOp, "y", y);
  const std::string order(bitorder.data(), bitorder.size());
  TVM_FFI_CHECK(order == "little" || order == "big", ValueError)
      << kOp << ": bitorder must be \"little\" or \"big\", got \"" << order << "\"";
  detail::Params p{};
  p.in = speculative_host::index_tensor(kOp, "input_indptr", input_indptr, x, 1);
  p.out = speculative_host::index_tensor(kOp, "output_indptr", output_indptr, x, 1);
  kernels::check_same_shape(kOp, "input_indptr", input_indptr, "output_indptr", output_indptr);
  TVM_FFI_CHECK(input_indptr.size(0) >= 1, ValueError)
      << kOp << ": input_indptr must have B+1 >= 1 entries";
  p.segments = input_indptr.size(0) - 1;
  p.y_len = y.size(0);
  if (p.segments == 0 || p.y_len == 0) return;
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(x);
  const kernels::Launch ctx(kOp, x);
  // 4. Launch.
  p.y = kernels::data<uint8_t>(y);
  p.x = kernels::data<const uint8_t>(x);
  p.nnz = x.size(0);
  p.big = order == "big";
  const unsigned grid = kernels::ceil_div(p.y_len, detail::kBytesPerBlock);
  // Staged pointers are int32: offsets up to nnz + 1 and len(y) + 1 must fit.
  constexpr int64_t kInt32Max = 2147483647;
  if (p.segments <= detail::kStagedSegments && p.nnz < kInt32Max && p.y_len < kInt32Max)
    kernels::launch(ctx, detail::packbits_kernel<true>, grid, detail::kThreads, p);
  else
    kernels::launch(ctx, detail::packbits_kernel<false>, grid, detail::kThreads, p);
}
