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
//   - at prefill sizes a vector copy into a cache of the input dtype takes the bulk path instead
//     (sm_90+) where its BulkGate lets it (the op module's _BULK_* attributes: row counts and
//     the cache-side run length): TMA bulk copies through a ring of shared-memory stages per
//     one-warp CTA, loads running stages - kBulkLag tokens ahead of the stores (below);
//   - fp8 caches (float8_e4m3fn, or uint8 holding its bytes) store cvt_satfinite_rne(x / scale),
//     x / scale correctly rounded (__fdiv_rn, so the reference's torch division is matched bit for
//     bit), two values per __nv_cvt_float2_to_fp8x2; the scale is read on the device;
//   - slots are int32 or int64 with 64-bit offsets. Negative slots and the skip index are skipped
//     (the semantics); a slot >= the cache's slot count is skipped too: the torch reference raises
//     ValueError for it, which the GPU cannot do without a host sync, so the kernels never form
//     its address (no illegal access) and drop that row.
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(9);

#include <cuda_fp8.h>

#include <kernels/bulk.cuh>
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

// Which slots are written, and where: (block, offset) = divmod(slot, block_size). Shared by the
// register and bulk paths (its fields keep the kernel parameters' layout of the flat fields it
// replaced).
struct SlotMap {
  int64_t limit = 0;    // slots in the cache: a slot >= limit is skipped
  int64_t skip = -1;    // one more slot value to skip (negative: none)
  int64_t block_size = 1;
  kernels::FastDivmod block_div;  // block_size, when limit < 2^31
  bool wide = false;              // limit >= 2^31: 64-bit division

  SlotMap() = default;
  SlotMap(int64_t limit_, int64_t skip_, int64_t block_size_)
      : limit(limit_), skip(skip_), block_size(block_size_), wide(limit_ >= (int64_t{1} << 31)) {
    if (block_size > 1 && !wide) block_div = kernels::FastDivmod(static_cast<uint32_t>(block_size));
  }

  // Not padding (negative), the skip index, or out of range: the row is written.
  __device__ __forceinline__ bool kept(int64_t slot) const {
    return slot >= 0 && slot != skip && slot < limit;
  }

  // The slot's block and its offset in the block.
  __device__ __forceinline__ void place(int64_t slot, int64_t& block, int64_t& offset) const {
    block = slot;
    offset = 0;
    if (block_size > 1) {
      if (wide) {
        block = slot / block_size;
        offset = slot - block * block_size;
      } else {
        uint32_t q, r;
        block_div.divmod(static_cast<uint32_t>(slot), q, r);
        block = q;
        offset = r;
      }
    }
  }
};

