// Shared by the kv_canary group's CUDA sources: the hashes of OPS.md section 15 (splitmix64's
// finalizer on uint64, bit for bit with reference.py), the KV sources (up to 4 caches viewed as
// byte rows) and their host-side description, and int32/int64 vectors read as int64.
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(4);

#include <kernels/checks.h>
#include <kernels/dtype.h>
#include <kernels/launch.cuh>
#include <kernels/pdl.cuh>
#include <kernels/tensor.h>

#include <cstdint>

namespace kv_canary_detail {

constexpr int kMaxSources = 4;
constexpr uint64_t kAnchorSeed = 0xC0FFEE1234567890ull;

__host__ __device__ __forceinline__ uint64_t fmix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

__device__ __forceinline__ uint64_t mix3(uint64_t a, uint64_t b, uint64_t c) {
  return fmix(fmix(fmix(a) ^ b) ^ c);
}

// A 1-D int32/int64 vector read as int64.
struct IndexRef {
  const void* ptr = nullptr;
  int64_t stride = 1;
  bool i64 = true;
  __device__ __forceinline__ int64_t operator[](int64_t i) const {
    return i64 ? static_cast<const int64_t*>(ptr)[i * stride]
               : static_cast<int64_t>(static_cast<const int32_t*>(ptr)[i * stride]);
  }
};

struct Source {
  const uint8_t* bytes;
  int64_t rows, row_bytes, page_size, bytes_per_token, read_bytes;
};

struct Sources {
  Source s[kMaxSources];
  int count;
};

// Whether slot s (>= 0) lies in every source's rows.
__device__ __forceinline__ bool slot_in_sources(const Sources& src, int64_t slot) {
  for (int k = 0; k < src.count; ++k)
    if (slot / src.s[k].page_size >= src.s[k].rows) return false;
  return true;
}

// h = fmix(h ^ w) over the little-endian 8-byte words of read_bytes bytes at p (zero-padded):
// 16-byte loads, four in flight, when p is 16-byte aligned; 8-byte or byte loads otherwise.
__device__ __forceinline__ uint64_t hash_bytes(const uint8_t* p, int64_t n) {
  uint64_t h = 0;
  int64_t i = 0;
  if ((reinterpret_cast<uintptr_t>(p) & 15u) == 0) {
    for (; i + 64 <= n; i += 64) {
      uint4 v[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) v[k] = *reinterpret_cast<const uint4*>(p + i + 16 * k);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        h = fmix(h ^ ((static_cast<uint64_t>(v[k].y) << 32) | v[k].x));
        h = fmix(h ^ ((static_cast<uint64_t>(v[k].w) << 32) | v[k].z));
      }
    }
  }
  if ((reinterpret_cast<uintptr_t>(p + i) & 7u) == 0) {
    for (; i + 8 <= n; i += 8) h = fmix(h ^ *reinterpret_cast<const uint64_t*>(p + i));
  }
  for (; i < n; i += 8) {
    uint64_t w = 0;
    const int64_t left = n - i < 8 ? n - i : 8;
    for (int64_t t = 0; t < left; ++t) w |= static_cast<uint64_t>(p[i + t]) << (8 * t);
    h = fmix(h ^ w);
  }
  return h;
}

// One source's hash of slot s (in range).
__device__ __forceinline__ uint64_t source_hash(const Source& s, int64_t slot) {
  const uint8_t* p =
      s.bytes + (slot / s.page_size) * s.row_bytes + (slot % s.page_size) * s.bytes_per_token;
  return hash_bytes(p, s.read_bytes);
}

