// sampling.{min_p,top_k,top_p}_renorm_probs and sampling.top_k_mask_logits, CUDA.
//
// One CTA of 1024 threads per row, or for small batches a thread-block cluster of 2-8 CTAs per
// row, each over a slice, histograms and reductions combined through distributed shared memory
// (every CTA sums them in rank order, so all hold identical bits). The row (V up to 2^31) is
// streamed from global memory in 16-byte packs, four packs in flight per thread, several times:
//   min_p:  max (+ bad-row flag) | kept sum | write.
//   top_k:  3 radix passes of 11/11/10 bits over an order-preserving uint32 key of the fp32 value
//           (shared-memory count histograms; the first also flags bad rows; the last also yields
//           the kept sum exactly: elements above the final range + count * value per final bin)
//           | write. Sorting-free; ties kept together (keep iff v >= the k-th largest value).
//   top_p:  the same passes with mass histograms (fp32 shared atomics) and the rule "lowest
//           non-empty bin whose strictly-greater mass < top_p" | write.
// Semantics follow kernels_sampling.reference exactly: bad rows (NaN/inf/negative entry), bad
// per-row parameters and an overflowing kept sum give an all-NaN row; kept sum < 1e-8 gives 0.
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(3);

#include <kernels/checks.h>
#include <kernels/dtype.h>
#include <kernels/launch.cuh>
#include <kernels/pdl.cuh>
#include <kernels/reduce.cuh>
#include <kernels/tensor.h>
#include <kernels/vec.cuh>

#include <cooperative_groups.h>

#include <cstdint>

namespace sampling_filters_detail {

constexpr int kThreads = 1024;
constexpr int kBins = 2048;  // 11-bit digits
constexpr int kUnroll = 4;   // packs in flight per thread
constexpr float kMinSum = 1e-8f;

enum Mode : int { kMinP = 0, kTopK = 1, kTopP = 2, kMaskTopK = 3 };
enum ParamKind : int { kNone = 0, kInt32 = 1, kInt64 = 2, kFloat32 = 3 };

struct Params {
  const void* x;
  void* out;
  int64_t x_stride, out_stride, cols;
  const void* param;  // per-row k (int32/int64) or p (float32), or null
  int param_kind;
  double value;   // the scalar k or p when param is null
  int cluster;    // CTAs per row (a thread-block cluster when > 1), each over one slice
  int64_t slice;  // elements per CTA slice (a multiple of the pack width)
};

// Order-preserving key of a float: all NaNs are the largest (like torch.sort), -0 == +0.
__device__ __forceinline__ uint32_t key_of(float v) {
  if (v != v) return 0xFFFFFFFFu;
  v += 0.0f;  // -0 -> +0
  const uint32_t b = __float_as_uint(v);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float value_of(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k);
}
__device__ __forceinline__ bool bad_prob(float v) { return !(v >= 0.0f && v < INFINITY); }

// fn(value) over the row: each thread kUnroll packs in flight.
template <typename T, bool kVec, typename F>
__device__ __forceinline__ void for_row(const T* row, int64_t cols, F&& fn) {
  constexpr int N = kernels::pack_width<T, kVec>;
  using P = kernels::Pack<T, N>;
  const int64_t step = static_cast<int64_t>(blockDim.x) * N;
  for (int64_t base = static_cast<int64_t>(threadIdx.x) * N; base < cols; base += step * kUnroll) {
    P p[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (base + u * step < cols) p[u].load_cached(row + base + u * step);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (base + u * step < cols) {
        float f[N];
        p[u].unpack(f);
#pragma unroll
        for (int j = 0; j < N; ++j) fn(f[j]);
      }
    }
  }
}

// out = fn(value) over the row.
template <typename T, bool kVec, typename F>
__device__ __forceinline__ void map_row(const T* row, T* out, int64_t cols, F&& fn) {
  constexpr int N = kernels::pack_width<T, kVec>;
  using P = kernels::Pack<T, N>;
  const int64_t step = static_cast<int64_t>(blockDim.x) * N;
  for (int64_t base = static_cast<int64_t>(threadIdx.x) * N; base < cols; base += step * kUnroll) {
    P p[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (base + u * step < cols) p[u].load_stream(row + base + u * step);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (base + u * step < cols) {
        float f[N];
        p[u].unpack(f);
#pragma unroll
        for (int j = 0; j < N; ++j) f[j] = fn(f[j]);
        P q;
        q.pack(f);
        q.store_stream(out + base + u * step);
      }
    }
  }
}

// Exclusive prefix sum over the block (blockDim.x a multiple of 32, <= 1024), thread order.
template <typename V>
__device__ __forceinline__ V block_exclusive_scan(V x, V* warp_totals) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  V inc = x;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const V y = __shfl_up_sync(0xFFFFFFFFu, inc, o);
    if (lane >= o) inc += y;
  }
  V exc = __shfl_up_sync(0xFFFFFFFFu, inc, 1);
  if (lane == 0) exc = V(0);
  if (lane == 31) warp_totals[warp] = inc;
  __syncthreads();
  if (warp == 0) {
    const V w = lane < warps ? warp_totals[lane] : V(0);
    V wi = w;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const V y = __shfl_up_sync(0xFFFFFFFFu, wi, o);
      if (lane >= o) wi += y;
    }
    V we = __shfl_up_sync(0xFFFFFFFFu, wi, 1);
    if (lane == 0) we = V(0);
    if (lane < warps) warp_totals[lane] = we;
  }
  __syncthreads();
  const V r = warp_totals[warp] + exc;
  __syncthreads();
  return r;
}

