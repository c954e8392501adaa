#include "runtime/zero/bf16_optimizer_layout.h"

namespace deepspeed::runtime {

bool zero1_uses_bf16_optimizer(const DeepSpeedConfig& config) {
  const auto& z = config.zero_optimization;
  return config.bf16.enabled && z.stage == 1 && config.data_types.grad_accum_dtype == "fp32" &&
         z.optimizer_offload() == OffloadDevice::kNone;
}

}  // namespace deepspeed::runtime
