// Gradient norm and clipping; the sum of squares is accumulated in double for stability.
#include "runtime/grad_clip.h"

#include <cmath>

#include <ATen/ATen.h>

namespace deepspeed::runtime {

double global_grad_norm(const std::vector<at::Tensor>& params) {
  double sum_sq = 0.0;
  for (const auto& p : params) {
    const at::Tensor& g = p.grad();
    if (!g.defined()) continue;
    double n = g.norm().item<double>();
    sum_sq += n * n;
  }
  return std::sqrt(sum_sq);
}

double clip_coefficient(double norm, double max_norm) {
  if (max_norm <= 0.0) return 1.0;
  const double coef = max_norm / (norm + 1e-6);
  return coef < 1.0 ? coef : 1.0;
}

double clip_grads_by_norm(const std::vector<at::Tensor>& params, double norm, double max_norm) {
  if (max_norm <= 0.0) return 1.0;
  double coef = max_norm / (norm + 1e-6);
  if (coef >= 1.0) return 1.0;
  for (const auto& p : params) {
    at::Tensor g = p.grad();
    if (g.defined()) g.mul_(coef);
  }
  return coef;
}

}  // namespace deepspeed::runtime
