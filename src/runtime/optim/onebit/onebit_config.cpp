// The config rules of the 1-bit optimizers (see the header).
#include "runtime/optim/onebit/onebit_config.h"

#include <algorithm>
#include <cctype>

#include "util/check.h"

namespace deepspeed::onebit {

bool is_onebit_type(const std::string& type) {
  std::string name = type;
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  return name == "onebitadam" || name == "zerooneadam" || name == "onebitlamb";
}

void check_onebit_compatible(const DeepSpeedConfig& config) {
  if (!config.optimizer.present || !is_onebit_type(config.optimizer.type)) return;
  const std::string head = config.source + ": optimizer.type \"" + config.optimizer.type + "\"";
  // Matches DeepSpeed's engine ("1bit-Adam is not compatible with ZeRO"): the optimizer's own
  // compressed all-reduce replaces the engine's gradient reduction, which ZeRO partitions.
  DS_CHECK(config.zero_optimization.stage == 0, ConfigError, head,
           " is not compatible with ZeRO (zero_optimization.stage is ",
           config.zero_optimization.stage, "); set zero_optimization.stage to 0");
  // DeepSpeed wraps them in its fp16 optimizers (FP16_Optimizer / FP16_UnfusedOptimizer) or
  // runs them in fp32; its bf16 optimizer reduces the gradients itself, which would bypass
  // the compressed all-reduce.
  DS_CHECK(!config.bf16.enabled, NotSupportedError, head,
           " does not run with bf16 (DeepSpeed runs it in fp32 or under its fp16 optimizer); "
           "set bf16.enabled to false, or use fp16.enabled");
}

}  // namespace deepspeed::onebit
