// Adagrad: torch.optim.Adagrad's update, or DeepSpeedCPUAdagrad's (reference §3.5), which the
// factory selects with offload_optimizer as DeepSpeed does.
#include <ATen/ATen.h>

#include "deepspeed/optimizers.h"
#include "runtime/optim/update_math.h"

namespace deepspeed::optim {

GroupOptions AdagradOptions::group(bool cpu_adagrad) const {
  GroupOptions g;
  if (cpu_adagrad) {
    // DeepSpeedCPUAdagrad's param_groups keys.
    g.set("lr", lr).set("eps", eps).set("weight_decay", weight_decay).set("amsgrad", false);
  } else {
    // torch.optim.Adagrad's.
    g.set("lr", lr).set("lr_decay", lr_decay).set("eps", eps).set("weight_decay", weight_decay);
    g.set("initial_accumulator_value", initial_accumulator_value).set("maximize", maximize);
  }
  return g;
}

Adagrad::Adagrad(std::vector<at::Tensor> params, AdagradOptions defaults, bool cpu_adagrad)
    : Adagrad(std::vector<torch::optim::OptimizerParamGroup>{
                  torch::optim::OptimizerParamGroup(std::move(params))},
              defaults, cpu_adagrad) {}

Adagrad::Adagrad(std::vector<torch::optim::OptimizerParamGroup> groups, AdagradOptions defaults,
                 bool cpu_adagrad)
    : DsOptimizer(std::move(groups), defaults.group(cpu_adagrad)), cpu_adagrad_(cpu_adagrad) {}

at::Tensor Adagrad::initial_state(const std::string& name, const at::Tensor& param,
                                  const GroupOptions& group) const {
  if (cpu_adagrad_) return at::zeros_like(param, at::MemoryFormat::Contiguous);
  return at::full_like(param, group.number("initial_accumulator_value"),
                       at::TensorOptions().memory_format(at::MemoryFormat::Contiguous));
}

void Adagrad::update(const at::Tensor& param, const at::Tensor& grad, ParamState& state,
                     const GroupOptions& group) {
  const double lr = group.number("lr");
  const double eps = group.number("eps");
  const double weight_decay = group.number("weight_decay");
  at::Tensor& sum = state.tensor(cpu_adagrad_ ? "exp_avg_sq" : "sum");

  const auto dtype = detail::math_dtype(param);
  at::Tensor p = detail::load(param, dtype);
  at::Tensor g = detail::load(grad, dtype);
  at::Tensor s = detail::load(sum, dtype);
  if (cpu_adagrad_) {
    // DeepSpeedCPUAdagrad: weight decay enters the accumulator only; the numerator is raw g.
    at::Tensor decayed = weight_decay > 0.0 ? g.add(p, weight_decay) : g;
    s.addcmul_(decayed, decayed);
    p.addcdiv_(g, s.sqrt().add_(eps), -lr);
  } else {
    if (group.flag("maximize")) g = g.neg();
    if (weight_decay != 0.0) g = g.add(p, weight_decay);
    const double clr =
        lr / (1.0 + static_cast<double>(state.step - 1) * group.number("lr_decay"));
    s.addcmul_(g, g);
    p.addcdiv_(g, s.sqrt().add_(eps), -clr);
  }
  detail::store(sum, s);
  detail::store(param, p);
}

}  // namespace deepspeed::optim
