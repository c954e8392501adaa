// The one place that knows which LibTorch this is built against: Debian's 1.13 on CPU machines,
// the torch 2.x wheel's on GPU machines. Every version #if lives here.
#pragma once

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
