// Global gradient norm and clipping (DeepSpeed's clip_grad_norm_ for the replicated fp32 path).
#pragma once

#include <vector>

#include <ATen/core/Tensor.h>

namespace deepspeed::runtime {

/// L2 norm over the .grad of every tensor in `params` (undefined grads count as zero).
/// Gradients are replicated after the ZeRO-0 all-reduce, so the local norm is the global one.
double global_grad_norm(const std::vector<at::Tensor>& params);

/// Matches DeepSpeed: coef = max_norm / (norm + 1e-6); gradients are scaled by coef only when
/// coef < 1. Returns the coefficient applied (1.0 when nothing was clipped).
double clip_grads_by_norm(const std::vector<at::Tensor>& params, double norm, double max_norm);

/// Matches DeepSpeed: max_norm / (norm + 1e-6) when that is below 1 (and max_norm > 0), else 1.
double clip_coefficient(double norm, double max_norm);

}  // namespace deepspeed::runtime
