// The momentum mask of the 1-bit optimizers: DeepSpeed's exp_avg_mask param-group key, or the
// mask derived from the frozen variance for groups without one (Note [Momentum mask]).
#pragma once

#include <cstddef>

#include <ATen/core/Tensor.h>

#include "deepspeed/onebit.h"

namespace deepspeed::onebit {

/// The index of `group` (one of `optimizer`'s own GroupOptions) among its param groups.
size_t group_index(optim::DsOptimizer& optimizer, const optim::GroupOptions& group);

/// Multiplies `momentum` (an all-reduced momentum or gradient) in place by `mask` (the
/// group's exp_avg_mask, viewed as momentum's shape) or, when `mask` is undefined, by
/// (exp_avg_sq != 0).
void mask_momentum(at::Tensor& momentum, const at::Tensor& mask, const at::Tensor& exp_avg_sq);

}  // namespace deepspeed::onebit
