// The device each rank trains on, chosen as DeepSpeed's accelerator does.
//
// DeepSpeed picks one accelerator per process (get_accelerator(): CUDA when a GPU is visible,
// else CPU; DS_ACCELERATOR overrides) and places rank r on device `local_rank`. This file is that
// choice, reached through ATen's CUDA hooks so that it compiles against the CPU-only LibTorch too.
#pragma once

#include <cstdint>

#include <c10/core/Device.h>

namespace deepspeed::runtime {

/// CUDA devices visible to this process (0 in a CPU-only LibTorch or without a GPU).
int cuda_device_count();

/// The device this rank trains on:
///  - DS_ACCELERATOR=cpu: the CPU, whatever is present;
///  - DS_ACCELERATOR=cuda: cuda:LOCAL_RANK, or ConfigError naming DS_ACCELERATOR without a GPU;
///  - unset: cuda:LOCAL_RANK when a GPU is visible, else the CPU.
/// LOCAL_RANK beyond the visible GPUs is a ConfigError naming both counts.
c10::Device training_device(int local_rank);

/// Makes `device` the current device of this thread (no-op for the CPU), as DeepSpeed's
/// get_accelerator().set_device(local_rank): kernels, NCCL communicators and the caching
/// allocator then use it.
void set_current_device(const c10::Device& device);

/// Waits until all work queued on `device` finished (no-op for the CPU).
void synchronize_device(const c10::Device& device);

/// The CUDA caching allocator's figures for a device (what torch.cuda.memory_allocated,
/// max_memory_allocated, memory_reserved and max_memory_reserved return). All 0 for the CPU
/// and in a build without CUDA.
struct DeviceMemory {
  int64_t allocated_bytes = 0;
  int64_t max_allocated_bytes = 0;
  int64_t reserved_bytes = 0;
  int64_t max_reserved_bytes = 0;
  int64_t total_bytes = 0;  // the device's memory (cudaMemGetInfo's total)
};
DeviceMemory device_memory(const c10::Device& device);
/// Restarts the peaks of device_memory (torch.cuda.reset_peak_memory_stats).
void reset_device_peaks(const c10::Device& device);

}  // namespace deepspeed::runtime
