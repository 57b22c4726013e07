// speculative.chain_speculative_sampling, CUDA: one CTA of 1024 threads per request.
//   1. Threads i < n decide draft i: u_i = U(seed, offset, b, i) (the project RNG, bit for bit
//      with kernels_jit.rng), accept iff u_i * q < p (fp32, strict); the first rejection r and the
//      independent accepted count come from block-wide shared atomics.
//   2. The residual pass: target row r and draft row r (or target row n when every draft was
//      accepted) read once, 4 elements per load (16 bytes of fp32) and 4 loads per thread in
//      flight: the sums of relu(t - d) and of t, and the last positive index of each.
//   3. The draw with U(seed, offset, b, n): smallest j whose running sum exceeds u * total, by
//      tiles of 16 contiguous elements per thread (16384 per tile for 16-byte packs; a block scan
//      per tile, stopping at the tile that crosses; the rows are re-read, mostly from L2), the
//      last positive index when rounding leaves none, 0 for a zero or
//      NaN total; the residual when its mass is > 0, else the target row.
// Sums run in a different order from torch's cumsum, so a draw whose threshold falls within an
// ulp of a boundary may differ from the reference (probability ~1e-7 per draw); every accept /
// reject decision is exact. A draft id outside [0, V) counts as rejected (the reference raises).
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(2);

#include <kernels/cuda_dtype.cuh>
#include <kernels/dtype.h>
#include <kernels/launch.cuh>
#include <kernels/pdl.cuh>

#include "speculative_common.cuh"

namespace chain_speculative_sampling_detail {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kUnroll = 4;

template <typename T>
struct Params {
  int32_t* out;  // [B, n+1] contiguous
  int32_t* accepted;
  int64_t accepted_s;
  int32_t* emitted;
  int64_t emitted_s;
  const T* draft;  // [B, n, V], last dim contiguous
  int64_t d_s0, d_s1;
  const T* target;  // [B, n+1, V], last dim contiguous
  int64_t t_s0, t_s1;
  speculative_detail::IndexRef ids, seed, offset;
  int64_t n, vocab;
};

template <typename T, int N>
__device__ __forceinline__ void load(const T* p, int64_t j, float (&v)[N]) {
  if constexpr (N == 4 && sizeof(T) == 4) {
    const float4 x = *reinterpret_cast<const float4*>(p + j);
    v[0] = x.x;
    v[1] = x.y;
    v[2] = x.z;
    v[3] = x.w;
  } else if constexpr (N == 4 && sizeof(T) == 2) {
    const uint2 x = *reinterpret_cast<const uint2*>(p + j);
    const T* h = reinterpret_cast<const T*>(&x);
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = kernels::to_float(h[k]);
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] = kernels::to_float(p[j + k]);
  }
}

// The weight of element j: relu(t - d) on the residual, t otherwise.
__device__ __forceinline__ float weight(float t, float d, bool residual) {
  if (!residual) return t;
  const float r = __fsub_rn(t, d);
  return r > 0.f ? r : 0.f;
}

// Inclusive scan over the block of one float per thread; returns this thread's exclusive prefix
// and sets `total`. `scratch`: kWarps floats.
__device__ __forceinline__ float block_exclusive_scan(float x, float* scratch, float& total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float inc = x;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const float y = __shfl_up_sync(0xffffffffu, inc, o);
    if (lane >= o) inc += y;
  }
  __syncthreads();
  if (lane == 31) scratch[warp] = inc;
  __syncthreads();
  float w = lane < kWarps ? scratch[lane] : 0.f;
  float winc = w;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const float y = __shfl_up_sync(0xffffffffu, winc, o);
    if (lane >= o) winc += y;
  }
  total = __shfl_sync(0xffffffffu, winc, kWarps - 1);
  const float warp_prefix = __shfl_sync(0xffffffffu, winc - w, warp);
  return warp_prefix + inc - x;
}

