// DeepSpeed's Adam/AdamW (reference §3.2): the fused CPU-Adam kernel for fp32 CPU tensors, the
// fused multi-tensor CUDA kernel for fp32 CUDA tensors (CUDA builds), the same formula in tensor
// ops elsewhere.
#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

#include <ATen/ATen.h>

#include "deepspeed/optimizers.h"
#include "ops/cpu_adam/cpu_adam.h"
#include "runtime/optim/update_math.h"

#ifdef DS_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "ops/cuda_optim/cuda_optim.h"
#endif

namespace deepspeed::optim {
namespace {

bool fits_cpu_adam(const at::Tensor& t) {
  return t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous();
}

/// The kernels' 16-bit copy kind for a copy-out destination (kNone: not bf16/fp16).
ops::HalfKind half_kind_of(const at::Tensor& dst) {
  if (!dst.defined()) return ops::HalfKind::kNone;
  if (dst.scalar_type() == at::kBFloat16) return ops::HalfKind::kBF16;
  if (dst.scalar_type() == at::kHalf) return ops::HalfKind::kFP16;
  return ops::HalfKind::kNone;
}

/// The copy-out of `u` when the kernel can write it: on the parameter's device, contiguous,
/// bf16/fp16 (set_copy_out checked the size).
ops::HalfKind usable_copy_out(const ParamUpdate& u) {
  if (!u.copy_out.defined() || u.copy_out.device() != u.param.device() ||
      !u.copy_out.is_contiguous()) {
    return ops::HalfKind::kNone;
  }
  return half_kind_of(u.copy_out);
}

ops::AdamStep adam_step(const GroupOptions& group, bool adam_w_mode, int64_t step,
                        double grad_scale = 1.0) {
  const auto [beta1, beta2] = group.pair("betas");
  ops::AdamStep s;
  s.lr = static_cast<float>(group.number("lr"));
  s.beta1 = static_cast<float>(beta1);
  s.beta2 = static_cast<float>(beta2);
  s.eps = static_cast<float>(group.number("eps"));
  s.weight_decay = static_cast<float>(group.number("weight_decay"));
  s.adamw_mode = adam_w_mode;
  s.bias_correction = group.flag("bias_correction");
  s.step = step;
  s.grad_scale = static_cast<float>(grad_scale);  // as grad.mul_(grad_scale) rounds it
  return s;
}

bool on_cpu_adam_kernel(const ParamUpdate& u) {
  return fits_cpu_adam(u.param) && fits_cpu_adam(u.grad) &&
         fits_cpu_adam(u.state.tensor("exp_avg")) && fits_cpu_adam(u.state.tensor("exp_avg_sq"));
}

// Note [16-bit parameters on CPU-Adam]
// ZeRO's 16-bit master weights (bf16.bf16_master_weights_and_grads and its fp16 twin) step on
// CPU-Adam as DeepSpeedCPUAdam steps them: every operand is read into fp32, the update is the
// kernel's fp32 arithmetic, and the parameter is rounded once to its dtype (to nearest even);
// the moments stay fp32 (fp32_optimizer_states) or are rounded back to their 16-bit dtype. The
// kernel takes fp32 buffers, so the update walks the parameter in slices of kStageNumel
// elements: each slice's 16-bit operands are widened into fp32 scratch (fp32 ones are used in
// place), the kernel updates the scratch and writes the rounded parameter straight into the
// 16-bit slice as its copy-out, and 16-bit moments are rounded back. A slice of 1 Mi elements
// bounds the scratch at 16 MiB and still gives the kernel's threads 64 chunks to share.
constexpr int64_t kStageNumel = int64_t{1} << 20;

bool is_16bit(at::ScalarType t) { return t == at::kBFloat16 || t == at::kHalf; }

/// A CPU-Adam operand once widened: contiguous on CPU, fp32 or 16-bit.
bool widenable(const at::Tensor& t) {
  return t.defined() && t.device().is_cpu() && t.is_contiguous() &&
         (t.scalar_type() == at::kFloat || is_16bit(t.scalar_type()));
}

bool on_staged_cpu_adam(const ParamUpdate& u) {
  return widenable(u.param) && is_16bit(u.param.scalar_type()) && widenable(u.grad) &&
         widenable(u.state.tensor("exp_avg")) && widenable(u.state.tensor("exp_avg_sq"));
}

/// Note [16-bit parameters on CPU-Adam]: `u` with a 16-bit parameter, slice by slice.
void update_staged(ParamUpdate& u, const ops::AdamStep& step) {
  const at::Tensor param = u.param.view(-1);
  const at::Tensor grad = u.grad.view(-1);
  const at::Tensor exp_avg = u.state.tensor("exp_avg").view(-1);
  const at::Tensor exp_avg_sq = u.state.tensor("exp_avg_sq").view(-1);
  const int64_t n = param.numel();
  const int64_t slice = std::min(n, kStageNumel);
  const auto fp32 = param.options().dtype(at::kFloat);
  // One scratch per 16-bit operand, reused by every slice.
  auto scratch_for = [&](const at::Tensor& t) {
    return t.scalar_type() == at::kFloat ? at::Tensor() : at::empty({slice}, fp32);
  };
  at::Tensor p32 = at::empty({slice}, fp32);
  at::Tensor g32 = scratch_for(grad);
  at::Tensor m32 = scratch_for(exp_avg);
  at::Tensor v32 = scratch_for(exp_avg_sq);
  ops::HalfCopy copy;
  copy.kind = param.scalar_type() == at::kBFloat16 ? ops::HalfKind::kBF16 : ops::HalfKind::kFP16;
  for (int64_t offset = 0; offset < n; offset += slice) {
    const int64_t len = std::min(slice, n - offset);
    auto widen = [&](const at::Tensor& t, const at::Tensor& scratch) {
      at::Tensor part = t.narrow(0, offset, len);
      return scratch.defined() ? scratch.narrow(0, 0, len).copy_(part) : part;
    };
    at::Tensor p = widen(param, p32);
    at::Tensor g = widen(grad, g32);
    at::Tensor m = widen(exp_avg, m32);
    at::Tensor v = widen(exp_avg_sq, v32);
    at::Tensor out = param.narrow(0, offset, len);
    copy.data = out.data_ptr();
    ops::adam_update(step, p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(),
                     v.data_ptr<float>(), len, copy);
    if (m32.defined()) exp_avg.narrow(0, offset, len).copy_(m);
    if (v32.defined()) exp_avg_sq.narrow(0, offset, len).copy_(v);
  }
}

/// One parameter on the CPU-Adam kernel (with its copy-out) or in tensor ops.
void update_one(ParamUpdate& u, const GroupOptions& group, bool adam_w_mode) {
  const at::Tensor& param = u.param;
  const at::Tensor& grad = u.grad;
  at::Tensor& exp_avg = u.state.tensor("exp_avg");
  at::Tensor& exp_avg_sq = u.state.tensor("exp_avg_sq");

  if (on_cpu_adam_kernel(u)) {
    ops::HalfCopy copy;
    copy.kind = usable_copy_out(u);
    if (copy.kind != ops::HalfKind::kNone) copy.data = u.copy_out.data_ptr();
    ops::adam_update(adam_step(group, adam_w_mode, u.state.step, u.grad_scale),
                     param.data_ptr<float>(),
                     grad.data_ptr<float>(), exp_avg.data_ptr<float>(),
                     exp_avg_sq.data_ptr<float>(), param.numel(), copy);
    u.wrote_copy_out = copy.kind != ops::HalfKind::kNone;
    return;
  }
  if (on_staged_cpu_adam(u)) {
    // A registered copy-out of a 16-bit parameter is left to the caller (wrote_copy_out false).
    update_staged(u, adam_step(group, adam_w_mode, u.state.step, u.grad_scale));
    return;
  }

  // The CPU-Adam formulation of the same update: denom = sqrt(v)/sqrt(bc2) + eps,
  // p -= lr*wd*p (AdamW), p -= (lr/bc1) * m/denom.
  const double lr = group.number("lr");
  const auto [beta1, beta2] = group.pair("betas");
  const double eps = group.number("eps");
  const double weight_decay = group.number("weight_decay");
  const bool bias_correction = group.flag("bias_correction");
  const auto dtype = detail::math_dtype(param);
  at::Tensor p = detail::load(param, dtype);
  at::Tensor g = detail::load(grad, dtype);
  at::Tensor m = detail::load(exp_avg, dtype);
  at::Tensor v = detail::load(exp_avg_sq, dtype);
  const double bc1 = bias_correction ? 1.0 - std::pow(beta1, u.state.step) : 1.0;
  const double bc2 = bias_correction ? 1.0 - std::pow(beta2, u.state.step) : 1.0;
  if (!adam_w_mode && weight_decay != 0.0) g = g.add(p, weight_decay);
  m.mul_(beta1).add_(g, 1.0 - beta1);
  v.mul_(beta2).addcmul_(g, g, 1.0 - beta2);
  at::Tensor denom = v.sqrt().mul_(1.0 / std::sqrt(bc2)).add_(eps);
  if (adam_w_mode && weight_decay != 0.0) p.mul_(1.0 - lr * weight_decay);
  p.addcdiv_(m, denom, -lr / bc1);
  detail::store(exp_avg, m);
  detail::store(exp_avg_sq, v);
  detail::store(param, p);
}

#ifdef DS_WITH_CUDA
bool fits_fused_cuda(const at::Tensor& t, const at::Device& device) {
  return t.device() == device && t.scalar_type() == at::kFloat && t.is_contiguous();
}

/// Whether `u` can go through ops::fused_adam: param, grad and moments fp32, contiguous, on one
/// CUDA device.
bool fits_fused_adam(const ParamUpdate& u) {
  const at::Device device = u.param.device();
  return device.is_cuda() && fits_fused_cuda(u.param, device) && fits_fused_cuda(u.grad, device) &&
         fits_fused_cuda(u.state.tensor("exp_avg"), device) &&
         fits_fused_cuda(u.state.tensor("exp_avg_sq"), device);
}

/// Updates `batch` (one device, one step count, one copy-out kind) with one ops::fused_adam call
/// on the device's current stream.
void fused_adam_batch(const std::vector<ParamUpdate*>& batch, const GroupOptions& group,
                      bool adam_w_mode, ops::HalfKind half_kind) {
  const at::Device device = batch.front()->param.device();
  const c10::cuda::CUDAGuard device_guard(device);
  std::vector<ops::AdamTensor> tensors;
  tensors.reserve(batch.size());
  for (ParamUpdate* u : batch) {
    ops::AdamTensor t;
    t.param = u->param.data_ptr<float>();
    t.grad = u->grad.data_ptr<float>();
    t.exp_avg = u->state.tensor("exp_avg").data_ptr<float>();
    t.exp_avg_sq = u->state.tensor("exp_avg_sq").data_ptr<float>();
    t.half_copy = half_kind == ops::HalfKind::kNone ? nullptr : u->copy_out.data_ptr();
    t.n = u->param.numel();
    tensors.push_back(t);
  }
  // One DsOptimizer::step hands every update the same coefficient (Note [Gradient scale in the
  // step]).
  ops::fused_adam(adam_step(group, adam_w_mode, batch.front()->state.step,
                            batch.front()->grad_scale),
                  tensors.data(),
                  static_cast<int>(tensors.size()), half_kind,
                  c10::cuda::getCurrentCUDAStream(device.index()).stream());
  for (ParamUpdate* u : batch) u->wrote_copy_out = half_kind != ops::HalfKind::kNone;
}
#endif

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
  std::vector<ParamUpdate> one{ParamUpdate{param, grad, state, at::Tensor()}};
  update_group(one, group);
}

bool Adam::applies_grad_scale(const ParamUpdate& u) const {
#ifdef DS_WITH_CUDA
  if (fits_fused_adam(u)) return true;  // the fused CUDA kernel scales as it loads, too
#endif
  return on_cpu_adam_kernel(u) || on_staged_cpu_adam(u);
}

at::Tensor Adam::initial_state(const std::string& name, const at::Tensor& param,
                               const GroupOptions& group) const {
  if (fp32_optimizer_states_ && is_16bit(param.scalar_type())) {
    return at::zeros(param.sizes(), param.options().dtype(at::kFloat));
  }
  return DsOptimizer::initial_state(name, param, group);
}

void Adam::update_group(std::vector<ParamUpdate>& params, const GroupOptions& group) {
#ifdef DS_WITH_CUDA
  // One launch per (device, step count, copy-out kind): the step count sets the bias
  // correction, and a group's parameters normally share all three, so a group is one launch.
  std::map<std::tuple<int, int64_t, int>, std::vector<ParamUpdate*>> batches;
  for (ParamUpdate& u : params) {
    if (!fits_fused_adam(u)) {
      update_one(u, group, adam_w_mode_);
      continue;
    }
    const auto kind = usable_copy_out(u);
    batches[{u.param.device().index(), u.state.step, static_cast<int>(kind)}].push_back(&u);
  }
  for (const auto& [key, batch] : batches) {
    fused_adam_batch(batch, group, adam_w_mode_, static_cast<ops::HalfKind>(std::get<2>(key)));
  }
#else
  for (ParamUpdate& u : params) update_one(u, group, adam_w_mode_);
#endif
}

}  // namespace deepspeed::optim