// Staged reads, when every source is 16-byte aligned with 16-byte multiples (bf16/fp16 heads, MLA
// rows): each warp owns a ring of kStages chunks of kChunk bytes per lane in shared memory, filled
// by cp.async kStages - 1 chunks ahead of the lanes' folds, so the sequential fmix chain never
// waits on DRAM after the first chunk. The warp copies cooperatively: each 16-byte cp.async
// instruction covers four lanes' whole 128-byte lines (8 lanes per line), so the memory system
// sees whole lines, where one thread's own 16-byte loads (32 random slots per warp instruction)
// reached ~40% of copy. No registers hold data in flight and no block barriers.
namespace staged {

constexpr int kChunk = 128, kStages = 3;
constexpr int kPitch = kChunk + 16;  // a lane's slice: +16 bytes puts 8 lanes on distinct banks
constexpr int kWarpBytes = kStages * 32 * kPitch;
constexpr int kLanesPerLine = kChunk / 16, kLinesPerCopy = 32 / kLanesPerLine;
constexpr int kCopies = 32 / kLinesPerCopy;  // 16-byte copies per lane per chunk

// Dynamic shared memory of a CTA of `threads` threads.
__host__ __device__ constexpr int block_bytes(int threads) { return threads / 32 * kWarpBytes; }

// Whether every source qualifies: base, row pitch, token pitch and read_bytes multiples of 16
// (read_bytes below 2^31: lengths are 32-bit there).
__host__ __device__ inline bool eligible(const Sources& src) {
  for (int k = 0; k < src.count; ++k) {
    const Source& s = src.s[k];
    if ((reinterpret_cast<uintptr_t>(s.bytes) | s.row_bytes | s.bytes_per_token | s.read_bytes) &
            15 ||
        s.read_bytes >= (int64_t{1} << 31))
      return false;
  }
  return true;
}

// One warp's ring (its kWarpBytes of shared memory).
struct Ring {
  unsigned char* base;
  __device__ void init(unsigned char* block_smem) {
    base = block_smem + (threadIdx.x / 32) * kWarpBytes;
  }
  __device__ unsigned char* slice(int stage, int lane) const {
    return base + (stage * 32 + lane) * kPitch;
  }
};

// Lane `lane`'s part of the copies of chunk c into stage c % kStages: 16 bytes at offset
// 16 (lane % 8) of the chunks of lanes 4 k + lane / 8 (their pointers and lengths in src/len),
// then one commit group (empty past the end, so the group count stays uniform).
__device__ __forceinline__ void issue(const Ring& r, const uint8_t* const (&src)[kCopies],
                                      const uint32_t (&len)[kCopies], uint32_t c,
                                      bool any) {
  const int lane = threadIdx.x & 31, part = 16 * (lane % kLanesPerLine);
  const uint32_t off = c * kChunk + part;
  if (any) {
#pragma unroll
    for (int k = 0; k < kCopies; ++k) {
      const int owner = kLinesPerCopy * k + lane / kLanesPerLine;
      if (off < len[k]) {
        const uint32_t dst = static_cast<uint32_t>(
            __cvta_generic_to_shared(r.slice(c % kStages, owner) + part));
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src[k] + off)
                     : "memory");
      }
    }
  }
  asm volatile("cp.async.commit_group;" ::: "memory");
}

// hash_bytes(p, n) for each lane (n a multiple of 16, 0 for a lane with nothing to hash), every
// lane of the warp calling it together. Leaves no copy in flight.
__device__ __forceinline__ uint64_t hash(const Ring& r, const uint8_t* p, uint32_t n) {
  const int lane = threadIdx.x & 31;
  const uint32_t chunks = (n + kChunk - 1) / kChunk;
  const uint32_t total = __reduce_max_sync(0xffffffffu, chunks);
  const uint8_t* src[kCopies];
  uint32_t len[kCopies];
#pragma unroll
  for (int k = 0; k < kCopies; ++k) {
    const int owner = kLinesPerCopy * k + lane / kLanesPerLine;
    src[k] = reinterpret_cast<const uint8_t*>(
        __shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(p), owner));
    len[k] = __shfl_sync(0xffffffffu, n, owner);
  }
#pragma unroll
  for (int c = 0; c < kStages - 1; ++c) issue(r, src, len, c, c < total);
  uint64_t h = 0;
  for (uint32_t c = 0; c < total; ++c) {
    // Chunk c + kStages - 1 goes into the stage freed at the end of iteration c - 1.
    issue(r, src, len, c + kStages - 1, c + kStages - 1 < total);
    asm volatile("cp.async.wait_group %0;" ::"n"(kStages - 1) : "memory");
    __syncwarp();  // the other lanes' copies of my chunk have landed
    const uint32_t left = n > c * kChunk ? n - c * kChunk : 0;
    const uint4* q = reinterpret_cast<const uint4*>(r.slice(c % kStages, lane));
#pragma unroll
    for (int k = 0; k < kChunk / 16; ++k) {
      if (16u * k < left) {
        const uint4 v = q[k];
        h = fmix(h ^ ((static_cast<uint64_t>(v.y) << 32) | v.x));
        h = fmix(h ^ ((static_cast<uint64_t>(v.w) << 32) | v.z));
      }
    }
    __syncwarp();  // every lane has read stage c % kStages before it is refilled
  }
  asm volatile("cp.async.wait_group 0;" ::: "memory");
  return h;
}

}  // namespace staged

// Source k's hash of `slot` for this lane (0 when !active), staged (every lane of the warp
// calling together, through `ring`) or by direct loads.
template <bool kStaged>
__device__ __forceinline__ uint64_t lane_source_hash(const Sources& src, int k, int64_t slot,
                                                     bool active, staged::Ring* ring) {
  if constexpr (kStaged) {
    const uint8_t* p = nullptr;
    uint32_t n = 0;
    if (active) {
      const Source& s = src.s[k];
      p = s.bytes + (slot / s.page_size) * s.row_bytes + (slot % s.page_size) * s.bytes_per_token;
      n = static_cast<uint32_t>(s.read_bytes);
    }
    return staged::hash(*ring, p, n);
  } else {
    return active ? source_hash(src.s[k], slot) : 0;
  }
}

