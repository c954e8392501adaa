// FP16_UnfusedOptimizer's checkpoint layout. At 16-bit stage 0 DeepSpeed wraps its FusedAdam in
// FP16_Optimizer (one flat fp32 master per param group: 'fp32_groups_flat', the inner optimizer's
// state over each flat) and every other optimizer (torch's Adam/AdamW with `torch_adam`, Lamb,
// Lion, Adagrad, SGD, a client's) in FP16_UnfusedOptimizer, whose state_dict holds one fp32 master
// per parameter ('fp32_groups': per param group, a list) and the inner optimizer's state per
// parameter. Its load hands that state to the inner optimizer as it is, so DeepSpeed resumes a
// stage-0 checkpoint only in the layout its own wrapper writes.
//
// Our 16-bit stage 0 keeps FP16_Optimizer's flat masters for every optimizer; these convert its
// masters and state to the per-parameter layout for a save and back for a load.
#pragma once

#include <string>
#include <vector>

#include <ATen/core/ivalue.h>
#include <ATen/core/Tensor.h>

#include "runtime/zero/zero_optimizer.h"

namespace torch::optim {
class Optimizer;
}

namespace deepspeed::runtime {

/// Whether DeepSpeed (0.19) wraps `optimizer` in FP16_UnfusedOptimizer at 16-bit stage 0: every
/// optimizer but its FusedAdam (optim::Adam here). The 1-bit optimizers keep FP16_Optimizer's
/// layout (their error buffers span each flat group; docs/onebit.md).
bool deepspeed_wraps_unfused(torch::optim::Optimizer& optimizer);

/// FP16_UnfusedOptimizer's 'fp32_groups' and 'optimizer_state_dict'.
struct PerParameterState {
  c10::IValue fp32_groups;           // per group, its parameters' fp32 masters (views)
  c10::IValue optimizer_state_dict;  // per parameter, indices running over the groups in order
};

/// Cuts each flat group's master (`masters[g]`, padding included) and each per-element tensor of
/// its state in `flat_state_dict` (optim::optimizer_state_dict over the flats) into the group's
/// parameters, shaped as they are; other state entries (the step) go to every parameter.
PerParameterState split_into_parameters(const std::vector<FlatGroupLayout>& layout,
                                        const std::vector<at::Tensor>& masters,
                                        const c10::IValue& flat_state_dict);

/// The flat masters (padded to each group's partition_numel) and the state over the flats,
/// for optim::load_optimizer_state_dict.
struct FlatState {
  std::vector<at::Tensor> masters;
  c10::IValue optimizer_state_dict;
};

/// The reverse of split_into_parameters for a file's FP16_UnfusedOptimizer dict: checks that each
/// group holds the layout's parameters (count and sizes), naming `path` and the parameter.
FlatState join_parameters(const std::vector<FlatGroupLayout>& layout,
                          const c10::IValue& fp32_groups, const c10::IValue& state_dict,
                          const std::string& path);

}  // namespace deepspeed::runtime
