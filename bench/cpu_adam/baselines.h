// The two reference loops CPU-Adam is measured against, kept in the benchmark (not the library):
// a STREAM triad (what the memory system gives a simple streaming loop) and a plain fused AdamW
// loop left to the compiler (-O3 -march=native -fno-math-errno, OpenMP), the practical ceiling of
// a one-pass update on this machine.
#pragma once

#include <cstdint>

namespace deepspeed::bench {

/// a[i] = b[i] + scalar * c[i] for i < n, OpenMP static split (STREAM's triad; 12 B/element
/// counted the STREAM way, 16 B moved with the write-allocate of `a`).
void stream_triad(float* a, const float* b, const float* c, float scalar, int64_t n);

/// One AdamW step written as the obvious loop (same math as DeepSpeed's CPU-Adam, no tiling, no
/// intrinsics): what the compiler makes of it is the bar for our hand-vectorized kernel.
struct FusedAdamwStep {
  float lr, beta1, beta2, eps, weight_decay;
  int64_t step;
};
void fused_adamw_loop(const FusedAdamwStep& s, float* param, const float* grad, float* exp_avg,
                      float* exp_avg_sq, int64_t n);

}  // namespace deepspeed::bench
