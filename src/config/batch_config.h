// The batch triad: train_batch_size = train_micro_batch_size_per_gpu * gradient_accumulation_steps
// * data-parallel world size. Any two given infer the third (DeepSpeed's integer floor division).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "config/json_reader.h"
#include "deepspeed/config.h"

namespace deepspeed::config_detail {

/// Resolves the triad for `dp_world_size` ranks; `source` prefixes error messages.
/// Throws ConfigError with DeepSpeed's error cases, each naming the keys and values.
BatchConfig resolve_batch_triad(std::optional<int64_t> train_batch_size,
                                std::optional<int64_t> micro_batch,
                                std::optional<int64_t> grad_accum, int64_t dp_world_size,
                                const std::string& source);

/// Reads the three keys from the top level of ds_config.json and resolves them. "auto" (Hugging
/// Face's placeholder) is unset: one "auto" key is resolved when the others determine it, with
/// a note in `notes` saying to what and why; otherwise a ConfigError names the key.
BatchConfig read_batch_triad(ConfigReader& top, int64_t dp_world_size, const std::string& source,
                             std::vector<std::string>* notes);

}  // namespace deepspeed::config_detail
