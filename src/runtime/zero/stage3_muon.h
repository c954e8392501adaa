// Muon under ZeRO-3, where every parameter is cut into one shard per rank and a sub-group's flat
// holds this rank's shard of each. Newton-Schulz needs whole matrices, so at the accumulation
// boundary, after the overflow check and before the norm (DeepSpeed's stage-3 order: an overflow
// leaves the momentum alone, clipping sees the orthogonalized updates), for each sub-group of a
// Muon param group:
//  1. each rank advances its shards of the momentum from its shards of the averaged gradient
//     and blends them (Nesterov), elementwise, as under ZeRO 1/2 (muon_orthogonalizer.h): the
//     momentum stays partitioned like any other per-element optimizer state;
//  2. the blends of a bucket of parameters (reduce_bucket_size elements at most, as DeepSpeed
//     bounds it) are all-gathered, so every rank sees each whole matrix;
//  3. the parameters are dealt round-robin, as DeepSpeed deals them: each rank orthogonalizes its
//     own, the updates are all-gathered, and each rank keeps its shard of every update as the
//     gradient, which the step applies as it is (optim::Muon::mark_orthogonalized).
// A shard with a non-finite element keeps its momentum and its gradient, as under ZeRO 1/2.
#pragma once

#include <cstdint>
#include <vector>

#include "deepspeed/comm.h"
#include "deepspeed/muon.h"
#include "runtime/zero/stage3_param.h"
#include "runtime/zero/stage3_sub_group.h"

namespace deepspeed::runtime {

class Stage3Muon {
 public:
  /// Marks the masters of `sub_groups` that belong to `muon`'s Muon param groups as stepping
  /// orthogonalized gradients. The masters must not be re-pointed afterwards.
  Stage3Muon(optim::Muon& muon, const std::vector<Stage3SubGroup>& sub_groups,
             int64_t bucket_numel);

  bool empty() const { return sub_groups_.empty(); }

  /// Replaces the gradients of the Muon sub-groups by this rank's shards of their orthogonalized
  /// updates, advancing the momentum; the gradients carry `loss_scale`, and so do the momentum and
  /// the updates (see orthogonalize_muon_partition). Collective over `group` (the partition
  /// group: rank r holds shard r of every parameter).
  void orthogonalize(std::vector<Stage3SubGroup>& sub_groups,
                     const std::vector<PartitionedParam>& params, const comm::Group& group,
                     double loss_scale);

 private:
  optim::Muon& muon_;
  std::vector<size_t> sub_groups_;  // indices of the sub-groups in Muon param groups
  int64_t bucket_numel_;
};

}  // namespace deepspeed::runtime
