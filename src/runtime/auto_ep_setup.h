// The engine's AutoEP (the `expert_parallel` section): shards the experts of a model's
// TokenChoiceMoE layers over expert-parallel groups at initialize, as DeepSpeed 0.19.8's
// _configure_expert_parallel replaces a Hugging Face model's MoE blocks (deepspeed/auto_ep.h).
#pragma once

#include <torch/nn/module.h>

#include "deepspeed/comm.h"
#include "deepspeed/config.h"

namespace deepspeed::runtime {

/// With expert_parallel.enabled: applies the section's routing overrides to each selected
/// TokenChoiceMoE layer (all of them, or those whose module name moe_layer_pattern fully
/// matches), broadcasts their whole expert weights from `dp_group`'s first rank, and keeps on
/// each rank the experts of its expert-parallel rank (groups "ep_size_<autoep_size>", cut from
/// `dp_group` as DeepSpeed's MoE groups are). Collective over the world. ConfigError naming the
/// key when autoep_size does not fit the layers or the data-parallel size; NotSupportedError for
/// the combinations this build lacks (ZeRO-3, tensor or pipeline parallelism). A no-op when the
/// section is off: the layers stay whole, each rank running every expert.
void configure_auto_ep(torch::nn::Module& module, const DeepSpeedConfig& config,
                       const comm::Group& dp_group, bool model_parallel);

}  // namespace deepspeed::runtime
