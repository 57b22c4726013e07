// Input checks for host entry points. Python validates first and names the argument; these are
// the last line of defence, so a direct call of the raw function fails with a ValueError or
// TypeError instead of faulting on the device.
#pragma once

#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>

#include <cstdint>
#include <string>

namespace kernels {

using tvm::ffi::TensorView;

inline std::string shape_string(const TensorView& t) {
  std::string s = "[";
  for (int i = 0; i < t.ndim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

inline void check_ndim(const char* op, const char* arg, const TensorView& t, int ndim) {
  TVM_FFI_CHECK(t.ndim() == ndim, ValueError)
      << op << ": " << arg << " must have " << ndim << " dims, got shape " << shape_string(t);
}

inline void check_same_shape(const char* op, const char* a, const TensorView& x, const char* b,
                             const TensorView& y) {
  bool same = x.ndim() == y.ndim();
  for (int i = 0; same && i < x.ndim(); ++i) same = x.size(i) == y.size(i);
  TVM_FFI_CHECK(same, ValueError) << op << ": " << a << " " << shape_string(x) << " and " << b
                                  << " " << shape_string(y) << " must have the same shape";
}

inline void check_same_dtype(const char* op, const char* a, const TensorView& x, const char* b,
                             const TensorView& y) {
  TVM_FFI_CHECK(x.dtype() == y.dtype(), TypeError)
      << op << ": " << a << " and " << b << " must have the same dtype";
}

inline void check_contiguous(const char* op, const char* arg, const TensorView& t) {
  TVM_FFI_CHECK(t.IsContiguous(), ValueError) << op << ": " << arg << " must be contiguous";
}

// Last dim contiguous; leading strides arbitrary (row-strided 2-D views are legal).
inline void check_last_dim_contiguous(const char* op, const char* arg, const TensorView& t) {
  TVM_FFI_CHECK(t.ndim() == 0 || t.size(t.ndim() - 1) <= 1 || t.stride(t.ndim() - 1) == 1,
                ValueError)
      << op << ": " << arg << " must have a contiguous last dim, got stride "
      << t.stride(t.ndim() - 1);
}

inline void check_device(const char* op, const char* arg, const TensorView& t, int device_type) {
  TVM_FFI_CHECK(t.device().device_type == device_type, ValueError)
      << op << ": " << arg << " is on the wrong device type (" << t.device().device_type
      << ", expected " << device_type << ")";
}

inline void check_same_device(const char* op, const char* a, const TensorView& x, const char* b,
                              const TensorView& y) {
  TVM_FFI_CHECK(x.device().device_type == y.device().device_type &&
                    x.device().device_id == y.device().device_id,
                ValueError)
      << op << ": " << a << " and " << b << " must be on the same device";
}

}  // namespace kernels
