// Shared pieces of the CPU-Adam tests: buffers at a chosen misalignment with guard zones, the
// list of paths with a loud skip for those the CPU lacks, and deterministic inputs.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ops/cpu_adam/cpu_adam.h"

namespace deepspeed::ops::testing {

inline constexpr SimdLevel kAllLevels[] = {SimdLevel::kScalar, SimdLevel::kAvx2,
                                           SimdLevel::kAvx512};

/// Skips (loudly) a test of a path this CPU or build cannot run.
#define DS_SKIP_UNLESS_CPU_HAS(level)                                                         \
  do {                                                                                       \
    if ((level) > ::deepspeed::ops::detect_simd_level()) {                                   \
      GTEST_SKIP() << "SKIPPED: this CPU/build has no " << simd_level_name(level)            \
                   << " (best path: " << simd_level_name(::deepspeed::ops::detect_simd_level()) \
                   << "); the " << simd_level_name(level) << " kernel is NOT tested here";    \
    }                                                                                        \
  } while (0)

/// n floats (or uint16_t) starting `offset_elems` past a 64-byte boundary, with guard zones of
/// a recognisable pattern on both sides so that a write outside [0, n) is caught.
template <typename T>
class GuardedBuffer {
 public:
  static constexpr int64_t kGuard = 32;

  GuardedBuffer(int64_t n, int offset_elems) : n_(n) {
    storage_.resize(static_cast<size_t>(n + 2 * kGuard + 64 / sizeof(T) + offset_elems));
    auto addr = reinterpret_cast<uintptr_t>(storage_.data() + kGuard);
    const int64_t to_boundary = static_cast<int64_t>((64 - addr % 64) % 64) / sizeof(T);
    begin_ = kGuard + to_boundary + offset_elems;
    for (auto& x : storage_) std::memset(&x, kGuardByte, sizeof(T));
  }
  T* data() { return storage_.data() + begin_; }
  const T* data() const { return storage_.data() + begin_; }
  T& operator[](int64_t i) { return data()[i]; }
  int64_t size() const { return n_; }
  std::vector<T> values() const { return std::vector<T>(data(), data() + n_); }
  bool guards_intact() const {
    const auto* bytes = reinterpret_cast<const unsigned char*>(storage_.data());
    const size_t lo = static_cast<size_t>(begin_) * sizeof(T);
    const size_t hi = static_cast<size_t>(begin_ + n_) * sizeof(T);
    for (size_t b = 0; b < storage_.size() * sizeof(T); ++b) {
      if ((b < lo || b >= hi) && bytes[b] != kGuardByte) return false;
    }
    return true;
  }

 private:
  static constexpr unsigned char kGuardByte = 0xA5;
  std::vector<T> storage_;
  int64_t begin_ = 0;
  int64_t n_ = 0;
};

/// The four Adam buffers of n elements, plus room for a half copy.
struct AdamBuffers {
  AdamBuffers(int64_t n, int offset_elems)
      : param(n, offset_elems), grad(n, offset_elems), exp_avg(n, offset_elems),
        exp_avg_sq(n, offset_elems), half(n, offset_elems) {}
  GuardedBuffer<float> param, grad, exp_avg, exp_avg_sq;
  GuardedBuffer<uint16_t> half;
  bool guards_intact() const {
    return param.guards_intact() && grad.guards_intact() && exp_avg.guards_intact() &&
           exp_avg_sq.guards_intact() && half.guards_intact();
  }
};

/// Parameters in [-1, 1]; zero moments, as a fresh optimizer has.
inline void fill_initial_state(AdamBuffers& b, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  for (int64_t i = 0; i < b.param.size(); ++i) {
    b.param[i] = unit(rng);
    b.exp_avg[i] = 0.0f;
    b.exp_avg_sq[i] = 0.0f;
  }
}

/// Gradients spanning five decades, with some exact zeros.
inline void fill_gradient(AdamBuffers& b, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::uniform_real_distribution<float> decade(-4.0f, 1.0f);
  for (int64_t i = 0; i < b.grad.size(); ++i) {
    b.grad[i] = (i % 97 == 5) ? 0.0f : unit(rng) * std::pow(10.0f, decade(rng));
  }
}

/// Reference fp32 -> bf16: the nearer of the two bf16 neighbours by exact distance, ties to the
/// even pattern; NaN -> 0x7FC0 (DeepSpeed's canonical NaN). Independent of the kernels' bit trick.
inline uint16_t reference_bf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  if (std::isnan(x)) return 0x7FC0;
  if (std::isinf(x)) return static_cast<uint16_t>(bits >> 16);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t below = (bits & 0x7FFFFFFFu) >> 16;  // truncation toward zero
  auto magnitude = [](uint32_t pattern) -> double {
    if (pattern == 0x7F80u) return std::ldexp(1.0, 128);  // infinity sits one step above max
    const uint32_t widened = pattern << 16;
    float f;
    std::memcpy(&f, &widened, sizeof f);
    return f;
  };
  const double a = std::fabs(static_cast<double>(x));
  const double down = a - magnitude(below);
  const double up = magnitude(below + 1) - a;
  const bool round_up = up < down || (up == down && (below & 1u));
  return static_cast<uint16_t>(sign | (below + (round_up ? 1u : 0u)));
}

/// Reference fp32 -> IEEE fp16: the nearest of all 31,745 non-negative halves (found by search
/// in a decoded table, with infinity placed at 65536, one step above 65504), ties to the even
/// pattern. NaN keeps its sign and the top 10 payload bits with the quiet bit set, as x86's
/// vcvtps2ph documents.
inline uint16_t reference_fp16(float x) {
  static const std::vector<double> table = [] {
    std::vector<double> t(0x7C01);
    for (uint32_t k = 0; k < 0x7C00; ++k) {
      const uint32_t exponent = k >> 10, mantissa = k & 0x3FFu;
      t[k] = exponent == 0 ? std::ldexp(mantissa, -24) : std::ldexp(1024 + mantissa, exponent - 25);
    }
    t[0x7C00] = 65536.0;
    return t;
  }();
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  if (std::isnan(x)) return static_cast<uint16_t>(sign | 0x7E00u | ((bits >> 13) & 0x3FFu));
  const double a = std::fabs(static_cast<double>(x));
  if (a >= 65536.0) return static_cast<uint16_t>(sign | 0x7C00u);
  // The last table entry <= a.
  const uint32_t below = static_cast<uint32_t>(
      std::upper_bound(table.begin(), table.end(), a) - table.begin() - 1);
  const double down = a - table[below];
  const double up = table[below + 1] - a;
  const bool round_up = up < down || (up == down && (below & 1u));
  return static_cast<uint16_t>(sign | (below + (round_up ? 1u : 0u)));
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace deepspeed::ops::testing
