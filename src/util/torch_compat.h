// The one place that knows which LibTorch this is built against: Debian's 1.13 on CPU machines,
// the torch 2.x wheel's on GPU machines. Every version #if lives here.
#pragma once

#include <string>

#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/util/Exception.h>
#include <torch/version.h>

#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif

namespace deepspeed::compat {

// The class the concrete process groups (Gloo, NCCL) derive from: c10d::ProcessGroup in 1.13,
// c10d::Backend since 2.0 (where ProcessGroup became a dispatcher over backends).
#if TORCH_VERSION_MAJOR >= 2
using CollectiveBackend = c10d::Backend;
#else
using CollectiveBackend = c10d::ProcessGroup;
#endif

}  // namespace deepspeed::compat

// c10::Allocator::allocate lost its `const` and gained a pure virtual copy_data() in 2.3.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
#define DS_ALLOCATOR_ALLOCATE_CONST
#define DS_ALLOCATOR_HAS_COPY_DATA 1
#else
#define DS_ALLOCATOR_ALLOCATE_CONST const
#define DS_ALLOCATOR_HAS_COPY_DATA 0
#endif

// ATen 1.x's CPU GEMM falls back to accumulating bf16 products in bf16 where oneDNN does not
// take them (runtime/precision/cpu_bf16_matmul.h); 2.x accumulates in fp32 on every path.
#if TORCH_VERSION_MAJOR >= 2
#define DS_CPU_BF16_GEMM_MAY_ACCUMULATE_IN_BF16 0
#else
#define DS_CPU_BF16_GEMM_MAY_ACCUMULATE_IN_BF16 1
#endif

// A c10::WarningHandler that drops what it is given (process() changed its arguments in 2.0),
// and the guard that installs one (moved from c10::Warning to c10::WarningUtils).
namespace deepspeed::compat {
#if TORCH_VERSION_MAJOR >= 2
using WarningHandlerGuard = c10::WarningUtils::WarningHandlerGuard;
#else
using WarningHandlerGuard = c10::Warning::WarningHandlerGuard;
#endif

class DroppingWarningHandler : public c10::WarningHandler {
 public:
#if TORCH_VERSION_MAJOR >= 2
  void process(const c10::Warning&) override {}
#else
  void process(const c10::SourceLocation&, const std::string&, const bool) override {}
#endif
};
}  // namespace deepspeed::compat

// at::scaled_dot_product_attention (fused flash / memory-efficient attention) exists since 2.0.
#if TORCH_VERSION_MAJOR >= 2
#define DS_HAS_FUSED_SDPA 1
#else
#define DS_HAS_FUSED_SDPA 0
#endif

namespace deepspeed::compat {

// The default CUDA generator of a device through ATen's hooks (compiles without CUDA headers):
// CUDAHooksInterface renamed getDefaultCUDAGenerator to getDefaultGenerator in 2.x.
inline at::Generator default_cuda_generator(int device) {
#if TORCH_VERSION_MAJOR >= 2
  return at::detail::getCUDAHooks().getDefaultGenerator(static_cast<c10::DeviceIndex>(device));
#else
  return at::detail::getCUDAHooks().getDefaultCUDAGenerator(static_cast<c10::DeviceIndex>(device));
#endif
}

}  // namespace deepspeed::compat
