// sampling.sampling_from_probs, CUDA: one seeded inverse-CDF draw per output row.
//
// One CTA of 1024 threads per output row (the source row indices[i] or i). Pass 1 streams the row
// (16 elements per thread in flight, 16-byte packs) for its fp32 total, the bad-row flag
// (NaN/inf/negative entry) and the last index with a positive weight. Pass 2 walks the row in
// tiles of 16 consecutive elements per thread (16384 per CTA step) in vocabulary order: a block
// exclusive scan of the tile sums gives each thread its running prefix, the thread whose running
// sum first exceeds u * total (on a positive weight) names the sample, and the walk stops there.
// u = U(seed, offset, i, 0) is the project RNG (kernels_jit.rng.uniform) bit for bit. The prefix
// sums are taken in a different order than torch.cumsum, so a sample may differ from the
// reference's only where u * total lies within rounding of a CDF boundary.
// Invalid rows (bad entry, total not in (0, inf), out-of-range index) give sample 0, valid false.
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(2);

#include "filters.cuh"

#include <kernels/rng.cuh>

#include <climits>
#include <string>

namespace sampling_draw_detail {

namespace f = sampling_filters_detail;
constexpr int kThreads = 1024;
constexpr int kTile = 16;  // consecutive elements per thread in one pass-2 step

// The project RNG (kernels/rng.cuh).
using kernels::rng::uniform;

struct Params {
  const void* x;
  int64_t x_stride, rows, cols;
  const void* indices;  // int32/int64 [out_rows] or null
  bool indices64;
  void* samples;  // int32 or int64 [out_rows]
  bool samples64;
  bool* valid;
  const int64_t* seed;
  const int64_t* offset;
  bool seed_per_row, offset_per_row;
};

// E consecutive elements starting at `start` (zeros past cols) as fp32.
template <typename T, bool kVec, int E>
__device__ __forceinline__ void load_tile(const T* row, int64_t start, int64_t cols, float* w) {
  if constexpr (kVec) {
    constexpr int N = kernels::pack_width<T, true>;
    static_assert(E % N == 0, "tile must hold whole packs");
    using P = kernels::Pack<T, N>;
    P p[E / N];
#pragma unroll
    for (int q = 0; q < E / N; ++q)
      if (start + q * N < cols) p[q].load_cached(row + start + q * N);
#pragma unroll
    for (int q = 0; q < E / N; ++q) {
      float v[N];
      if (start + q * N < cols) {
        p[q].unpack(v);
      } else {
#pragma unroll
        for (int j = 0; j < N; ++j) v[j] = 0.0f;
      }
#pragma unroll
      for (int j = 0; j < N; ++j) w[q * N + j] = v[j];
    }
  } else {
#pragma unroll
    for (int j = 0; j < E; ++j)
      w[j] = start + j < cols ? kernels::to_float(row[start + j]) : 0.0f;
  }
}

struct Shared {
  float red[32];
  float scan[32];
  int last_pos;
  int found;
  float step_total;
};

// Output row i: the source row, or -1 when indices[i] is out of range.
__device__ __forceinline__ int64_t source_row(const Params& p, int64_t i) {
  int64_t src = i;
  if (p.indices != nullptr)
    src = p.indices64 ? static_cast<const int64_t*>(p.indices)[i]
                      : static_cast<int64_t>(static_cast<const int32_t*>(p.indices)[i]);
  return (src < 0 || src >= p.rows) ? -1 : src;
}

__device__ __forceinline__ void write_result(const Params& p, int64_t i, int64_t index, bool ok) {
  if (threadIdx.x != 0) return;
  if (p.samples64)
    static_cast<int64_t*>(p.samples)[i] = index;
  else
    static_cast<int32_t*>(p.samples)[i] = static_cast<int32_t>(index);
  p.valid[i] = ok;
}

// The draw over weights w = (v >= thr ? v : 0) of one row (thr = -inf: the whole row). `invalid`
// (block-uniform) forces sample 0 / valid false; bad entries are judged over the whole row.
template <typename T, bool kVec>
__device__ void draw_row(const Params& p, int64_t i, const T* row, float thr, bool invalid,
                         Shared& s) {
  const int64_t cols = p.cols;
  // Pass 1: kept total, bad flag, last kept positive index.
  if (threadIdx.x == 0) s.last_pos = -1;
  float part = 0.0f;
  bool bad = false;
  int last = -1;
  constexpr int E1 = 16;
  for (int64_t base = static_cast<int64_t>(threadIdx.x) * E1; base < cols;
       base += static_cast<int64_t>(kThreads) * E1) {
    float w[E1];
    load_tile<T, kVec, E1>(row, base, cols, w);
#pragma unroll
    for (int j = 0; j < E1; ++j) {
      bad |= f::bad_prob(w[j]);  // padding is 0: never bad
      const float x = w[j] >= thr ? w[j] : 0.0f;
      part += x;
      if (x > 0.0f) last = static_cast<int>(base + j);
    }
  }
  __syncthreads();
  if (last >= 0) atomicMax(&s.last_pos, last);
  bad = __syncthreads_or(bad);
  const float total = kernels::block_sum(part, s.red);
  if (invalid || bad || !(total > 0.0f && total < INFINITY)) {
    write_result(p, i, 0, false);
    return;
  }
  const int last_pos = s.last_pos;
  const int64_t seed = p.seed[p.seed_per_row ? i : 0];
  const int64_t offset = p.offset[p.offset_per_row ? i : 0];
  const float target = uniform(seed, offset, i, 0) * total;

  // Pass 2: tiles in vocabulary order until the running sum exceeds target.
  if (threadIdx.x == 0) s.found = INT_MAX;
  float carry = 0.0f;
  for (int64_t step = 0; step < cols; step += static_cast<int64_t>(kThreads) * kTile) {
    const int64_t start = step + static_cast<int64_t>(threadIdx.x) * kTile;
    float w[kTile];
    load_tile<T, kVec, kTile>(row, start, cols, w);
    float local = 0.0f;
#pragma unroll
    for (int j = 0; j < kTile; ++j) {
      w[j] = w[j] >= thr ? w[j] : 0.0f;
      local += w[j];
    }
    // Ends with __syncthreads: s.found (set last step) is stable here.
    const float excl = f::block_exclusive_scan<float>(local, s.scan);
    float c = carry + excl;
    int hit = INT_MAX;
#pragma unroll
    for (int j = 0; j < kTile; ++j) {
      c += w[j];
      if (hit == INT_MAX && w[j] > 0.0f && c > target) hit = static_cast<int>(start + j);
    }
    if (hit != INT_MAX) atomicMin(&s.found, hit);
    if (threadIdx.x == kThreads - 1) s.step_total = excl + local;
    __syncthreads();
    const int found = s.found;
    carry += s.step_total;
    __syncthreads();  // s.step_total is rewritten next step
    if (found != INT_MAX) {
      write_result(p, i, found, true);
      return;
    }
  }
  // u * total rounded up to (or past) our last prefix: the last token with weight.
  write_result(p, i, last_pos, true);
}

template <typename T, bool kVec>
__global__ void __launch_bounds__(kThreads) draw_kernel(Params p) {
  __shared__ Shared s;
  const int64_t i = blockIdx.x;
  const int64_t src = source_row(p, i);
  if (src < 0) {  // block-uniform: never read outside probs
    write_result(p, i, 0, false);
    return;
  }
  draw_row<T, kVec>(p, i, static_cast<const T*>(p.x) + src * p.x_stride, -INFINITY, false, s);
}

// Per-source-row filter parameters of top_k_top_p_sampling_from_probs.
struct FilterParams {
  const void* k_arr;  // int32/int64 [B] or null
  bool k64;
  int64_t k_val;
  const float* p_arr;  // float32 [B] or null
  float p_val;
  bool joint;  // "joint": both rules on the original row; else top-p on the top-k renormalised row
};

// Sum and maximum of a row (block-wide).
template <typename T, bool kVec>
__device__ __forceinline__ void sum_max(const T* row, int64_t cols, float thr, float& sum,
                                        float& mx, f::Shared& fs) {
  float part = 0.0f, m = -INFINITY;
  f::for_row<T, kVec>(row, cols, [&](float v) {
    if (v >= thr) part += v;
    m = fmaxf(m, v);
  });
  sum = kernels::block_sum(part, fs.red);
  mx = kernels::block_max(m, fs.red);
}

template <typename T, bool kVec>
__global__ void __launch_bounds__(kThreads) top_k_top_p_kernel(Params p, FilterParams fp) {
  __shared__ Shared s;
  __shared__ f::Shared fs;
  const int64_t i = blockIdx.x;
  const int64_t src = source_row(p, i);
  if (src < 0) {
    write_result(p, i, 0, false);
    return;
  }
  const T* row = static_cast<const T*>(p.x) + src * p.x_stride;
  const int64_t cols = p.cols;
  int64_t k = fp.k_val;
  if (fp.k_arr != nullptr)
    k = fp.k64 ? static_cast<const int64_t*>(fp.k_arr)[src]
               : static_cast<int64_t>(static_cast<const int32_t*>(fp.k_arr)[src]);
  const float tp = fp.p_arr != nullptr ? fp.p_arr[src] : fp.p_val;
  // Top-k: keep v >= thr_k (the k-th largest value), kept sum sum_k.
  float thr_k = -INFINITY, sum_k = 0.0f, mx = 0.0f;
  const bool k_on = k > 0 && k < cols;
  if (k_on) {
    const f::Threshold t = f::radix_threshold<T, kVec, false, true>(row, cols, 0.0f,
                                                                    static_cast<int>(k), fs, 1);
    thr_k = t.value;
    sum_k = t.kept_sum;
  }
  // Top-p: keep v >= thr_p. On the original row (joint) the rule is S_gt(v) < tp; on the top-k
  // renormalised row (top_k_first) it is S_gt(v) / sum_k < tp, i.e. S_gt(v) < tp * sum_k over the
  // same values (every value strictly greater than a kept one is kept by top-k).
  float thr_p = -INFINITY;
  if (tp == tp && tp < 1.0f) {
    if (tp <= 0.0f || (!fp.joint && !k_on)) {
      float total;
      sum_max<T, kVec>(row, cols, -INFINITY, total, mx, fs);
      if (!k_on) sum_k = total;
    }
    if (tp <= 0.0f) {
      thr_p = mx;  // the argmax set (top-k keeps the maximum)
    } else if (fp.joint || (sum_k >= f::kMinSum && sum_k < INFINITY)) {
      // top_k_first with a kept sum < 1e-8: the renormalised row is zero, top-p keeps it all.
      const float target = fp.joint ? tp : tp * sum_k;
      thr_p = f::radix_threshold<T, kVec, true, true>(row, cols, target, 0, fs, 1).value;
    }
  }
  draw_row<T, kVec>(p, i, row, fmaxf(thr_k, thr_p), tp != tp, s);
}

}  // namespace sampling_draw_detail

