// DeepSpeed's ZeroOneAdam (0/1 Adam): adaptive variance freezing, then local steps synchronized
// through the 1-bit compressed all-reduce (docs/onebit.md).
#include <algorithm>

#include <ATen/ATen.h>

#include "deepspeed/onebit.h"
#include "runtime/optim/onebit/momentum_mask.h"
#include "util/check.h"

namespace deepspeed::onebit {
namespace {

// The per-parameter counters live in one-element float tensors so that they are part of the
// optimizer's state dict (DeepSpeed keeps them in state[p] too); they hold small integers and
// lr sums, exact or rounded the same way on every rank.
int64_t count_of(optim::ParamState& state, const char* name) {
  return static_cast<int64_t>(state.tensor(name).item<float>());
}
void set_count(optim::ParamState& state, const char* name, double value) {
  state.tensor(name).fill_(value);
}

}  // namespace

ZeroOneAdam::ZeroOneAdam(std::vector<torch::optim::OptimizerParamGroup> groups,
                         optim::GroupOptions defaults, OneBitSettings settings)
    : DsOptimizer(std::move(groups), std::move(defaults)), settings_(std::move(settings)) {}

bool ZeroOneAdam::backward_allreduce_enabled() const {
  auto* self = const_cast<ZeroOneAdam*>(this);
  for (auto& group : self->param_groups()) {
    for (const auto& p : group.params()) {
      auto* s = self->find_state(p);
      if (s == nullptr) continue;
      if (s->step > settings_.var_freeze_step) return false;  // local steps from now on
      // The next step updates the variance, from gradients the engine averages in full
      // precision, when its number is a multiple of var_interval.
      return (s->step + 1) % count_of(*s, "var_interval") == 0;
    }
  }
  return true;
}

at::Tensor ZeroOneAdam::initial_state(const std::string& name, const at::Tensor& param,
                                      const optim::GroupOptions& group) const {
  const auto opts = param.options().dtype(at::kFloat);
  if (name == "worker_error" || name == "server_error") {
    const auto l = compression_layout(param.numel(), compression_world_size(group_));
    return at::zeros({name == "worker_error" ? l.padded_numel : l.chunk_numel}, opts);
  }
  if (name == "var_interval" || name == "local_step_interval") return at::ones({1}, opts);
  if (name == "var_counter" || name == "local_step_counter" || name == "lrs") {
    return at::zeros({1}, opts);
  }
  return DsOptimizer::initial_state(name, param, group);
}

void ZeroOneAdam::update(const at::Tensor& param, const at::Tensor& grad, optim::ParamState& state,
                         const optim::GroupOptions& group) {
  DS_CHECK(param.scalar_type() == at::kFloat && grad.scalar_type() == at::kFloat, NotSupportedError,
           "ZeroOneAdam steps fp32 parameters only (got ", param.scalar_type(), ")");
  const double lr = group.number("lr");
  const auto [beta1, beta2] = group.pair("betas");
  const double eps = group.number("eps");
  const double weight_decay = group.number("weight_decay");
  at::Tensor& m = state.tensor("exp_avg");
  at::Tensor& v = state.tensor("exp_avg_sq");
  at::Tensor& acc = state.tensor("momentum_accumulator");
  at::Tensor& worker_error = state.tensor("worker_error");
  at::Tensor& server_error = state.tensor("server_error");
  const bool compress = compression_world_size(group_) > 1;
  const comm::Group& g = group_.valid() ? group_ : comm::world();
  const int64_t step = state.step;
  // The variance freezes after the step whose count exceeded var_freeze_step; DeepSpeed then
  // zeroes the error buffers once, before their first use for local-step synchronization.
  const bool frozen = step - 1 > settings_.var_freeze_step;
  if (frozen && step - 1 == settings_.var_freeze_step + 1) {
    worker_error.zero_();
    server_error.zero_();
  }
  const int64_t var_interval = count_of(state, "var_interval");
  const int64_t local_interval = count_of(state, "local_step_interval");
  const at::Tensor mask = exp_avg_mask(group_index(*this, group));

  if (!frozen) {
    if (step % var_interval == 0) {  // the engine averaged this gradient in full precision
      v.mul_(beta2).addcmul_(grad, grad, 1.0 - beta2);
      m.mul_(beta1).add_(grad, 1.0 - beta1);
    } else {  // a local gradient: 1-bit all-reduce, momentum only
      at::Tensor averaged = grad.clone();
      if (compress) compressed_allreduce(averaged, worker_error, server_error, g);
      mask_momentum(averaged, mask, v);  // Note [Momentum mask] (momentum_mask.cpp)
      m.mul_(beta1).add_(averaged, 1.0 - beta1);
    }
  } else {
    m.mul_(beta1).add_(grad, 1.0 - beta1);
    state.tensor("lrs").add_(lr);
  }
  at::Tensor update = m / (v.sqrt() + eps);
  if (weight_decay > 0.0) update.add_(param, weight_decay);
  param.add_(update, -lr);
  if (frozen) acc.add_(update, -lr);

  if (frozen && step % local_interval == 0) {
    // Synchronize: undo the local updates since the last synchronization, average them in
    // gradient scale (times sqrt(v) + eps) with 1-bit compression, and apply the average.
    at::Tensor denom = v.sqrt() + eps;
    param.sub_(acc);
    acc.mul_(denom);
    if (compress) compressed_allreduce(acc, worker_error, server_error, g);
    mask_momentum(acc, mask, v);
    m.copy_(acc / state.tensor("lrs")).neg_();
    param.add_(acc / denom);
    acc.zero_();
    state.tensor("lrs").zero_();
  }

  if (!frozen) {
    if (step % var_interval == 0) {
      int64_t counter = count_of(state, "var_counter") + 1;
      int64_t interval = var_interval;
      if (counter == settings_.var_update_scaler) {
        counter = 0;
        interval *= 2;
      }
      set_count(state, "var_counter", static_cast<double>(counter));
      set_count(state, "var_interval", static_cast<double>(interval));
    }
  } else {
    int64_t counter = count_of(state, "local_step_counter") + 1;
    int64_t interval = local_interval;
    if (counter == settings_.local_step_scaler) {
      counter = 0;
      interval = std::min(settings_.local_step_clipper, interval * 2);
    }
    set_count(state, "local_step_counter", static_cast<double>(counter));
    set_count(state, "local_step_interval", static_cast<double>(interval));
  }
}

}  // namespace deepspeed::onebit
