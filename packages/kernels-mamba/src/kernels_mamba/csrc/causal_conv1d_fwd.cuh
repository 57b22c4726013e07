// mamba.causal_conv1d_fwd, CUDA: the depthwise causal conv1d of prefill sequences, in place.
//
// The op works in place, so a sequence's channel is owned by one warp or one CTA from its first
// column to its last (the W-1 halo of a chunk is carried in registers, never re-read from x, which
// the previous chunk has already overwritten). Three kernels, by the layout of x:
// - channel-first (stride 1 along time: [D, T] or [Bt, D, L] contiguous): a warp per (sequence,
//   channel), 4 warps per CTA. Lane l holds packs base + u*32 + l (u < kCfU = 8) of 16 bytes
//   along time (aligned to 16-byte addresses, the row's head and tail element-wise), so each load
//   is one coalesced 512-byte run; the next iteration's 8 packs are loaded before this one's math
//   and stores (double buffer: 4 KB per warp always in flight). Short rows (at most the op
//   module's _SHORT_ROW_MAX_BYTES: 2 KB, 1024 bf16 columns) take the 2-pack kernel instead
//   (kCfUShort: <= 64 registers, 8 CTAs = 32 warps per SM: [1, 4096, 512] in one wave), whose two
//   buffers go out at once (the whole row before any math) and are reloaded in turn with the
//   iteration after next (an H200 A/B: [1, 4096, 512] 10.08 -> 7.31 us; the same two-ahead
//   loading in the 8-pack kernel lost, [1, 4096, 4096] 22.67 -> 27.26). The halo of a pack is the
//   tail of the previous pack, from lane l-1 (or lane 31 of pack u-1, or the previous iteration) by
//   shuffles. A warp's 32 packs u whose windows lie inside the sequence (all but the first and
//   the last of a sequence) take a lean path without prefix/edge/state logic (~12 instructions
//   per element); silu on 16-bit data uses MUFU ex2 + rcp. No shared memory.
// - channel-last (stride 1 along channels: the proj_out[:, :D].T view), 16-byte aligned rows: a
//   CTA of 512 threads per (sequence, kClP channel packs = 64 bytes per time step): thread (p, q)
//   loads kClR consecutive time steps of pack p; its halo comes from thread q-1 by shuffles (the
//   first time lane of a warp from shared memory, written by the previous warp); the next round's
//   loads are issued before this round's math and stores (two rounds in flight per CTA).
// - anything else (misaligned channel-last, odd strides): the scalar kernel below, a CTA per
//   (sequence, channel) walking the sequence in rounds with a shared-memory halo.
// fp32 products and sums, one rounding. The new conv state (the last W-1 original columns of
// concat(prefix, x_b)) is written from registers after every read of the prefix. The small
// inputs (query_start_loc, cache_indices, has_initial_state, taps, bias, prefix) are issued as
// one batch after the first packs (mamba_common::load_raw), not as a chain of dependent loads.
//
// Why the channel-first kernel ran at 21% of copy ([1, 4096, 4096] bf16: 76.6 us): (1) a chain of
// ~12 dependent loads before the first pack (4 index loads, then taps, bias, prefix through
// load_any, whose dtype branch consumes each load), ~6-8 us with 1024 CTAs in ~2 waves; (2) IEEE
// silu (expf + a full division, ~25 instructions) and the prefix/edge checks on every pack:
// ~40 instructions per element, 16.7 M elements -> ~23 us of issue on 528 schedulers, not
// overlapped with memory because (3) each warp loaded, then computed, then stored (no loads in
// flight during its math). Now: ~12 instructions per element (~7 us of issue, 2 MUFU/element
// ~9 us of the MUFU pipe), hidden behind the next iteration's loads.
// Arithmetic: 4096 warps (1024 CTAs of 4), 128 registers -> 4 CTAs = 16 warps per SM, 2112
// resident: 1.94 waves. In flight: 16 warps x 4 KB = 64 KB per SM (40-64 KB needed), ~8.6 MB
// over the GPU. Bytes: 2 x 33.5 MB -> 15.7 us at 4.26 TB/s; expected ~19-21 us (>= 80% of the
// torch copy's 18.7 us is 23 us). The channel-last view ([4096, 4096] of a [L, D + 256] buffer):
// 128 CTAs of 512 threads (1 per SM): the batched parameter loads (40 dependent loads per thread
// before) and MUFU silu apply, but one CTA per SM with one round of lookahead (32 KB) keeps it
// latency-bound (~35-45 us expected); full speed there needs more CTAs per sequence, i.e.
// narrower channel slices (32-byte sectors) or a time split, not done here.
// Measured on the H200 (2026-12-03): channel-first 22.48 us (70.4% of copy), channel-last
// 28.66 us (55.3%).
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(2);

#include <kernels/checks.h>
#include <kernels/dtype.h>
#include <kernels/launch.cuh>
#include <kernels/tensor.h>
#include <kernels/vec.cuh>

#include "mamba_common.cuh"

