// lplb.lplb_dispatch, CUDA: two launches, no host synchronisation.
//
// 1. shares_kernel, one CTA of 256 threads: checks the layout (phy2log[p] in [0, L); log2phy the
//    exact inverse of phy2log, every slot once; every expert has a slot), counts the tokens per
//    logical expert when no counts are given (shared-memory integer atomics over topk_ids),
//    builds the reference's LP (kernels_lplb.reference.replica_shares: a variable per copy of a
//    replicated expert, numbered in log2phy row order; GPU g owns slots [g Pe/G, (g+1) Pe/G);
//    single-copy loads found through phy2log) in shared memory and solves it with the
//    interior-point method of csrc/ipm.cuh (fp64, deterministic: no float atomics, fixed
//    reduction trees, so every rank computes the same shares), then writes log2phy_prob. The LP
//    is at most (Pe - L + G) x (2 (Pe - L) + G + 2) for a valid layout: the shared memory is sized
//    from the shapes. A layout that fails the checks (reachable only with validate=False) makes
//    every log2phy_prob entry NaN and every phys_id -1: loud, never an out-of-bounds access.
// 2. draw_kernel, a thread per slot (t, j): l = topk_ids[t, j], the fp32 prefix sums of
//    log2phy_prob[l] left to right, u = U(seed, 0, t, j) (the project RNG, bit for bit
//    kernels_jit.rng.uniform) and the reference's inverse-CDF pick (reference.dispatch_draw).
//
// Given shares (a precomputed log2phy_prob), only draw_kernel runs, on them; its first L Cmax
// threads also copy them to log2phy_prob (no second launch for the copy). The layout is then not
// checked on the device (that check lives in shares_kernel): the draw stays in bounds whatever
// log2phy and the shares hold, and Python's validate=True checks both on the host.
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(4);

#include "ipm.cuh"

#include <kernels/checks.h>
#include <kernels/dtype.h>
#include <kernels/launch.cuh>
#include <kernels/rng.cuh>
#include <kernels/tensor.h>

#include <algorithm>

