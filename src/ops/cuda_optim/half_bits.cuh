// bf16/fp16 bit patterns of an fp32 value on the device, rounded exactly as CPU-Adam's copy-out
// (ops/cpu_adam/scalar.cpp): to nearest even, overflow to infinity, fp16 subnormals kept. The
// hardware conversions (cvt.rn) round finite values and infinities that way; NaN is handled here
// because cvt gives one canonical NaN while CPU-Adam writes 0x7FC0 for bf16 and keeps the sign
// and the payload's top bits for fp16 (as x86's vcvtps2ph does).
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace deepspeed::ops::cuda_detail {

__device__ __forceinline__ uint16_t bf16_bits(float x) {
  const uint32_t bits = __float_as_uint(x);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;
  return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}

__device__ __forceinline__ uint16_t fp16_bits(float x) {
  const uint32_t bits = __float_as_uint(x);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) {
    return static_cast<uint16_t>(((bits >> 16) & 0x8000u) | 0x7E00u | ((bits >> 13) & 0x3FFu));
  }
  return __half_as_ushort(__float2half_rn(x));
}

}  // namespace deepspeed::ops::cuda_detail
