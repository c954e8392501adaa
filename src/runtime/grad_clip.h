// Global gradient norm and clipping (DeepSpeed's clip_grad_norm_ for the replicated fp32 path).
#pragma once

#include <vector>

#include <ATen/core/Tensor.h>

#include "deepspeed/comm.h"

namespace deepspeed::runtime {

/// Sum of the squares of `t`'s elements, accumulated in double. LibTorch 1.13's CPU norm() of a
/// float tensor accumulates in float: over the hundreds of millions of elements of a ZeRO
/// partition its error reaches percents, which the gradient norm and clipping then carry.
double squared_l2_norm(const at::Tensor& t);

/// The sum of squared_l2_norm over `tensors` (undefined ones count as zero), in their order.
/// Device tensors are summed where they live: one host synchronisation in all, not one each.
double squared_l2_norm(const std::vector<at::Tensor>& tensors);

/// `value` summed over `group` (one double all-reduce): a partial squared norm made global.
double sum_over_group(double value, const comm::Group& group);

/// L2 norm over the .grad of every tensor in `params` (undefined grads count as zero).
/// Gradients are replicated after the ZeRO-0 all-reduce, so the local norm is the global one.
double global_grad_norm(const std::vector<at::Tensor>& params);

/// Matches DeepSpeed: coef = max_norm / (norm + 1e-6); gradients are scaled by coef only when
/// coef < 1. Returns the coefficient applied (1.0 when nothing was clipped).
double clip_grads_by_norm(const std::vector<at::Tensor>& params, double norm, double max_norm);

/// Matches DeepSpeed: max_norm / (norm + 1e-6) when that is below 1 (and max_norm > 0), else 1.
double clip_coefficient(double norm, double max_norm);

}  // namespace deepspeed::runtime