// samples int32/int64 [B'], valid bool [B'], probs [B, V] (last dim contiguous), indices optional
// int32/int64 [B'], seed/offset int64 [1] or [B'].
namespace sampling_draw_detail {

// Steps 1-2 of both entries: validate, fill Params; false when there is nothing to launch.
inline bool prepare(const char* op, Params& p, tvm::ffi::TensorView samples,
                    tvm::ffi::TensorView valid, tvm::ffi::TensorView probs,
                    const tvm::ffi::Optional<tvm::ffi::TensorView>& indices,
                    tvm::ffi::TensorView seed, tvm::ffi::TensorView offset) {
  namespace d = sampling_draw_detail;
  // 1. Validate.
  kernels::check_ndim(op, "probs", probs, 2);
  kernels::check_last_dim_contiguous(op, "probs", probs);
  kernels::check_device(op, "probs", probs, kDLCUDA);
  kernels::check_ndim(op, "samples", samples, 1);
  kernels::check_ndim(op, "valid", valid, 1);
  kernels::check_contiguous(op, "samples", samples);
  kernels::check_contiguous(op, "valid", valid);
  kernels::check_same_device(op, "samples", samples, "probs", probs);
  kernels::check_same_device(op, "valid", valid, "probs", probs);
  const int64_t rows = probs.size(0), cols = probs.size(1);
  const int64_t out_rows = samples.size(0);
  TVM_FFI_CHECK(valid.size(0) == out_rows, ValueError)
      << op << ": valid must have shape (" << out_rows << ",), got " << kernels::shape_string(valid);
  TVM_FFI_CHECK(kernels::is_dtype(valid.dtype(), kDLBool, 8) ||
                    kernels::is_dtype(valid.dtype(), kDLUInt, 8),
                TypeError)
      << op << ": valid must be bool";
  if (kernels::is_dtype(samples.dtype(), kDLInt, 64)) {
    p.samples64 = true;
  } else {
    TVM_FFI_CHECK(kernels::is_dtype(samples.dtype(), kDLInt, 32), TypeError)
        << op << ": samples must be int32 or int64";
  }
  if (indices.has_value()) {
    const tvm::ffi::TensorView t = indices.value();
    kernels::check_ndim(op, "indices", t, 1);
    kernels::check_contiguous(op, "indices", t);
    kernels::check_same_device(op, "indices", t, "probs", probs);
    TVM_FFI_CHECK(t.size(0) == out_rows, ValueError)
        << op << ": indices must have shape (" << out_rows << ",), got "
        << kernels::shape_string(t);
    if (kernels::is_dtype(t.dtype(), kDLInt, 64)) {
      p.indices64 = true;
    } else {
      TVM_FFI_CHECK(kernels::is_dtype(t.dtype(), kDLInt, 32), TypeError)
          << op << ": indices must be int32 or int64";
    }
    p.indices = kernels::data<const void>(t);
  } else {
    TVM_FFI_CHECK(out_rows == rows, ValueError)
        << op << ": samples must have shape (" << rows << ",), got "
        << kernels::shape_string(samples);
  }
  const char* names[2] = {"seed", "offset"};
  const tvm::ffi::TensorView* rng[2] = {&seed, &offset};
  for (int k = 0; k < 2; ++k) {
    const tvm::ffi::TensorView& t = *rng[k];
    kernels::check_ndim(op, names[k], t, 1);
    kernels::check_contiguous(op, names[k], t);
    kernels::check_same_device(op, names[k], t, "probs", probs);
    TVM_FFI_CHECK(kernels::is_dtype(t.dtype(), kDLInt, 64), TypeError)
        << op << ": " << names[k] << " must be int64";
    TVM_FFI_CHECK(t.size(0) == 1 || t.size(0) == out_rows, ValueError)
        << op << ": " << names[k] << " must have shape (1,) or (" << out_rows << ",), got "
        << kernels::shape_string(t);
  }
  TVM_FFI_CHECK(out_rows < (int64_t{1} << 31) && cols < (int64_t{1} << 31) - d::kThreads * 32,
                ValueError)
      << op << ": the CUDA kernel takes B' < 2^31 rows and V < 2^31 - 32768, got " << out_rows
      << " and " << cols;
  if (out_rows == 0) return false;  // V = 0: every row is invalid (the kernel reads nothing)
  p.x = kernels::data<const void>(probs);
  p.x_stride = probs.stride(0);
  p.rows = rows;
  p.cols = cols;
  p.samples = kernels::data<void>(samples);
  p.valid = kernels::data<bool>(valid);
  p.seed = kernels::data<const int64_t>(seed);
  p.offset = kernels::data<const int64_t>(offset);
  p.seed_per_row = seed.size(0) != 1;
  p.offset_per_row = offset.size(0) != 1;
  return true;
}

template <typename T>
bool vectorizable(const Params& p) {
  constexpr int64_t N = kernels::kVectorBytes / sizeof(T);
  return p.cols % N == 0 && p.x_stride % N == 0 && kernels::is_aligned(p.x);
}

}  // namespace sampling_draw_detail

