// DeepSpeed's optimizers as torch::optim::Optimizer subclasses, so that the engine, ZeRO and
// client code treat them like any torch optimizer: Adam/AdamW (FusedAdam / DeepSpeedCPUAdam),
// Lamb (FusedLamb), Lion (FusedLion), Adagrad (torch.optim.Adagrad, or DeepSpeedCPUAdagrad's
// update) and SGD (torch.optim.SGD). Also Python-layout state dicts for checkpoints, for these and
// for torch::optim::Adam/AdamW/SGD/Adagrad. Building one from ds_config is the job of
// runtime/optim/optimizer_factory.h; LR schedules are in lr_schedules.h.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <variant>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <torch/optim/optimizer.h>

#include "deepspeed/errors.h"

namespace deepspeed::optim {

// Note [Lazy optimizer state]
// State (step count, moments) is created at a parameter's first update, keyed by the tensor the
// param group holds at that moment, never in a constructor. ZeRO relies on this: it builds the
// optimizer over the model's parameters and may then replace a group's params with a flat fp32
// partition tensor (param_groups()[g].params() = {flat}) before the first step; the state then
// has the partition's size. A parameter whose grad is undefined is skipped and gets no state.

/// Per-group hyper-parameters: "lr" plus named numbers ("eps", "weight_decay", ...), flags
/// ("bias_correction"), pairs ("betas") and texts (Muon's "ns_method"), in the order Python's
/// param_groups list them.
/// Schedulers set lr through OptimizerOptions::set_lr and beta1 through set_betas() below.
class GroupOptions : public torch::optim::OptimizerCloneableOptions<GroupOptions> {
 public:
  using Value = std::variant<double, bool, std::pair<double, double>, std::string>;

  /// Sets `name`, adding it at the end when new: set("eps", 1e-8), set("betas", {0.9, 0.99}).
  GroupOptions& set(const std::string& name, Value value);

  bool has(const std::string& name) const;
  /// Typed reads; throw deepspeed::Error when `name` is absent or of another kind.
  double number(const std::string& name) const;
  bool flag(const std::string& name) const;
  std::pair<double, double> pair(const std::string& name) const;
  const std::string& text(const std::string& name) const;

  double get_lr() const override { return number("lr"); }
  void set_lr(const double lr) override { set("lr", lr); }

  const std::vector<std::pair<std::string, Value>>& items() const { return items_; }

 private:
  const Value* find(const std::string& name) const;
  std::vector<std::pair<std::string, Value>> items_;
};

/// One parameter's state: Python's state[p] dict.
class ParamState : public torch::optim::OptimizerCloneableParamState<ParamState> {
 public:
  /// Updates done so far (DeepSpeed's state['step'], incremented before each update).
  int64_t step = 0;
  /// Named state tensors in Python's order, e.g. {exp_avg, exp_avg_sq}. A tensor may be
  /// undefined (SGD's momentum_buffer before its first use); state dicts then omit it.
  std::vector<std::pair<std::string, at::Tensor>> tensors;

  /// The tensor named `name`; throws deepspeed::Error when there is none.
  at::Tensor& tensor(const std::string& name);
};

/// One parameter of a group as DsOptimizer::step() hands it to update_group().
struct ParamUpdate {
  at::Tensor param;  // detached
  at::Tensor grad;   // detached
  ParamState& state;  // state.step already incremented
  /// The bf16/fp16 destination set_copy_out() registered for this parameter; undefined if none.
  at::Tensor copy_out;
  /// Set by update_group() when it wrote copy_out (then wrote_copy_out() answers true).
  bool wrote_copy_out = false;
  /// The gradient scale (set_grad_scale) that update_group() must apply itself, 1 when it was
  /// applied to `grad` already (see Note [Gradient scale in the step]).
  double grad_scale = 1.0;
};

/// Base of our optimizers: step() walks the groups, creates state lazily (see Note [Lazy
/// optimizer state]), increments state.step and calls update_group() once per group with every
/// parameter that has a grad (by default: update() on each).
class DsOptimizer : public torch::optim::Optimizer {
 public:
  /// A group without options takes a copy of `defaults`; a group with options must hold
  /// GroupOptions, and names it lacks are filled from `defaults`. Throws UsageError otherwise.
  DsOptimizer(std::vector<torch::optim::OptimizerParamGroup> groups, GroupOptions defaults);

