// DeepSpeed's Adam/AdamW (reference §3.2): the fused CPU-Adam kernel for fp32 CPU tensors, the
// same formula in tensor ops elsewhere.
#include <cmath>

#include <ATen/ATen.h>

#include "deepspeed/optimizers.h"
#include "ops/cpu_adam/cpu_adam.h"
#include "runtime/optim/update_math.h"

namespace deepspeed::optim {
namespace {

bool fits_cpu_adam(const at::Tensor& t) {
  return t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous();
}

}  // namespace

GroupOptions AdamOptions::group() const {
  // FusedAdam's param_groups keys, in its order.
  GroupOptions g;
  g.set("lr", lr).set("bias_correction", bias_correction).set("betas", betas).set("eps", eps);
  g.set("weight_decay", weight_decay);
  return g;
}

Adam::Adam(std::vector<at::Tensor> params, AdamOptions defaults, bool adam_w_mode)
    : Adam(std::vector<torch::optim::OptimizerParamGroup>{
               torch::optim::OptimizerParamGroup(std::move(params))},
           defaults, adam_w_mode) {}

Adam::Adam(std::vector<torch::optim::OptimizerParamGroup> groups, AdamOptions defaults,
           bool adam_w_mode)
    : DsOptimizer(std::move(groups), defaults.group()), adam_w_mode_(adam_w_mode) {}

void Adam::update(const at::Tensor& param, const at::Tensor& grad, ParamState& state,
                  const GroupOptions& group) {
  const double lr = group.number("lr");
  const auto [beta1, beta2] = group.pair("betas");
  const double eps = group.number("eps");
  const double weight_decay = group.number("weight_decay");
  const bool bias_correction = group.flag("bias_correction");
  at::Tensor& exp_avg = state.tensor("exp_avg");
  at::Tensor& exp_avg_sq = state.tensor("exp_avg_sq");

  if (fits_cpu_adam(param) && fits_cpu_adam(grad) && fits_cpu_adam(exp_avg) &&
      fits_cpu_adam(exp_avg_sq)) {
    ops::AdamStep s;
    s.lr = static_cast<float>(lr);
    s.beta1 = static_cast<float>(beta1);
    s.beta2 = static_cast<float>(beta2);
    s.eps = static_cast<float>(eps);
    s.weight_decay = static_cast<float>(weight_decay);
    s.adamw_mode = adam_w_mode_;
    s.bias_correction = bias_correction;
    s.step = state.step;
    ops::adam_update(s, param.data_ptr<float>(), grad.data_ptr<float>(), exp_avg.data_ptr<float>(),
                     exp_avg_sq.data_ptr<float>(), param.numel());
    return;
  }

  // The CPU-Adam formulation of the same update: denom = sqrt(v)/sqrt(bc2) + eps,
  // p -= lr*wd*p (AdamW), p -= (lr/bc1) * m/denom.
  const auto dtype = detail::math_dtype(param);
  at::Tensor p = detail::load(param, dtype);
  at::Tensor g = detail::load(grad, dtype);
  at::Tensor m = detail::load(exp_avg, dtype);
  at::Tensor v = detail::load(exp_avg_sq, dtype);
  const double bc1 = bias_correction ? 1.0 - std::pow(beta1, state.step) : 1.0;
  const double bc2 = bias_correction ? 1.0 - std::pow(beta2, state.step) : 1.0;
  if (!adam_w_mode_ && weight_decay != 0.0) g = g.add(p, weight_decay);
  m.mul_(beta1).add_(g, 1.0 - beta1);
  v.mul_(beta2).addcmul_(g, g, 1.0 - beta2);
  at::Tensor denom = v.sqrt().mul_(1.0 / std::sqrt(bc2)).add_(eps);
  if (adam_w_mode_ && weight_decay != 0.0) p.mul_(1.0 - lr * weight_decay);
  p.addcdiv_(m, denom, -lr / bc1);
  detail::store(exp_avg, m);
  detail::store(exp_avg_sq, v);
  detail::store(param, p);
}

}  // namespace deepspeed::optim
