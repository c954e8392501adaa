// CPU-Adam on AVX-512 (F, BW, VL): 16 floats per register, unaligned loads and stores. Compiled
// with -mavx512f -mavx512bw -mavx512vl (src/ops/CMakeLists.txt) and called only when the CPU and
// the OS support them; intrinsics only, see Note [ISA files] in kernel_impl.h.
#include <immintrin.h>

#include <cstdint>

#include "ops/cpu_adam/kernel.h"
#include "ops/cpu_adam/kernel_impl.h"

namespace deepspeed::ops::detail {
namespace {

struct Avx512Vec {
  using Reg = __m512;
  static constexpr int64_t kWidth = 16;
  static __m512 load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, __m512 x) { _mm512_storeu_ps(p, x); }
  static __m512 set1(float x) { return _mm512_set1_ps(x); }
  static __m512 mul(__m512 a, __m512 b) { return _mm512_mul_ps(a, b); }
  static __m512 fma(__m512 a, __m512 b, __m512 c) { return _mm512_fmadd_ps(a, b, c); }
  static __m512 sqrt(__m512 x) { return _mm512_sqrt_ps(x); }
  static __m512 div(__m512 a, __m512 b) { return _mm512_div_ps(a, b); }

  // Same rounding as float_to_bf16 in scalar.cpp; vpmovdw narrows the lanes (each <= 0xFFFF).
  static void store_bf16(uint16_t* p, __m512 x) {
    const __m512i bits = _mm512_castps_si512(x);
    const __m512i lowest_kept = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    const __m512i bias = _mm512_add_epi32(lowest_kept, _mm512_set1_epi32(0x7FFF));
    __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, bias), 16);
    const __mmask16 is_nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    rounded = _mm512_mask_mov_epi32(rounded, is_nan, _mm512_set1_epi32(0x7FC0));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(rounded));
  }
  static void store_fp16(uint16_t* p, __m512 x) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
};

}  // namespace

void adam_chunk_avx512(const AdamCoeffs& c, float* param, const float* grad, float* exp_avg,
                       float* exp_avg_sq, int64_t n, uint16_t* half_out, HalfKind half_kind) {
  const int64_t done =
      adam_vector_dispatch<Avx512Vec>(c, param, grad, exp_avg, exp_avg_sq, n, half_out, half_kind);
  if (done < n) {
    adam_chunk_scalar(c, param + done, grad + done, exp_avg + done, exp_avg_sq + done, n - done,
                      half_out != nullptr ? half_out + done : nullptr, half_kind);
  }
}

}  // namespace deepspeed::ops::detail