struct Shared {
  int count[kBins];
  float mass[kBins];
  float scan_f[32];
  int scan_i[32];
  float red[32];
  int selected;
  int above_count;
  float above_mass;
  float xfer;  // this CTA's partial for a cluster reduction
};

// Reductions over the row: the block, then (cluster > 1) every CTA of the cluster, summed in rank
// order by every CTA so all of them hold the same bits.
__device__ __forceinline__ float cluster_combine(float v, Shared& s, int cluster, bool is_max) {
  if (cluster == 1) return v;
  namespace cg = cooperative_groups;
  cg::cluster_group cl = cg::this_cluster();
  if (threadIdx.x == 0) s.xfer = v;
  cl.sync();
  float t = is_max ? -INFINITY : 0.0f;
  for (int r = 0; r < cluster; ++r) {
    const float x = *cl.map_shared_rank(&s.xfer, r);
    t = is_max ? fmaxf(t, x) : t + x;
  }
  cl.sync();  // s.xfer is reused by the next reduction
  return t;
}
__device__ __forceinline__ float row_sum(float v, Shared& s, int cluster) {
  return cluster_combine(kernels::block_sum(v, s.red), s, cluster, false);
}
__device__ __forceinline__ float row_max(float v, Shared& s, int cluster) {
  return cluster_combine(kernels::block_max(v, s.red), s, cluster, true);
}
__device__ __forceinline__ bool row_or(bool b, Shared& s, int cluster) {
  return cluster_combine(__syncthreads_or(b) ? 1.0f : 0.0f, s, cluster, true) > 0.0f;
}

// Result of the radix threshold search over one row.
struct Threshold {
  float value;  // keep iff v >= value
  float kept_sum;
  bool bad;     // a probability row holding a NaN, inf or negative entry
};