  /// One update of every parameter that has a grad, under NoGradGuard. Returns the closure's
  /// loss (undefined without a closure).
  at::Tensor step(LossClosure closure = nullptr) override;

  /// The DeepSpeed/PyTorch class whose update this reproduces ("FusedAdam", "torch.optim.SGD").
  virtual std::string type_name() const = 0;
  /// Names of the per-parameter state tensors, in Python's order.
  virtual std::vector<std::string> state_names() const = 0;
  /// Whether the per-parameter state holds a "step" (torch.optim.SGD's does not).
  virtual bool counts_steps() const { return true; }
  /// The same for the parameters of one group: an optimizer whose groups run different updates
  /// (Muon's Newton-Schulz groups beside its Adam ones) keeps different state in each.
  virtual std::vector<std::string> state_names(const GroupOptions& /*group*/) const {
    return state_names();
  }
  virtual bool counts_steps(const GroupOptions& /*group*/) const { return counts_steps(); }

  /// The state of `param` (keyed by its TensorImpl), or nullptr before its first update.
  ParamState* find_state(const at::Tensor& param);
  /// The state of `param`, created with initial values if absent (used by step() and by
  /// load_optimizer_state_dict).
  ParamState& get_or_create_state(const at::Tensor& param, const GroupOptions& group);
  /// The GroupOptions of group `index`.
  GroupOptions& group_options(size_t index);

  // Note [Fused copy-out]
  // With bf16/fp16 training ZeRO keeps an fp32 master partition and copies it, after every step,
  // into the model-dtype partition. An optimizer whose kernel can write that copy in the same
  // pass as the update (Adam: ops::fused_adam on CUDA, ops::adam_update's HalfCopy on the CPU)
  // does so when asked here, and saves a read of the masters. Others leave it unwritten, so the
  // caller copies when wrote_copy_out() is false.

  /// Registers `half_dst` (contiguous bf16 or fp16, master's numel) to receive `master`'s
  /// updated values, rounded to nearest even, from the next step(); an undefined `half_dst`
  /// removes the registration. `master` is the tensor the param group holds. UsageError when
  /// half_dst does not fit.
  void set_copy_out(const at::Tensor& master, at::Tensor half_dst);
  /// Whether the last step() wrote `master`'s registered copy-out (see Note [Fused copy-out]).
  bool wrote_copy_out(const at::Tensor& master) const;

  // Note [Gradient scale in the step]
  // ZeRO multiplies the gradients by the unscale/clip coefficient right before the step. With
  // the gradients in host memory (ZeRO-Offload) that multiply is a pass of its own over them, as
  // long as a quarter of CPU-Adam's memory traffic. An optimizer whose kernel can multiply each
  // gradient as it loads it (CPU-Adam, the fused CUDA Adam) takes the coefficient here instead;
  // every other update gets gradients multiplied in place first, as before. The product is the
  // same fp32 one. ZeRO 1, 2 and 3 hand it over whenever the optimizer is a DsOptimizer.

  /// Every following step() uses `coef` x the gradients (1: as they are) until set again. The
  /// gradients are either left unscaled or multiplied in place, so the caller must not read
  /// them after the step.
  void set_grad_scale(double coef) { grad_scale_ = coef; }
  double grad_scale() const { return grad_scale_; }