template <typename T, int N>
__global__ void __launch_bounds__(kThreads) chain_kernel(bool pdl, Params<T> p) {
  __shared__ int s_reject, s_count, s_token;
  __shared__ float s_sum[2][kWarps];
  __shared__ int s_last[2];
  __shared__ float s_scan[kWarps];
  const int64_t b = blockIdx.x;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  if (pdl) kernels::pdl_wait();
  const int64_t seed = p.seed[b], offset = p.offset[b];
  if (tid == 0) {
    s_reject = static_cast<int>(p.n);
    s_count = 0;
    s_token = 0x7fffffff;
    s_last[0] = s_last[1] = -1;
  }
  __syncthreads();
  // 1. Accept or reject each draft.
  for (int64_t i = tid; i < p.n; i += kThreads) {
    const int64_t d = p.ids.at(b, i);
    bool ok = false;
    if (d >= 0 && d < p.vocab) {
      const float q = kernels::to_float(p.draft[b * p.d_s0 + i * p.d_s1 + d]);
      const float pt = kernels::to_float(p.target[b * p.t_s0 + i * p.t_s1 + d]);
      ok = __fmul_rn(speculative_detail::uniform(seed, offset, b, i), q) < pt;
    }
    if (ok)
      atomicAdd(&s_count, 1);
    else
      atomicMin(&s_reject, static_cast<int>(i));
  }
  __syncthreads();
  const int64_t r = s_reject;
  const bool has_residual = r < p.n;
  const T* trow = p.target + b * p.t_s0 + r * p.t_s1;
  const T* drow = has_residual ? p.draft + b * p.d_s0 + r * p.d_s1 : trow;
  // 2. The residual pass: sums and last positive indices.
  float sum_res = 0.f, sum_t = 0.f;
  int last_res = -1, last_t = -1;
  const int64_t stride = static_cast<int64_t>(kThreads) * N;
  int64_t j = static_cast<int64_t>(tid) * N;
  for (; j + (kUnroll - 1) * stride < p.vocab - (N - 1); j += kUnroll * stride) {
    float t[kUnroll][N], d[kUnroll][N];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) load<T, N>(trow, j + u * stride, t[u]);
    if (has_residual) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) load<T, N>(drow, j + u * stride, d[u]);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
      for (int k = 0; k < N; ++k) {
        const int idx = static_cast<int>(j + u * stride + k);
        sum_t += t[u][k];
        if (t[u][k] > 0.f) last_t = idx;
        if (has_residual) {
          const float w = weight(t[u][k], d[u][k], true);
          sum_res += w;
          if (w > 0.f) last_res = idx;
        }
      }
    }
  }
  for (; j < p.vocab; j += stride) {  // the tail: whole packs, then single elements
    if (j + N <= p.vocab) {
      float t[N], d[N];
      load<T, N>(trow, j, t);
      if (has_residual) load<T, N>(drow, j, d);
#pragma unroll
      for (int k = 0; k < N; ++k) {
        sum_t += t[k];
        if (t[k] > 0.f) last_t = static_cast<int>(j + k);
        if (has_residual) {
          const float w = weight(t[k], d[k], true);
          sum_res += w;
          if (w > 0.f) last_res = static_cast<int>(j + k);
        }
      }
    } else {
      for (int64_t k = j; k < p.vocab; ++k) {
        const float tk = kernels::to_float(trow[k]);
        sum_t += tk;
        if (tk > 0.f) last_t = static_cast<int>(k);
        if (has_residual) {
          const float w = weight(tk, kernels::to_float(drow[k]), true);
          sum_res += w;
          if (w > 0.f) last_res = static_cast<int>(k);
        }
      }
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    sum_t += __shfl_xor_sync(0xffffffffu, sum_t, o);
    sum_res += __shfl_xor_sync(0xffffffffu, sum_res, o);
    last_t = max(last_t, __shfl_xor_sync(0xffffffffu, last_t, o));
    last_res = max(last_res, __shfl_xor_sync(0xffffffffu, last_res, o));
  }
  if (lane == 0) {
    s_sum[0][warp] = sum_t;
    s_sum[1][warp] = sum_res;
    atomicMax(&s_last[0], last_t);
    atomicMax(&s_last[1], last_res);
  }
  __syncthreads();
  float total_t = 0.f, total_res = 0.f;
  for (int w = 0; w < kWarps; ++w) {
    total_t += s_sum[0][w];
    total_res += s_sum[1][w];
  }
  const bool residual = has_residual && total_res > 0.f;
  const float total = residual ? total_res : total_t;
  const int last_positive = residual ? s_last[1] : s_last[0];
  // 3. The draw: smallest j with running sum > u * total.
  int token = 0;
  if (total > 0.f) {
    const float threshold =
        __fmul_rn(speculative_detail::uniform(seed, offset, b, p.n), total);
    float carry = 0.f;
    constexpr int kPer = kUnroll * N;  // contiguous elements per thread and tile
    const int64_t tile_stride = static_cast<int64_t>(kThreads) * kPer;
    for (int64_t base = 0; base < p.vocab; base += tile_stride) {
      const int64_t jj = base + static_cast<int64_t>(tid) * kPer;
      float w[kPer];
#pragma unroll
      for (int k = 0; k < kPer; ++k) w[k] = 0.f;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t j0 = jj + u * N;
        if (j0 + N <= p.vocab) {
          float t[N], d[N];
          load<T, N>(trow, j0, t);
          if (residual) load<T, N>(drow, j0, d);
#pragma unroll
          for (int k = 0; k < N; ++k) w[u * N + k] = weight(t[k], residual ? d[k] : 0.f, residual);
        } else {
          for (int k = 0; k < N && j0 + k < p.vocab; ++k)
            w[u * N + k] = weight(kernels::to_float(trow[j0 + k]),
                                  residual ? kernels::to_float(drow[j0 + k]) : 0.f, residual);
        }
      }
      float local = 0.f;
#pragma unroll
      for (int k = 0; k < kPer; ++k) local += w[k];
      float tile = 0.f;
      const float excl = block_exclusive_scan(local, s_scan, tile);
      if (carry + tile > threshold) {  // uniform: every thread holds the same carry and tile
        float run = carry + excl;
#pragma unroll
        for (int k = 0; k < kPer; ++k) {
          run += w[k];
          if (run > threshold && jj + k < p.vocab) {
            atomicMin(&s_token, static_cast<int>(jj + k));
            break;
          }
        }
        __syncthreads();
        if (s_token != 0x7fffffff) break;  // else rounding: no element crossed, go on
      }
      carry += tile;
    }
    __syncthreads();
    token = s_token;
    if (token >= p.vocab) token = last_positive < 0 ? 0 : last_positive;
  }
  // Outputs.
  int32_t* out = p.out + b * (p.n + 1);
  for (int64_t i = tid; i <= p.n; i += kThreads) {
    out[i] = i < r ? static_cast<int32_t>(p.ids.at(b, i)) : (i == r ? token : -1);
  }
  if (tid == 0) {
    p.accepted[b * p.accepted_s] = s_count;
    p.emitted[b * p.emitted_s] = static_cast<int32_t>(r);
  }
  if (pdl) kernels::pdl_launch_dependents();
}

}  // namespace chain_speculative_sampling_detail

