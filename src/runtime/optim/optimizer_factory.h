// Building the optimizer named in ds_config (`optimizer.type` + `params`), with DeepSpeed's
// selection rules: DeepSpeed names match case-insensitively; "Adam" means decoupled AdamW unless
// params.adam_w_mode is false; DeepSpeed's Adam weight_decay default is 0 (torch's AdamW: 0.01).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "deepspeed/config.h"

namespace torch::optim {
class Optimizer;
}
namespace at {
class Tensor;
}

namespace deepspeed::optim {

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

/// Parses optimizer.params for Adam/AdamW; unknown keys are errors naming them (DeepSpeed
/// forwards params as constructor kwargs, so an unknown one fails there too).
AdamParams parse_adam_params(const OptimizerConfig& config, const std::string& source);

/// Throws NotSupportedError / ConfigError when `config.type` cannot be built by this build.
void check_optimizer_supported(const OptimizerConfig& config, const std::string& source);

/// Builds the optimizer over `params` (all in one param group).
std::unique_ptr<torch::optim::Optimizer> build_optimizer(const OptimizerConfig& config,
                                                         const std::vector<at::Tensor>& params,
                                                         const std::string& source);

}  // namespace deepspeed::optim
