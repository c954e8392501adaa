// Which CPU-Adam path runs: what the processor supports (CPUID, via the compiler's
// __builtin_cpu_supports, which also checks that the OS saves the AVX/AVX-512 registers), what
// this build compiled, and the DS_CPU_ADAM_SIMD override. Compiled for the baseline ISA, like
// everything that runs before the check.
#include <cctype>
#include <cstdlib>
#include <string>

#include "ops/cpu_adam/cpu_adam.h"
#include "ops/cpu_adam/kernel.h"
#include "util/check.h"

namespace deepspeed::ops {
namespace {

// Environment variable that lowers the path (docs/cpu_adam.md, docs/env.md). Read here rather
// than through util/env.cpp because this library must not depend on the deepspeed library.
constexpr const char* kSimdEnvVar = "DS_CPU_ADAM_SIMD";

SimdLevel probe_simd_level() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                    __builtin_cpu_supports("f16c");
#if defined(DS_CPU_ADAM_WITH_AVX512)
  // The AVX-512 file may also use AVX2/FMA/F16C instructions, hence `avx2 &&`.
  if (avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl")) {
    return SimdLevel::kAvx512;
  }
#endif
#if defined(DS_CPU_ADAM_WITH_AVX2)
  if (avx2) return SimdLevel::kAvx2;
#endif
  (void)avx2;
#endif
  return SimdLevel::kScalar;
}

SimdLevel parse_simd_env(const std::string& raw) {
  std::string value;
  for (char ch : raw) value += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (value == "scalar") return SimdLevel::kScalar;
  if (value == "avx2") return SimdLevel::kAvx2;
  if (value == "avx512") return SimdLevel::kAvx512;
  throw ConfigError(::deepspeed::detail::str_cat("environment variable ", kSimdEnvVar, "='", raw,
                                    "': expected scalar, avx2 or avx512 (or unset for the best "
                                    "path this CPU supports)"));
}

}  // namespace

SimdLevel detect_simd_level() {
  static const SimdLevel level = probe_simd_level();
  return level;
}

SimdLevel default_simd_level() {
  const SimdLevel detected = detect_simd_level();
  // Read on every call (a getenv is cheap next to an update) so that a test or a tool can change
  // the override at run time.
  const char* raw = std::getenv(kSimdEnvVar);
  if (raw == nullptr || *raw == '\0') return detected;
  const SimdLevel requested = parse_simd_env(raw);
  // Lowered, never raised: asking for AVX-512 on an AVX2 machine runs AVX2.
  return requested < detected ? requested : detected;
}

const char* simd_level_name(SimdLevel level) {
  switch (level) {
    case SimdLevel::kScalar:
      return "scalar";
    case SimdLevel::kAvx2:
      return "avx2";
    case SimdLevel::kAvx512:
      return "avx512";
  }
  return "unknown";
}

namespace detail {

AdamChunkFn adam_chunk_fn(SimdLevel level) {
  DS_CHECK(level <= detect_simd_level(), NotSupportedError, "cpu_adam: the ",
           simd_level_name(level), " path was requested, but this CPU and build support at most ",
           simd_level_name(detect_simd_level()), "; use a lower SimdLevel");
  switch (level) {
    case SimdLevel::kAvx512:
#if defined(DS_CPU_ADAM_WITH_AVX512)
      return adam_chunk_avx512;
#else
      break;
#endif
    case SimdLevel::kAvx2:
#if defined(DS_CPU_ADAM_WITH_AVX2)
      return adam_chunk_avx2;
#else
      break;
#endif
    case SimdLevel::kScalar:
      return adam_chunk_scalar;
  }
  DS_INTERNAL_ASSERT(false, "cpu_adam: no kernel compiled for ", simd_level_name(level));
}

}  // namespace detail
}  // namespace deepspeed::ops
