// FusedLamb (reference §3.3): the fused multi-tensor kernel for fp32 CUDA tensors (CUDA
// builds), tensor ops elsewhere; the trust ratio stays on the device either way.
#include <cmath>
#include <map>
#include <tuple>
#include <utility>

#include <ATen/ATen.h>

#include "deepspeed/optimizers.h"
#include "runtime/optim/update_math.h"

#ifdef DS_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "ops/cuda_optim/cuda_optim.h"
#endif

namespace deepspeed::optim {
namespace {

/// One parameter's update in tensor ops; returns its trust ratio (a 0-dim tensor on its device).
at::Tensor update_with_tensor_ops(const at::Tensor& param, const at::Tensor& grad,
                                  ParamState& state, const GroupOptions& group,
                                  bool eps_inside_sqrt) {
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
  at::Tensor denom = eps_inside_sqrt ? v.add(eps).sqrt_() : v.sqrt().add_(eps);
  // Moments are not bias-corrected inside u; the correction is folded into the step size.
  at::Tensor u = m / denom;
  if (weight_decay != 0.0) u.add_(p, weight_decay);

  at::Tensor w_norm = p.norm();
  at::Tensor u_norm = u.norm();
  // Matches FusedLamb: the ratio is clamped only when both norms are non-zero, else it is 1.
  at::Tensor coeff = at::where(w_norm.ne(0).logical_and(u_norm.ne(0)),
                               (w_norm / u_norm).clamp(min_coeff, max_coeff),
                               at::ones_like(w_norm));

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
  return coeff;
}

#ifdef DS_WITH_CUDA
bool fits_fused_cuda(const at::Tensor& t, const at::Device& device) {
  return t.device() == device && t.scalar_type() == at::kFloat && t.is_contiguous();
}

/// Whether `u` can go through ops::fused_lamb: param, grad and moments fp32, contiguous, on one
/// CUDA device.
bool fits_fused_lamb(ParamUpdate& u) {
  const at::Device device = u.param.device();
  return device.is_cuda() && fits_fused_cuda(u.param, device) && fits_fused_cuda(u.grad, device) &&
         fits_fused_cuda(u.state.tensor("exp_avg"), device) &&
         fits_fused_cuda(u.state.tensor("exp_avg_sq"), device);
}

/// Updates the parameters `members` of `params` (one device, one step count) with one
/// ops::fused_lamb call on the device's current stream; coeffs[i] gets member i's trust ratio,
/// a view into the device array the kernel wrote.
void fused_lamb_batch(std::vector<ParamUpdate>& params, const std::vector<size_t>& members,
                      const GroupOptions& group, bool eps_inside_sqrt,
                      std::vector<at::Tensor>& coeffs) {
  const ParamUpdate& first = params[members.front()];
  const at::Device device = first.param.device();
  const c10::cuda::CUDAGuard device_guard(device);
  std::vector<ops::LambTensor> tensors;
  tensors.reserve(members.size());
  for (size_t i : members) {
    ParamUpdate& u = params[i];
    ops::LambTensor t;
    t.param = u.param.data_ptr<float>();
    t.grad = u.grad.data_ptr<float>();
    t.exp_avg = u.state.tensor("exp_avg").data_ptr<float>();
    t.exp_avg_sq = u.state.tensor("exp_avg_sq").data_ptr<float>();
    t.n = u.param.numel();
    tensors.push_back(t);
  }
  const int count = static_cast<int>(tensors.size());
  const auto options = first.param.options();
  at::Tensor workspace = at::empty({ops::fused_lamb_workspace_numel(tensors.data(), count)},
                                   options);
  at::Tensor batch_coeffs = at::empty({count}, options);

  ops::LambStep s;
  s.lr = group.number("lr");
  std::tie(s.beta1, s.beta2) = group.pair("betas");
  s.eps = group.number("eps");
  s.weight_decay = group.number("weight_decay");
  s.bias_correction = group.flag("bias_correction");
  s.eps_inside_sqrt = eps_inside_sqrt;
  s.max_coeff = group.number("max_coeff");
  s.min_coeff = group.number("min_coeff");
  s.step = first.state.step;
  ops::fused_lamb(s, tensors.data(), count, workspace.data_ptr<float>(),
                  batch_coeffs.data_ptr<float>(),
                  c10::cuda::getCurrentCUDAStream(device.index()).stream());
  for (size_t k = 0; k < members.size(); ++k) {
    coeffs[members[k]] = batch_coeffs.select(0, static_cast<int64_t>(k));
  }
}
#endif

}  // namespace

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
  lamb_coeffs_.push_back(update_with_tensor_ops(param, grad, state, group, eps_inside_sqrt_));
}

void Lamb::update_group(std::vector<ParamUpdate>& params, const GroupOptions& group) {
  // lamb_coeffs_ lists the trust ratios in parameter order, whichever path computed them.
  std::vector<at::Tensor> coeffs(params.size());
#ifdef DS_WITH_CUDA
  // One fused_lamb call per (device, step count): the step count sets the bias correction.
  std::map<std::pair<int, int64_t>, std::vector<size_t>> batches;
  for (size_t i = 0; i < params.size(); ++i) {
    if (fits_fused_lamb(params[i])) {
      batches[{params[i].param.device().index(), params[i].state.step}].push_back(i);
    }
  }
  for (const auto& [key, members] : batches) {
    fused_lamb_batch(params, members, group, eps_inside_sqrt_, coeffs);
  }
#endif
  for (size_t i = 0; i < params.size(); ++i) {
    if (coeffs[i].defined()) continue;
    ParamUpdate& u = params[i];
    coeffs[i] = update_with_tensor_ops(u.param, u.grad, u.state, group, eps_inside_sqrt_);
  }
  lamb_coeffs_.insert(lamb_coeffs_.end(), coeffs.begin(), coeffs.end());
}

}  // namespace deepspeed::optim
