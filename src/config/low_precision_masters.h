// DeepSpeed's 16-bit master weights: bf16.bf16_master_weights_and_grads (with
// bf16.bf16_optimizer_states) and fp16.fp16_master_weights_and_grads. The config-level rules
// (Note [Low-precision masters] in low_precision_masters.cpp); the optimizer a client passes is
// checked by the engine (runtime/zero/master_weights.h).
#pragma once

#include "deepspeed/config.h"

namespace deepspeed::config_detail {

/// Throws ConfigError where DeepSpeed asserts (a ZeRO stage other than 1-3, no optimizer
/// offload where CPU Adam must keep fp32 moments, an optimizer section that is not Adam/AdamW
/// on CPU Adam); warns into c.warnings when a flag's section is not enabled.
void check_low_precision_masters(DeepSpeedConfig& c);

}  // namespace deepspeed::config_detail