// The k-th largest value (kMass = false, target = k, 1 <= k < cols) or the top-p threshold
// (kMass = true, target = p in (0, 1)): three passes of 11/11/10 bits over key_of(v).
template <typename T, bool kVec, bool kMass, bool kProbs>
__device__ Threshold radix_threshold(const T* row, int64_t cols, float target_p, int target_k,
                                     Shared& s, int cluster) {
  uint32_t prefix = 0, himask = 0;
  int above_k = 0;
  float above_m = 0.0f;
  bool bad = false;
  float kept_sum = 0.0f;
#pragma unroll 1
  for (int pass = 0; pass < 3; ++pass) {
    const int shift = pass == 0 ? 21 : (pass == 1 ? 10 : 0);
    const uint32_t digit_mask = pass == 2 ? 0x3FFu : 0x7FFu;
    for (int b = threadIdx.x; b < kBins; b += blockDim.x) {
      s.count[b] = 0;
      if (kMass) s.mass[b] = 0.0f;
    }
    __syncthreads();
    float above_local = 0.0f;  // last pass: sum of the values above the final key range
    const bool last = pass == 2;
    for_row<T, kVec>(row, cols, [&](float v) {
      if (kProbs && pass == 0) bad |= bad_prob(v);
      const uint32_t k = key_of(v);
      if (((k ^ prefix) & himask) == 0) {
        const int bin = static_cast<int>((k >> shift) & digit_mask);
        atomicAdd(&s.count[bin], 1);
        if (kMass) atomicAdd(&s.mass[bin], v);
      } else if (last && (k & himask) > prefix) {
        above_local += v;
      }
    });
    if (kProbs && pass == 0) bad = row_or(bad, s, cluster);
    if (!kProbs) bad = false;
    if (threadIdx.x == 0) s.selected = kBins;
    __syncthreads();
    // Bins in descending order: thread t owns bins hi = kBins-1-2t and lo = hi-1.
    const int hi = kBins - 1 - 2 * static_cast<int>(threadIdx.x), lo = hi - 1;
    const bool own = hi >= 1;
    int c_hi = own ? s.count[hi] : 0, c_lo = own ? s.count[lo] : 0;
    float m_hi = 0.0f, m_lo = 0.0f;
    if (kMass && own) {
      m_hi = s.mass[hi];
      m_lo = s.mass[lo];
    }
    if (cluster > 1) {  // the row's histogram: every CTA's, summed in rank order
      namespace cg = cooperative_groups;
      cg::cluster_group cl = cg::this_cluster();
      cl.sync();
      c_hi = c_lo = 0;
      m_hi = m_lo = 0.0f;
      for (int r = 0; r < cluster; ++r) {
        Shared* remote = cl.map_shared_rank(&s, r);
        if (own) {
          c_hi += remote->count[hi];
          c_lo += remote->count[lo];
          if (kMass) {
            m_hi += remote->mass[hi];
            m_lo += remote->mass[lo];
          }
        }
      }
      cl.sync();  // every CTA has read every histogram before any clears its own
    }
    int a_hi_k = 0, a_lo_k = 0;
    float a_hi_m = 0.0f, a_lo_m = 0.0f;
    bool cand_hi, cand_lo;
    if (kMass) {
      a_hi_m = above_m + block_exclusive_scan<float>(m_hi + m_lo, s.scan_f);
      a_lo_m = a_hi_m + m_hi;
      cand_hi = c_hi > 0 && a_hi_m < target_p;
      cand_lo = c_lo > 0 && a_lo_m < target_p;
    } else {
      a_hi_k = above_k + block_exclusive_scan<int>(c_hi + c_lo, s.scan_i);
      a_lo_k = a_hi_k + c_hi;
      cand_hi = c_hi > 0 && a_hi_k < target_k;
      cand_lo = c_lo > 0 && a_lo_k < target_k;
    }
    if (own && (cand_lo || cand_hi)) atomicMin(&s.selected, cand_lo ? lo : hi);
    __syncthreads();
    int sel = s.selected;
    if (sel == kBins) sel = 0;  // unreachable for a good row and a target in range
    if (own && (sel == hi || sel == lo)) {
      s.above_count = sel == hi ? a_hi_k : a_lo_k;
      s.above_mass = sel == hi ? a_hi_m : a_lo_m;
    }
    __syncthreads();
    if (last) {
      // Exact kept sum: values above the final range plus count * value of each kept bin
      // (the bins are the whole row's already: summed over the block only).
      float part = 0.0f;
      if (own) {
        if (hi >= sel && c_hi) part += static_cast<float>(c_hi) * value_of(prefix | hi);
        if (lo >= sel && c_lo) part += static_cast<float>(c_lo) * value_of(prefix | lo);
      }
      kept_sum = row_sum(above_local, s, cluster) + kernels::block_sum(part, s.red);
    }
    above_k = s.above_count;
    above_m = s.above_mass;
    prefix |= static_cast<uint32_t>(sel) << shift;
    himask |= digit_mask << shift;
    __syncthreads();
  }
  return Threshold{value_of(prefix), kept_sum, bad};
}

