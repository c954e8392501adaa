// The contract between CPU-Adam's driver (adam_update.cpp: tiles, OpenMP, dispatch) and its
// per-instruction-set kernels (scalar.cpp, avx2.cpp, avx512.cpp). Each kernel updates one
// contiguous chunk on the calling thread; threading and argument checks live in the driver.
// Internal to the ops library and its tests; users call ops/cpu_adam/cpu_adam.h.
#pragma once

#include <cstdint>

#include "ops/cpu_adam/cpu_adam.h"

namespace deepspeed::ops::detail {

/// Which weight-decay term a step applies (DeepSpeed skips both when weight_decay <= 0).
enum class DecayMode { kNone, kL2, kDecoupled };

/// The per-step scalars of the update, computed once per call so that every path multiplies by
/// the very same fp32 constants (see Note [Identical arithmetic on every path]).
struct AdamCoeffs {
  float beta1 = 0.9f;
  float one_minus_beta1 = 0.1f;
  float beta2 = 0.999f;
  float one_minus_beta2 = 0.001f;
  float eps = 1e-8f;
  float bias_correction2_inv_sqrt = 1.0f;  // 1 / sqrt(1 - beta2^step), or 1
  float step_size = -1e-3f;                // -lr / (1 - beta1^step), or -lr
  float decay = 0.0f;                      // kL2: weight_decay; kDecoupled: -lr * weight_decay
  DecayMode decay_mode = DecayMode::kNone;
  float grad_scale = 1.0f;  // AdamStep::grad_scale (g * 1 is g: no cost to the result)
};

/// DeepSpeed's scalars for `step` (bias terms from the 1-based step count).
AdamCoeffs make_adam_coeffs(const AdamStep& step);

// Note [Identical arithmetic on every path]
// Every path performs, per element and in this order, the same fp32 operations, each rounded
// once: an FMA is always a fused multiply-add (vfmadd on AVX2/AVX-512, std::fma in the scalar
// path), never a separate multiply and add, and no path lets the compiler contract or reorder
// (the library is compiled with -ffp-contract=off). sqrt and division are correctly rounded in
// IEEE arithmetic on all paths. The paths therefore agree bit for bit, which the tests check.
// The order follows DeepSpeed's SIMD step, after the gradient's scale (DeepSpeed multiplies the
// gradients by it beforehand, the same single rounding):
//   g = g * grad_scale
//   L2:        g = fma(p, wd, g)
//   m = fma(g, 1-beta1, m*beta1);  v = fma(g*g, 1-beta2, v*beta2)
//   denom = fma(sqrt(v), 1/sqrt(bc2), eps)
//   AdamW:     p = fma(p, -lr*wd, p)
//   p = fma(m/denom, -lr/bc1, p)

/// Updates `n` elements of one chunk on the calling thread. `half_out` is null when
/// `half_kind` is kNone, else receives n uint16_t values. No alignment is required.
using AdamChunkFn = void (*)(const AdamCoeffs& c, float* param, const float* grad,
                             float* exp_avg, float* exp_avg_sq, int64_t n, uint16_t* half_out,
                             HalfKind half_kind);

void adam_chunk_scalar(const AdamCoeffs& c, float* param, const float* grad, float* exp_avg,
                       float* exp_avg_sq, int64_t n, uint16_t* half_out, HalfKind half_kind);
// Defined only when the build compiled them (DS_CPU_ADAM_WITH_AVX2 / _AVX512); called only after
// detect_simd_level() has seen the instructions on this CPU.
void adam_chunk_avx2(const AdamCoeffs& c, float* param, const float* grad, float* exp_avg,
                     float* exp_avg_sq, int64_t n, uint16_t* half_out, HalfKind half_kind);
void adam_chunk_avx512(const AdamCoeffs& c, float* param, const float* grad, float* exp_avg,
                       float* exp_avg_sq, int64_t n, uint16_t* half_out, HalfKind half_kind);

/// The chunk kernel of `level`; throws NotSupportedError when `level` exceeds
/// detect_simd_level().
AdamChunkFn adam_chunk_fn(SimdLevel level);

/// Sizes of the driver's work split (elements). A tile is one OpenMP parallel-for; its chunks
/// are the units the threads share out. See adam_update.cpp for why these values.
inline constexpr int64_t kAdamTileNumel = int64_t{1} << 27;  // DeepSpeed's TILE
inline constexpr int64_t kAdamChunkNumel = int64_t{1} << 14;

/// adam_update() with explicit tile and chunk sizes, so that tests can cross many tile and
/// chunk boundaries with small buffers. Same checks and throws as adam_update().
void adam_update_tiled(const AdamStep& step, float* param, const float* grad, float* exp_avg,
                       float* exp_avg_sq, int64_t n, HalfCopy copy, SimdLevel level,
                       int64_t tile_numel, int64_t chunk_numel);

}  // namespace deepspeed::ops::detail
