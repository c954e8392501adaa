// Gradient norm and clipping; the sum of squares is accumulated in double for stability.
#include "runtime/grad_clip.h"

#include <algorithm>
#include <cmath>

#include <ATen/ATen.h>

namespace deepspeed::runtime {

double squared_l2_norm(const at::Tensor& t) {
  if (t.numel() == 0) return 0.0;
  if (t.is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous()) {
    // Four double accumulators: the compiler vectorizes the widening multiply-add.
    const float* x = t.data_ptr<float>();
    const int64_t n = t.numel();
    double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
      s0 += static_cast<double>(x[i]) * x[i];
      s1 += static_cast<double>(x[i + 1]) * x[i + 1];
      s2 += static_cast<double>(x[i + 2]) * x[i + 2];
      s3 += static_cast<double>(x[i + 3]) * x[i + 3];
    }
    for (; i < n; ++i) s0 += static_cast<double>(x[i]) * x[i];
    return (s0 + s1) + (s2 + s3);
  }
  // Other dtypes and devices: in double, a chunk at a time (no full-size copy).
  constexpr int64_t kChunk = int64_t{1} << 20;
  const at::Tensor flat = t.reshape({-1});
  double sum = 0.0;
  for (int64_t begin = 0; begin < flat.numel(); begin += kChunk) {
    at::Tensor c = flat.narrow(0, begin, std::min(kChunk, flat.numel() - begin)).to(at::kDouble);
    sum += c.dot(c).item<double>();
  }
  return sum;
}

double sum_over_group(double value, const comm::Group& group) {
  at::Tensor t = at::full({1}, value, at::TensorOptions().dtype(at::kDouble));
  comm::all_reduce(t, comm::ReduceOp::kSum, false, group);
  return t.item<double>();
}

double global_grad_norm(const std::vector<at::Tensor>& params) {
  double sum_sq = 0.0;
  for (const auto& p : params) {
    const at::Tensor& g = p.grad();
    if (g.defined()) sum_sq += squared_l2_norm(g);
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
