// OpenBlasCore: OpenBLAS's kernels chosen for the CPU this process runs on.
// Why: a dynamic-arch OpenBLAS picks its kernels at load time from the CPU models it knows. A
// release older than the CPU falls back to its generic Prescott (SSE3) kernels: Debian 12's
// OpenBLAS 0.3.21 does so on Emerald Rapids (family 6, model 207), where its single-thread SGEMM
// then runs at ~30 GFLOP/s instead of ~190 with the AVX-512 kernels the CPU has. Every GEMM of
// training (and LibTorch's CPU linear algebra) pays that 6x. When OPENBLAS_CORETYPE is unset and
// OpenBLAS fell back to a pre-AVX2 core on a CPU with AVX-512 (or AVX2 + FMA), the library
// re-selects SkylakeX (or Haswell) before main() runs, through OpenBLAS's own dynamic-arch entry
// points, and exports OPENBLAS_CORETYPE so that child processes (Python references, ranks) run
// the same kernels. A set OPENBLAS_CORETYPE is always obeyed; a process without OpenBLAS, or with
// a single-target build, is left alone.
#pragma once

#include <string>

namespace deepspeed::runtime {

struct OpenBlasCore {
  std::string detected;  // OpenBLAS's own choice at load; empty without OpenBLAS
  std::string selected;  // the kernels in use now
  std::string note;      // why they differ, or why they were left as they were
};

/// What happened at load time (the selection runs once, before main()).
const OpenBlasCore& openblas_core();

/// The core to select instead of `detected` on a CPU with these features, or "" to keep it.
/// Only OpenBLAS's generic fallbacks are replaced; a named modern core (Haswell, Zen, SkylakeX,
/// Cooperlake, SapphireRapids, ...) is kept as OpenBLAS chose it.
std::string openblas_core_upgrade(const std::string& detected, bool avx512_kernels,
                                  bool avx2_fma_kernels);

}  // namespace deepspeed::runtime
