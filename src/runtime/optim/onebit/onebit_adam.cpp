// DeepSpeed's OnebitAdam: Adam warm-up, then frozen variance and a 1-bit compressed all-reduce of
// the momentum (docs/onebit.md).
#include <ATen/ATen.h>

#include "deepspeed/onebit.h"
#include "runtime/optim/onebit/momentum_mask.h"
#include "util/check.h"

namespace deepspeed::onebit {

int compression_world_size(const comm::Group& group) {
  if (group.valid()) return group.size();
  return comm::is_initialized() ? comm::world().size() : 1;
}

OneBitAdam::OneBitAdam(std::vector<torch::optim::OptimizerParamGroup> groups,
                       optim::GroupOptions defaults, OneBitSettings settings)
    : DsOptimizer(std::move(groups), std::move(defaults)), settings_(std::move(settings)) {}

int64_t OneBitAdam::completed_steps() {
  for (auto& group : param_groups()) {
    for (const auto& p : group.params()) {
      if (auto* s = find_state(p)) return s->step;
    }
  }
  return 0;
}

bool OneBitAdam::backward_allreduce_enabled() const {
  // DeepSpeed freezes once the step count reaches freeze_step; from then on the gradients
  // stay local and the momentum is what gets (compressed and) communicated.
  return const_cast<OneBitAdam*>(this)->completed_steps() < settings_.freeze_step;
}

at::Tensor OneBitAdam::initial_state(const std::string& name, const at::Tensor& param,
                                     const optim::GroupOptions& group) const {
  if (name == "worker_error" || name == "server_error") {
    const auto l = compression_layout(param.numel(), compression_world_size(group_));
    const int64_t n = name == "worker_error" ? l.padded_numel : l.chunk_numel;
    return at::zeros({n}, param.options().dtype(at::kFloat));
  }
  return DsOptimizer::initial_state(name, param, group);
}

void OneBitAdam::update(const at::Tensor& param, const at::Tensor& grad, optim::ParamState& state,
                        const optim::GroupOptions& group) {
  DS_CHECK(param.scalar_type() == at::kFloat && grad.scalar_type() == at::kFloat, NotSupportedError,
           "OnebitAdam steps fp32 parameters only (got ", param.scalar_type(), ")");
  const double lr = group.number("lr");
  const auto [beta1, beta2] = group.pair("betas");
  const double eps = group.number("eps");
  const double weight_decay = group.number("weight_decay");
  at::Tensor& exp_avg = state.tensor("exp_avg");
  at::Tensor& exp_avg_sq = state.tensor("exp_avg_sq");

  // The step count before this update decides the stage, as DeepSpeed's flag set after the
  // step that reached freeze_step.
  const bool compressing = state.step - 1 >= settings_.freeze_step;
  exp_avg.mul_(beta1).add_(grad, 1.0 - beta1);
  if (!compressing) {
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1.0 - beta2);
  } else if (compression_world_size(group_) > 1) {
    const comm::Group& g = group_.valid() ? group_ : comm::world();
    compressed_allreduce(exp_avg, state.tensor("worker_error"), state.tensor("server_error"), g);
    // Note [Momentum mask] (momentum_mask.cpp): the group's exp_avg_mask, as in DeepSpeed.
    mask_momentum(exp_avg, exp_avg_mask(group_index(*this, group)), exp_avg_sq);
  }
  at::Tensor update = exp_avg / (exp_avg_sq.sqrt() + eps);
  if (weight_decay > 0.0) update.add_(param, weight_decay);
  param.add_(update, -lr);
}

}  // namespace deepspeed::onebit