// This CTA's row and slice [start, start + len) of it (cluster > 1: rank = blockIdx.x % cluster).
__device__ __forceinline__ int64_t row_index(const Params& p) { return blockIdx.x / p.cluster; }
__device__ __forceinline__ int64_t slice_start(const Params& p) {
  return static_cast<int64_t>(blockIdx.x % p.cluster) * p.slice;
}
__device__ __forceinline__ int64_t slice_len(const Params& p) {
  const int64_t left = p.cols - slice_start(p);
  return left < 0 ? 0 : (left < p.slice ? left : p.slice);
}
template <typename T>
__device__ __forceinline__ const T* row_in(const Params& p) {
  return static_cast<const T*>(p.x) + row_index(p) * p.x_stride + slice_start(p);
}
template <typename T>
__device__ __forceinline__ T* row_out(const Params& p) {
  return static_cast<T*>(p.out) + row_index(p) * p.out_stride + slice_start(p);
}

__device__ __forceinline__ float float_param(const Params& p) {
  return p.param_kind == kFloat32 ? static_cast<const float*>(p.param)[row_index(p)]
                                  : static_cast<float>(p.value);
}
__device__ __forceinline__ int64_t int_param(const Params& p) {
  if (p.param_kind == kInt32) return static_cast<const int32_t*>(p.param)[row_index(p)];
  if (p.param_kind == kInt64) return static_cast<const int64_t*>(p.param)[row_index(p)];
  return static_cast<int64_t>(p.value);
}

// The renorm write: bad -> NaN; kept -> v / sum (0 when sum < 1e-8); dropped -> 0.
template <typename T, bool kVec>
__device__ __forceinline__ void write_renorm(const Params& p, float thr, float sum, bool bad) {
  bad = bad || !(sum < INFINITY);
  const bool tiny = sum < kMinSum;
  map_row<T, kVec>(row_in<T>(p), row_out<T>(p), slice_len(p), [&](float v) {
    if (bad) return NAN;
    return (v >= thr && !tiny) ? v / sum : 0.0f;
  });
}

// Sum of the values >= thr (and the bad flag) in one pass.
template <typename T, bool kVec>
__device__ __forceinline__ float kept_sum_pass(const Params& p, float thr, bool& bad, Shared& s) {
  float part = 0.0f;
  bool b = false;
  for_row<T, kVec>(row_in<T>(p), slice_len(p), [&](float v) {
    b |= bad_prob(v);
    if (v >= thr) part += v;
  });
  bad = row_or(b, s, p.cluster);
  return row_sum(part, s, p.cluster);
}

template <typename T, bool kVec>
__global__ void __launch_bounds__(kThreads) min_p_kernel(bool, Params p) {
  __shared__ Shared s;
  float mx = 0.0f;
  bool b = false;
  for_row<T, kVec>(row_in<T>(p), slice_len(p), [&](float v) {
    b |= bad_prob(v);
    mx = fmaxf(mx, v);
  });
  const bool bad = row_or(b, s, p.cluster);
  mx = row_max(mx, s, p.cluster);
  const float mp = float_param(p);
  const bool bad_param = !(mp >= 0.0f && mp <= 1.0f);
  const float thr = mp * mx;
  bool unused;
  const float sum = kept_sum_pass<T, kVec>(p, thr, unused, s);
  write_renorm<T, kVec>(p, thr, sum, bad || bad_param);
}

template <typename T, bool kVec>
__global__ void __launch_bounds__(kThreads) top_k_renorm_kernel(bool, Params p) {
  __shared__ Shared s;
  const int64_t k = int_param(p);
  if (k <= 0 || k >= p.cols) {
    bool bad;
    const float sum = kept_sum_pass<T, kVec>(p, -INFINITY, bad, s);
    write_renorm<T, kVec>(p, -INFINITY, sum, bad);
    return;
  }
  const Threshold t =
      radix_threshold<T, kVec, false, true>(row_in<T>(p), slice_len(p), 0.0f, static_cast<int>(k),
                                            s, p.cluster);
  write_renorm<T, kVec>(p, t.value, t.kept_sum, t.bad);
}