namespace causal_conv1d_fwd_detail {

constexpr int kThreads = 256;
constexpr int kR = 8;  // time steps per thread per round, at most

struct Params {
  void* x;
  const void* weight;
  const void* bias;
  void* states;
  const void* qsl;
  const void* indices;
  const bool* init;
  int64_t dim, tokens, length;   // tokens: T of a varlen x; length: L of a batched x
  int64_t xs_b, xs_d, xs_t;      // x strides (xs_b = 0 for varlen)
  int64_t ws_d, ws_w, bs_d;
  int64_t ss_s, ss_d, ss_w, slots;
  int64_t pad_slot_id;
  int64_t init_stride;
  int wcode, bcode, scode;
  bool varlen, qsl64, indices64, silu;
};

template <typename T, int kN, int kCG, int kW>
__global__ void __launch_bounds__(kThreads, 2) fwd_kernel(const Params p) {
  using Pk = kernels::Pack<T, kN>;
  constexpr int kRuns = kThreads / kCG;
  constexpr int kHalo = kW - 1;
  constexpr int kBlockCh = kCG * kN;
  __shared__ float halo[2][kHalo][kBlockCh];
  __shared__ __align__(16) float wsm[kW + 1][kBlockCh];  // the taps, then the bias

  const int64_t b = blockIdx.y;
  const int cg = threadIdx.x % kCG, tr = threadIdx.x / kCG;
  const int64_t c0 = (static_cast<int64_t>(blockIdx.x) * kCG + cg) * kN;
  const bool active = c0 < p.dim;

  // The sequence: its columns, its state row, whether it runs at all (uniform over the CTA).
  int64_t start = 0, len = p.length;
  if (p.varlen) {
    start = mamba_common::load_index(p.qsl, b, p.qsl64);
    const int64_t end = mamba_common::load_index(p.qsl, b + 1, p.qsl64);
    if (start < 0 || end > p.tokens || end < start) return;
    len = end - start;
  }
  int64_t row = b;
  if (p.indices != nullptr) {
    row = mamba_common::load_index(p.indices, b, p.indices64);
    if (row == p.pad_slot_id) return;
  }
  if (p.states != nullptr && (row < 0 || row >= p.slots)) return;
  const bool use_state = p.states != nullptr && p.init != nullptr && p.init[b * p.init_stride];

  T* x = static_cast<T*>(p.x) + b * p.xs_b + start * p.xs_t + c0 * p.xs_d;
  // The taps and bias of the block's channels, and the first halo (the prefix), in shared memory.
  if (tr == 0) {
#pragma unroll
    for (int i = 0; i < kN; ++i) {
      const int64_t c = active ? c0 + i : 0;
#pragma unroll
      for (int j = 0; j < kW; ++j)
        wsm[j][cg * kN + i] = mamba_common::load_any(p.weight, c * p.ws_d + j * p.ws_w, p.wcode);
      wsm[kW][cg * kN + i] = p.bias ? mamba_common::load_any(p.bias, c * p.bs_d, p.bcode) : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < kHalo; ++k)
#pragma unroll
      for (int i = 0; i < kN; ++i)
        halo[0][k][cg * kN + i] =
            use_state && active
                ? mamba_common::load_any(p.states, row * p.ss_s + (c0 + i) * p.ss_d + k * p.ss_w,
                                         p.scode)
                : 0.0f;
  }
  __syncthreads();

  const int64_t run = len < static_cast<int64_t>(kRuns) * kR ? (len + kRuns - 1) / kRuns : kR;
  const int64_t per_round = run * kRuns;
  int cur = 0;
  for (int64_t rs = 0; rs < len; rs += per_round) {
    const int64_t t0 = rs + tr * run;
    // Loads: positions t0 - kHalo + m, m < run + kHalo (global when inside this round's columns
    // or later, shared halo when before the round).
    Pk raw[kR + kHalo];
    if (active) {
#pragma unroll
      for (int m = 0; m < kR + kHalo; ++m) {
        const int64_t pos = t0 - kHalo + m;
        if (m < run + kHalo && pos >= rs && pos < len) raw[m].load(x + pos * p.xs_t);
      }
    }
    // The next halo: the original last kHalo columns of this round.
    const int64_t round_end = rs + per_round < len ? rs + per_round : len;
    if (tr == 0 && active) {
#pragma unroll
      for (int k = 0; k < kHalo; ++k) {
        const int64_t pos = round_end - kHalo + k;
        float f[kN];
        if (pos >= rs) {
          Pk v;
          v.load(x + pos * p.xs_t);
          v.unpack(f);
        } else {
#pragma unroll
          for (int i = 0; i < kN; ++i) f[i] = halo[cur][pos - rs + kHalo][cg * kN + i];
        }
#pragma unroll
        for (int i = 0; i < kN; ++i) halo[cur ^ 1][k][cg * kN + i] = f[i];
      }
    }
    // Compute: a sliding window of kHalo fp32 columns.
    if (active) {
      float win[kHalo][kN];
#pragma unroll
      for (int m = 0; m < kHalo; ++m) {
        const int64_t pos = t0 - kHalo + m;
        if (pos < rs) {
#pragma unroll
          for (int i = 0; i < kN; ++i) win[m][i] = halo[cur][pos - rs + kHalo][cg * kN + i];
        } else {
          raw[m].unpack(win[m]);
        }
      }
#pragma unroll
      for (int m = 0; m < kR; ++m) {
        if (m < run) {
          float f[kN], y[kN];
          raw[m + kHalo].unpack(f);
#pragma unroll
          for (int i = 0; i < kN; ++i) {
            const int ch = cg * kN + i;
            float acc = wsm[kW][ch];
#pragma unroll
            for (int j = 0; j < kHalo; ++j) acc += wsm[j][ch] * win[j][i];
            acc += wsm[kW - 1][ch] * f[i];
            y[i] = p.silu ? mamba_common::silu(acc) : acc;
          }
#pragma unroll
          for (int j = 0; j + 1 < kHalo; ++j)
#pragma unroll
            for (int i = 0; i < kN; ++i) win[j][i] = win[j + 1][i];
#pragma unroll
          for (int i = 0; i < kN; ++i) win[kHalo - 1][i] = f[i];
          raw[m + kHalo].pack(y);
        }
      }
    }
    __syncthreads();  // every read of the round (global and halo) before any write
    if (active) {
#pragma unroll
      for (int m = 0; m < kR; ++m)
        if (m < run && t0 + m < len) raw[m + kHalo].store(x + (t0 + m) * p.xs_t);
    }
    cur ^= 1;
  }
  // The new state: the last kHalo columns of concat(prefix, x_b), original values.
  if (p.states != nullptr && tr == 0 && active) {
#pragma unroll
    for (int k = 0; k < kHalo; ++k)
#pragma unroll
      for (int i = 0; i < kN; ++i)
        mamba_common::store_any(p.states, row * p.ss_s + (c0 + i) * p.ss_d + k * p.ss_w, p.scode,
                                halo[cur][k][cg * kN + i]);
  }
}


// The sequence of CTA row b: its first column and length, its state row, whether the prefix is
// the stored state. False when it is skipped (pad slot, out-of-range row or bad query_start_loc).
// Every index load is issued before any is used (one memory round trip, not four).
__device__ __forceinline__ bool sequence_of(const Params& p, int64_t b, int64_t& start,
                                            int64_t& len, int64_t& row, bool& use_state) {
  int64_t s = 0, e = p.length, r = b;
  bool init = false;
  if (p.varlen) {
    s = mamba_common::load_index(p.qsl, b, p.qsl64);
    e = mamba_common::load_index(p.qsl, b + 1, p.qsl64);
  }
  if (p.indices != nullptr) r = mamba_common::load_index(p.indices, b, p.indices64);
  if (p.states != nullptr && p.init != nullptr) init = p.init[b * p.init_stride];
  if (p.varlen && (s < 0 || e > p.tokens || e < s)) return false;
  start = s;
  len = e - s;
  row = r;
  if (p.indices != nullptr && r == p.pad_slot_id) return false;
  if (p.states != nullptr && (r < 0 || r >= p.slots)) return false;
  use_state = init;
  return true;
}

constexpr int kCfWarps = 4;  // channels per CTA (one warp each)
constexpr int kCfU = 8;      // 16-byte packs per lane per iteration (4 KB of bf16 per warp)
// Short rows (the host's choice: rows of at most _SHORT_ROW_MAX_BYTES) take 2 packs per lane per
// iteration, <= 64 registers, 8 CTAs (32 warps) per SM: [1, 4096, 512] is 4096 warps in one wave
// of 4224 (kCfU: 4 CTAs per SM, 1.94 waves of warps that each live one load round trip).
constexpr int kCfUShort = 2;
constexpr int kCfCtasShort = 8;

// The packs of one iteration of the channel-first kernel: pack k = base + u * 32 + lane covers
// columns [k * kN - o, k * kN - o + kN) of the row; whole 16-byte vectors inside the row,
// element-wise at the row's ends, zeros past `last`.
template <typename T, typename Pk, int kU>
__device__ __forceinline__ void cf_load(Pk (&raw)[kU], const T* xr, int64_t base, int64_t last,
                                        int64_t o, int64_t rowlen, int lane) {
  constexpr int kN = Pk::size;
  const int64_t c_first = base * kN - o, c_end = (base + 32 * kU) * kN - o;
  if (c_first >= 0 && c_end <= rowlen && base + 32 * kU - 1 <= last) {  // uniform: all whole
    const T* it = xr + c_first + lane * kN;
#pragma unroll
    for (int u = 0; u < kU; ++u) raw[u].load_stream(it + u * 32 * kN);
    return;
  }
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    const int64_t pk = base + u * 32 + lane;
    const int64_t c0 = pk * kN - o;
    if (pk <= last && c0 >= 0 && c0 + kN <= rowlen) {
      raw[u].load_stream(xr + c0);
    } else if (pk <= last) {
      float f[kN];
#pragma unroll
      for (int i = 0; i < kN; ++i)
        f[i] = c0 + i >= 0 && c0 + i < rowlen ? kernels::to_float(xr[c0 + i]) : 0.0f;
      raw[u].pack(f);  // exact: the values came from T
    } else {
      raw[u].zero();
    }
  }
}