namespace lplb_dispatch_detail {

namespace ipm = lplb_ipm;
constexpr int kDrawThreads = 256;

// The project RNG (kernels/rng.cuh).
using kernels::rng::uniform;

__device__ __forceinline__ int64_t load_index(const void* p, bool wide, int64_t i) {
  return wide ? static_cast<const int64_t*>(p)[i] : static_cast<const int32_t*>(p)[i];
}

enum CountsKind { kNoCounts = 0, kInt32 = 1, kInt64 = 2, kFloat32 = 3 };

struct SharesParams {
  const void* topk;
  bool topk64;
  int64_t slots;  // T * k
  const void* phy2log;
  bool phy2log64;
  const void* log2phy;
  bool log2phy64;
  const void* counts;
  int counts_kind;
  float* prob;
  int experts, max_copies, physical, gpus, m_cap, n_cap;
};

// Shared-memory layout of shares_kernel (byte offsets), host and device alike.
struct SharesLayout {
  int64_t single, a, bf, t, share, copies, cnt, row_of, var_off, seen, varslot, misc, bytes;
  __host__ __device__ static SharesLayout make(int experts, int physical, int gpus, int m_cap,
                                               int n_cap) {
    SharesLayout s{};
    int64_t at = ipm::work_bytes(m_cap, n_cap);
    // Each region's offset, then the running end moves past its `bytes`.
    auto take = [&at](int64_t bytes) {
      const int64_t offset = at;
      at += bytes;
      return offset;
    };
    const int64_t e4 = static_cast<int64_t>(experts) * 4, p4 = static_cast<int64_t>(physical) * 4;
    s.single = take(static_cast<int64_t>(gpus) * 8);
    s.a = take(static_cast<int64_t>(m_cap) * ipm::odd_stride(n_cap) * 4);
    s.bf = take(static_cast<int64_t>(m_cap) * 4);
    s.t = take(e4);
    s.share = take(p4);
    s.copies = take(e4);
    s.cnt = take(e4);
    s.row_of = take(e4);
    s.var_off = take(e4);
    s.seen = take(p4);
    s.varslot = take(static_cast<int64_t>(n_cap) * 4);
    s.misc = take(4 * 4);
    s.bytes = at;
    return s;
  }
};

__global__ void __launch_bounds__(ipm::kThreads, 1) shares_kernel(SharesParams p) {
  extern __shared__ double smem[];
  char* base = reinterpret_cast<char*>(smem);
  const SharesLayout lay = SharesLayout::make(p.experts, p.physical, p.gpus, p.m_cap, p.n_cap);
  double* single = reinterpret_cast<double*>(base + lay.single);
  float* a = reinterpret_cast<float*>(base + lay.a);
  float* bf = reinterpret_cast<float*>(base + lay.bf);
  float* t = reinterpret_cast<float*>(base + lay.t);
  float* share = reinterpret_cast<float*>(base + lay.share);
  int* copies = reinterpret_cast<int*>(base + lay.copies);
  int* cnt = reinterpret_cast<int*>(base + lay.cnt);
  int* row_of = reinterpret_cast<int*>(base + lay.row_of);
  int* var_off = reinterpret_cast<int*>(base + lay.var_off);
  int* seen = reinterpret_cast<int*>(base + lay.seen);
  int* varslot = reinterpret_cast<int*>(base + lay.varslot);
  int* misc = reinterpret_cast<int*>(base + lay.misc);  // bad layout, R, nvar
  const int L = p.experts, C = p.max_copies, Pe = p.physical, G = p.gpus, tid = threadIdx.x;
  const int per_gpu = Pe / G;
  const int lane = tid % 32, warp = tid / 32;

  // 1. The layout checks and the token counts.
  for (int l = tid; l < L; l += ipm::kThreads) copies[l] = cnt[l] = 0;
  for (int q = tid; q < Pe; q += ipm::kThreads) seen[q] = 0;
  if (tid == 0) misc[0] = 0;
  __syncthreads();
  bool bad = false;
  for (int q = tid; q < Pe; q += ipm::kThreads) {
    const int64_t l = load_index(p.phy2log, p.phy2log64, q);
    if (l < 0 || l >= L)
      bad = true;
    else
      atomicAdd(&copies[l], 1);
  }
  for (int64_t e = tid; e < static_cast<int64_t>(L) * C; e += ipm::kThreads) {
    const int64_t q = load_index(p.log2phy, p.log2phy64, e);
    if (q == -1) continue;
    if (q < -1 || q >= Pe) {
      bad = true;
      continue;
    }
    atomicAdd(&seen[q], 1);
    if (load_index(p.phy2log, p.phy2log64, q) != e / C) bad = true;
  }
  if (p.counts_kind == kNoCounts) {
    for (int64_t e = tid; e < p.slots; e += ipm::kThreads) {
      const int64_t l = load_index(p.topk, p.topk64, e);
      if (l >= 0 && l < L) atomicAdd(&cnt[l], 1);
    }
  }
  __syncthreads();
  for (int q = tid; q < Pe; q += ipm::kThreads) bad |= seen[q] != 1;
  for (int l = tid; l < L; l += ipm::kThreads) bad |= copies[l] < 1;
  if (bad) misc[0] = 1;
  __syncthreads();
  if (misc[0]) {
    for (int64_t e = tid; e < static_cast<int64_t>(L) * C; e += ipm::kThreads) p.prob[e] = NAN;
    return;
  }

  // 2. Loads t_l = counts_l / sum(counts) (fp64, a fixed reduction tree), rounded to fp32.
  auto count_of = [&](int l) -> double {
    switch (p.counts_kind) {
      case kInt32: return static_cast<const int32_t*>(p.counts)[l];
      case kInt64: return static_cast<double>(static_cast<const int64_t*>(p.counts)[l]);
      case kFloat32: return static_cast<const float*>(p.counts)[l];
      default: return cnt[l];
    }
  };
  ipm::Work w;
  w.carve(smem, p.m_cap, p.n_cap);
  double tot[1] = {0.0};
  for (int l = tid; l < L; l += ipm::kThreads) tot[0] += count_of(l);
  ipm::block_reduce<1, 1>(tot, w.red);
  const double total = tot[0];
  for (int l = tid; l < L; l += ipm::kThreads)
    t[l] = total > 0 ? static_cast<float>(count_of(l) / total) : 0.0f;

  // 3. Replicated experts in increasing l: their LP rows and first variables (warp 0 scans).
  if (warp == 0) {
    int run_r = 0, run_v = 0;
    for (int base_l = 0; base_l < L; base_l += 32) {
      const int l = base_l + lane;
      const bool rep = l < L && copies[l] >= 2;
      int sr = rep ? 1 : 0, sv = rep ? copies[l] : 0;
      for (int o = 1; o < 32; o <<= 1) {
        const int ur = __shfl_up_sync(0xffffffffu, sr, o), uv = __shfl_up_sync(0xffffffffu, sv, o);
        if (lane >= o) {
          sr += ur;
          sv += uv;
        }
      }
      if (l < L) {
        row_of[l] = rep ? run_r + sr - 1 : -1;
        var_off[l] = run_v + sv - (rep ? copies[l] : 0);
      }
      run_r += __shfl_sync(0xffffffffu, sr, 31);
      run_v += __shfl_sync(0xffffffffu, sv, 31);
    }
    if (lane == 0) {
      misc[1] = run_r;
      misc[2] = run_v;
    }
  }
  __syncthreads();  // t, row_of, var_off, misc

  // 4. Single-copy slots carry their expert's load; per-GPU sums of them (a warp per GPU).
  for (int q = tid; q < Pe; q += ipm::kThreads) {
    const int l = static_cast<int>(load_index(p.phy2log, p.phy2log64, q));
    share[q] = copies[l] == 1 ? t[l] : 0.0f;
  }
  for (int g = warp; g < G; g += ipm::kWarps) {
    double acc = 0.0;
    for (int q = g * per_gpu + lane; q < (g + 1) * per_gpu; q += 32) {
      const int l = static_cast<int>(load_index(p.phy2log, p.phy2log64, q));
      if (copies[l] == 1) acc += static_cast<double>(t[l]);
    }
    acc = ipm::warp_sum(acc);
    if (lane == 0) single[g] = acc;
  }
  __syncthreads();

  // 5. The LP (reference.replica_shares) and its solve.
  const int R = misc[1], nvar = misc[2];
  int status = ipm::kConverged;
  if (R > 0 && total > 0) {
    const int m = R + G, n = nvar + G + 2;
    const int64_t lda = ipm::odd_stride(n);
    if (m > p.m_cap || n > p.n_cap) {
      status = ipm::kInfeasible;  // unreachable for a valid layout
    } else {
      w.carve(smem, m, n);
      for (int64_t e = tid; e < m * lda; e += ipm::kThreads) a[e] = 0.0f;
      __syncthreads();
      for (int64_t e = tid; e < static_cast<int64_t>(L) * C; e += ipm::kThreads) {
        const int l = static_cast<int>(e / C), col = static_cast<int>(e % C);
        const int64_t q = load_index(p.log2phy, p.log2phy64, e);
        if (row_of[l] < 0 || q < 0) continue;
        int rank = 0;  // valid entries before col in row l
        for (int k = 0; k < col; ++k)
          rank += load_index(p.log2phy, p.log2phy64, static_cast<int64_t>(l) * C + k) >= 0;
        const int v = var_off[l] + rank;
        a[row_of[l] * lda + v] = 1.0f;
        a[(R + q / per_gpu) * lda + v] = 1.0f;
        varslot[v] = static_cast<int>(q);
      }
      for (int g = tid; g < G; g += ipm::kThreads) {
        a[(R + g) * lda + nvar + g] = 1.0f;
        a[(R + g) * lda + nvar + G] = -1.0f;
        bf[R + g] = -static_cast<float>(single[g]);
      }
      for (int l = tid; l < L; l += ipm::kThreads)
        if (row_of[l] >= 0) bf[row_of[l]] = t[l];
      __syncthreads();
      for (int i = tid; i < m; i += ipm::kThreads) {  // z column b - A 1, in fp32 like torch
        float sum = 0.0f;
        for (int j = 0; j < n - 1; ++j) sum += a[i * lda + j];
        a[i * lda + n - 1] = bf[i] - sum;
        w.b[i] = static_cast<double>(bf[i]);
        w.y[i] = 0.0;
      }
      for (int j = tid; j < n; j += ipm::kThreads)
        w.c[j] = j == nvar + G ? 1.0 : (j == n - 1 ? 1000.0 : 0.0);
      __syncthreads();
      status = ipm::solve(static_cast<const float*>(a), lda, w, 50, 1e-6);
      if (status == ipm::kConverged)
        for (int v = tid; v < nvar; v += ipm::kThreads)
          share[varslot[v]] = fmaxf(static_cast<float>(w.x[v]), 0.0f);
    }
  }
  if (status != ipm::kConverged) {  // equal split over the copies
    for (int q = tid; q < Pe; q += ipm::kThreads) {
      const int l = static_cast<int>(load_index(p.phy2log, p.phy2log64, q));
      share[q] = t[l] / static_cast<float>(copies[l]);
    }
  }
  __syncthreads();

  // 6. log2phy_prob.
  for (int64_t e = tid; e < static_cast<int64_t>(L) * C; e += ipm::kThreads) {
    const int64_t q = load_index(p.log2phy, p.log2phy64, e);
    p.prob[e] = q >= 0 ? share[q] : 0.0f;
  }
}

struct DrawParams {
  const void* topk;
  bool topk64;
  const void* log2phy;
  bool log2phy64;
  const float* prob;
  float* prob_copy;  // given shares: log2phy_prob, written with prob's L Cmax entries; else null
  int32_t* out;
  int64_t slots;
  int k, experts, max_copies;
  int64_t seed;
};

__global__ void __launch_bounds__(kDrawThreads) draw_kernel(DrawParams p) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kDrawThreads + threadIdx.x;
  if (p.prob_copy != nullptr && i < static_cast<int64_t>(p.experts) * p.max_copies)
    p.prob_copy[i] = p.prob[i];
  if (i >= p.slots) return;
  const int64_t l = load_index(p.topk, p.topk64, i);
  int32_t result = -1;
  if (l >= 0 && l < p.experts) {
    const int C = p.max_copies;
    const float* row = p.prob + l * C;
    float total = 0.0f;
    int last_positive = 0;
    for (int c = 0; c < C; ++c) {
      const float wc = row[c];
      total += wc;
      if (wc > 0.0f) last_positive = c;
    }
    if (!isnan(total)) {  // NaN: the shares kernel rejected the layout (or bad given shares)
      int pick = 0;
      if (total > 0.0f) {
        const int64_t tok = i / p.k, j = i - tok * p.k;
        const float target = uniform(p.seed, 0, tok, j) * total;
        float acc = 0.0f;
        for (int c = 0; c < C; ++c) {
          acc += row[c];
          pick += acc <= target;
        }
        if (pick >= C) pick = last_positive;
      }
      result = static_cast<int32_t>(load_index(p.log2phy, p.log2phy64, l * C + pick));
    }
  }
  p.out[i] = result;
}

