// The `expert_parallel` section (DeepSpeed 0.19.8's AutoEP: parse_autoep_config and
// validate_autoep_config). Read at config load, where every error DeepSpeed raises for it is a
// ConfigError naming the key and what this build lacks is refused by name, and again by the
// engine from DeepSpeedConfig::raw. DeepSpeed ignores keys it does not know here; we warn.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "config/json_reader.h"
#include "deepspeed/config.h"

namespace deepspeed::config_detail {

struct ExpertParallelSection {
  bool enabled = false;
  int64_t autoep_size = 1;             // ranks each MoE layer's experts are spread over
  std::optional<std::string> preset_model;
  std::optional<std::string> moe_layer_pattern;  // regex, fully matching a layer's module name
  // Routing overrides for every sharded layer (unset / "auto": the model's own).
  std::optional<int64_t> top_k;
  std::string score_func = "auto";     // auto | softmax | sigmoid
  std::string score_apply = "auto";    // auto | pre | post
  std::optional<bool> route_norm;
  double route_scale = 1.0;            // routed_scaling_factor, when a number, wins
  // Group-limited routing (moe::TokenChoiceOptions); unset: the layer's own.
  std::optional<int64_t> num_expert_groups;
  std::optional<int64_t> num_limited_groups;
};

/// The preset names DeepSpeed 0.19.8 knows (auto_ep_presets/registry.py).
const std::vector<std::string>& autoep_preset_names();

/// Reads `top`'s expert_parallel section; the features this build lacks go to `unimplemented`.
ExpertParallelSection read_expert_parallel_section(ConfigReader& top,
                                                   std::vector<std::string>* unimplemented);

/// The section of a loaded config (from c.raw).
ExpertParallelSection expert_parallel_section(const DeepSpeedConfig& c);

}  // namespace deepspeed::config_detail
