// "auto" ZeRO sizes (Hugging Face's placeholders), filled from the model as the Hugging Face
// integration fills them from model.config.hidden_size:
//   reduce_bucket_size                 = hidden_size^2
//   stage3_prefetch_bucket_size        = 0.9 * hidden_size^2
//   stage3_param_persistence_threshold = 10 * hidden_size
// A C++ module has no config, so the hidden size is read off the parameters: the dimension that
// occurs most often among the 2-D parameters' dimensions (in a transformer every projection and
// embedding has the hidden size on one side).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "deepspeed/config.h"

namespace deepspeed::config_detail {

/// The most frequent dimension of the 2-D shapes in `shapes` (ties: the larger); nullopt when
/// there is no 2-D shape.
std::optional<int64_t> hidden_size_of(const std::vector<std::vector<int64_t>>& shapes);

/// Fills every key of c.zero_optimization.auto_sizes from `hidden_size`, with a note each in
/// c.notes naming the value, the formula and `origin` (where the hidden size came from), and
/// clears the list.
void resolve_auto_sizes(DeepSpeedConfig& c, int64_t hidden_size, const std::string& origin);

/// resolve_auto_sizes() with the hidden size of `param_shapes` (the model's trainable
/// parameters); a ConfigError naming the first "auto" key when the model has no 2-D parameter.
void resolve_auto_sizes_from_model(DeepSpeedConfig& c,
                                   const std::vector<std::vector<int64_t>>& param_shapes);

/// What resolved() shows for an "auto" size not resolved yet (ds_config without a model).
std::string unresolved_auto_size(const std::string& key);

}  // namespace deepspeed::config_detail
