// The schedule DeepSpeed's CurriculumScheduler (fixed_root, fixed_linear) and RandomLTDScheduler
// (fixed_linear) share: a value rising from `lo` to `hi` over `total_steps` steps as the
// root_degree-th root of the progress, in multiples of `step`. Computed as DeepSpeed computes it:
// a double for the progress, Python's floor division and modulo for the rest.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace deepspeed::data_pipeline {

// Python's // and % for a positive divisor: rounded towards minus infinity.
inline int64_t floor_div(int64_t a, int64_t b) { return a / b - ((a % b != 0 && a < 0) ? 1 : 0); }
inline int64_t floor_mod(int64_t a, int64_t b) { return a - floor_div(a, b) * b; }

/// floor((t / total_steps)^(1 / root_degree) * (hi - lo) + lo), rounded down to a multiple of
/// `step` but not below the first multiple at or above `lo` (DeepSpeed's later releases: the
/// rounding alone gives 0 at first for, e.g., lo 8 and step 16), and at most `hi`.
inline int64_t fixed_root_value(int64_t global_steps, int64_t total_steps, double root_degree,
                                int64_t lo, int64_t hi, int64_t step) {
  const double progress = std::pow(
      static_cast<double>(global_steps) / static_cast<double>(total_steps), 1.0 / root_degree);
  int64_t next = static_cast<int64_t>(
      std::floor(progress * static_cast<double>(hi - lo) + static_cast<double>(lo)));
  next -= floor_mod(next, step);
  next = std::max(next, -floor_div(-lo, step) * step);
  return std::min(next, hi);
}

}  // namespace deepspeed::data_pipeline