inline void sampling_from_probs(tvm::ffi::TensorView samples, tvm::ffi::TensorView valid,
                                tvm::ffi::TensorView probs,
                                tvm::ffi::Optional<tvm::ffi::TensorView> indices,
                                tvm::ffi::TensorView seed, tvm::ffi::TensorView offset,
                                bool /*deterministic*/) {
  namespace d = sampling_draw_detail;
  const char* op = "sampling.sampling_from_probs";
  // 1. Validate.
  d::Params p{};
  if (!d::prepare(op, p, samples, valid, probs, indices, seed, offset)) return;
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(probs);
  const kernels::Launch ctx(op, probs);
  // 4. Dispatch on dtype and launch: one CTA per output row.
  const unsigned grid = static_cast<unsigned>(samples.size(0));
  KERNELS_DISPATCH_FLOAT(probs.dtype(), op, T, [&] {
    auto kernel = d::vectorizable<T>(p) ? d::draw_kernel<T, true> : d::draw_kernel<T, false>;
    kernel<<<grid, d::kThreads, 0, ctx.stream>>>(p);
    kernels::check_launch(op, cudaGetLastError());
  });
}

// As sampling_from_probs, plus top_k (int32/int64 [B] per probs row, or top_k_val) and top_p
// (float32 [B], or top_p_val); filter_apply_order "top_k_first" or "joint".
inline void top_k_top_p_sampling_from_probs(
    tvm::ffi::TensorView samples, tvm::ffi::TensorView valid, tvm::ffi::TensorView probs,
    tvm::ffi::Optional<tvm::ffi::TensorView> top_k_arr, int64_t top_k_val,
    tvm::ffi::Optional<tvm::ffi::TensorView> top_p_arr, double top_p_val,
    tvm::ffi::Optional<tvm::ffi::TensorView> indices, tvm::ffi::String filter_apply_order,
    tvm::ffi::TensorView seed, tvm::ffi::TensorView offset, bool /*deterministic*/) {
  namespace d = sampling_draw_detail;
  const char* op = "sampling.top_k_top_p_sampling_from_probs";
  // 1. Validate.
  d::FilterParams fp{};
  const std::string order(filter_apply_order);
  TVM_FFI_CHECK(order == "top_k_first" || order == "joint", ValueError)
      << op << ": filter_apply_order must be 'top_k_first' or 'joint', got '" << order << "'";
  fp.joint = order == "joint";
  const int64_t rows = probs.ndim() == 2 ? probs.size(0) : 0;
  fp.k_val = top_k_val;
  fp.p_val = static_cast<float>(top_p_val);
  if (top_k_arr.has_value()) {
    const tvm::ffi::TensorView t = top_k_arr.value();
    kernels::check_ndim(op, "top_k", t, 1);
    kernels::check_contiguous(op, "top_k", t);
    kernels::check_same_device(op, "top_k", t, "probs", probs);
    TVM_FFI_CHECK(t.size(0) == rows, ValueError)
        << op << ": top_k must have shape (" << rows << ",), got " << kernels::shape_string(t);
    if (kernels::is_dtype(t.dtype(), kDLInt, 64)) {
      fp.k64 = true;
    } else {
      TVM_FFI_CHECK(kernels::is_dtype(t.dtype(), kDLInt, 32), TypeError)
          << op << ": top_k must be int32 or int64";
    }
    fp.k_arr = kernels::data<const void>(t);
  }
  if (top_p_arr.has_value()) {
    const tvm::ffi::TensorView t = top_p_arr.value();
    kernels::check_ndim(op, "top_p", t, 1);
    kernels::check_contiguous(op, "top_p", t);
    kernels::check_same_device(op, "top_p", t, "probs", probs);
    TVM_FFI_CHECK(t.size(0) == rows, ValueError)
        << op << ": top_p must have shape (" << rows << ",), got " << kernels::shape_string(t);
    TVM_FFI_CHECK(kernels::is_dtype(t.dtype(), kDLFloat, 32), TypeError)
        << op << ": top_p must be float32";
    fp.p_arr = kernels::data<const float>(t);
  }
  d::Params p{};
  if (!d::prepare(op, p, samples, valid, probs, indices, seed, offset)) return;
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(probs);
  const kernels::Launch ctx(op, probs);
  // 4. Dispatch on dtype and launch: one CTA per output row.
  const unsigned grid = static_cast<unsigned>(samples.size(0));
  KERNELS_DISPATCH_FLOAT(probs.dtype(), op, T, [&] {
    auto kernel =
        d::vectorizable<T>(p) ? d::top_k_top_p_kernel<T, true> : d::top_k_top_p_kernel<T, false>;
    kernel<<<grid, d::kThreads, 0, ctx.stream>>>(p, fp);
    kernels::check_launch(op, cudaGetLastError());
  });
}
