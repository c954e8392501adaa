// Which module each recorded operator belongs to.
//
// Note [Op attribution]
// C++ modules have no forward hooks, so the module running an operator is inferred:
//  1. An operator from the cost table that reads a parameter or buffer (addmm with a bias,
//     layer_norm, embedding) belongs to the module registering that tensor. If several do
//     (shared weights), the one closest to the previous operator's module. A torch::nn::Linear
//     runs t(weight) then matmul / addmm; an operator reading that t() view right after it is
//     the Linear's too (views of other modules' parameters, e.g. a tied output projection
//     reading wte.weight.t() in the model's forward, do not anchor).
//  2. Any other operator lies between two such "anchored" operators (or the start / end of the
//     profile, which count as the root) and is given to their lowest common ancestor: the
//     deepest module whose forward certainly spans both, and so contains the operator. This is
//     exact for the model and its upper levels and a lower bound below (a residual add at the
//     end of block h.0, followed by h.1's first operator, goes to "h", not to "h.0").
//  3. A ModuleScope makes it exact: an operator inside a scope goes to the scope's module unless
//     rule 1 or 2 found a module inside that scope.
#pragma once

#include <vector>

#include "profiling/module_tree.h"
#include "profiling/op_recorder.h"

namespace deepspeed::profiling::detail {

/// The node of each event, in order.
std::vector<int> attribute_events(const ModuleTree& tree, const std::vector<OpEvent>& events);

}  // namespace deepspeed::profiling::detail
