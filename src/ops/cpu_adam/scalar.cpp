// The portable CPU-Adam kernel: one element at a time, plain C++ (compiled for the baseline
// ISA). It is the fallback path and also finishes the tails that the vector paths leave, so its
// results must equal theirs bit for bit (Note [Identical arithmetic on every path]): it uses
// std::fma wherever they use an FMA instruction, and software half conversions that round
// exactly as the hardware ones do.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "ops/cpu_adam/kernel.h"
#include "ops/cpu_adam/kernel_impl.h"

namespace deepspeed::ops::detail {
namespace {

uint32_t float_bits(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return bits;
}

// bf16 = the high half of the fp32 pattern, rounded to nearest even on the 16 dropped bits.
// Adding 0x7FFF plus the lowest kept bit carries into the kept half exactly when the dropped
// part is above one half, or equal to it with an odd kept half; it also rounds to infinity
// correctly. NaN would be corrupted by the carry, so it maps to DeepSpeed's canonical 0x7FC0.
uint16_t float_to_bf16(float x) {
  const uint32_t bits = float_bits(x);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;
  return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

// IEEE binary16, round to nearest even, as x86's vcvtps2ph does: overflow gives infinity, tiny
// values give subnormals, and NaN stays NaN with the quiet bit set and the payload's top bits.
uint16_t float_to_fp16(float x) {
  const uint32_t bits = float_bits(x);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  uint32_t abs_bits = bits & 0x7FFFFFFFu;
  if (abs_bits > 0x7F800000u) {
    return static_cast<uint16_t>(sign | 0x7E00u | ((abs_bits >> 13) & 0x3FFu));
  }
  // 65520 is halfway between 65504 (the largest half) and 65536; its tie goes to the even
  // neighbour, infinity.
  if (abs_bits >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);
  if (abs_bits >= 0x38800000u) {  // >= 2^-14: a normal half
    abs_bits += 0xFFFu + ((abs_bits >> 13) & 1u);  // round the 13 dropped mantissa bits
    abs_bits -= (127u - 15u) << 23;                // re-bias the exponent
    return static_cast<uint16_t>(sign | (abs_bits >> 13));
  }
  // Subnormal half: count units of 2^-24. The fp32 value is mantissa * 2^(exponent - 150),
  // that is mantissa >> (126 - exponent) units. Below 2^-25 (exponent < 102) it rounds to 0.
  const uint32_t exponent = abs_bits >> 23;
  if (exponent < 102) return sign;
  const uint32_t mantissa = (abs_bits & 0x7FFFFFu) | 0x800000u;
  const uint32_t shift = 126 - exponent;  // 14..24
  uint32_t units = mantissa >> shift;
  const uint32_t rest = mantissa & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  if (rest > half || (rest == half && (units & 1u))) ++units;  // may carry into 2^-14: correct
  return static_cast<uint16_t>(sign | units);
}

struct ScalarVec {
  using Reg = float;
  static constexpr int64_t kWidth = 1;
  static float load(const float* p) { return *p; }
  static void store(float* p, float x) { *p = x; }
  static float set1(float x) { return x; }
  static float mul(float a, float b) { return a * b; }
  static float fma(float a, float b, float c) { return std::fma(a, b, c); }
  static float sqrt(float x) { return std::sqrt(x); }
  static float div(float a, float b) { return a / b; }
  static void store_bf16(uint16_t* p, float x) { *p = float_to_bf16(x); }
  static void store_fp16(uint16_t* p, float x) { *p = float_to_fp16(x); }
};

}  // namespace

void adam_chunk_scalar(const AdamCoeffs& c, float* param, const float* grad, float* exp_avg,
                       float* exp_avg_sq, int64_t n, uint16_t* half_out, HalfKind half_kind) {
  adam_vector_dispatch<ScalarVec>(c, param, grad, exp_avg, exp_avg_sq, n, half_out, half_kind);
}

}  // namespace deepspeed::ops::detail
