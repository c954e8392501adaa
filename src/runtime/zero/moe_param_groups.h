// MoE parameter groups for the flat ZeRO stages (DeepSpeed's
// split_params_into_different_moe_groups_for_optimizer, which its engine applies to the
// optimizers it builds): an expert's parameters are partitioned over its expert-data-parallel
// group, so they cannot share a flat group with dense parameters, partitioned over the whole
// data-parallel group. Each optimizer param group gives its expert parameters up to new groups,
// one per expert group it holds parameters of, appended after the original groups with the
// original's options (lr, betas, weight decay ...). A group that holds one expert group's
// parameters alone is left as it is (already an MoE group).
#pragma once

#include <vector>

#include "runtime/zero/zero_optimizer.h"

namespace torch::optim {
class Optimizer;
}

namespace deepspeed::runtime {

/// Splits `optimizer`'s param groups (before its first step) and returns, for every param group
/// after the split, the index in `experts` of the expert group its parameters belong to, or -1
/// for a dense group. No-op (all -1) when `experts` is empty.
std::vector<int> split_moe_param_groups(torch::optim::Optimizer& optimizer,
                                        const std::vector<ExpertParams>& experts);

}  // namespace deepspeed::runtime
