// See master_weights.h.
#include "runtime/zero/master_weights.h"

#include "deepspeed/config.h"
#include "deepspeed/optimizers.h"
#include "util/check.h"

namespace deepspeed::runtime {

at::ScalarType configure_master_weights(const DeepSpeedConfig& config,
                                        torch::optim::Optimizer& optimizer) {
  const bool bf16 = config.bf16.enabled && config.bf16.bf16_master_weights_and_grads;
  const bool fp16 = config.fp16.enabled && config.fp16.fp16_master_weights_and_grads;
  if (!bf16 && !fp16) return at::kFloat;
  const bool fp32_moments = fp16 || !config.bf16.bf16_optimizer_states;
  auto* adam = dynamic_cast<optim::Adam*>(&optimizer);
  // The config checked the offload rule and a configured optimizer's type; a client's is
  // checked here, as DeepSpeed asserts on DeepSpeedCPUAdam.
  const bool offload = config.zero_optimization.optimizer_offload() != OffloadDevice::kNone;
  DS_CHECK(adam != nullptr || !offload, ConfigError, config.source, ": ",
           bf16 ? "bf16.bf16_master_weights_and_grads" : "fp16.fp16_master_weights_and_grads",
           " with offload_optimizer needs DeepSpeed's CPU Adam (deepspeed::optim::Adam, or "
           "optimizer.type \"Adam\"/\"AdamW\" in the config); the client optimizer is another");
  if (adam != nullptr) adam->set_fp32_optimizer_states(fp32_moments);
  return bf16 ? at::kBFloat16 : at::kHalf;
}

}  // namespace deepspeed::runtime