 protected:
  /// Initial value of state tensor `name` of `param`: zeros like the parameter by default.
  virtual at::Tensor initial_state(const std::string& name, const at::Tensor& param,
                                   const GroupOptions& group) const;
  /// Called once at the start of every step().
  virtual void begin_step() {}
  /// Updates `param` in place from `grad`; `state.step` is already incremented.
  virtual void update(const at::Tensor& param, const at::Tensor& grad, ParamState& state,
                      const GroupOptions& group) = 0;
  /// Whether update_group() applies ParamUpdate::grad_scale to `u` itself (Note [Gradient scale
  /// in the step]); by default it does not, and step() multiplies u.grad first.
  virtual bool applies_grad_scale(const ParamUpdate& /*u*/) const { return false; }
  /// Updates every parameter of one group that has a grad, in group order: update() on each by
  /// default. Optimizers that batch parameters into one kernel launch override it (Adam and Lamb
  /// on CUDA), and may write copy_out (setting wrote_copy_out).
  virtual void update_group(std::vector<ParamUpdate>& params, const GroupOptions& group);

 private:
  // set_copy_out's registrations and the ones the last step wrote, keyed by the master's
  // TensorImpl (the same identity as the optimizer state).
  std::unordered_map<const void*, at::Tensor> copy_outs_;
  std::unordered_set<const void*> copy_outs_written_;
  double grad_scale_ = 1.0;
};

/// Adam/AdamW hyper-parameters (DeepSpeed's defaults: weight_decay 0, unlike torch's AdamW).
struct AdamOptions {
  double lr = 1e-3;
  std::pair<double, double> betas{0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool bias_correction = true;
  GroupOptions group() const;
};

/// DeepSpeed's Adam (reference §3.2): eps after the sqrt of the bias-corrected second moment;
/// adam_w_mode true decouples weight decay (AdamW), false adds it to the gradient (L2).
/// fp32 contiguous CPU tensors go through the fused CPU-Adam kernel (ops/cpu_adam), fp32
/// contiguous CUDA tensors (CUDA builds) through ops::fused_adam, one launch per group for all
/// parameters on one device with the same step count; others (bf16/fp16 in fp32 math, fp64 in
/// fp64 math, non-contiguous) through the same formula in tensor ops. Both kernels write a
/// registered copy-out (Note [Fused copy-out]) on the master's device. bf16/fp16 contiguous CPU
/// parameters (ZeRO's 16-bit masters) go through CPU-Adam too, in fp32 slices (Note [16-bit
/// parameters on CPU-Adam] in adam.cpp).
/// State: step, exp_avg, exp_avg_sq (device of the parameter; its dtype too unless
/// set_fp32_optimizer_states makes the moments of 16-bit parameters fp32).
class Adam : public DsOptimizer {
 public:
  Adam(std::vector<at::Tensor> params, AdamOptions defaults = {}, bool adam_w_mode = true);
  Adam(std::vector<torch::optim::OptimizerParamGroup> groups, AdamOptions defaults = {},
       bool adam_w_mode = true);

  bool adam_w_mode() const { return adam_w_mode_; }
  std::string type_name() const override { return adam_w_mode_ ? "FusedAdam(adam_w_mode=True)"
                                                                : "FusedAdam(adam_w_mode=False)"; }
  std::vector<std::string> state_names() const override { return {"exp_avg", "exp_avg_sq"}; }

  /// DeepSpeedCPUAdam's fp32_optimizer_states: the moments of bf16/fp16 parameters are created
  /// in fp32 (true) or in the parameter's dtype (false, the default, as FusedAdam's). ZeRO sets
  /// it for 16-bit master weights (bf16.bf16_master_weights_and_grads); state already created
  /// keeps its dtype.
  void set_fp32_optimizer_states(bool fp32) { fp32_optimizer_states_ = fp32; }
  bool fp32_optimizer_states() const { return fp32_optimizer_states_; }

 protected:
  at::Tensor initial_state(const std::string& name, const at::Tensor& param,
                           const GroupOptions& group) const override;
  void update(const at::Tensor& param, const at::Tensor& grad, ParamState& state,
              const GroupOptions& group) override;
  void update_group(std::vector<ParamUpdate>& params, const GroupOptions& group) override;
  /// On the CPU-Adam kernel (fp32 contiguous CPU tensors).
  bool applies_grad_scale(const ParamUpdate& u) const override;

 private:
  friend class Muon;  // runs its Adam half through this class's update

