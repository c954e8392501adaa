// CPU-Adam on AVX2 + FMA + F16C: 8 floats per register, unaligned loads and stores. Compiled
// with -mavx2 -mfma -mf16c (src/ops/CMakeLists.txt) and called only when the CPU has all three;
// intrinsics only, see Note [ISA files] in kernel_impl.h.
#include <immintrin.h>

#include <cstdint>

#include "ops/cpu_adam/kernel.h"
#include "ops/cpu_adam/kernel_impl.h"

namespace deepspeed::ops::detail {
namespace {

struct Avx2Vec {
  using Reg = __m256;
  static constexpr int64_t kWidth = 8;
  static __m256 load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, __m256 x) { _mm256_storeu_ps(p, x); }
  static __m256 set1(float x) { return _mm256_set1_ps(x); }
  static __m256 mul(__m256 a, __m256 b) { return _mm256_mul_ps(a, b); }
  static __m256 fma(__m256 a, __m256 b, __m256 c) { return _mm256_fmadd_ps(a, b, c); }
  static __m256 sqrt(__m256 x) { return _mm256_sqrt_ps(x); }
  static __m256 div(__m256 a, __m256 b) { return _mm256_div_ps(a, b); }

  // Round to nearest even on the dropped 16 bits (as float_to_bf16 in scalar.cpp), NaN -> 0x7FC0,
  // then narrow the 32-bit lanes (each now <= 0xFFFF) to 16 bits.
  static void store_bf16(uint16_t* p, __m256 x) {
    const __m256i bits = _mm256_castps_si256(x);
    const __m256i lowest_kept = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    const __m256i bias = _mm256_add_epi32(lowest_kept, _mm256_set1_epi32(0x7FFF));
    __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, bias), 16);
    const __m256 is_nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    rounded = _mm256_blendv_epi8(rounded, _mm256_set1_epi32(0x7FC0), _mm256_castps_si256(is_nan));
    const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(rounded),
                                            _mm256_extracti128_si256(rounded, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
  }
  static void store_fp16(uint16_t* p, __m256 x) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
};

}  // namespace

void adam_chunk_avx2(const AdamCoeffs& c, float* param, const float* grad, float* exp_avg,
                     float* exp_avg_sq, int64_t n, uint16_t* half_out, HalfKind half_kind) {
  const int64_t done =
      adam_vector_dispatch<Avx2Vec>(c, param, grad, exp_avg, exp_avg_sq, n, half_out, half_kind);
  if (done < n) {
    adam_chunk_scalar(c, param + done, grad + done, exp_avg + done, exp_avg_sq + done, n - done,
                      half_out != nullptr ? half_out + done : nullptr, half_kind);
  }
}

}  // namespace deepspeed::ops::detail
