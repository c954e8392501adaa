// DeepSpeed's compatibility rules for its 1-bit optimizers, checked while the config is parsed.
#pragma once

#include "deepspeed/config.h"

namespace deepspeed::onebit {

/// Whether optimizer.type names one of DeepSpeed's 1-bit optimizers (case-insensitive).
bool is_onebit_type(const std::string& type);

/// Throws for a 1-bit optimizer with ZeRO (ConfigError: DeepSpeed asserts "not compatible with
/// ZeRO") or with bf16 (NotSupportedError: DeepSpeed wraps them in its fp16 optimizers, never
/// in its bf16 optimizer). fp32 and fp16 pass.
void check_onebit_compatible(const DeepSpeedConfig& config);

}  // namespace deepspeed::onebit