  bool adam_w_mode_;
  bool fp32_optimizer_states_ = false;
};

/// Lamb hyper-parameters (FusedLamb's defaults).
struct LambOptions {
  double lr = 1e-3;
  std::pair<double, double> betas{0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool bias_correction = true;
  double max_coeff = 10.0;
  double min_coeff = 0.01;
  GroupOptions group() const;
};

/// FusedLamb (reference §3.3): u = m/(sqrt(v)+eps) + wd*p with un-corrected moments, trust
/// ratio ||p||/||u|| clamped to [min_coeff, max_coeff] (1 when either norm is 0), step size
/// lr*sqrt(bc2)/bc1. eps_inside_sqrt uses sqrt(v+eps). State: step, exp_avg, exp_avg_sq.
/// fp32 contiguous CUDA tensors (CUDA builds) go through ops::fused_lamb, one batch per group,
/// device and step count, with the trust ratios computed on the device; others in tensor ops.
class Lamb : public DsOptimizer {
 public:
  Lamb(std::vector<at::Tensor> params, LambOptions defaults = {}, bool eps_inside_sqrt = false);
  Lamb(std::vector<torch::optim::OptimizerParamGroup> groups, LambOptions defaults = {},
       bool eps_inside_sqrt = false);

  bool eps_inside_sqrt() const { return eps_inside_sqrt_; }
  /// The trust ratios of the last step, one per updated parameter (DeepSpeed's
  /// get_lamb_coeffs()); reading them synchronizes with the device.
  std::vector<double> lamb_coeffs() const;
  std::string type_name() const override { return "FusedLamb"; }
  std::vector<std::string> state_names() const override { return {"exp_avg", "exp_avg_sq"}; }

 protected:
  void begin_step() override { lamb_coeffs_.clear(); }
  void update(const at::Tensor& param, const at::Tensor& grad, ParamState& state,
              const GroupOptions& group) override;
  void update_group(std::vector<ParamUpdate>& params, const GroupOptions& group) override;

 private:
  bool eps_inside_sqrt_;
  std::vector<at::Tensor> lamb_coeffs_;
};

/// Lion hyper-parameters (FusedLion's defaults).
struct LionOptions {
  double lr = 1e-3;
  std::pair<double, double> betas{0.9, 0.999};
  double weight_decay = 0.0;
  GroupOptions group() const;
};

/// FusedLion (reference §3.4): c = b1*m + (1-b1)*g; p = p*(1-lr*wd) - lr*sign(c), where c == 0
/// counts as negative (+lr), as in the CUDA kernel; m = b2*m + (1-b2)*g. State: step, exp_avg.
class Lion : public DsOptimizer {
 public:
  explicit Lion(std::vector<at::Tensor> params, LionOptions defaults = {});
  Lion(std::vector<torch::optim::OptimizerParamGroup> groups, LionOptions defaults = {});

  std::string type_name() const override { return "FusedLion"; }
  std::vector<std::string> state_names() const override { return {"exp_avg"}; }

 protected:
  void update(const at::Tensor& param, const at::Tensor& grad, ParamState& state,
              const GroupOptions& group) override;
};

/// Adagrad hyper-parameters (torch.optim.Adagrad's defaults; lr_decay,
/// initial_accumulator_value and maximize exist only in torch semantics).
struct AdagradOptions {
  double lr = 1e-2;
  double lr_decay = 0.0;
  double weight_decay = 0.0;
  double initial_accumulator_value = 0.0;
  double eps = 1e-10;
  bool maximize = false;
  /// The group for `cpu_adagrad` semantics or torch's.
  GroupOptions group(bool cpu_adagrad) const;
};

/// Adagrad. Default: torch.optim.Adagrad (g' = g + wd*p; sum += g'^2; p -= clr*g'/(sqrt(sum)+eps),
/// clr = lr/(1+(step-1)*lr_decay)); state step, sum. cpu_adagrad: DeepSpeedCPUAdagrad, used by
/// DeepSpeed with offload_optimizer (reference §3.5): the numerator is the raw gradient g;
/// state step, exp_avg_sq. The two agree when weight_decay is 0.
class Adagrad : public DsOptimizer {
 public:
  Adagrad(std::vector<at::Tensor> params, AdagradOptions defaults = {}, bool cpu_adagrad = false);
  Adagrad(std::vector<torch::optim::OptimizerParamGroup> groups, AdagradOptions defaults = {},
          bool cpu_adagrad = false);

