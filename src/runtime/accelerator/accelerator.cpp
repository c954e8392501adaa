// See accelerator.h.
#include "runtime/accelerator/accelerator.h"

#include <string>

#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#ifdef DS_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>
#endif

#include "deepspeed/errors.h"
#include "util/check.h"
#include "util/env.h"

namespace deepspeed::runtime {

int cuda_device_count() {
  return at::hasCUDA() ? static_cast<int>(at::detail::getCUDAHooks().getNumGPUs()) : 0;
}

c10::Device training_device(int local_rank) {
  const std::string want = env::get("DS_ACCELERATOR").value_or("");
  DS_CHECK(want.empty() || want == "cpu" || want == "cuda", ConfigError, "DS_ACCELERATOR=", want,
           ": this build knows 'cpu' and 'cuda'");
  if (want == "cpu") return c10::Device(c10::kCPU);
  const int gpus = cuda_device_count();
  if (gpus == 0) {
    DS_CHECK(want.empty(), ConfigError, "DS_ACCELERATOR=cuda but ",
             at::hasCUDA() ? "no CUDA GPU is visible (CUDA_VISIBLE_DEVICES?)"
                           : "this LibTorch has no CUDA (build with -DDS_BUILD_CUDA=ON)");
    return c10::Device(c10::kCPU);
  }
  DS_CHECK(local_rank >= 0 && local_rank < gpus, ConfigError, "LOCAL_RANK=", local_rank,
           " but this host shows ", gpus, " CUDA GPU(s): each local rank trains on cuda:LOCAL_RANK "
           "(start at most one process per GPU, or set DS_ACCELERATOR=cpu)");
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(local_rank));
}

void set_current_device(const c10::Device& device) {
  if (device.is_cpu()) return;
  c10::impl::getDeviceGuardImpl(device.type())->setDevice(device);
}

void synchronize_device(const c10::Device& device) {
  if (device.is_cpu()) return;
  c10::impl::getDeviceGuardImpl(device.type())->getStream(device).synchronize();
}

DeviceMemory device_memory(const c10::Device& device) {
  DeviceMemory m;
#ifdef DS_WITH_CUDA
  if (!device.is_cuda()) return m;
  namespace alloc = c10::cuda::CUDACachingAllocator;
  const auto stats = alloc::getDeviceStats(device.index());
  const auto all = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  m.allocated_bytes = stats.allocated_bytes[all].current;
  m.max_allocated_bytes = stats.allocated_bytes[all].peak;
  m.reserved_bytes = stats.reserved_bytes[all].current;
  m.max_reserved_bytes = stats.reserved_bytes[all].peak;
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) m.total_bytes = static_cast<int64_t>(total_b);
#else
  (void)device;
#endif
  return m;
}

void reset_device_peaks(const c10::Device& device) {
#ifdef DS_WITH_CUDA
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
#else
  (void)device;
#endif
}

}  // namespace deepspeed::runtime