template <typename T, int kW, int kU>
__global__ void __launch_bounds__(kCfWarps * 32, kU >= kCfU ? 4 : kCfCtasShort)
    fwd_cf_kernel(const Params p) {
  constexpr int kN = kernels::kVectorBytes / static_cast<int>(sizeof(T));
  constexpr int kH = kW - 1;
  using Pk = kernels::Pack<T, kN>;
  using mamba_common::load_raw;
  using mamba_common::Raw;
  using mamba_common::raw_float;
  constexpr int kWords = Pk::kWords;
  constexpr int kPerWord = Pk::kPerWord;
  constexpr int kHW = (kH + kPerWord - 1) / kPerWord;  // words holding a pack's last kH values
  constexpr int64_t kStep = 32 * kU;                    // packs per iteration
  const int lane = threadIdx.x % 32;
  const int64_t d = static_cast<int64_t>(blockIdx.x) * kCfWarps + threadIdx.x / 32;
  const int64_t b = blockIdx.y;
  if (d >= p.dim) return;  // uniform over the warp
  int64_t start, len, row;
  bool use_state;
  if (!sequence_of(p, b, start, len, row, use_state)) return;
  const int64_t rowlen = p.varlen ? p.tokens : p.length;
  T* xr = static_cast<T*>(p.x) + b * p.xs_b + d * p.xs_d;  // column 0 of the row (xs_t == 1)
  // Pack k covers columns [k * kN - o, k * kN - o + kN): packs sit on 16-byte addresses.
  const int64_t o = static_cast<int64_t>(reinterpret_cast<uintptr_t>(xr) % 16) / sizeof(T);
  const int64_t end = start + len;
  const int64_t first = (start + o) / kN, last = len > 0 ? (end - 1 + o) / kN : first - 1;
  // The 2-pack kernel loads two iterations ahead (both buffers at once, reloaded in turn); the
  // 8-pack kernel one (the next iteration's packs in flight during this one's, then copied).
  constexpr bool kTwoAhead = kU < kCfU;
  // 1. The first iteration's packs go out first (the 2-pack kernel: the first two iterations',
  // the whole row of L <= 2 x kStep packs), then the taps, bias and prefix as one batch
  // (load_raw: no load waits for another), converted after.
  Pk buf0[kU], buf1[kU];
  if (len > 0) cf_load<T>(buf0, xr, first, last, o, rowlen, lane);
  if constexpr (kTwoAhead) {
    if (first + kStep <= last) cf_load<T>(buf1, xr, first + kStep, last, o, rowlen, lane);
  }
  const int64_t srow = row * p.ss_s + d * p.ss_d;
  Raw rw[kW], rb{0, 0}, rp[kH];
#pragma unroll
  for (int j = 0; j < kW; ++j) rw[j] = load_raw(p.weight, d * p.ws_d + j * p.ws_w, p.wcode);
  if (p.bias) rb = load_raw(p.bias, d * p.bs_d, p.bcode);
#pragma unroll
  for (int k = 0; k < kH; ++k) rp[k] = use_state ? load_raw(p.states, srow + k * p.ss_w, p.scode)
                                                 : Raw{0, 0};
  float w[kW], pre[kH];
#pragma unroll
  for (int j = 0; j < kW; ++j) w[j] = raw_float(rw[j], p.wcode);
  const float bias = p.bias ? raw_float(rb, p.bcode) : 0.0f;
#pragma unroll
  for (int k = 0; k < kH; ++k) pre[k] = use_state ? raw_float(rp[k], p.scode) : 0.0f;
  __syncwarp();  // every lane's prefix read before any lane's state write
  if (len == 0) {  // the state keeps the prefix (zeros without an initial state)
    if (p.states != nullptr && lane == 0) {
#pragma unroll
      for (int k = 0; k < kH; ++k)
        mamba_common::store_any(p.states, srow + k * p.ss_w, p.scode, pre[k]);
    }
    return;
  }
  uint32_t carry[kHW];
#pragma unroll
  for (int k = 0; k < kHW; ++k) carry[k] = 0;
  // 2. One iteration on the packs `cur` of packs base..: the next iteration's packs are in flight
  // during its math and stores (other addresses: the reads of x stay ahead of its writes); the
  // 2-pack kernel then reloads `cur` with the iteration after next (two buffers in turn).
  auto iterate = [&](Pk (&cur)[kU], int64_t base) {
    // 3. Per pack: the halo (tail of the previous pack) by shuffles, fp32 math, store.
    uint32_t next_carry[kHW];
#pragma unroll
    for (int k = 0; k < kHW; ++k)
      next_carry[k] = __shfl_sync(0xffffffffu, cur[kU - 1].w[kWords - kHW + k], 31);
    const int64_t c_first = base * kN - o;
    // The window of pack u: columns c0 - kH .. c0 + kN - 1 (halo from the previous pack).
    auto window = [&](int u, float (&e)[kH + kN]) {
      uint32_t hw[kHW];
#pragma unroll
      for (int k = 0; k < kHW; ++k) {
        const uint32_t up = __shfl_up_sync(0xffffffffu, cur[u].w[kWords - kHW + k], 1);
        const uint32_t wrap =
            u > 0 ? __shfl_sync(0xffffffffu, cur[u > 0 ? u - 1 : 0].w[kWords - kHW + k], 31)
                  : carry[k];
        hw[k] = lane == 0 ? wrap : up;
      }
      float hf[kHW * kPerWord];
#pragma unroll
      for (int k = 0; k < kHW; ++k) kernels::Words<T>::unpack(hw[k], hf + k * kPerWord);
#pragma unroll
      for (int m = 0; m < kH; ++m) e[m] = hf[kHW * kPerWord - kH + m];
      float f[kN];
      cur[u].unpack(f);
#pragma unroll
      for (int i = 0; i < kN; ++i) e[kH + i] = f[i];
    };
    auto conv = [&](const float (&e)[kH + kN], float (&y)[kN]) {
#pragma unroll
      for (int i = 0; i < kN; ++i) {
        float acc = bias;
#pragma unroll
        for (int j = 0; j < kW; ++j) acc = fmaf(w[j], e[i + j], acc);
        y[i] = acc;
      }
      if (p.silu) {
#pragma unroll
        for (int i = 0; i < kN; ++i) y[i] = mamba_common::silu_for<T>(y[i]);
      }
    };
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      float e[kH + kN], y[kN];
      window(u, e);
      // Uniform: the warp's 32 packs u (columns g0 .. g0 + 32 kN - 1) are whole, inside the
      // sequence with their windows, and none is the last pack: the lean path (no edge,
      // prefix or state logic), taken by every pack of a long sequence but its first and last.
      const int64_t g0 = c_first + u * 32 * kN;
      if (g0 - kH >= start && g0 + 32 * kN <= end && base + u * 32 + 31 < last) {
        conv(e, y);
        Pk out;
        out.pack(y);
        out.store_stream(xr + g0 + lane * kN);
        continue;
      }
      const int64_t pk = base + u * 32 + lane;
      const int64_t c0 = pk * kN - o;
      if (pk > last) continue;
      if (c0 - kH < start) {  // columns before the sequence: its prefix
#pragma unroll
        for (int m = 0; m < kH + kN; ++m) {
          const int64_t c = c0 - kH + m;
          if (c < start) {
            float v = 0.0f;
#pragma unroll
            for (int k = 0; k < kH; ++k) v = c == start - kH + k ? pre[k] : v;
            e[m] = v;
          }
        }
      }
      conv(e, y);
      if (c0 >= start && c0 + kN <= end) {
        Pk out;
        out.pack(y);
        out.store_stream(xr + c0);
      } else {
#pragma unroll
        for (int i = 0; i < kN; ++i)
          if (c0 + i >= start && c0 + i < end) xr[c0 + i] = kernels::from_float<T>(y[i]);
      }
      if (p.states != nullptr && pk == last) {
        // The new state: columns end - kH .. end - 1, original values.
#pragma unroll
        for (int k = 0; k < kH; ++k) {
          const int64_t idx = end - c0 + k;  // in e: column end - kH + k
          float v = 0.0f;
#pragma unroll
          for (int m = 0; m < kH + kN; ++m) v = m == idx ? e[m] : v;
          mamba_common::store_any(p.states, srow + k * p.ss_w, p.scode, v);
        }
      }
    }
#pragma unroll
    for (int k = 0; k < kHW; ++k) carry[k] = next_carry[k];
    if constexpr (kTwoAhead) {
      if (base + 2 * kStep <= last) cf_load<T>(cur, xr, base + 2 * kStep, last, o, rowlen, lane);
    }
  };
  if constexpr (kTwoAhead) {
    for (int64_t base = first; base <= last; base += 2 * kStep) {
      iterate(buf0, base);
      if (base + kStep > last) break;
      iterate(buf1, base + kStep);
    }
  } else {
    for (int64_t base = first; base <= last; base += kStep) {
      Pk nxt[kU];
      if (base + kStep <= last) cf_load<T>(nxt, xr, base + kStep, last, o, rowlen, lane);
      iterate(buf0, base);
#pragma unroll
      for (int u = 0; u < kU; ++u) buf0[u] = nxt[u];
    }
  }
}