template <typename T, typename TC>
struct Params {
  Part<T, TC> a;
  Part<T, TC> b;  // items == 0 when absent
  const void* slots = nullptr;
  int64_t tokens = 0;
  SlotMap map;
  int group_shift = 0;  // log2(G)
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
  if (!p.map.kept(slot)) return;
  int64_t block, offset;
  p.map.place(slot, block, offset);
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
// The bulk path (sm_90+, prefill sizes, caches of the input dtype, 16-byte aligned runs): TMA bulk
// copies through shared memory instead of registers. One warp per CTA, a contiguous range of
// tokens per CTA, a ring of kBulk* stages (one token's K and V rows each) in dynamic shared
// memory: global -> shared bulk loads (L2 evict-first, completing on the stage's mbarrier) run
// stages - kBulkLag tokens ahead of the stores; a token's slot is held by one lane of a 32-slot
// batch loaded a batch ahead (shuffled out), so neither the slot nor the stores' addresses stand
// between a token's loads and the next ones; shared -> global bulk stores (plain L2 policy: the
// cache is read next) free their stage once read (cp.async.bulk.wait_group.read). Bytes in flight
// are shared memory, not registers: ~24 KB of loads per CTA, several CTAs per SM.

constexpr int kBulkLag = 2;                   // stores a stage may still be read by before reuse
constexpr int kBulkStageBudget = 32 * 1024;  // shared bytes of stages per CTA (before clamping)
constexpr int kBulkMinStages = 4;
constexpr int kBulkMaxStages = 16;
constexpr int kBulkBarBytes = 128;           // the mbarriers, ahead of the stages
constexpr int64_t kBulkMaxRowBytes = 16 * 1024;

// Where the bulk path runs, from the op module's attributes (_BULK_MIN_ROWS, _BULK_MAX_ROWS,
// _BULK_MIN_RUN_BYTES, read each call): from min_rows tokens (negative: never) up to max_rows
// (negative: no ceiling), and only where a token's cache-side runs average at least
// min_run_bytes (its row bytes over its bulk stores, parts back to back in one cache counted as
// one run): an H200 A/B won with 2 KB runs (NHD, token-major) and MLA's 1152-byte rows, lost with
// HND's 256-byte head runs.
struct BulkGate {
  int64_t min_rows = -1;
  int64_t max_rows = -1;
  int64_t min_run_bytes = 0;
};

// One part in bytes: `src_runs` runs of `src_bytes` (src_run apart) per token, likewise for the
// destination; a part's heads lie back to back from `offset` in a stage, so a part whose heads
// are contiguous on one side moves as one run on that side.
struct BulkPart {
  const char* src = nullptr;
  char* dst = nullptr;
  int64_t src_tok = 0, src_run = 0;
  int64_t dst_block = 0, dst_tok = 0, dst_run = 0;
  uint32_t src_runs = 0, src_bytes = 0;
  uint32_t dst_runs = 0, dst_bytes = 0;
  uint32_t offset = 0;
};

struct BulkParams {
  BulkPart a, b;
  const void* slots = nullptr;
  int64_t tokens = 0;
  SlotMap map;
  uint32_t row_bytes = 0;    // a's and b's bytes: one stage's transaction count
  uint32_t stage_bytes = 0;  // row_bytes rounded up to 128
  int stages = 0;            // kBulkMinStages..kBulkMaxStages
};

// Token `token`'s runs into the stage at `stage` (lane r issues runs r, r + 32, ...): lane 0 arms
// the stage's mbarrier with the row's bytes first.
__device__ __forceinline__ void bulk_issue_loads(const BulkParams& p, int64_t token,
                                                 uint32_t stage, uint32_t bar, uint32_t lane,
                                                 uint64_t policy) {
  if (lane == 0) kernels::mbarrier_expect_tx(bar, p.row_bytes);
  __syncwarp();
  const uint32_t runs = p.a.src_runs + p.b.src_runs;
  for (uint32_t r = lane; r < runs; r += 32) {
    const bool second = r >= p.a.src_runs;
    const uint32_t k = second ? r - p.a.src_runs : r;
    const char* base = second ? p.b.src : p.a.src;
    const int64_t tok = second ? p.b.src_tok : p.a.src_tok;
    const int64_t run = second ? p.b.src_run : p.a.src_run;
    const uint32_t bytes = second ? p.b.src_bytes : p.a.src_bytes;
    const uint32_t offset = second ? p.b.offset : p.a.offset;
    kernels::bulk_load(stage + offset + k * bytes, base + token * tok + k * run, bytes, bar,
                       policy);
  }
}

// The stage's runs to (block, offset) of both caches, in this lane's current bulk group.
__device__ __forceinline__ void bulk_issue_stores(const BulkParams& p, int64_t block,
                                                  int64_t offset, uint32_t stage, uint32_t lane) {
  const uint32_t runs = p.a.dst_runs + p.b.dst_runs;
  for (uint32_t r = lane; r < runs; r += 32) {
    const bool second = r >= p.a.dst_runs;
    const uint32_t k = second ? r - p.a.dst_runs : r;
    char* base = second ? p.b.dst : p.a.dst;
    const int64_t blk = second ? p.b.dst_block : p.a.dst_block;
    const int64_t tok = second ? p.b.dst_tok : p.a.dst_tok;
    const int64_t run = second ? p.b.dst_run : p.a.dst_run;
    const uint32_t bytes = second ? p.b.dst_bytes : p.a.dst_bytes;
    const uint32_t at = second ? p.b.offset : p.a.offset;
    kernels::bulk_store(base + block * blk + offset * tok + k * run, stage + at + k * bytes, bytes);
  }
}

template <typename Idx>
__global__ void __launch_bounds__(32)
    bulk_rows_kernel(bool pdl, const __grid_constant__ BulkParams p) {
  extern __shared__ __align__(128) unsigned char bulk_smem[];
  const uint32_t lane = threadIdx.x;
  const uint32_t bars = kernels::shared_address(bulk_smem);
  const uint32_t stages = bars + kBulkBarBytes;
  const int S = p.stages;
  const int64_t t0 = p.tokens * blockIdx.x / gridDim.x;
  const int64_t n = p.tokens * (blockIdx.x + 1) / gridDim.x - t0;
  if (lane < static_cast<uint32_t>(S)) kernels::mbarrier_init(bars + 8 * lane);
  kernels::mbarrier_init_fence();  // visible to the copies
  __syncwarp();
  const uint64_t policy = kernels::l2_evict_first();
  if (pdl) kernels::pdl_wait();
  const Idx* slots = static_cast<const Idx*>(p.slots) + t0;
  const auto slot_at = [&](int64_t i) -> int64_t {
    return i < n ? static_cast<int64_t>(slots[i]) : -1;
  };
  int64_t cur = slot_at(lane), next = slot_at(32 + lane);  // this batch's and the next's
  const int64_t first = n < S ? n : S;
  for (int64_t i = 0; i < first; ++i)
    bulk_issue_loads(p, t0 + i, stages + static_cast<uint32_t>(i) * p.stage_bytes,
                     bars + 8 * static_cast<uint32_t>(i), lane, policy);
  if (pdl) kernels::pdl_launch_dependents();
  int s = 0;            // token i's stage
  uint32_t parity = 0;  // its use of the stage, mod 2
  for (int64_t i = 0; i < n; ++i) {
    if (i > 0 && (i & 31) == 0) {
      cur = next;
      next = slot_at(i + 32 + lane);
    }
    // Refill the stage of token i - kBulkLag (stored at iteration i - kBulkLag) with token
    // i - kBulkLag + S, once that store has read it: groups 0..i-1 are committed, so at most
    // kBulkLag - 1 of them may still be pending.
    const int64_t j = i - kBulkLag + S;
    if (i >= kBulkLag && j < n) {
      kernels::bulk_wait_read<kBulkLag - 1>();
      __syncwarp();
      const int r = s >= kBulkLag ? s - kBulkLag : s - kBulkLag + S;
      bulk_issue_loads(p, t0 + j, stages + static_cast<uint32_t>(r) * p.stage_bytes,
                       bars + 8 * static_cast<uint32_t>(r), lane, policy);
    }
    const int64_t slot = __shfl_sync(0xffffffffu, cur, static_cast<int>(i & 31));
    const uint32_t stage = stages + static_cast<uint32_t>(s) * p.stage_bytes;
    // The stage's bytes, written by the async proxy, are read by the async proxy next: no proxy
    // fence (fence.proxy.async compiles to MEMBAR.ALL.CTA; DeepEP's TMA load -> store copies
    // go without one too).
    kernels::mbarrier_wait(bars + 8 * static_cast<uint32_t>(s), parity);
    if (p.map.kept(slot)) {
      int64_t block, offset;
      p.map.place(slot, block, offset);
      bulk_issue_stores(p, block, offset, stage, lane);
    }
    kernels::bulk_commit();  // every iteration, empty or not: the groups count tokens
    if (++s == S) {
      s = 0;
      parity ^= 1u;
    }
  }
  kernels::bulk_wait_read<0>();  // the stages stay valid until the last stores have read them
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

inline BulkPart bulk_part(const PartSpec& s, int64_t es, int64_t offset) {
  BulkPart q;
  if (s.heads == 0 || s.width == 0) return q;
  const int64_t run = s.width * es;
  const int64_t all = s.heads * run;
  q.src = static_cast<const char*>(s.src);
  q.dst = static_cast<char*>(s.dst);
  q.src_tok = s.src_tok * es;
  q.dst_block = s.dst_block * es;
  q.dst_tok = s.dst_tok * es;
  const bool src_one = s.heads == 1 || s.src_head == s.width;  // the heads back to back
  const bool dst_one = s.heads == 1 || s.dst_head == s.width;
  q.src_runs = static_cast<uint32_t>(src_one ? 1 : s.heads);
  q.src_bytes = static_cast<uint32_t>(src_one ? all : run);
  q.src_run = s.src_head * es;
  q.dst_runs = static_cast<uint32_t>(dst_one ? 1 : s.heads);
  q.dst_bytes = static_cast<uint32_t>(dst_one ? all : run);
  q.dst_run = s.dst_head * es;
  q.offset = static_cast<uint32_t>(offset);
  return q;
}

template <auto kKernel>
inline bool launch_bulk_kernel(const kernels::Launch& ctx, int64_t tokens, int64_t smem,
                               const BulkParams& p) {
  kernels::allow_dynamic_smem<kKernel>(ctx.op, ctx.device, smem);
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kKernel, 32,
                                                    static_cast<size_t>(smem)) != cudaSuccess ||
      per_sm <= 0) {
    (void)cudaGetLastError();  // a refused query leaves no error behind; the register path runs
    return false;
  }
  const int64_t resident = static_cast<int64_t>(per_sm) * kernels::sm_count(ctx.device);
  const unsigned grid = static_cast<unsigned>(tokens < resident ? tokens : resident);
  kernels::launch_dynamic(ctx, kKernel, grid, 32, smem, p);
  return true;
}