  bool cpu_adagrad() const { return cpu_adagrad_; }
  std::string type_name() const override {
    return cpu_adagrad_ ? "DeepSpeedCPUAdagrad" : "torch.optim.Adagrad";
  }
  std::vector<std::string> state_names() const override {
    return {cpu_adagrad_ ? "exp_avg_sq" : "sum"};
  }

 protected:
  at::Tensor initial_state(const std::string& name, const at::Tensor& param,
                           const GroupOptions& group) const override;
  void update(const at::Tensor& param, const at::Tensor& grad, ParamState& state,
              const GroupOptions& group) override;

 private:
  bool cpu_adagrad_;
};

/// SGD hyper-parameters (torch.optim.SGD's defaults).
struct SGDOptions {
  double lr = 1e-3;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
  bool maximize = false;
  GroupOptions group() const;
};

/// torch.optim.SGD: d = g (+ wd*p); with momentum, buf = d at the first update, then
/// buf = momentum*buf + (1-dampening)*d; d = buf, or d + momentum*buf with nesterov; p -= lr*d.
/// State: momentum_buffer, only for groups with momentum != 0; no step count.
class SGD : public DsOptimizer {
 public:
  explicit SGD(std::vector<at::Tensor> params, SGDOptions defaults = {});
  SGD(std::vector<torch::optim::OptimizerParamGroup> groups, SGDOptions defaults = {});

  std::string type_name() const override { return "torch.optim.SGD"; }
  std::vector<std::string> state_names() const override { return {"momentum_buffer"}; }
  bool counts_steps() const override { return false; }

 protected:
  at::Tensor initial_state(const std::string& name, const at::Tensor& param,
                           const GroupOptions& group) const override;
  void update(const at::Tensor& param, const at::Tensor& grad, ParamState& state,
              const GroupOptions& group) override;
};

/// (beta1, beta2) of a param group's options (ours, or torch's Adam/AdamW); nullopt when the
/// optimizer has no betas (SGD, Adagrad, ...).
std::optional<std::pair<double, double>> get_betas(const torch::optim::OptimizerOptions& options);
/// Writes them; returns false (and writes nothing) when the options have no betas.
bool set_betas(torch::optim::OptimizerOptions& options, double beta1, double beta2);

/// The optimizer's state in Python's layout, as torch.optim.Optimizer.state_dict() returns it:
///   {"state": {int index: {"step": ..., "<state name>": tensor, ...}},
///    "param_groups": [{"lr": ..., "betas": (b1, b2), ..., "params": [indices]}]}
/// Indices count parameters across groups in order; parameters without state are absent.
/// Works for our optimizers and torch::optim::Adam, AdamW, SGD and Adagrad (whose "step" is a
/// float32 scalar tensor, as in PyTorch). Holds only tensors, numbers, strings, bools, lists,
/// tuples and dicts, so Python's torch.load(weights_only=True) accepts it once pickled. The
/// tensors alias the optimizer's live state: serialize (or clone) before the next step.
/// Throws NotSupportedError for other optimizer classes.
c10::IValue optimizer_state_dict(torch::optim::Optimizer& optimizer);

/// Restores a dict in the layout above (also one written by Python): hyper-parameters of each
/// group (params excepted) and the per-parameter state, cast to each parameter's dtype and
/// device ("step" kept as a count). Throws CheckpointError naming the mismatch when the group
/// count, a group's parameter count or a state tensor's shape differs, or a value has the
/// wrong type.
void load_optimizer_state_dict(torch::optim::Optimizer& optimizer, const c10::IValue& state_dict);

}  // namespace deepspeed::optim
