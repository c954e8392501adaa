// See baselines.h. Compiled with -O3 -march=native -fno-math-errno and OpenMP
// (bench/cpu_adam/CMakeLists.txt): -fno-math-errno lets GCC vectorize std::sqrt.
#include "baselines.h"

#include <cmath>

namespace deepspeed::bench {

void stream_triad(float* a, const float* b, const float* c, float scalar, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) a[i] = b[i] + scalar * c[i];
}

void fused_adamw_loop(const FusedAdamwStep& s, float* param, const float* grad, float* exp_avg,
                      float* exp_avg_sq, int64_t n) {
  const float bias_correction1 = 1.0f - std::pow(s.beta1, static_cast<float>(s.step));
  const float bias_correction2 = 1.0f - std::pow(s.beta2, static_cast<float>(s.step));
  const float step_size = s.lr / bias_correction1;
  const float inv_sqrt_bc2 = 1.0f / std::sqrt(bias_correction2);
  const float keep = 1.0f - s.lr * s.weight_decay;
  const float beta1 = s.beta1, beta2 = s.beta2, eps = s.eps;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i];
    const float m = beta1 * exp_avg[i] + (1.0f - beta1) * g;
    const float v = beta2 * exp_avg_sq[i] + (1.0f - beta2) * g * g;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    param[i] = param[i] * keep - step_size * m / (std::sqrt(v) * inv_sqrt_bc2 + eps);
  }
}

}  // namespace deepspeed::bench
