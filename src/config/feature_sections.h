// Parsing of the feature sections that do not drive the ZeRO-0 engine yet (activation
// checkpointing, flops profiler, aio, pipeline, data types, elasticity, progressive layer drop,
// torch autocast): typed, with DeepSpeed's defaults, so that they are validated and refusable.
#pragma once

#include "config/json_reader.h"
#include "deepspeed/config.h"

namespace deepspeed::config_detail {

/// Reads those sections from `top` into `c` (warnings go to c.warnings).
void parse_feature_sections(ConfigReader& top, DeepSpeedConfig& c);

/// Their resolved JSON, merged into DeepSpeedConfig::resolved().
void resolve_feature_sections(const DeepSpeedConfig& c, json& out);

}  // namespace deepspeed::config_detail