// A token's cache-side stores: both parts' runs, or one where b's single run follows a's in the
// same cache (set_mla_kv_buffer's nope | rope row).
inline int64_t bulk_dst_runs(const BulkPart& a, const BulkPart& b) {
  const bool joined = a.dst_runs == 1 && b.dst_runs == 1 && b.dst == a.dst + a.dst_bytes &&
                      b.dst_tok == a.dst_tok && b.dst_block == a.dst_block;
  return joined ? 1 : int64_t{a.dst_runs} + b.dst_runs;
}

// The bulk path where it applies (caches of the input dtype, 16-byte packs, sm_90+, rows of at
// most kBulkMaxRowBytes, and where `gate` lets it); false: the caller runs the register path.
inline bool launch_bulk(const kernels::Launch& ctx, const BulkGate& gate, int64_t es,
                        const PartSpec& a, const PartSpec& b, const tvm::ffi::TensorView& slots,
                        int64_t tokens, int64_t limit, int64_t skip, int64_t block_size) {
  if (gate.min_rows < 0 || tokens < gate.min_rows) return false;
  if (gate.max_rows >= 0 && tokens > gate.max_rows) return false;
  if (!kernels::pdl_supported(ctx.device)) return false;
  const int64_t a_bytes = a.heads * a.width * es;
  const int64_t row = a_bytes + b.heads * b.width * es;
  if (row <= 0 || row > kBulkMaxRowBytes) return false;
  BulkParams p;
  p.a = bulk_part(a, es, 0);
  p.b = bulk_part(b, es, a_bytes);
  if (row / bulk_dst_runs(p.a, p.b) < gate.min_run_bytes) return false;  // the mean run
  p.slots = kernels::data<const void>(slots);
  p.tokens = tokens;
  p.map = SlotMap(limit, skip, block_size);
  p.row_bytes = static_cast<uint32_t>(row);
  p.stage_bytes = static_cast<uint32_t>((row + 127) / 128 * 128);
  p.stages = std::clamp(kBulkStageBudget / static_cast<int>(p.stage_bytes), kBulkMinStages,
                        kBulkMaxStages);
  const int64_t smem = kBulkBarBytes + int64_t{p.stages} * p.stage_bytes;
  if (kernels::is_dtype(slots.dtype(), kDLInt, 64))
    return launch_bulk_kernel<bulk_rows_kernel<int64_t>>(ctx, tokens, smem, p);
  return launch_bulk_kernel<bulk_rows_kernel<int32_t>>(ctx, tokens, smem, p);
}

