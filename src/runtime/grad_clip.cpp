// Gradient norm and clipping; the sum of squares is accumulated in double for stability.
#include "runtime/grad_clip.h"

#include <algorithm>
#include <cmath>

#include <ATen/ATen.h>

namespace deepspeed::runtime {

namespace {

// The host's fast path: contiguous fp32 on the CPU.
bool host_float(const at::Tensor& t) {
  return t.is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous();
}

// Adds t's squares into `sum` (a 0-dim double tensor where t lives, or undefined), a chunk at a
// time, without a host synchronisation. On the CPU each chunk is widened to double (no full-size
// copy). A device reduces in a tree, not serially as 1.13's CPU float sum, so there each chunk's
// fp32 norm is exact enough (DeepSpeed's own is fp32) and the chunks are summed in double: one
// read of the gradient, where widening it would write and read it twice more.
void add_squares(const at::Tensor& t, at::Tensor& sum) {
  const int64_t chunk = t.is_cpu() ? int64_t{1} << 20 : int64_t{1} << 24;
  const at::Tensor flat = t.reshape({-1});
  for (int64_t begin = 0; begin < flat.numel(); begin += chunk) {
    const at::Tensor c = flat.narrow(0, begin, std::min(chunk, flat.numel() - begin));
    at::Tensor squares;
    if (t.is_cpu()) {
      const at::Tensor wide = c.to(at::kDouble);
      squares = wide.dot(wide);
    } else {
      const at::Tensor norm =
          at::linalg_vector_norm(c, 2, at::OptionalIntArrayRef(), false, at::kFloat);
      squares = norm.to(at::kDouble).square();
    }
    sum = sum.defined() ? sum + squares : squares;
  }
}

}  // namespace

double squared_l2_norm(const at::Tensor& t) {
  if (t.numel() == 0) return 0.0;
  if (host_float(t)) {
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
  // Other dtypes and devices: summed where the tensor lives, one synchronisation at the end.
  at::Tensor sum;
  add_squares(t, sum);
  return sum.item<double>();
}

double squared_l2_norm(const std::vector<at::Tensor>& tensors) {
  double host = 0.0;
  at::Tensor device;  // device tensors' sum; the host's other tensors go into `host` as before
  for (const auto& t : tensors) {
    if (!t.defined() || t.numel() == 0) continue;
    if (t.is_cpu()) {
      host += squared_l2_norm(t);
    } else {
      add_squares(t, device);
    }
  }
  return device.defined() ? host + device.item<double>() : host;
}

double sum_over_group(double value, const comm::Group& group) {
  at::Tensor t = at::full({1}, value, at::TensorOptions().dtype(at::kDouble));
  comm::all_reduce(t, comm::ReduceOp::kSum, false, group);
  return t.item<double>();
}

double global_grad_norm(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> grads;
  for (const auto& p : params) grads.push_back(p.grad());
  return std::sqrt(squared_l2_norm(grads));
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
