// CPU-Adam: a fused Adam/AdamW update over fp32 buffers, the kernel behind ZeRO-Offload and every
// optimizer step the engine runs on CPU. One pass reads param, grad, exp_avg, exp_avg_sq and
// writes param, exp_avg, exp_avg_sq (28 bytes per element), optionally also a bf16/fp16 copy of
// the updated parameters. Vectorized for AVX-512 and AVX2 (+FMA) with a scalar fallback, chosen
// at run time from what the processor supports; OpenMP threads split each tile.
//
// Matches DeepSpeed's CPU-Adam (csrc/includes/cpu_adam.h): all arithmetic in fp32,
//   bc1 = 1 - beta1^step, bc2 = 1 - beta2^step (1 when bias_correction is false)
//   L2 mode (adamw_mode false, weight_decay > 0): g += weight_decay * p
//   m = beta1*m + (1-beta1)*g;  v = beta2*v + (1-beta2)*g*g
//   denom = sqrt(v) * (1/sqrt(bc2)) + eps
//   AdamW mode (weight_decay > 0): p += (-lr*weight_decay) * p
//   p += (-lr/bc1) * m / denom
// The torch-free header: the kernel library does not depend on LibTorch.
#pragma once

#include <cstdint>

namespace deepspeed::ops {

/// Instruction-set paths of the kernel, slowest to fastest.
enum class SimdLevel { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

/// The best path this processor supports (and this build compiled).
SimdLevel detect_simd_level();
/// The path used by default: detect_simd_level(), lowered (never raised) by the environment
/// variable DS_CPU_ADAM_SIMD=scalar|avx2|avx512.
SimdLevel default_simd_level();
const char* simd_level_name(SimdLevel level);

/// Hyper-parameters of one update (DeepSpeed's CPU-Adam semantics, see above).
struct AdamStep {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  bool adamw_mode = true;       // decoupled weight decay; false: L2 (added to the gradient)
  bool bias_correction = true;
  int64_t step = 1;             // 1-based count of this update (already incremented)
  // Multiplies the gradient before anything else: the unscale/clip coefficient, applied in this
  // pass instead of a pass of its own over the gradients (the same fp32 product as grad.mul_).
  float grad_scale = 1.0f;
};

/// Optional low-precision copy of the updated parameters, written in the same pass.
enum class HalfKind { kNone, kBF16, kFP16 };
struct HalfCopy {
  void* data = nullptr;  // n uint16_t values; bf16 rounds to nearest even, NaN -> 0x7FC0
  HalfKind kind = HalfKind::kNone;
};

/// Updates n elements in place. No alignment is required of any buffer; buffers must not
/// overlap. Threads: OpenMP (omp_get_max_threads()) over tiles of the buffers.
/// Throws UsageError (deepspeed/errors.h) for n < 0, step.step < 1, or a HalfCopy without data,
/// before touching any buffer; ConfigError for a bad DS_CPU_ADAM_SIMD. Results are the same
/// bit for bit on every path and thread count (docs/cpu_adam.md).
void adam_update(const AdamStep& step, float* param, const float* grad, float* exp_avg,
                 float* exp_avg_sq, int64_t n, HalfCopy copy = {});
/// The same on an explicit path; `level` must not exceed detect_simd_level() (NotSupportedError).
void adam_update(const AdamStep& step, float* param, const float* grad, float* exp_avg,
                 float* exp_avg_sq, int64_t n, HalfCopy copy, SimdLevel level);

}  // namespace deepspeed::ops
