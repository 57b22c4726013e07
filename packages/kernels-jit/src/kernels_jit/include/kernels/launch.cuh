// Launch helpers: the caller's stream (torch's current stream, passed through tvm-ffi) and a
// checked launch whose error names the kernel's op.
#pragma once

#include <cuda_runtime.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>

namespace kernels {

// Selects the tensor's device for the duration of a host entry point, then restores the old one.
class DeviceGuard {
 public:
  explicit DeviceGuard(const tvm::ffi::TensorView& t) {
    cudaGetDevice(&previous_);
    if (previous_ != t.device().device_id) cudaSetDevice(t.device().device_id);
  }
  ~DeviceGuard() { cudaSetDevice(previous_); }

 private:
  int previous_ = 0;
};

inline cudaStream_t current_stream(const tvm::ffi::TensorView& t) {
  return static_cast<cudaStream_t>(TVMFFIEnvGetStream(kDLCUDA, t.device().device_id));
}

inline void check_launch(const char* op) {
  const cudaError_t status = cudaGetLastError();
  TVM_FFI_CHECK(status == cudaSuccess, RuntimeError)
      << op << ": kernel launch failed: " << cudaGetErrorString(status);
}

inline unsigned ceil_div(long long a, long long b) { return static_cast<unsigned>((a + b - 1) / b); }

inline int sm_count(int device) {
  static int cached[64] = {0};
  if (device < 64 && cached[device]) return cached[device];
  int count = 0;
  cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device);
  if (device < 64) cached[device] = count;
  return count;
}

}  // namespace kernels
