// DeepSpeed's ds_autoep_layers: the model-states key (beside num_experts) that describes each
// AutoEP layer of the model that wrote the checkpoint, in the form DeepSpeed's
// _save_moe_checkpoint writes and its loader validates (checkpoint/autoep_zero3_metadata.py):
// the layer's module path and moe_layer_id (MoE and AutoEP layers counted together in
// named_modules order), num_experts, num_local_experts, ep_size, the placement (which experts
// each expert-parallel rank holds), the key prefix of its stacked weights and, for this rank,
// its expert-parallel and expert-data-parallel ranks and its experts' global range.
//
// checkpoint_format says where the experts are: "per_expert_files" at ZeRO 0-2 (DeepSpeed's
// layer_<L>_expert_<E> files), "zero3_partitioned" at ZeRO-3 (in the ZeRO-3 optimizer shards,
// cut for the expert-data-parallel group: Note [Expert partitions] in stage3_param.h). The
// partitioned form loads only with the placement it was written with, as in DeepSpeed.
//
// Not written: DeepSpeed's affine_maps (a general placement descriptor; the contiguous
// placement here needs none: its universal checkpoints slice each rank's experts by ep rank).
#pragma once

#include <string>

#include <ATen/core/ivalue.h>
#include <nlohmann/json.hpp>
#include <torch/nn/module.h>

namespace deepspeed::runtime {

inline constexpr const char* kAutoEPLayersKey = "ds_autoep_layers";
inline constexpr const char* kZero3PartitionedFormat = "zero3_partitioned";

/// This rank's entries for `module`'s sharded AutoEP layers (an empty array without any).
nlohmann::json autoep_layers_metadata(torch::nn::Module& module, bool zero3_partitioned);

/// DeepSpeed's universal_checkpoint_info for a model with AutoEP layers (`layers`, as
/// autoep_layers_metadata gives them): the version, the stacked experts' name pattern
/// (".*\.experts\.w[123]$") and the layers again. DeepSpeed's ds_to_universal requires it.
inline constexpr const char* kUniversalInfoKey = "universal_checkpoint_info";
c10::IValue autoep_universal_checkpoint_info(const nlohmann::json& layers);

/// A checkpoint's ds_autoep_layers value as JSON, each entry without DeepSpeed's affine_maps,
/// whose dicts are keyed by rank numbers (JSON has string keys only) and which nothing here
/// reads; `where` names the file in errors.
nlohmann::json autoep_layers_json(const c10::IValue& value, const std::string& where);

/// Whether a checkpoint's ds_autoep_layers value (None, or DeepSpeed's list) has an entry in
/// the zero3_partitioned format.
bool has_zero3_partitioned_experts(const c10::IValue& ds_autoep_layers, const std::string& where);

/// A zero3_partitioned checkpoint loads only where every saved layer has this rank's placement:
/// the same module path, num_experts, ep_size, ep_rank and expert-data-parallel size.
/// CheckpointError naming `file`, the layer and the field otherwise.
void check_autoep_placement(const c10::IValue& ds_autoep_layers, torch::nn::Module& module,
                            const std::string& file);

}  // namespace deepspeed::runtime