// output_token_ids [B, n+1] int32 (contiguous), accepted_num / emitted_num [B] int32,
// draft_probs [B, n, V] and target_probs [B, n+1, V] (float32/float16/bfloat16, one dtype, last
// dim contiguous), draft_token_ids [B, n] int32/int64, seed / offset int64 [1] or [B].
inline void chain_speculative_sampling(tvm::ffi::TensorView output_token_ids,
                                       tvm::ffi::TensorView accepted_num,
                                       tvm::ffi::TensorView emitted_num,
                                       tvm::ffi::TensorView draft_probs,
                                       tvm::ffi::TensorView draft_token_ids,
                                       tvm::ffi::TensorView target_probs,
                                       tvm::ffi::TensorView seed, tvm::ffi::TensorView offset,
                                       bool deterministic) {
  namespace detail = chain_speculative_sampling_detail;
  constexpr const char* kOp = "speculative.chain_speculative_sampling";
  (void)deterministic;  // every path is deterministic
  // 1. Validate.
  kernels::check_ndim(kOp, "draft_probs", draft_probs, 3);
  kernels::check_ndim(kOp, "target_probs", target_probs, 3);
  kernels::check_device(kOp, "draft_probs", draft_probs, kDLCUDA);
  kernels::check_same_device(kOp, "target_probs", target_probs, "draft_probs", draft_probs);
  kernels::check_same_dtype(kOp, "target_probs", target_probs, "draft_probs", draft_probs);
  const int64_t batch = draft_probs.size(0), n = draft_probs.size(1), vocab = draft_probs.size(2);
  TVM_FFI_CHECK(target_probs.size(0) == batch && target_probs.size(1) == n + 1 &&
                    target_probs.size(2) == vocab,
                ValueError)
      << kOp << ": target_probs must have shape [B, n+1, V] = [" << batch << ", " << n + 1 << ", "
      << vocab << "], got " << kernels::shape_string(target_probs);
  TVM_FFI_CHECK(vocab < (int64_t{1} << 30), ValueError)
      << kOp << ": the vocabulary must have fewer than 2^30 entries";
  kernels::check_last_dim_contiguous(kOp, "draft_probs", draft_probs);
  kernels::check_last_dim_contiguous(kOp, "target_probs", target_probs);
  const auto ids = speculative_host::index_tensor(kOp, "draft_token_ids", draft_token_ids,
                                                  draft_probs, 2);
  TVM_FFI_CHECK(draft_token_ids.size(0) == batch && draft_token_ids.size(1) == n, ValueError)
      << kOp << ": draft_token_ids must have shape [B, n] = [" << batch << ", " << n << "]";
  auto rng = [&](const char* name, const tvm::ffi::TensorView& t) {
    auto r = speculative_host::index_tensor(kOp, name, t, draft_probs, 1);
    TVM_FFI_CHECK(r.i64, TypeError) << kOp << ": " << name << " must be int64";
    TVM_FFI_CHECK(t.size(0) == 1 || t.size(0) == batch, ValueError)
        << kOp << ": " << name << " must have shape [1] or [B]";
    if (t.size(0) == 1) r.s0 = 0;
    return r;
  };
  const auto seed_ref = rng("seed", seed), offset_ref = rng("offset", offset);
  for (const auto* t : {&output_token_ids, &accepted_num, &emitted_num}) {
    kernels::check_same_device(kOp, "an output", *t, "draft_probs", draft_probs);
    TVM_FFI_CHECK(kernels::is_dtype(t->dtype(), kDLInt, 32), TypeError)
        << kOp << ": the outputs must be int32";
  }
  kernels::check_ndim(kOp, "output_token_ids", output_token_ids, 2);
  kernels::check_contiguous(kOp, "output_token_ids", output_token_ids);
  TVM_FFI_CHECK(output_token_ids.size(0) == batch && output_token_ids.size(1) == n + 1 &&
                    accepted_num.ndim() == 1 && accepted_num.size(0) == batch &&
                    emitted_num.ndim() == 1 && emitted_num.size(0) == batch,
                ValueError)
      << kOp << ": outputs must be [B, n+1], [B], [B] with B = " << batch;
  if (batch == 0) return;
  TVM_FFI_CHECK(vocab > 0, ValueError) << kOp << ": the vocabulary must not be empty";
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(draft_probs);
  const kernels::Launch ctx(kOp, draft_probs);
  // 4. Dispatch on dtype and launch.
  KERNELS_DISPATCH_FLOAT(draft_probs.dtype(), kOp, T, [&] {
    detail::Params<T> p{};
    p.out = kernels::data<int32_t>(output_token_ids);
    p.accepted = kernels::data<int32_t>(accepted_num);
    p.accepted_s = accepted_num.stride(0);
    p.emitted = kernels::data<int32_t>(emitted_num);
    p.emitted_s = emitted_num.stride(0);
    p.draft = kernels::data<const T>(draft_probs);
    p.d_s0 = draft_probs.stride(0);
    p.d_s1 = draft_probs.stride(1);
    p.target = kernels::data<const T>(target_probs);
    p.t_s0 = target_probs.stride(0);
    p.t_s1 = target_probs.stride(1);
    p.ids = ids;
    p.seed = seed_ref;
    p.offset = offset_ref;
    p.n = n;
    p.vocab = vocab;
    // 16-byte (fp32) / 8-byte (fp16, bf16) packs of 4 when every row starts aligned.
    const int64_t align = 4 * static_cast<int64_t>(sizeof(T));
    const bool packed = vocab % 4 == 0 && (p.t_s0 % 4 == 0 || batch == 1) && p.t_s1 % 4 == 0 &&
                        (p.d_s0 % 4 == 0 || batch == 1) && (p.d_s1 % 4 == 0 || n <= 1) &&
                        reinterpret_cast<uintptr_t>(p.target) % align == 0 &&
                        reinterpret_cast<uintptr_t>(p.draft) % align == 0;
    if (packed)
      kernels::launch(ctx, detail::chain_kernel<T, 4>, static_cast<unsigned>(batch),
                      detail::kThreads, p);
    else
      kernels::launch(ctx, detail::chain_kernel<T, 1>, static_cast<unsigned>(batch),
                      detail::kThreads, p);
  });
}
