// Host helpers shared by every entry point: a tensor's data pointer, its rows (the leading dims
// collapsed into at most two levels with one stride each), and the argument rules that more than
// one op shares (eps, overlapping buffers). Host-only; CUDA and CPU sources both use it.
#pragma once

#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>

#include "checks.h"

namespace kernels {

// The first element of `t` (data pointer plus byte offset: views may carry one).
template <typename T = void>
inline T* data(const TensorView& t) {
  return reinterpret_cast<T*>(static_cast<char*>(t.data_ptr()) + t.byte_offset());
}

// Element offset of row r in a tensor of rows (outer, inner) with strides (s0, s1).
struct RowMap {
  int64_t s0 = 0;
  int64_t s1 = 0;
};

// Leading dims of tensors of one shape [..., H], merged into (outer, inner), with each tensor's
// strides in map[i]. levels: 0 (one row), 1 (inner == 1) or 2.
struct RowLayout {
  static constexpr int kMaxTensors = 4;
  int64_t outer = 1;
  int64_t inner = 1;
  RowMap map[kMaxTensors];
  int levels = 0;
  int64_t rows() const { return outer * inner; }
};

constexpr int kMaxDims = 16;

// The collapse: adjacent leading dims merge where every tensor's strides allow (a dim's stride
// equals the next inner one's stride times its size); size-1 dims are skipped. Returns false when
// more than `max_levels` levels remain (or too many dims). Shapes are checked by the caller.
inline bool collapse_rows(const TensorView* const* tensors, int count, int max_levels,
                          RowLayout& layout) {
  const TensorView& t0 = *tensors[0];
  const int lead = t0.ndim() - 1;
  if (count > RowLayout::kMaxTensors || lead >= kMaxDims) return false;
  int64_t size[kMaxDims];
  int64_t stride[RowLayout::kMaxTensors][kMaxDims];
  int levels = 0;
  for (int d = 0; d < lead; ++d) {
    const int64_t n = t0.size(d);
    if (n == 1) continue;
    bool merge = levels > 0;
    for (int i = 0; merge && i < count; ++i)
      merge = stride[i][levels - 1] == tensors[i]->stride(d) * n;
    if (merge) {
      size[levels - 1] *= n;
      for (int i = 0; i < count; ++i) stride[i][levels - 1] = tensors[i]->stride(d);
    } else {
      if (levels == max_levels) return false;
      size[levels] = n;
      for (int i = 0; i < count; ++i) stride[i][levels] = tensors[i]->stride(d);
      ++levels;
    }
  }
  layout = RowLayout{};
  layout.levels = levels;
  if (levels >= 1) {
    layout.outer = size[0];
    for (int i = 0; i < count; ++i) layout.map[i].s0 = stride[i][0];
  }
  if (levels == 2) {
    layout.inner = size[1];
    for (int i = 0; i < count; ++i) layout.map[i].s1 = stride[i][1];
  }
  return true;
}

// Rows as (tokens, heads) for the row engine; a layout needing more levels is a ValueError naming
// the op. Empty tensors have no rows. With inner > 1, rows < 2^32 (the device splits with 32 bits).
inline RowLayout row_layout(const char* op, const char* what,
                            std::initializer_list<const TensorView*> tensors) {
  const TensorView& t0 = **tensors.begin();
  if (t0.numel() == 0) {
    RowLayout empty;
    empty.outer = 0;
    return empty;
  }
  TVM_FFI_CHECK(t0.ndim() - 1 < kMaxDims, ValueError)
      << op << ": " << what << " has too many dims (" << t0.ndim() << ")";
  RowLayout layout;
  TVM_FFI_CHECK(collapse_rows(tensors.begin(), static_cast<int>(tensors.size()), 2, layout),
                ValueError)
      << op << ": the leading dims of " << what << " " << shape_string(t0)
      << " cannot be merged into (tokens, heads) rows with one stride each; pass a "
      << "contiguous tensor (.contiguous()) or a view whose leading dims collapse";
  TVM_FFI_CHECK(layout.inner == 1 || layout.rows() < (int64_t{1} << 32), ValueError)
      << op << ": " << what << " " << shape_string(t0) << " has too many rows";
  return layout;
}

// `t` as `rows` rows of its last dim (`cols` elements, stride 1), row r at element r * stride:
// the one-level collapse. `ok` is false when the leading dims need two levels or the last dim is
// strided; callers send such tensors elsewhere.
struct RowView {
  int64_t rows = 1;
  int64_t cols = 1;
  int64_t stride = 0;
  bool ok = true;
};

inline RowView row_view(const TensorView& t) {
  RowView v;
  const int nd = t.ndim();
  v.cols = nd ? t.size(nd - 1) : 1;
  for (int i = 0; i + 1 < nd; ++i) v.rows *= t.size(i);
  const TensorView* tensors[] = {&t};
  RowLayout layout;
  v.ok = !(nd && v.cols > 1 && t.stride(nd - 1) != 1) && collapse_rows(tensors, 1, 1, layout);
  v.stride = v.ok && layout.levels == 1 ? layout.map[0].s0 : v.cols;
  return v;
}

// 16-byte vectors of `vec` elements are legal at every row start: the base `pointers` aligned
// (null ones, absent tensors, pass), the row length and every row stride multiples of `vec`.
inline bool vectors_fit(int64_t cols, int64_t vec, std::initializer_list<const void*> pointers,
                        std::initializer_list<RowMap> maps) {
  bool fit = cols % vec == 0;
  for (const void* ptr : pointers)
    fit = fit && reinterpret_cast<uintptr_t>(ptr) % 16 == 0;
  for (const RowMap& m : maps) fit = fit && m.s0 % vec == 0 && m.s1 % vec == 0;
  return fit;
}

// eps of every row op: finite and >= 0 (the Python rule).
inline void check_eps(const char* op, double eps) {
  TVM_FFI_CHECK(std::isfinite(eps) && eps >= 0.0, ValueError)
      << op << ": eps must be a finite number >= 0, got " << eps;
}

// The bytes a tensor's elements span: [first, last) from the lowest to the highest address.
inline void byte_range(const TensorView& t, uintptr_t& first, uintptr_t& last) {
  first = last = reinterpret_cast<uintptr_t>(data(t));
  if (t.numel() == 0) return;
  int64_t lo = 0, hi = 0;
  for (int i = 0; i < t.ndim(); ++i) {
    const int64_t span = (t.size(i) - 1) * t.stride(i);
    (span < 0 ? lo : hi) += span;
  }
  const int64_t elem = (t.dtype().bits * t.dtype().lanes + 7) / 8;
  first += lo * elem;
  last += (hi + 1) * elem;
}

// A ValueError when the memory of `a` and `b` overlaps (an op that reads one while writing the
// other would compute garbage).
inline void check_no_overlap(const char* op, const char* a, const TensorView& x, const char* b,
                             const TensorView& y) {
  uintptr_t x0, x1, y0, y1;
  byte_range(x, x0, x1);
  byte_range(y, y0, y1);
  TVM_FFI_CHECK(x0 == x1 || y0 == y1 || x1 <= y0 || y1 <= x0, ValueError)
      << op << ": " << a << " and " << b << " must not overlap in memory";
}

}  // namespace kernels
