// Turns the CUDA error state after a kernel launch into a typed deepspeed error, for the kernel
// files of ops/cuda_optim (internal; users see the throws documented in cuda_optim.h).
#pragma once

namespace deepspeed::ops::cuda_detail {

/// Reads (and clears) the CUDA runtime's last error on this thread; throws when there is one,
/// naming `kernel` and cudaGetErrorString. Launches are asynchronous, so an error left by an
/// earlier, unrelated kernel surfaces here too; the message says so.
void check_launch(const char* kernel);

}  // namespace deepspeed::ops::cuda_detail
