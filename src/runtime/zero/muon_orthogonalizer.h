// Muon under ZeRO 1/2 and 16-bit stage 0, where the optimizer steps flat partitions. Newton-
// Schulz needs whole matrices, so at the accumulation boundary, after the overflow check and
// before the gradient norm (DeepSpeed's order: an overflow leaves the momentum alone, clipping
// sees the orthogonalized updates):
//  1. each rank updates its slice of the momentum from its slice of the averaged gradient and
//     blends them (Nesterov), both elementwise, so the momentum stays partitioned like any
//     other optimizer state (and checkpoints, re-partitions and universal checkpoints as one);
//  2. the blended slices are all-gathered into the whole flat update;
//  3. each rank orthogonalizes the matrices that overlap its slice (one straddling two slices
//     is computed by both, on the same values) and keeps its slice of the result as the
//     gradient, which the step applies as it is (optim::Muon::mark_orthogonalized).
// A slice with a non-finite element keeps its momentum and its gradient, so the overflow check
// still sees it (DeepSpeed's muon_update does the same per matrix).
#pragma once

#include <ATen/core/Tensor.h>

#include "deepspeed/comm.h"
#include "deepspeed/muon.h"
#include "runtime/zero/flat_group.h"

namespace deepspeed::runtime {

/// Replaces `grad_partition` (this rank's averaged gradient slice of `group`, which `group`
/// cuts into `group.world_size()` slices over `comm_group`) by its slice of the orthogonalized
/// Muon update, advancing `momentum` (the same slice's momentum_buffer). The gradients carry
/// `loss_scale`, and so does the momentum, as in DeepSpeed; Newton-Schulz drops it, so the update
/// is multiplied by it to be unscaled like a gradient. Collective over `comm_group` when the
/// group has more than one slice.
void orthogonalize_muon_partition(const FlatGroup& group, at::Tensor& grad_partition,
                                  at::Tensor& momentum, double beta, optim::NsMethod method,
                                  double loss_scale, const comm::Group& comm_group);

}  // namespace deepspeed::runtime