// kv_hash(slot) of OPS.md section 15 over groups of 2^group_log2 adjacent lanes: lane k of the
// group hashes source k (when `valid`), the shuffles fold them in source order. Every lane of the
// warp must call it (full-mask shuffles); every lane of the group gets the hash.
template <bool kStaged>
__device__ __forceinline__ uint64_t group_kv_hash(const Sources& src, int64_t slot, bool valid,
                                                  int group_log2, staged::Ring* ring) {
  const int g = 1 << group_log2;
  const int lane = threadIdx.x & 31, k = lane & (g - 1), base = lane & ~(g - 1);
  const uint64_t h = lane_source_hash<kStaged>(src, k, slot, valid && k < src.count, ring);
  uint64_t acc = 0;
  for (int j = 0; j < src.count; ++j) acc = fmix(acc ^ __shfl_sync(0xffffffffu, h, base + j));
  return acc;
}

// slot_hash(s) = mix3(prev_hash[s], token[s], position[s]); ANCHOR for s < 0 (or out of range).
__device__ __forceinline__ uint64_t slot_hash(const int64_t* canary, int64_t rows, int64_t slot) {
  if (slot < 0 || slot >= rows) return fmix(kAnchorSeed);
  const int64_t* r = canary + slot * 4;
  return mix3(static_cast<uint64_t>(r[2]), static_cast<uint64_t>(r[0]),
              static_cast<uint64_t>(r[1]));
}

}  // namespace kv_canary_detail

namespace kv_canary_host {

inline kv_canary_detail::IndexRef index_vector(const char* op, const char* arg,
                                               const tvm::ffi::TensorView& t,
                                               const tvm::ffi::TensorView& like, int64_t length) {
  kernels::check_ndim(op, arg, t, 1);
  kernels::check_same_device(op, arg, t, "canary", like);
  const bool i64 = kernels::is_dtype(t.dtype(), kDLInt, 64);
  TVM_FFI_CHECK(i64 || kernels::is_dtype(t.dtype(), kDLInt, 32), TypeError)
      << op << ": " << arg << " must be int32 or int64";
  TVM_FFI_CHECK(length < 0 || t.size(0) == length, ValueError)
      << op << ": " << arg << " must have " << length << " entries, got " << t.size(0);
  kv_canary_detail::IndexRef r;
  r.ptr = kernels::data<const void>(t);
  r.stride = t.stride(0);
  r.i64 = i64;
  return r;
}

// Adds source k (when present) after checking it: contiguous, on canary's device, rows that hold
// (page_size - 1) * bytes_per_token + read_bytes bytes.
inline void add_source(const char* op, kv_canary_detail::Sources& src,
                       const tvm::ffi::Optional<tvm::ffi::TensorView>& cache, int64_t page_size,
                       int64_t bytes_per_token, int64_t read_bytes,
                       const tvm::ffi::TensorView& canary) {
  if (!cache.has_value()) return;
  const tvm::ffi::TensorView& c = cache.value();
  kernels::check_contiguous(op, "kv_sources cache", c);
  kernels::check_same_device(op, "kv_sources cache", c, "canary", canary);
  TVM_FFI_CHECK(c.ndim() >= 1, ValueError) << op << ": a kv_sources cache must have a row dim";
  TVM_FFI_CHECK(page_size >= 1 && bytes_per_token >= 1 && read_bytes >= 0, ValueError)
      << op << ": kv_sources need page_size >= 1, bytes_per_token >= 1, read_bytes >= 0";
  const int64_t rows = c.size(0);
  const int64_t elem = (c.dtype().bits * c.dtype().lanes + 7) / 8;
  const int64_t row_bytes = rows ? c.numel() / rows * elem : 0;
  TVM_FFI_CHECK(rows == 0 || (page_size - 1) * bytes_per_token + read_bytes <= row_bytes,
                ValueError)
      << op << ": a kv_sources row has " << row_bytes << " bytes, fewer than (page_size - 1) * "
      << "bytes_per_token + read_bytes";
  TVM_FFI_CHECK(src.count < kv_canary_detail::kMaxSources, ValueError)
      << op << ": at most " << kv_canary_detail::kMaxSources << " kv_sources";
  src.s[src.count++] = kv_canary_detail::Source{kernels::data<const uint8_t>(c), rows, row_bytes,
                                                page_size, bytes_per_token, read_bytes};
}

}  // namespace kv_canary_host
