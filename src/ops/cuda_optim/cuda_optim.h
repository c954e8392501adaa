// Fused CUDA optimizers: Adam/AdamW and LAMB over fp32 device buffers, several tensors per kernel
// launch (multi-tensor apply). ZeRO hands the optimizer a few large flat partitions and the
// unpartitioned paths many small parameters; one launch covers them all, in chunks of 16 Ki
// elements shared out over the grid.
//
// Adam is CPU-Adam's arithmetic (ops/cpu_adam/cpu_adam.h) on the GPU: the same per-step fp32
// scalars (computed on the host by the same code) and the same fp32 operations in the same order
// (FMA where CPU-Adam fuses, correctly rounded sqrt and division, nothing contracted), so that
// results agree with CPU-Adam to the bit. The optional bf16/fp16 copy of the updated parameters
// (ZeRO's model partition) is written in the same pass and rounds as CPU-Adam's does.
//
// LAMB is runtime/optim/lamb.cpp's FusedLamb: the trust ratio ||p|| / ||u|| of each tensor is
// reduced and applied on the device without a host round trip (see fused_lamb below).
//
// Torch-free and CUDA-free header: streams are cudaStream_t passed as void* (nullptr: the legacy
// default stream). Every pointer is a device pointer of the current CUDA device; no alignment is
// required (16-byte aligned buffers take the vectorized path). Calls are asynchronous: results
// are ready when the stream reaches them.
#pragma once

#include <cstdint>

#include "ops/cpu_adam/cpu_adam.h"  // AdamStep, HalfKind

namespace deepspeed::ops {

/// One tensor of a fused Adam step: n fp32 elements each of param, grad, exp_avg, exp_avg_sq.
struct AdamTensor {
  float* param = nullptr;
  const float* grad = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  /// n uint16_t values that receive the updated param as fused_adam's half_kind, or nullptr for
  /// no copy of this tensor.
  void* half_copy = nullptr;
  int64_t n = 0;
};

/// One Adam/AdamW step (CPU-Adam's semantics, cpu_adam.h) of `count` tensors sharing `step`,
/// in as few launches as the kernel-argument space allows (64 tensors each). Any n >= 0.
/// half_kind applies to every tensor whose half_copy is set; kNone writes no copy.
/// Throws UsageError for count < 0, n < 0, step.step < 1 or a null buffer of a non-empty tensor,
/// before launching anything; a CUDA error of the launch as NotSupportedError (no kernel for
/// this GPU), OutOfMemoryError, UsageError (invalid stream or argument) or Error, naming the
/// kernel and cudaGetErrorString.
void fused_adam(const AdamStep& step, const AdamTensor* tensors, int count, HalfKind half_kind,
                void* stream);

/// Hyper-parameters of one FusedLamb step, as lamb.cpp reads them from the param group. Doubles,
/// as there: every constant the kernel uses is computed in double and rounded once to fp32.
struct LambStep {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool bias_correction = true;
  bool eps_inside_sqrt = false;  // denom = sqrt(v + eps) instead of sqrt(v) + eps
  double max_coeff = 10.0;
  double min_coeff = 0.01;
  int64_t step = 1;  // 1-based count of this update (already incremented)
};

/// One tensor of a fused LAMB step.
struct LambTensor {
  float* param = nullptr;
  const float* grad = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  int64_t n = 0;
};

/// fp32 elements of the device workspace fused_lamb needs for these tensors: two partial sums of
/// squares (||p||^2 and ||u||^2) per 16 Ki-element chunk. 0 when every tensor is empty.
int64_t fused_lamb_workspace_numel(const LambTensor* tensors, int count);

/// One FusedLamb step of `count` tensors sharing `step` (runtime/optim/lamb.cpp):
///   m = beta1*m + (1-beta1)*g;  v = beta2*v + (1-beta2)*g*g     (no bias correction inside u)
///   u = m / (sqrt(v) + eps)  [eps_inside_sqrt: m / sqrt(v + eps)];  u += weight_decay * p
///   coeff = clamp(||p|| / ||u||, min_coeff, max_coeff), or 1 when either norm is 0
///   p -= (coeff * step_size) * u,  step_size = lr * sqrt(bc2) / bc1 (lr without bias_correction)
/// Phase 1 updates m and v and writes per-chunk partial sums of p^2 and u^2 to `workspace`
/// (fused_lamb_workspace_numel floats); a small kernel reduces each tensor's partials, in a
/// fixed order, to its coefficient and stores it in coeffs[i] (count floats, device memory);
/// phase 2 recomputes u from the new moments (bit for bit what phase 1 computed, so no fp32
/// scratch of the update is needed) and applies it. Deterministic: no atomics.
/// Throws as fused_adam does; also UsageError for a null workspace or coeffs where needed.
void fused_lamb(const LambStep& step, const LambTensor* tensors, int count, float* workspace,
                float* coeffs, void* stream);

}  // namespace deepspeed::ops
