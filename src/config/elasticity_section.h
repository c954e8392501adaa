// The `elasticity` section: read as DeepSpeed's ElasticityConfig reads it, and, when enabled, the
// batch triad it computes for the data-parallel size (DeepSpeed's DeepSpeedConfig does the same
// before it reads train_batch_size and the rest).
#pragma once

#include <cstdint>

#include "config/json_reader.h"
#include "deepspeed/config.h"

namespace deepspeed::config_detail {

/// The section's keys with DeepSpeed's defaults; an enabled section needs max_train_batch_size
/// and micro_batch_sizes (ConfigError naming the key).
ElasticityConfig parse_elasticity(ConfigReader& section);

/// For an enabled section: the batch compute_elastic_config gives `dp_world_size`, after
/// DeepSpeed's checks (the scheduler's copy of the section in DEEPSPEED_ELASTICITY_CONFIG must
/// match; a batch key in the file is an error unless ignore_non_elastic_batch_info, and then a
/// warning that it is overridden). The valid sizes go to c.notes.
BatchConfig elastic_batch_triad(ConfigReader& top, DeepSpeedConfig& c, int64_t dp_world_size);

}  // namespace deepspeed::config_detail