constexpr int kClP = 4;                   // 16-byte channel packs per CTA (64 bytes a step)
constexpr int kClThreads = 512;
constexpr int kClQ = kClThreads / kClP;   // time lanes
constexpr int kClR = 4;                   // consecutive steps per time lane per round (>= W-1)
constexpr int kClWarps = kClThreads / 32;
constexpr int kClQW = 32 / kClP;          // time lanes per warp

template <typename T, int kW>
__global__ void __launch_bounds__(kClThreads, 1) fwd_cl_kernel(const Params p) {
  constexpr int kN = kernels::kVectorBytes / static_cast<int>(sizeof(T));
  constexpr int kH = kW - 1;
  constexpr int kCh = kClP * kN;
  using Pk = kernels::Pack<T, kN>;
  __shared__ float halo[3][kClWarps][kH][kCh];  // each warp's last kH steps, rounds mod 3
  __shared__ float prefix[kH][kCh];
  const int t = threadIdx.x;
  const int pi = t % kClP, q = t / kClP, warp = t / 32, qw = q % kClQW;
  const int64_t b = blockIdx.y;
  const int64_t c0 = (static_cast<int64_t>(blockIdx.x) * kClP + pi) * kN;
  const bool active = c0 < p.dim;
  int64_t start, len, row;
  bool use_state;
  if (!sequence_of(p, b, start, len, row, use_state)) return;  // uniform over the CTA
  T* xs = static_cast<T*>(p.x) + b * p.xs_b + start * p.xs_t + (active ? c0 : 0);
  // 1. The first round's packs go out first, then the taps, bias and prefix as one batch of
  // loads (load_raw: none waits for another; load_any here was 40 dependent round trips).
  const int64_t per_round = static_cast<int64_t>(kClQ) * kClR;
  Pk raw[kClR];
#pragma unroll
  for (int m = 0; m < kClR; ++m) {
    const int64_t pos = static_cast<int64_t>(q) * kClR + m;
    if (active && pos < len) {
      raw[m].load_stream(xs + pos * p.xs_t);
    } else {
      raw[m].zero();
    }
  }
  float w[kN][kW], bias[kN];
  {
    mamba_common::Raw rw[kN][kW], rb[kN];
#pragma unroll
    for (int i = 0; i < kN; ++i) {
      const int64_t c = active ? c0 + i : 0;
#pragma unroll
      for (int j = 0; j < kW; ++j)
        rw[i][j] = mamba_common::load_raw(p.weight, c * p.ws_d + j * p.ws_w, p.wcode);
      rb[i] = p.bias ? mamba_common::load_raw(p.bias, c * p.bs_d, p.bcode)
                     : mamba_common::Raw{0, 0};
    }
#pragma unroll
    for (int i = 0; i < kN; ++i) {
#pragma unroll
      for (int j = 0; j < kW; ++j) w[i][j] = mamba_common::raw_float(rw[i][j], p.wcode);
      bias[i] = p.bias ? mamba_common::raw_float(rb[i], p.bcode) : 0.0f;
    }
  }
  if (q == 0) {
    mamba_common::Raw rp[kH][kN];
#pragma unroll
    for (int k = 0; k < kH; ++k)
#pragma unroll
      for (int i = 0; i < kN; ++i)
        rp[k][i] = use_state && active
                       ? mamba_common::load_raw(p.states,
                                                row * p.ss_s + (c0 + i) * p.ss_d + k * p.ss_w,
                                                p.scode)
                       : mamba_common::Raw{0, 0};
#pragma unroll
    for (int k = 0; k < kH; ++k)
#pragma unroll
      for (int i = 0; i < kN; ++i)
        prefix[k][pi * kN + i] = use_state && active ? mamba_common::raw_float(rp[k][i], p.scode)
                                                     : 0.0f;
  }
  int r3 = 0;  // round % 3
  for (int64_t rs = 0; rs < len; rs += per_round) {
    // 1. The warp's last time lane publishes its last kH (original) steps.
    if (qw == kClQW - 1) {
#pragma unroll
      for (int k = 0; k < kH; ++k) {
        float f[kN];
        raw[kClR - kH + k].unpack(f);
#pragma unroll
        for (int i = 0; i < kN; ++i) halo[r3][warp][k][pi * kN + i] = f[i];
      }
    }
    // 2. The next round's loads, in flight during this round's math and stores.
    Pk nxt[kClR];
#pragma unroll
    for (int m = 0; m < kClR; ++m) {
      const int64_t pos = rs + per_round + static_cast<int64_t>(q) * kClR + m;
      if (active && pos < len) {
        nxt[m].load_stream(xs + pos * p.xs_t);
      } else {
        nxt[m].zero();
      }
    }
    __syncthreads();
    // 3. The window before my first step: time lane q-1 (shuffle), the previous warp (shared),
    //    the previous round's last warp, or the prefix.
    float win[kH][kN];
#pragma unroll
    for (int k = 0; k < kH; ++k) {
      Pk v;
#pragma unroll
      for (int a = 0; a < Pk::kWords; ++a)
        v.w[a] = __shfl_up_sync(0xffffffffu, raw[kClR - kH + k].w[a], kClP);
      v.unpack(win[k]);
    }
    if (qw == 0) {
      const float(*src)[kCh] = warp > 0    ? halo[r3][warp - 1]
                               : rs == 0   ? prefix
                                           : halo[r3 == 0 ? 2 : r3 - 1][kClWarps - 1];
#pragma unroll
      for (int k = 0; k < kH; ++k)
#pragma unroll
        for (int i = 0; i < kN; ++i) win[k][i] = src[k][pi * kN + i];
    }
    // 4. kClR steps: fp32 math, store, and the new state from the last kH original steps.
#pragma unroll
    for (int m = 0; m < kClR; ++m) {
      const int64_t pos = rs + static_cast<int64_t>(q) * kClR + m;
      float f[kN], y[kN];
      raw[m].unpack(f);
#pragma unroll
      for (int i = 0; i < kN; ++i) {
        float acc = bias[i] + w[i][kW - 1] * f[i];
#pragma unroll
        for (int k = 0; k < kH; ++k) acc += w[i][k] * win[k][i];
        y[i] = acc;
      }
      if (p.silu) {
#pragma unroll
        for (int i = 0; i < kN; ++i) y[i] = mamba_common::silu_for<T>(y[i]);
      }
#pragma unroll
      for (int k = 0; k + 1 < kH; ++k)
#pragma unroll
        for (int i = 0; i < kN; ++i) win[k][i] = win[k + 1][i];
#pragma unroll
      for (int i = 0; i < kN; ++i) win[kH - 1][i] = f[i];
      if (active && pos < len) {
        Pk out;
        out.pack(y);
        out.store_stream(xs + pos * p.xs_t);
        if (p.states != nullptr && pos >= len - kH) {
#pragma unroll
          for (int i = 0; i < kN; ++i)
            mamba_common::store_any(p.states,
                                    row * p.ss_s + (c0 + i) * p.ss_d + (pos - (len - kH)) * p.ss_w,
                                    p.scode, f[i]);
        }
      }
    }
#pragma unroll
    for (int m = 0; m < kClR; ++m) raw[m] = nxt[m];
    r3 = r3 == 2 ? 0 : r3 + 1;
  }
  // A sequence shorter than kH: the state's first kH - len columns are the prefix's tail (the
  // threads that read the prefix write them: their own reads come first).
  if (p.states != nullptr && len < kH && q == 0 && active) {
#pragma unroll
    for (int k = 0; k < kH; ++k) {
      if (k < kH - len) {
#pragma unroll
        for (int i = 0; i < kN; ++i)
          mamba_common::store_any(p.states, row * p.ss_s + (c0 + i) * p.ss_d + k * p.ss_w,
                                  p.scode, prefix[k + len][pi * kN + i]);
      }
    }
  }
}

