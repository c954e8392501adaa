// FusedLamb (reference §3.3) in tensor ops; the trust ratio stays on the device.
#include <cmath>

#include <ATen/ATen.h>

#include "deepspeed/optimizers.h"
#include "runtime/optim/update_math.h"

namespace deepspeed::optim {

GroupOptions LambOptions::group() const {
  // FusedLamb's param_groups keys, in its order. max_grad_norm stays 0: DeepSpeed refuses it in
  // ds_config (gradient_clipping does that job), but Python's FusedLamb reads it in step().
  GroupOptions g;
  g.set("lr", lr).set("bias_correction", bias_correction).set("betas", betas).set("eps", eps);
  g.set("weight_decay", weight_decay).set("max_grad_norm", 0.0);
  g.set("max_coeff", max_coeff).set("min_coeff", min_coeff);
  return g;
}

Lamb::Lamb(std::vector<at::Tensor> params, LambOptions defaults, bool eps_inside_sqrt)
    : Lamb(std::vector<torch::optim::OptimizerParamGroup>{
               torch::optim::OptimizerParamGroup(std::move(params))},
           defaults, eps_inside_sqrt) {}

Lamb::Lamb(std::vector<torch::optim::OptimizerParamGroup> groups, LambOptions defaults,
           bool eps_inside_sqrt)
    : DsOptimizer(std::move(groups), defaults.group()), eps_inside_sqrt_(eps_inside_sqrt) {}

std::vector<double> Lamb::lamb_coeffs() const {
  std::vector<double> out;
  out.reserve(lamb_coeffs_.size());
  for (const auto& c : lamb_coeffs_) out.push_back(c.item<double>());
  return out;
}

void Lamb::update(const at::Tensor& param, const at::Tensor& grad, ParamState& state,
                  const GroupOptions& group) {
  const double lr = group.number("lr");
  const auto [beta1, beta2] = group.pair("betas");
  const double eps = group.number("eps");
  const double weight_decay = group.number("weight_decay");
  const double max_coeff = group.number("max_coeff");
  const double min_coeff = group.number("min_coeff");
  at::Tensor& exp_avg = state.tensor("exp_avg");
  at::Tensor& exp_avg_sq = state.tensor("exp_avg_sq");

  const auto dtype = detail::math_dtype(param);
  at::Tensor p = detail::load(param, dtype);
  at::Tensor g = detail::load(grad, dtype);
  at::Tensor m = detail::load(exp_avg, dtype);
  at::Tensor v = detail::load(exp_avg_sq, dtype);
  m.mul_(beta1).add_(g, 1.0 - beta1);
  v.mul_(beta2).addcmul_(g, g, 1.0 - beta2);
  at::Tensor denom = eps_inside_sqrt_ ? v.add(eps).sqrt_() : v.sqrt().add_(eps);
  // Moments are not bias-corrected inside u; the correction is folded into the step size.
  at::Tensor u = m / denom;
  if (weight_decay != 0.0) u.add_(p, weight_decay);

  at::Tensor w_norm = p.norm();
  at::Tensor u_norm = u.norm();
  // Matches FusedLamb: the ratio is clamped only when both norms are non-zero, else it is 1.
  at::Tensor coeff = at::where(w_norm.ne(0).logical_and(u_norm.ne(0)),
                               (w_norm / u_norm).clamp(min_coeff, max_coeff),
                               at::ones_like(w_norm));
  lamb_coeffs_.push_back(coeff);

  double step_size = lr;
  if (group.flag("bias_correction")) {
    const double bc1 = 1.0 - std::pow(beta1, state.step);
    const double bc2 = 1.0 - std::pow(beta2, state.step);
    step_size = lr * std::sqrt(bc2) / bc1;
  }
  p.sub_(u.mul_(coeff * step_size));
  detail::store(exp_avg, m);
  detail::store(exp_avg_sq, v);
  detail::store(param, p);
}

}  // namespace deepspeed::optim
