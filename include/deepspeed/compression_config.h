// compression_training as read from ds_config.json (torch-free: the launcher's config reader
// compiles it too): DeepSpeed Compression's techniques, each a section of shared_parameters and
// named different_groups of layers. What uses it: compression.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "deepspeed/config.h"

namespace deepspeed::compression {

/// One entry of a technique's different_groups: the layers it applies to and its params.
struct GroupConfig {
  std::string name;
  /// Regular expressions searched in the model's module names (Python's re.search); "*" alone
  /// means every Linear/Embedding layer (DeepSpeed's default, which its own re.search rejects).
  std::vector<std::string> modules{"*"};
  /// Per entry of `modules`, the patterns of the layers whose input dimension shrinks with its
  /// output rows or heads at redundancy_clean (row and head pruning). Empty: the pruned rows and
  /// heads are zeroed, nothing shrinks.
  std::vector<std::vector<std::string>> related_modules;
  // params: which apply depends on the technique.
  int64_t start_bits = 0;           // weight_quantization (required)
  int64_t target_bits = 0;          // weight_quantization (required)
  int64_t quantization_period = 1;  // weight_quantization
  int64_t bits = 0;                 // activation_quantization (required): 4 or 8
  double dense_ratio = 0.0;         // the pruning techniques (required): the share kept
};

/// A technique's shared_parameters (DeepSpeed's defaults) and its groups.
struct TechniqueConfig {
  bool enabled = false;
  int64_t schedule_offset = 0;
  /// Pruning: "l1" | "topk" (sparse pruning also "snip_momentum"); head pruning "topk".
  std::string method;
  /// Weight and activation quantization: "symmetric" | "asymmetric".
  std::string quantization_type = "symmetric";
  // weight_quantization
  bool quantizer_kernel = false;
  int64_t quantize_groups = 1;
  bool quantize_verbose = false;
  std::string rounding = "nearest";  // "nearest" | "stochastic"
  /// true: each forward uses the weight quantized to target_bits (straight-through gradient);
  /// false: MoQ, the fp16 weights are quantized after each optimizer step, start_bits
  /// decreasing to target_bits, one bit per doubling quantization_period.
  bool quantize_weight_in_forward = false;
  bool fp16_mixed_quantize = false;
  double quantize_change_ratio = 0.001;
  // activation_quantization
  std::string range_calibration = "dynamic";  // "dynamic" | "static"
  // sparse_pruning's snip_momentum
  std::string block_pattern = "4x1";
  double dense_ratio = 0.1;
  int64_t schedule_offset_stride = 1;
  std::vector<std::string> excluded_modules;
  /// Sparse pruning is switched on at a step in [schedule_offset, schedule_offset_end].
  int64_t schedule_offset_end = 0;
  // head_pruning
  int64_t num_heads = 0;

  std::vector<GroupConfig> groups;
};

/// layer_reduction: the student's first layers initialised from the teacher's teacher_layer.
struct LayerReductionConfig {
  bool enabled = false;
  int64_t keep_number_layer = 0;
  std::string module_name_prefix;  // e.g. "h": layers h.0, h.1, ...
  std::vector<int64_t> teacher_layer;
  std::vector<std::string> other_module_name;  // copied whole (embeddings, final norm)
};

struct CompressionConfig {
  TechniqueConfig weight_quantization, activation_quantization, sparse_pruning, row_pruning,
      head_pruning, channel_pruning;
  LayerReductionConfig layer_reduction;

  /// Whether any technique (or layer reduction) is enabled.
  bool any_enabled() const;
  /// The techniques in DeepSpeed's order, each with its section name.
  std::vector<std::pair<const char*, const TechniqueConfig*>> techniques() const;
};

/// The section as DeepSpeedConfig validated it at load (read again from its raw JSON).
CompressionConfig compression_config(const DeepSpeedConfig& config);

/// The compression_training section of a whole ds_config JSON (DeepSpeed's init_compression
/// takes a config path or dict); errors name `source` and the key.
CompressionConfig read_compression_config(const json& ds_config, const std::string& source);

}  // namespace deepspeed::compression
