// The process groups of ZeRO-3's variants, made once per layout and kept for the life of the
// process (zero::Init and the engine share them).
//
// MiCS (zero_optimization.mics_shard_size > 0): ZeRO-3 partitions each parameter, its gradient
// and its optimizer state over a shard group of mics_shard_size consecutive ranks instead of the
// whole data-parallel group, and the W / S shard groups hold replicas of one another. A gather
// then spans S ranks, never the world; the gradients are reduce-scattered inside the shard
// group and all-reduced across the replicas (the ranks with the same shard rank) once per
// accumulation boundary. Checkpoints are those of ZeRO-3 on S ranks, written by the first
// shard group (DeepSpeed's MiCS_Optimizer and its engine's is_first_weights_partition_group).
//
// mics_hierarchical_params_gather splits a shard group that spans several nodes: a gather goes
// first across the nodes (ranks with the same local rank) and then inside each node (Note
// [Hierarchical gather] in stage3_param.h). A node is NDEV_PER_NODE ranks (DeepSpeed's
// debugging variable), else the launcher's LOCAL_WORLD_SIZE.
#pragma once

#include <optional>

#include "deepspeed/comm.h"
#include "deepspeed/config.h"

namespace deepspeed::runtime {

struct MicsGroups {
  comm::Group shard;    // S consecutive ranks: shard r of every parameter lives on group rank r
  comm::Group replica;  // the W / S ranks holding this rank's shards
  /// With mics_hierarchical_params_gather: this rank's ranks of its shard group on other nodes
  /// (same local rank) and on its own node. Empty groups otherwise.
  comm::Group inter_node;
  comm::Group intra_node;
  bool hierarchical() const { return intra_node.valid(); }
};

/// DeepSpeed's MiCS layout (mics_utils.create_mics_comm_groups) over `dp_group`, which must be
/// the world: shard groups {0..S-1}, {S..2S-1}, ...; replica groups {r, r+S, r+2S, ...}.
/// Collective over the world. nullopt unless ZeRO stage 3 with mics_shard_size > 0.
/// Throws ConfigError naming the key when S does not divide the world, or when a hierarchical
/// gather is asked for a shard group on one node; NotSupportedError with an mpu.
std::optional<MicsGroups> make_mics_groups(const DeepSpeedConfig& config,
                                           const comm::Group& dp_group, bool has_mpu);

/// The ranks of a node for MiCS' hierarchy: NDEV_PER_NODE, else the local world size.
int mics_ranks_per_node();

/// ZeRO++'s hpZ (zero_hpz_partition_size H > 1): this rank's group of H consecutive ranks
/// (DeepSpeed's _create_zero_param_parallel_group), over which a parameter gathered once is
/// kept as a secondary partition and gathered again (Note [Secondary partition] in
/// stage3_param.h). Collective over the world; nullopt unless stage 3 with H > 1. Throws
/// ConfigError naming the key when H does not divide the world, NotSupportedError with an
/// mpu.
std::optional<comm::Group> make_hpz_group(const DeepSpeedConfig& config,
                                          const comm::Group& dp_group, bool has_mpu);

/// A data-parallel world cut into nodes of L consecutive ranks (rank = node * L + local).
struct NodeGroups {
  comm::Group intra_node;  // the L ranks of this rank's node, by local rank
  comm::Group inter_node;  // the ranks with this rank's local rank, one per node, by node
};

/// ZeRO++'s qgZ (zero_quantized_gradients): the groups of Note [Quantized reduction]
/// (quantized_reduction.h), nodes of mics_ranks_per_node() ranks. Collective over the world.
/// nullopt unless stage 3 with the key, or when the world is one node (as in DeepSpeed, qgZ
/// then reduces as plain ZeRO-3, with a warning here). Throws ConfigError naming the key when
/// the node size does not divide the world or reduce_scatter is false; NotSupportedError with
/// an mpu or MiCS.
std::optional<NodeGroups> make_qgz_groups(const DeepSpeedConfig& config,
                                          const comm::Group& dp_group, bool has_mpu);

}  // namespace deepspeed::runtime