template <typename T, int kN, int kCG>
void launch(const kernels::Launch& ctx, const Params& p, int64_t width, int64_t seqs) {
  const dim3 grid(kernels::ceil_div(p.dim, kCG * kN), static_cast<unsigned>(seqs));
  switch (width) {
    case 2: fwd_kernel<T, kN, kCG, 2><<<grid, kThreads, 0, ctx.stream>>>(p); break;
    case 3: fwd_kernel<T, kN, kCG, 3><<<grid, kThreads, 0, ctx.stream>>>(p); break;
    default: fwd_kernel<T, kN, kCG, 4><<<grid, kThreads, 0, ctx.stream>>>(p); break;
  }
}

}  // namespace causal_conv1d_fwd_detail

// x: varlen [D, T] (with query_start_loc [B+1]) or batched [Bt, D, L], any strides, float32,
// float16 or bfloat16, overwritten; weight [D, W] (W in 2..4), bias [D] or None, conv_states
// [S, D, W-1] or None (any float dtype, any strides); cache_indices [B] int32/int64 or None;
// has_initial_state [B] bool or None. short_row_max_bytes: channel-first rows of at most this many
// bytes take the 2-pack kernel (the op module's _SHORT_ROW_MAX_BYTES; negative: never).
inline void causal_conv1d_fwd(tvm::ffi::TensorView x, tvm::ffi::TensorView weight,
                              tvm::ffi::Optional<tvm::ffi::TensorView> bias,
                              tvm::ffi::Optional<tvm::ffi::TensorView> conv_states,
                              tvm::ffi::Optional<tvm::ffi::TensorView> query_start_loc,
                              tvm::ffi::Optional<tvm::ffi::TensorView> cache_indices,
                              tvm::ffi::Optional<tvm::ffi::TensorView> has_initial_state,
                              bool silu, int64_t pad_slot_id, int64_t short_row_max_bytes) {
  namespace detail = causal_conv1d_fwd_detail;
  constexpr const char* kOp = "mamba.causal_conv1d_fwd";
  // 1. Validate.
  TVM_FFI_CHECK(x.ndim() == 2 || x.ndim() == 3, ValueError)
      << kOp << ": x must be [D, T] or [Bt, D, L], got " << kernels::shape_string(x);
  kernels::check_device(kOp, "x", x, kDLCUDA);
  kernels::check_ndim(kOp, "weight", weight, 2);
  kernels::check_same_device(kOp, "weight", weight, "x", x);
  const bool varlen = x.ndim() == 2;
  const int64_t dim = varlen ? x.size(0) : x.size(1);
  const int64_t width = weight.size(1);
  TVM_FFI_CHECK(weight.size(0) == dim && width >= 2 && width <= 4, ValueError)
      << kOp << ": weight must be [D, W] = [" << dim << ", 2..4], got "
      << kernels::shape_string(weight);
  detail::Params p{};
  p.wcode = mamba_common::float_code(kOp, "weight", weight);
  int64_t seqs = varlen ? 0 : x.size(0);
  if (varlen) {
    TVM_FFI_CHECK(query_start_loc.has_value(), ValueError)
        << kOp << ": varlen x [D, T] needs query_start_loc";
    const tvm::ffi::TensorView q = query_start_loc.value();
    kernels::check_ndim(kOp, "query_start_loc", q, 1);
    TVM_FFI_CHECK(q.size(0) >= 1 && (q.stride(0) == 1 || q.size(0) <= 1), ValueError)
        << kOp << ": query_start_loc must be a contiguous [B+1] vector";
    kernels::check_same_device(kOp, "query_start_loc", q, "x", x);
    p.qsl64 = mamba_common::index_is64(kOp, "query_start_loc", q);
    p.qsl = kernels::data(q);
    seqs = q.size(0) - 1;
  } else {
    TVM_FFI_CHECK(!query_start_loc.has_value(), ValueError)
        << kOp << ": batched x takes no query_start_loc";
  }
  if (bias.has_value()) {
    const tvm::ffi::TensorView v = bias.value();
    kernels::check_ndim(kOp, "bias", v, 1);
    TVM_FFI_CHECK(v.size(0) == dim, ValueError) << kOp << ": bias must have " << dim << " entries";
    kernels::check_same_device(kOp, "bias", v, "x", x);
    p.bcode = mamba_common::float_code(kOp, "bias", v);
    p.bias = kernels::data(v);
    p.bs_d = v.stride(0);
  }
  if (conv_states.has_value()) {
    const tvm::ffi::TensorView v = conv_states.value();
    kernels::check_ndim(kOp, "conv_states", v, 3);
    TVM_FFI_CHECK(v.size(1) == dim && v.size(2) == width - 1, ValueError)
        << kOp << ": conv_states must be [S, " << dim << ", " << width - 1 << "], got "
        << kernels::shape_string(v);
    kernels::check_same_device(kOp, "conv_states", v, "x", x);
    p.scode = mamba_common::float_code(kOp, "conv_states", v);
    p.states = kernels::data(v);
    p.ss_s = v.stride(0);
    p.ss_d = v.stride(1);
    p.ss_w = v.stride(2);
    p.slots = v.size(0);
  }
  if (cache_indices.has_value()) {
    const tvm::ffi::TensorView v = cache_indices.value();
    kernels::check_ndim(kOp, "cache_indices", v, 1);
    TVM_FFI_CHECK(v.size(0) == seqs && (v.stride(0) == 1 || seqs <= 1), ValueError)
        << kOp << ": cache_indices must be a contiguous [" << seqs << "] vector";
    kernels::check_same_device(kOp, "cache_indices", v, "x", x);
    p.indices64 = mamba_common::index_is64(kOp, "cache_indices", v);
    p.indices = kernels::data(v);
  }
  if (has_initial_state.has_value()) {
    const tvm::ffi::TensorView v = has_initial_state.value();
    kernels::check_ndim(kOp, "has_initial_state", v, 1);
    TVM_FFI_CHECK(v.size(0) == seqs && kernels::is_dtype(v.dtype(), kDLBool, 8), ValueError)
        << kOp << ": has_initial_state must be a bool [" << seqs << "] vector";
    kernels::check_same_device(kOp, "has_initial_state", v, "x", x);
    p.init = kernels::data<const bool>(v);
    p.init_stride = v.stride(0);
  }
  TVM_FFI_CHECK(seqs <= 65535, ValueError) << kOp << ": at most 65535 sequences, got " << seqs;
  if (x.numel() == 0 || seqs == 0) return;
  p.x = kernels::data(x);
  p.weight = kernels::data(weight);
  p.ws_d = weight.stride(0);
  p.ws_w = weight.stride(1);
  p.dim = dim;
  p.varlen = varlen;
  if (varlen) {
    p.tokens = x.size(1);
    p.xs_b = 0;
    p.xs_d = x.stride(0);
    p.xs_t = x.stride(1);
  } else {
    p.length = x.size(2);
    p.xs_b = x.stride(0);
    p.xs_d = x.stride(1);
    p.xs_t = x.stride(2);
  }
  p.pad_slot_id = pad_slot_id;
  p.silu = silu;
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(x);
  const kernels::Launch ctx(kOp, x);
  // 4. Dispatch on the layout of x: channel-first rows (stride 1 along time) take the warp
  // kernel; 16-byte aligned channel-last rows the CTA kernel; anything else the scalar kernel.
  KERNELS_DISPATCH_FLOAT(x.dtype(), kOp, T, [&] {
    constexpr int kN = kernels::kVectorBytes / static_cast<int>(sizeof(T));
    const int64_t esize = sizeof(T);
    const int64_t len_dim = varlen ? x.size(1) : x.size(2);
    const bool time_unit = p.xs_t == 1 || len_dim == 1;
    const bool chan_unit = p.xs_d == 1 || dim == 1;
    const bool chan_last = chan_unit && !(time_unit && dim == 1) && dim % kN == 0 &&
                           kernels::is_aligned(p.x) && (p.xs_t * esize) % 16 == 0 &&
                           (p.xs_b * esize) % 16 == 0;
    const bool chan_first = time_unit && (!chan_unit || dim == 1 || !chan_last) &&
                            kernels::is_aligned(p.x, sizeof(T));
    if (time_unit) p.xs_t = 1;  // the warp kernel addresses columns as xr + c
    if (chan_first) {
      const dim3 grid(kernels::ceil_div(dim, detail::kCfWarps), static_cast<unsigned>(seqs));
      // Rows of at most short_row_max_bytes (every sequence, as the rows of x are; negative:
      // none) take the 2-pack kernel: twice the resident warps, the whole row loaded at once.
      const bool short_rows = len_dim * esize <= short_row_max_bytes;
      auto go = [&](auto kernel) {
        kernel<<<grid, detail::kCfWarps * 32, 0, ctx.stream>>>(p);
      };
      auto by_len = [&](auto long_kernel, auto short_kernel) {
        short_rows ? go(short_kernel) : go(long_kernel);
      };
      constexpr int kU = detail::kCfU, kS = detail::kCfUShort;
      switch (width) {
        case 2: by_len(detail::fwd_cf_kernel<T, 2, kU>, detail::fwd_cf_kernel<T, 2, kS>); break;
        case 3: by_len(detail::fwd_cf_kernel<T, 3, kU>, detail::fwd_cf_kernel<T, 3, kS>); break;
        default: by_len(detail::fwd_cf_kernel<T, 4, kU>, detail::fwd_cf_kernel<T, 4, kS>); break;
      }
    } else if (chan_last) {
      const dim3 grid(kernels::ceil_div(dim / kN, detail::kClP), static_cast<unsigned>(seqs));
      switch (width) {
        case 2: detail::fwd_cl_kernel<T, 2><<<grid, detail::kClThreads, 0, ctx.stream>>>(p); break;
        case 3: detail::fwd_cl_kernel<T, 3><<<grid, detail::kClThreads, 0, ctx.stream>>>(p); break;
        default: detail::fwd_cl_kernel<T, 4><<<grid, detail::kClThreads, 0, ctx.stream>>>(p); break;
      }
    } else {
      detail::launch<T, 1, 1>(ctx, p, width, seqs);
    }
  });
  kernels::check_launch(kOp);
}
