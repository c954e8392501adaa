// The dtype of ZeRO's master weights (Note [Low-precision masters] in
// config/low_precision_masters.cpp) and the optimizer check that goes with it.
#pragma once

#include <c10/core/ScalarType.h>

namespace torch::optim {
class Optimizer;
}

namespace deepspeed {
struct DeepSpeedConfig;
}

namespace deepspeed::runtime {

/// The model's 16-bit dtype under bf16.bf16_master_weights_and_grads or
/// fp16.fp16_master_weights_and_grads (their section enabled), else fp32. With optimizer offload
/// `optimizer` must be DeepSpeed's Adam (the CPU Adam DeepSpeed requires; ConfigError
/// otherwise), whose moments it makes fp32 unless bf16.bf16_optimizer_states.
at::ScalarType configure_master_weights(const DeepSpeedConfig& config,
                                        torch::optim::Optimizer& optimizer);

}  // namespace deepspeed::runtime