template <typename T, bool kVec>
__global__ void __launch_bounds__(kThreads) top_p_renorm_kernel(bool, Params p) {
  __shared__ Shared s;
  const float tp = float_param(p);
  if (tp != tp) {  // a NaN top_p: the row is invalid
    map_row<T, kVec>(row_in<T>(p), row_out<T>(p), slice_len(p), [](float) { return NAN; });
    return;
  }
  if (tp >= 1.0f || tp <= 0.0f) {
    // One pass for the bad-row flag and the maximum (as min_p), then the kept sum: tp is the
    // row's, so every CTA of the row's cluster takes the same branches.
    float mx = -INFINITY;
    bool b = false;
    for_row<T, kVec>(row_in<T>(p), slice_len(p), [&](float v) {
      b |= bad_prob(v);
      mx = fmaxf(mx, v);
    });
    const bool bad = row_or(b, s, p.cluster);
    mx = row_max(mx, s, p.cluster);
    const float thr = tp <= 0.0f ? mx : -INFINITY;  // the argmax set, or the whole row
    bool unused;
    const float sum = kept_sum_pass<T, kVec>(p, thr, unused, s);
    write_renorm<T, kVec>(p, thr, sum, bad);
    return;
  }
  const Threshold t =
      radix_threshold<T, kVec, true, true>(row_in<T>(p), slice_len(p), tp, 0, s, p.cluster);
  write_renorm<T, kVec>(p, t.value, t.kept_sum, t.bad);
}

template <typename T, bool kVec>
__global__ void __launch_bounds__(kThreads) top_k_mask_kernel(bool, Params p) {
  __shared__ Shared s;
  const int64_t k = int_param(p);
  float thr = -INFINITY;
  bool keep_all = k <= 0 || k >= p.cols;
  if (!keep_all) {
    thr = radix_threshold<T, kVec, false, false>(row_in<T>(p), slice_len(p), 0.0f,
                                                 static_cast<int>(k), s, p.cluster)
              .value;
  }
  map_row<T, kVec>(row_in<T>(p), row_out<T>(p), slice_len(p),
                   [&](float v) { return (keep_all || v >= thr) ? v : -INFINITY; });
}

using KernelFn = void (*)(bool, Params);

template <typename T, bool kVec>
KernelFn kernel_for(int mode) {
  switch (mode) {
    case kMinP: return min_p_kernel<T, kVec>;
    case kTopK: return top_k_renorm_kernel<T, kVec>;
    case kTopP: return top_p_renorm_kernel<T, kVec>;
    default: return top_k_mask_kernel<T, kVec>;
  }
}

// CTAs per row: a cluster of up to kMaxCluster when the batch alone leaves SMs idle (small B),
// with slices of at least kMinSlice elements. 1 disables the cluster path.
constexpr int kMaxCluster = 8;
constexpr int64_t kMinSlice = 4096;

inline int cluster_for(int device, int64_t rows, int64_t cols) {
  const int64_t sms = kernels::sm_count(device);
  int c = 1;
  while (c < kMaxCluster && rows * c * 2 <= sms && cols >= 2 * c * kMinSlice) c *= 2;
  return c;
}

template <typename T>
void launch(const kernels::Launch& ctx, int mode, int64_t rows, Params p) {
  constexpr int64_t N = kernels::kVectorBytes / sizeof(T);
  const bool vec = p.cols % N == 0 && p.x_stride % N == 0 && p.out_stride % N == 0 &&
                   kernels::is_aligned(p.x) && kernels::is_aligned(p.out);
  const KernelFn kernel = vec ? kernel_for<T, true>(mode) : kernel_for<T, false>(mode);
  p.cluster = cluster_for(ctx.device, rows, p.cols);
  const int64_t per = (p.cols + p.cluster - 1) / p.cluster;
  p.slice = (per + N - 1) / N * N;  // slices start on whole packs
  // One CTA (or one cluster of p.cluster CTAs) per row; gridDim.x takes up to 2^31 - 1.
  TVM_FFI_CHECK(rows * p.cluster < (int64_t{1} << 31), ValueError)
      << ctx.op << ": the CUDA kernel takes B < 2^31 rows, got " << rows;
  kernels::LaunchConfig config(dim3(static_cast<unsigned>(rows * p.cluster)), dim3(kThreads), 0,
                               ctx.stream, false, static_cast<unsigned>(p.cluster));
  kernels::check_launch(ctx.op, config.launch(kernel, false, p));
}

