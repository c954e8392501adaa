// DeepSpeed's OnebitLamb: LAMB warm-up, then one compressed all-reduce of all (rescaled)
// momenta per step and trust ratios from the frozen coefficients (docs/onebit.md).
#include <algorithm>
#include <cmath>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "deepspeed/onebit.h"
#include "runtime/optim/onebit/momentum_mask.h"
#include "util/check.h"

namespace deepspeed::onebit {
namespace {

double scalar(optim::ParamState& s, const char* name) { return s.tensor(name).item<double>(); }
void set_scalar(optim::ParamState& s, const char* name, double v) { s.tensor(name).fill_(v); }

}  // namespace

OneBitLamb::OneBitLamb(std::vector<torch::optim::OptimizerParamGroup> groups,
                       optim::GroupOptions defaults, OneBitSettings settings)
    : DsOptimizer(std::move(groups), std::move(defaults)), settings_(std::move(settings)) {}

bool OneBitLamb::backward_allreduce_enabled() const {
  auto* self = const_cast<OneBitLamb*>(this);
  for (auto& group : self->param_groups()) {
    for (const auto& p : group.params()) {
      if (auto* s = self->find_state(p)) return s->step < settings_.freeze_step;
    }
  }
  return true;
}

at::Tensor OneBitLamb::initial_state(const std::string& name, const at::Tensor& param,
                                     const optim::GroupOptions& group) const {
  const auto opts = param.options().dtype(at::kFloat);
  if (name == "worker_error" || name == "server_error") {
    // One pair of buffers for the flattened momenta of all parameters, kept by the first.
    auto* self = const_cast<OneBitLamb*>(this);
    const at::Tensor& first = self->param_groups().at(0).params().at(0);
    // `param` is a detached alias of the parameter: compare the storage, not the TensorImpl.
    if (first.data_ptr() != param.data_ptr()) return at::Tensor();
    int64_t total = 0;
    for (auto& g : self->param_groups()) {
      for (const auto& p : g.params()) total += p.numel();
    }
    const auto l = compression_layout(total, compression_world_size(group_));
    return at::zeros({name == "worker_error" ? l.padded_numel : l.chunk_numel}, opts);
  }
  if (name == "last_factor") return at::ones({1}, opts);
  if (name == "lamb_coeff_freeze" || name == "scaling_coeff") return at::zeros({1}, opts);
  return DsOptimizer::initial_state(name, param, group);
}

void OneBitLamb::update(const at::Tensor& param, const at::Tensor& grad, optim::ParamState& state,
                        const optim::GroupOptions& group) {
  warmup_update(param, grad, state, group);
}

void OneBitLamb::warmup_update(const at::Tensor& param, const at::Tensor& grad,
                               optim::ParamState& state, const optim::GroupOptions& group) {
  DS_CHECK(param.scalar_type() == at::kFloat && grad.scalar_type() == at::kFloat, NotSupportedError,
           "OnebitLamb steps fp32 parameters only (got ", param.scalar_type(), ")");
  const double lr = group.number("lr");
  const auto [beta1, beta2] = group.pair("betas");
  const double eps = group.number("eps");
  const double weight_decay = group.number("weight_decay");
  at::Tensor& m = state.tensor("exp_avg");
  at::Tensor& v = state.tensor("exp_avg_sq");
  m.mul_(beta1).add_(grad, 1.0 - beta1);
  v.mul_(beta2).addcmul_(grad, grad, 1.0 - beta2);
  if (state.step == settings_.freeze_step) state.tensor("exp_avg_sq_fresh").copy_(v);
  const double weight_norm = param.norm().item<double>();
  at::Tensor update = m / (v.sqrt() + eps);
  if (weight_decay > 0.0) update.add_(param, weight_decay);
  const double update_norm = update.norm().item<double>();
  double coeff = 1.0;
  if (weight_norm != 0 && update_norm != 0) {
    coeff = std::clamp(weight_norm / update_norm, group.number("min_coeff"),
                       group.number("max_coeff"));
  }
  if (coeff != 1.0) {
    set_scalar(state, "lamb_coeff_freeze",
               settings_.coeff_beta * scalar(state, "lamb_coeff_freeze") +
                   (1.0 - settings_.coeff_beta) * coeff);
  }
  lamb_coeffs_.push_back(coeff);
  param.add_(update, -lr * coeff);
}

at::Tensor OneBitLamb::step(LossClosure closure) {
  at::Tensor loss;
  if (closure) {
    torch::AutoGradMode enable_grad(true);
    loss = closure();
  }
  torch::NoGradGuard no_grad;
  // Note [Gradient scale in the step]: this step reads the gradients in more places than one
  // update, so they are multiplied in place first.
  if (grad_scale() != 1.0) {
    for (const auto& group : param_groups()) {
      for (const at::Tensor& p : group.params()) {
        if (p.grad().defined()) p.grad().mul_(grad_scale());
      }
    }
  }
  lamb_coeffs_.clear();
  if (backward_allreduce_enabled()) {
    // Warm-up: parameter by parameter, like any of our optimizers.
    for (size_t g = 0; g < param_groups().size(); ++g) {
      const auto& group = group_options(g);
      for (const at::Tensor& p : param_groups()[g].params()) {
        if (!p.grad().defined()) continue;
        auto& state = get_or_create_state(p, group);
        ++state.step;
        update(p.detach(), p.grad().detach(), state, group);
      }
    }
    return loss;
  }
  compressed_step();
  return loss;
}

void OneBitLamb::compressed_step() {
  struct Item {
    at::Tensor param;
    at::Tensor grad;
    optim::ParamState* state;
    const optim::GroupOptions* group;
    at::Tensor last_exp_avg;
  };
  std::vector<Item> items;
  for (size_t g = 0; g < param_groups().size(); ++g) {
    const auto& group = group_options(g);
    for (const at::Tensor& p : param_groups()[g].params()) {
      auto& state = get_or_create_state(p, group);
      ++state.step;
      at::Tensor grad = p.grad().defined() ? p.grad().detach() : at::zeros_like(p);
      DS_CHECK(p.scalar_type() == at::kFloat, NotSupportedError,
               "OnebitLamb steps fp32 parameters only (got ", p.scalar_type(), ")");
      items.push_back({p.detach(), grad, &state, &group, state.tensor("exp_avg").clone()});
    }
  }
  // The momenta's scales are equalized once, at the first compressed step, so that one 1-bit
  // scale serves every parameter. A parameter whose momentum is zero keeps scale 1.
  if (scalar(*items[0].state, "scaling_coeff") == 0.0) {
    std::vector<double> scales;
    for (auto& it : items) {
      const at::Tensor& m = it.state->tensor("exp_avg");
      scales.push_back(m.numel() ? m.norm().item<double>() / std::sqrt(double(m.numel())) : 0.0);
    }
    double united = 0;
    for (double s : scales) united += s;
    united /= static_cast<double>(scales.size());
    for (size_t i = 0; i < items.size(); ++i) {
      set_scalar(*items[i].state, "scaling_coeff", scales[i] > 0 ? united / scales[i] : 1.0);
    }
  }
  std::vector<at::Tensor> flat_parts;
  for (auto& it : items) {
    const auto [beta1, beta2] = it.group->pair("betas");
    at::Tensor& m = it.state->tensor("exp_avg");
    m.mul_(beta1).add_(it.grad, 1.0 - beta1);
    m.mul_(scalar(*it.state, "scaling_coeff"));
    flat_parts.push_back(m.reshape({-1}));
  }
  if (compression_world_size(group_) > 1) {
    at::Tensor flat = at::cat(flat_parts);
    const comm::Group& g = group_.valid() ? group_ : comm::world();
    compressed_allreduce(flat, items[0].state->tensor("worker_error"),
                         items[0].state->tensor("server_error"), g);
    int64_t offset = 0;
    for (auto& it : items) {
      at::Tensor& m = it.state->tensor("exp_avg");
      m.view({-1}).copy_(flat.narrow(0, offset, m.numel()));
      offset += m.numel();
    }
  }
  for (auto& it : items) {
    auto& state = *it.state;
    const auto& group = *it.group;
    const double lr = group.number("lr");
    const auto [beta1, beta2] = group.pair("betas");
    const double eps = group.number("eps");
    const double weight_decay = group.number("weight_decay");
    at::Tensor& m = state.tensor("exp_avg");
    at::Tensor& v = state.tensor("exp_avg_sq");
    at::Tensor& v_fresh = state.tensor("exp_avg_sq_fresh");
    m.div_(scalar(state, "scaling_coeff"));
    // Note [Momentum mask] (momentum_mask.cpp): where DeepSpeed applies exp_avg_mask.
    mask_momentum(m, exp_avg_mask(group_index(*this, group)), v);
    // The averaged gradient this momentum implies keeps a fresh variance, which measures how
    // stale the frozen one has become.
    at::Tensor grad_reconstructed = (m - it.last_exp_avg * beta1) / (1.0 - beta1);
    v_fresh.mul_(beta2).addcmul_(grad_reconstructed, grad_reconstructed, 1.0 - beta2);
    at::Tensor denom = v.sqrt() + eps;
    at::Tensor update_prelim = m / denom;
    at::Tensor update = weight_decay > 0.0 ? update_prelim + it.param * weight_decay : update_prelim;
    const double update_norm = update.norm().item<double>();
    at::Tensor denom_real = v_fresh.sqrt() + eps;
    double factor = (denom / denom_real).max().item<double>();
    if (weight_decay > 0.0) {
      const double ratio = std::min(1.0, update_prelim.norm().item<double>() / update_norm);
      factor = factor * ratio + (1.0 - ratio);
    }
    factor = std::clamp(factor, settings_.factor_min, settings_.factor_max);
    const double last = scalar(state, "last_factor");
    factor = std::min(factor, last * (1.0 + settings_.factor_threshold));
    factor = std::max(factor, last * (1.0 - settings_.factor_threshold));
    set_scalar(state, "last_factor", factor);
    const double coeff = scalar(state, "lamb_coeff_freeze") * factor;
    lamb_coeffs_.push_back(coeff);
    it.param.add_(update, -lr * coeff);
  }
}

}  // namespace deepspeed::onebit
