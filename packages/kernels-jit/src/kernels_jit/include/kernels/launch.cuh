// Launch helpers: the caller's stream (torch's current stream, passed through tvm-ffi) and a
// checked launch whose error names the kernel's op.
#pragma once

#include <cuda_runtime.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>

#include <cstdint>

namespace kernels {

// Selects the tensor's device for the duration of a host entry point, then restores the old one.
inline cudaStream_t current_stream(const tvm::ffi::TensorView& t) {
  return static_cast<cudaStream_t>(TVMFFIEnvGetStream(kDLCUDA, t.device().device_id));
}

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


// A failed launch (`status`, or the runtime's last error) as a RuntimeError naming the op.
inline void check_launch(const char* op, cudaError_t status = cudaGetLastError()) {
  if (status != cudaSuccess) cudaGetLastError();  // clear it: the error is reported here
  TVM_FFI_CHECK(status == cudaSuccess, RuntimeError)
      << op << ": kernel launch failed: " << cudaGetErrorString(status);
}

// Where and how an entry point launches: the op (for errors), the device, the caller's stream
// and the PDL switch (-1 auto: kernels::pdl_for_grid; 0 off; 1 on). Taken after the DeviceGuard.
struct Launch {
  const char* op;
  int device;
  cudaStream_t stream;
  int enable_pdl;
  Launch(const char* op_name, const tvm::ffi::TensorView& like, int64_t pdl = -1)
      : op(op_name),
        device(like.device().device_id),
        stream(current_stream(like)),
        enable_pdl(static_cast<int>(pdl)) {}
};

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
