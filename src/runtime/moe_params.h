// The engine's view of a model's MoE layers (deepspeed::moe): which parameters are experts,
// over which groups they are reduced, and the flat broadcast the engine starts ranks with.
#pragma once

#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include "deepspeed/comm.h"
#include "deepspeed/config.h"
#include "runtime/zero/zero_optimizer.h"

namespace deepspeed::runtime {

/// Gives the model's MoE layers their expert groups, cut from the data-parallel groups (the
/// config's use_data_before_expert_parallelism); collective over the world. No-op without MoE
/// layers, except in a pipeline (`pipeline_stages` > 1), where the stages hold different layers:
/// every rank then makes the groups of every ep_size some stage uses, in one order.
void configure_moe_layers(torch::nn::Module& module, const DeepSpeedConfig& config,
                          const comm::Group& dp_group, int pipeline_stages);

/// The model's expert parameters by group (after configure_moe_layers); empty without MoE.
std::vector<ExpertParams> moe_expert_params(torch::nn::Module& module);

/// DeepSpeed's _broadcast_model: every parameter from `dp_group`'s first rank, MoE expert
/// parameters from their expert-data-parallel group's first rank; one flat broadcast per dtype
/// and group.
void broadcast_module_parameters(torch::nn::Module& module, const comm::Group& dp_group);

}  // namespace deepspeed::runtime
