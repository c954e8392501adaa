// Building the optimizer named in ds_config (`optimizer.type` + `params`) over the model's param
// groups, with DeepSpeed's selection rules (reference §3.1; resolution in optimizer_params.h):
// "Adam" means decoupled AdamW unless params.adam_w_mode is false; DeepSpeed's Adam
// weight_decay default is 0 (torch's AdamW: 0.01); offload_optimizer selects the CPU variants.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "deepspeed/config.h"
#include "deepspeed/param_group.h"

namespace torch::optim {
class Optimizer;
}
namespace at {
class Tensor;
}

namespace deepspeed::optim {

/// What the engine knows beyond the optimizer section.
struct OptimizerBuildOptions {
  /// zero_optimization.offload_optimizer.device is cpu or nvme. DeepSpeed then builds its CPU
  /// optimizers (DeepSpeedCPUAdam/Adagrad/Lion): Adagrad's update changes (reference §3.5) and
  /// the accepted params differ (fp32_optimizer_states, no set_grad_none/lr_decay).
  bool offload = false;
  /// The module's name of each trainable parameter (by TensorImpl). Muon chooses its half by
  /// name as DeepSpeed's set_optimizer_flags does; the others ignore it.
  std::unordered_map<const void*, std::string> param_names;
};

/// Builds the optimizer over `groups`: each group's `options` override optimizer.params for that
/// group. Empty groups are dropped. Returns one of deepspeed::optim's optimizers
/// (deepspeed/optimizers.h), or torch::optim::Adam/AdamW with params.torch_adam true.
/// Throws ConfigError (unknown type or parameter, bad value, max_grad_norm, a parameter in two
/// groups), NotSupportedError (a type or setting not built here) and UsageError (no parameters).
/// State is created at the first step (see Note [Lazy optimizer state]).
std::unique_ptr<torch::optim::Optimizer> build_optimizer(const OptimizerConfig& config,
                                                         const std::vector<ParamGroup>& groups,
                                                         const std::string& source,
                                                         const OptimizerBuildOptions& options);

/// The same with all of `params` in one group and no offload.
std::unique_ptr<torch::optim::Optimizer> build_optimizer(const OptimizerConfig& config,
                                                         const std::vector<at::Tensor>& params,
                                                         const std::string& source);

/// Throws what build_optimizer would for `config` itself (type and params), accepting the
/// params of both the offload and the non-offload class. Called while parsing ds_config.
void check_optimizer_supported(const OptimizerConfig& config, const std::string& source);

/// Whether ZeRO runs `optimizer` without "zero_allow_untested_optimizer": true. Matches
/// DeepSpeed's list: Adam/AdamW (ours, torch's), Adagrad (ours, torch's), Lion, Muon. Lamb and
/// SGD are untested with ZeRO in DeepSpeed.
bool is_zero_supported_optimizer(const torch::optim::Optimizer& optimizer);

/// The lr a group gets from `config` (optimizer.params.lr or the selected class's default).
double configured_lr(const OptimizerConfig& config, const std::string& source);

/// Adam/AdamW hyper-parameters after DeepSpeed's defaults are applied.
struct AdamParams {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool adam_w_mode = true;  // decoupled weight decay (AdamW)
  bool bias_correction = true;
  bool torch_adam = false;
};

/// Parses optimizer.params of an Adam/AdamW section (ConfigError for another type).
AdamParams parse_adam_params(const OptimizerConfig& config, const std::string& source);

}  // namespace deepspeed::optim
