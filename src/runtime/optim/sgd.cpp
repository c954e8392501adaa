// torch.optim.SGD's update (DeepSpeed builds torch.optim.SGD for optimizer.type "SGD").
#include <ATen/ATen.h>

#include "deepspeed/optimizers.h"
#include "runtime/optim/update_math.h"

namespace deepspeed::optim {

GroupOptions SGDOptions::group() const {
  GroupOptions g;
  g.set("lr", lr).set("momentum", momentum).set("dampening", dampening);
  g.set("weight_decay", weight_decay).set("nesterov", nesterov).set("maximize", maximize);
  return g;
}

SGD::SGD(std::vector<at::Tensor> params, SGDOptions defaults)
    : SGD(std::vector<torch::optim::OptimizerParamGroup>{
              torch::optim::OptimizerParamGroup(std::move(params))},
          defaults) {}

SGD::SGD(std::vector<torch::optim::OptimizerParamGroup> groups, SGDOptions defaults)
    : DsOptimizer(std::move(groups), defaults.group()) {}

at::Tensor SGD::initial_state(const std::string& name, const at::Tensor& param,
                              const GroupOptions& group) const {
  return at::Tensor();  // torch.optim.SGD seeds the buffer with the first step's direction
}

void SGD::update(const at::Tensor& param, const at::Tensor& grad, ParamState& state,
                 const GroupOptions& group) {
  const double lr = group.number("lr");
  const double momentum = group.number("momentum");
  const double dampening = group.number("dampening");
  const double weight_decay = group.number("weight_decay");

  const auto dtype = detail::math_dtype(param);
  at::Tensor p = detail::load(param, dtype);
  at::Tensor d = detail::load(grad, dtype);
  if (group.flag("maximize")) d = d.neg();
  if (weight_decay != 0.0) d = d.add(p, weight_decay);
  if (momentum != 0.0) {
    at::Tensor& buffer = state.tensor("momentum_buffer");
    at::Tensor buf;
    if (!buffer.defined()) {
      buf = d.clone(at::MemoryFormat::Contiguous);
    } else {
      buf = detail::load(buffer, dtype);
      buf.mul_(momentum).add_(d, 1.0 - dampening);
    }
    d = group.flag("nesterov") ? d.add(buf, momentum) : buf;
    if (!buffer.defined()) {
      buffer = buf.to(param.scalar_type());
    } else {
      detail::store(buffer, buf);
    }
  }
  p.add_(d, -lr);
  detail::store(param, p);
}

}  // namespace deepspeed::optim