inline bool index_dtype(const char* op, const char* name, const tvm::ffi::TensorView& t) {
  if (kernels::is_dtype(t.dtype(), kDLInt, 64)) return true;
  TVM_FFI_CHECK(kernels::is_dtype(t.dtype(), kDLInt, 32), TypeError)
      << op << ": " << name << " must be int32 or int64";
  return false;
}

}  // namespace lplb_dispatch_detail

// phys_ids [T, k] int32, log2phy_prob [L, Cmax] float32 (outputs); topk_ids [T, k], phy2log
// [Pe], log2phy [L, Cmax] (int32/int64 each); counts [L] int32/int64/float32 or None; shares
// [L, Cmax] float32 or None (then no LP: the draw on them, copied to log2phy_prob; exclusive
// with counts); all contiguous on one CUDA device.
inline void lplb_dispatch(tvm::ffi::TensorView phys_ids, tvm::ffi::TensorView prob,
                          tvm::ffi::TensorView topk, tvm::ffi::TensorView phy2log,
                          tvm::ffi::TensorView log2phy, int64_t num_gpus,
                          tvm::ffi::Optional<tvm::ffi::TensorView> counts,
                          tvm::ffi::Optional<tvm::ffi::TensorView> shares, int64_t seed) {
  namespace d = lplb_dispatch_detail;
  namespace ipm = lplb_ipm;
  constexpr const char* kOp = "lplb.lplb_dispatch";
  // 1. Validate.
  kernels::check_ndim(kOp, "topk_ids", topk, 2);
  kernels::check_ndim(kOp, "phys_ids", phys_ids, 2);
  kernels::check_ndim(kOp, "phy2log", phy2log, 1);
  kernels::check_ndim(kOp, "log2phy", log2phy, 2);
  kernels::check_ndim(kOp, "log2phy_prob", prob, 2);
  kernels::check_same_shape(kOp, "phys_ids", phys_ids, "topk_ids", topk);
  kernels::check_same_shape(kOp, "log2phy_prob", prob, "log2phy", log2phy);
  TVM_FFI_CHECK(kernels::is_dtype(phys_ids.dtype(), kDLInt, 32), TypeError)
      << kOp << ": phys_ids must be int32";
  TVM_FFI_CHECK(kernels::is_dtype(prob.dtype(), kDLFloat, 32), TypeError)
      << kOp << ": log2phy_prob must be float32";
  const int64_t experts = log2phy.size(0), max_copies = log2phy.size(1);
  const int64_t physical = phy2log.size(0);
  d::SharesParams sp{};
  sp.topk64 = d::index_dtype(kOp, "topk_ids", topk);
  sp.phy2log64 = d::index_dtype(kOp, "phy2log", phy2log);
  sp.log2phy64 = d::index_dtype(kOp, "log2phy", log2phy);
  const tvm::ffi::TensorView* all[] = {&phys_ids, &prob, &topk, &phy2log, &log2phy};
  const char* names[] = {"phys_ids", "log2phy_prob", "topk_ids", "phy2log", "log2phy"};
  for (int i = 0; i < 5; ++i) {
    kernels::check_contiguous(kOp, names[i], *all[i]);
    kernels::check_device(kOp, names[i], *all[i], kDLCUDA);
    kernels::check_same_device(kOp, names[i], *all[i], "topk_ids", topk);
  }
  sp.counts_kind = d::kNoCounts;
  if (counts.has_value()) {
    const tvm::ffi::TensorView t = counts.value();
    kernels::check_ndim(kOp, "counts", t, 1);
    kernels::check_contiguous(kOp, "counts", t);
    kernels::check_same_device(kOp, "counts", t, "topk_ids", topk);
    TVM_FFI_CHECK(t.size(0) == experts, ValueError)
        << kOp << ": counts must have L = " << experts << " entries, got " << t.size(0);
    if (kernels::is_dtype(t.dtype(), kDLInt, 32))
      sp.counts_kind = d::kInt32;
    else if (kernels::is_dtype(t.dtype(), kDLInt, 64))
      sp.counts_kind = d::kInt64;
    else if (kernels::is_dtype(t.dtype(), kDLFloat, 32))
      sp.counts_kind = d::kFloat32;
    else
      TVM_FFI_THROW(TypeError) << kOp << ": counts must be int32, int64 or float32";
    sp.counts = kernels::data<const void>(t);
  }
  const float* given = nullptr;
  if (shares.has_value()) {
    const tvm::ffi::TensorView t = shares.value();
    TVM_FFI_CHECK(!counts.has_value(), ValueError)
        << kOp << ": counts and shares are exclusive: counts only feed the LP, which given shares "
        << "replace";
    kernels::check_ndim(kOp, "shares", t, 2);
    kernels::check_same_shape(kOp, "shares", t, "log2phy", log2phy);
    TVM_FFI_CHECK(kernels::is_dtype(t.dtype(), kDLFloat, 32), TypeError)
        << kOp << ": shares must be float32";
    kernels::check_contiguous(kOp, "shares", t);
    kernels::check_same_device(kOp, "shares", t, "topk_ids", topk);
    given = kernels::data<const float>(t);
  }
  TVM_FFI_CHECK(num_gpus >= 1 && physical % num_gpus == 0, ValueError)
      << kOp << ": num_gpus must be >= 1 and divide Pe = " << physical << ", got " << num_gpus;
  TVM_FFI_CHECK(max_copies >= 1, ValueError)
      << kOp << ": log2phy must have Cmax >= 1 columns, got shape "
      << kernels::shape_string(log2phy);
  TVM_FFI_CHECK(experts < (int64_t{1} << 20) && physical < (int64_t{1} << 20) &&
                    max_copies < (int64_t{1} << 20) && experts * max_copies < (int64_t{1} << 31) &&
                    topk.numel() < (int64_t{1} << 31),
                ValueError)
      << kOp << ": the CUDA kernels take L, Pe, Cmax < 2^20 and T k < 2^31";
  if (experts == 0) return;
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(topk);
  const kernels::Launch ctx(kOp, topk);
  d::DrawParams dp{};
  dp.topk = kernels::data<const void>(topk);
  dp.topk64 = sp.topk64;
  dp.log2phy = kernels::data<const void>(log2phy);
  dp.log2phy64 = sp.log2phy64;
  dp.prob = given != nullptr ? given : kernels::data<float>(prob);
  dp.prob_copy = given != nullptr ? kernels::data<float>(prob) : nullptr;
  dp.out = kernels::data<int32_t>(phys_ids);
  dp.slots = topk.numel();
  dp.k = static_cast<int>(topk.size(1));
  dp.experts = static_cast<int>(experts);
  dp.max_copies = static_cast<int>(max_copies);
  dp.seed = seed;
  if (given != nullptr) {  // 4. Launch the draw alone (a thread per slot and per share copied).
    const int64_t threads = std::max(dp.slots, experts * max_copies);
    d::draw_kernel<<<kernels::ceil_div(threads, d::kDrawThreads), d::kDrawThreads, 0,
                     ctx.stream>>>(dp);
    kernels::check_launch(kOp, cudaGetLastError());
    return;
  }
  const int extra = static_cast<int>(physical > experts ? physical - experts : 0);
  sp.m_cap = extra + static_cast<int>(num_gpus);
  sp.n_cap = 2 * extra + static_cast<int>(num_gpus) + 2;
  const d::SharesLayout lay =
      d::SharesLayout::make(static_cast<int>(experts), static_cast<int>(physical),
                            static_cast<int>(num_gpus), sp.m_cap, sp.n_cap);
  int limit = 0;
  cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, ctx.device);
  TVM_FFI_CHECK(lay.bytes <= limit, ValueError)
      << kOp << ": L = " << experts << ", Pe = " << physical << ", G = " << num_gpus
      << " needs " << lay.bytes << " bytes of shared memory for the LP; this device allows "
      << limit << " (use backend='torch')";
  sp.topk = kernels::data<const void>(topk);
  sp.slots = topk.numel();
  sp.phy2log = kernels::data<const void>(phy2log);
  sp.log2phy = kernels::data<const void>(log2phy);
  sp.prob = kernels::data<float>(prob);
  sp.experts = static_cast<int>(experts);
  sp.max_copies = static_cast<int>(max_copies);
  sp.physical = static_cast<int>(physical);
  sp.gpus = static_cast<int>(num_gpus);
  // 4. Launch: the shares (one CTA), then the draw (a thread per slot).
  kernels::allow_dynamic_smem<d::shares_kernel>(kOp, ctx.device, lay.bytes);
  d::shares_kernel<<<1, ipm::kThreads, static_cast<size_t>(lay.bytes), ctx.stream>>>(sp);
  kernels::check_launch(kOp, cudaGetLastError());
  if (sp.slots == 0) return;
  d::draw_kernel<<<kernels::ceil_div(dp.slots, d::kDrawThreads), d::kDrawThreads, 0,
                   ctx.stream>>>(dp);
  kernels::check_launch(kOp, cudaGetLastError());
}
