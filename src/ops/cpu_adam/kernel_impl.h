// The CPU-Adam element loop, written once over a vector type V and instantiated by each
// instruction-set file (scalar.cpp, avx2.cpp, avx512.cpp) with its own V. Include only from
// those files, and only with a V declared in an anonymous namespace: see Note [ISA files].
//
// V provides: `using Reg`, `kWidth` (floats per Reg), and static load/store/set1/mul/fma/sqrt/div
// plus store_bf16/store_fp16 (round to nearest even; bf16 NaN -> 0x7FC0; fp16 as F16C does).
#pragma once

#include <cstdint>

#include "ops/cpu_adam/kernel.h"

// Note [ISA files]
// avx2.cpp and avx512.cpp are compiled with -mavx2/-mavx512f..., so any code they emit may use
// those instructions. An inline function or template instantiation with external linkage that
// such a file emits (std::min, std::fma, a shared helper...) is merged by the linker with the
// portable copies of other files, and the portable path could end up calling the AVX copy on a
// CPU without AVX. So those files use intrinsics only, keep their types in an anonymous
// namespace (which gives every instantiation of this template internal linkage), and hand their
// tail to the portable adam_chunk_scalar() instead of instantiating a scalar loop themselves.

namespace deepspeed::ops::detail {

template <DecayMode kMode>
struct DecayTag {
  static constexpr DecayMode value = kMode;
};

/// Updates elements [0, n - n % V::kWidth) and returns how many it did; the caller finishes the
/// tail. See Note [Identical arithmetic on every path] for the operation order.
template <class V, DecayMode kDecay, HalfKind kHalf>
int64_t adam_vector_body(const AdamCoeffs& c, float* param, const float* grad, float* exp_avg,
                         float* exp_avg_sq, int64_t n, uint16_t* half_out) {
  using Reg = typename V::Reg;
  const Reg beta1 = V::set1(c.beta1);
  const Reg one_minus_beta1 = V::set1(c.one_minus_beta1);
  const Reg beta2 = V::set1(c.beta2);
  const Reg one_minus_beta2 = V::set1(c.one_minus_beta2);
  const Reg eps = V::set1(c.eps);
  const Reg bias_correction2_inv_sqrt = V::set1(c.bias_correction2_inv_sqrt);
  const Reg step_size = V::set1(c.step_size);
  const Reg decay = V::set1(c.decay);
  const Reg grad_scale = V::set1(c.grad_scale);

  const int64_t n_body = n - n % V::kWidth;
  for (int64_t i = 0; i < n_body; i += V::kWidth) {
    Reg g = V::mul(V::load(grad + i), grad_scale);
    Reg p = V::load(param + i);
    Reg m = V::load(exp_avg + i);
    Reg v = V::load(exp_avg_sq + i);
    if constexpr (kDecay == DecayMode::kL2) g = V::fma(p, decay, g);
    m = V::fma(g, one_minus_beta1, V::mul(m, beta1));
    v = V::fma(V::mul(g, g), one_minus_beta2, V::mul(v, beta2));
    const Reg denom = V::fma(V::sqrt(v), bias_correction2_inv_sqrt, eps);
    if constexpr (kDecay == DecayMode::kDecoupled) p = V::fma(p, decay, p);
    p = V::fma(V::div(m, denom), step_size, p);
    V::store(param + i, p);
    V::store(exp_avg + i, m);
    V::store(exp_avg_sq + i, v);
    if constexpr (kHalf == HalfKind::kBF16) V::store_bf16(half_out + i, p);
    if constexpr (kHalf == HalfKind::kFP16) V::store_fp16(half_out + i, p);
  }
  return n_body;
}

/// Picks the instantiation for the runtime decay mode and half kind (hoisted out of the loop).
template <class V>
int64_t adam_vector_dispatch(const AdamCoeffs& c, float* param, const float* grad,
                             float* exp_avg, float* exp_avg_sq, int64_t n, uint16_t* half_out,
                             HalfKind half_kind) {
  auto with_decay = [&](auto decay_tag) -> int64_t {
    constexpr DecayMode kDecay = decltype(decay_tag)::value;
    switch (half_kind) {
      case HalfKind::kBF16:
        return adam_vector_body<V, kDecay, HalfKind::kBF16>(c, param, grad, exp_avg, exp_avg_sq,
                                                            n, half_out);
      case HalfKind::kFP16:
        return adam_vector_body<V, kDecay, HalfKind::kFP16>(c, param, grad, exp_avg, exp_avg_sq,
                                                            n, half_out);
      case HalfKind::kNone:
        break;
    }
    return adam_vector_body<V, kDecay, HalfKind::kNone>(c, param, grad, exp_avg, exp_avg_sq, n,
                                                        half_out);
  };
  switch (c.decay_mode) {
    case DecayMode::kL2:
      return with_decay(DecayTag<DecayMode::kL2>{});
    case DecayMode::kDecoupled:
      return with_decay(DecayTag<DecayMode::kDecoupled>{});
    case DecayMode::kNone:
      break;
  }
  return with_decay(DecayTag<DecayMode::kNone>{});
}

}  // namespace deepspeed::ops::detail
