// check_launch(): which deepspeed error a CUDA error becomes (deepspeed/errors.h).
#include <cuda_runtime.h>

#include "ops/cuda_optim/launch_check.h"
#include "util/check.h"

namespace deepspeed::ops::cuda_detail {

void check_launch(const char* kernel) {
  const cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return;
  const std::string what = ::deepspeed::detail::str_cat(
      "cuda_optim: launching ", kernel, " failed: ", cudaGetErrorName(err), " (",
      cudaGetErrorString(err), ")");
  switch (err) {
    // The build has no code this GPU (or driver) can run.
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorInvalidDeviceFunction:
    case cudaErrorUnsupportedPtxVersion:
    case cudaErrorInsufficientDriver:
    case cudaErrorNoDevice:
      throw NotSupportedError(what +
                              "; this library was compiled for sm_90 (CMAKE_CUDA_ARCHITECTURES): "
                              "rebuild it for this GPU's architecture");
    case cudaErrorMemoryAllocation:
      throw OutOfMemoryError(what);
    // What the caller passed: a stream of another device or context, an impossible argument.
    case cudaErrorInvalidResourceHandle:
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
      throw UsageError(what + "; check the stream and that every buffer is device memory of the "
                              "current CUDA device");
    default:
      throw Error(what + "; CUDA reports errors asynchronously, so this may come from an earlier "
                         "kernel (run with CUDA_LAUNCH_BLOCKING=1 to find it)");
  }
}

}  // namespace deepspeed::ops::cuda_detail
