// FusedLion (reference §3.4) in tensor ops.
#include <ATen/ATen.h>

#include "deepspeed/optimizers.h"
#include "runtime/optim/update_math.h"

namespace deepspeed::optim {

GroupOptions LionOptions::group() const {
  GroupOptions g;
  g.set("lr", lr).set("betas", betas).set("weight_decay", weight_decay);
  return g;
}

Lion::Lion(std::vector<at::Tensor> params, LionOptions defaults)
    : Lion(std::vector<torch::optim::OptimizerParamGroup>{
               torch::optim::OptimizerParamGroup(std::move(params))},
           defaults) {}

Lion::Lion(std::vector<torch::optim::OptimizerParamGroup> groups, LionOptions defaults)
    : DsOptimizer(std::move(groups), defaults.group()) {}

void Lion::update(const at::Tensor& param, const at::Tensor& grad, ParamState& state,
                  const GroupOptions& group) {
  const double lr = group.number("lr");
  const auto [beta1, beta2] = group.pair("betas");
  const double weight_decay = group.number("weight_decay");
  at::Tensor& exp_avg = state.tensor("exp_avg");

  const auto dtype = detail::math_dtype(param);
  at::Tensor p = detail::load(param, dtype);
  at::Tensor g = detail::load(grad, dtype);
  at::Tensor m = detail::load(exp_avg, dtype);
  at::Tensor c = m.mul(beta1).add_(g, 1.0 - beta1);
  // FusedLion's kernel: -lr where c > 0, +lr otherwise (c == 0 included).
  at::Tensor direction = c.gt(0).to(dtype).mul_(2.0).sub_(1.0);
  p.mul_(1.0 - lr * weight_decay).sub_(direction, lr);
  m.mul_(beta2).add_(g, 1.0 - beta2);
  detail::store(exp_avg, m);
  detail::store(param, p);
}

}  // namespace deepspeed::optim