// The launch: T the input element type, TC the cache's (T, or uint8_t for fp8 bytes).
template <typename T, typename TC>
void write_rows(const kernels::Launch& ctx, const BulkGate& gate, const PartSpec& a,
                const PartSpec& b, const tvm::ffi::TensorView& slots, int64_t tokens,
                int64_t limit, int64_t skip, int64_t block_size) {
  constexpr int kVec = kernels::kVectorBytes / static_cast<int>(sizeof(T));
  const bool vector = part_fits(a, kVec, sizeof(T), sizeof(TC)) &&
                      part_fits(b, kVec, sizeof(T), sizeof(TC));
  const int kN = vector ? kVec : 1;
  const int64_t items = a.heads * (a.width / kN) + b.heads * (b.width / kN);
  TVM_FFI_CHECK(items < (int64_t{1} << 31), ValueError)
      << ctx.op << ": a token's row is too wide (" << items << " accesses)";
  if (items == 0 || tokens == 0) return;
  if constexpr (std::is_same_v<T, TC>) {
    if (vector &&
        launch_bulk(ctx, gate, sizeof(T), a, b, slots, tokens, limit, skip, block_size))
      return;
  }
  Params<T, TC> p;
  p.a = make_part<T, TC>(a, kN);
  p.b = make_part<T, TC>(b, kN);
  p.slots = kernels::data<const void>(slots);
  p.tokens = tokens;
  p.map = SlotMap(limit, skip, block_size);
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
inline void dispatch(const kernels::Launch& ctx, const BulkGate& gate, DLDataType dtype, bool fp8,
                     const PartSpec& a, const PartSpec& b, const tvm::ffi::TensorView& slots,
                     int64_t tokens, int64_t limit, int64_t skip, int64_t block_size) {
  KERNELS_DISPATCH_FLOAT(dtype, ctx.op, T, [&] {
    if (fp8)
      write_rows<T, uint8_t>(ctx, gate, a, b, slots, tokens, limit, skip, block_size);
    else
      write_rows<T, T>(ctx, gate, a, b, slots, tokens, limit, skip, block_size);
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