// out [B, V] contiguous rows like x (same dtype); x [B, V] with a contiguous last dim; param a
// per-row [B] tensor (int32/int64 for k, float32 for p) or None (then `value` for every row).
inline void run(const char* op, int mode, tvm::ffi::TensorView out, tvm::ffi::TensorView x,
                tvm::ffi::Optional<tvm::ffi::TensorView> param, double value) {
  const char* xname = mode == kMaskTopK ? "logits" : "probs";
  const char* pname = mode == kMinP ? "min_p" : (mode == kTopP ? "top_p" : "top_k");
  // 1. Validate.
  kernels::check_ndim(op, xname, x, 2);
  kernels::check_ndim(op, "out", out, 2);
  kernels::check_same_shape(op, "out", out, xname, x);
  kernels::check_same_dtype(op, "out", out, xname, x);
  kernels::check_last_dim_contiguous(op, xname, x);
  kernels::check_last_dim_contiguous(op, "out", out);
  kernels::check_device(op, xname, x, kDLCUDA);
  kernels::check_same_device(op, "out", out, xname, x);
  const int64_t rows = x.size(0), cols = x.size(1);
  TVM_FFI_CHECK(rows < (int64_t{1} << 31), ValueError)
      << op << ": the CUDA kernel takes B < 2^31 rows, got " << rows;
  Params p{};
  p.value = value;
  p.param_kind = kNone;
  p.cluster = 1;
  if (param.has_value()) {
    const tvm::ffi::TensorView t = param.value();
    kernels::check_ndim(op, pname, t, 1);
    TVM_FFI_CHECK(t.size(0) == rows, ValueError)
        << op << ": " << pname << " must have shape (" << rows << ",), got "
        << kernels::shape_string(t);
    kernels::check_contiguous(op, pname, t);
    kernels::check_same_device(op, pname, t, xname, x);
    if (mode == kMinP || mode == kTopP) {
      TVM_FFI_CHECK(kernels::is_dtype(t.dtype(), kDLFloat, 32), TypeError)
          << op << ": " << pname << " must be float32";
      p.param_kind = kFloat32;
    } else if (kernels::is_dtype(t.dtype(), kDLInt, 32)) {
      p.param_kind = kInt32;
    } else {
      TVM_FFI_CHECK(kernels::is_dtype(t.dtype(), kDLInt, 64), TypeError)
          << op << ": " << pname << " must be int32 or int64";
      p.param_kind = kInt64;
    }
    p.param = kernels::data<const void>(t);
  }
  if (rows == 0 || cols == 0) return;
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(x);
  const kernels::Launch ctx(op, x);
  // 4. Dispatch on dtype and launch.
  p.x = kernels::data<const void>(x);
  p.out = kernels::data<void>(out);
  p.x_stride = x.stride(0);
  p.out_stride = out.stride(0);
  p.cols = cols;
  KERNELS_DISPATCH_FLOAT(x.dtype(), op, T, [&] { launch<T>(ctx, mode, rows, p); });
}

}  // namespace sampling_filters_detail

inline void min_p_renorm_probs(tvm::ffi::TensorView out, tvm::ffi::TensorView probs,
                               tvm::ffi::Optional<tvm::ffi::TensorView> min_p_arr,
                               double min_p_val) {
  namespace d = sampling_filters_detail;
  d::run("sampling.min_p_renorm_probs", d::kMinP, out, probs, min_p_arr, min_p_val);
}

inline void top_k_renorm_probs(tvm::ffi::TensorView out, tvm::ffi::TensorView probs,
                               tvm::ffi::Optional<tvm::ffi::TensorView> top_k_arr,
                               int64_t top_k_val) {
  namespace d = sampling_filters_detail;
  d::run("sampling.top_k_renorm_probs", d::kTopK, out, probs, top_k_arr,
         static_cast<double>(top_k_val));
}

inline void top_p_renorm_probs(tvm::ffi::TensorView out, tvm::ffi::TensorView probs,
                               tvm::ffi::Optional<tvm::ffi::TensorView> top_p_arr,
                               double top_p_val) {
  namespace d = sampling_filters_detail;
  d::run("sampling.top_p_renorm_probs", d::kTopP, out, probs, top_p_arr, top_p_val);
}

inline void top_k_mask_logits(tvm::ffi::TensorView out, tvm::ffi::TensorView logits,
                              tvm::ffi::Optional<tvm::ffi::TensorView> top_k_arr,
                              int64_t top_k_val) {
  namespace d = sampling_filters_detail;
  d::run("sampling.top_k_mask_logits", d::kMaskTopK, out, logits, top_k_arr,
         static_cast<double>(top_k_val));
}
