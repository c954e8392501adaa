// The one place that knows which LibTorch this is built against: Debian's 1.13 on CPU machines,
// the torch 2.x wheel's on GPU machines. Every version #if lives here.
#pragma once

#include <ATen/detail/CUDAHooksInterface.h>
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
