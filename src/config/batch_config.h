// The batch triad: train_batch_size = train_micro_batch_size_per_gpu * gradient_accumulation_steps
// * data-parallel world size. Any two given infer the third (DeepSpeed's integer floor division).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "deepspeed/config.h"

namespace deepspeed::config_detail {

/// Resolves the triad for `dp_world_size` ranks; `source` prefixes error messages.
/// Throws ConfigError with DeepSpeed's error cases, each naming the keys and values.
BatchConfig resolve_batch_triad(std::optional<int64_t> train_batch_size,
                                std::optional<int64_t> micro_batch,
                                std::optional<int64_t> grad_accum, int64_t dp_world_size,
                                const std::string& source);

}  // namespace deepspeed::config_detail
