// PartitionedParam: one model parameter under ZeRO-3 (reference §7.6) and the two operations on
// it: gather (all ranks' shards into the parameter's own storage) and release (the storage
// shrunk to 0 bytes). It owns nothing of the optimizer: the shard it gathers from is a view
// that the sub-group (stage3_sub_group.h) writes after each step.
//
// Note [Release by storage resize]: autograd keeps the parameter (and views of it, e.g. W.t()
// saved by addmm) for backward. Those all share the parameter's StorageImpl, so release keeps
// that StorageImpl and swaps its DataPtr for an empty one; gather allocates a fresh DataPtr of
// the padded size and all-gathers into it. Writes go through a separate tensor over the same
// storage, so the parameter's version counter does not move and autograd does not report an
// in-place modification. Replacing the tensor instead (set_data) would free nothing: the saved
// views would keep the old storage alive.
//
// Note [Coalesced gathers]: a collective costs a round trip whatever its size (about 1 ms on
// Gloo over loopback, tens of microseconds on NCCL), and a unit holds several small parameters
// (biases, norms) whose shards are a few KB; the persistent parameters refreshed after every
// step are dozens of those. So the shards of at most kCoalesceShardBytes that are gathered
// together (one unit's fetch, one prefetch, the refresh) travel in one collective: concatenated,
// all-gathered into a [world, S] buffer, and copied out to each parameter's storage when the
// first of them is waited for. Larger shards gain nothing and would pay the copy: each is
// gathered straight into its storage, as before. DeepSpeed coalesces its fetches likewise.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "deepspeed/comm.h"
#include "runtime/accelerator/side_stream.h"
#include "runtime/zero/block_quantizer.h"

namespace deepspeed::runtime {

/// DeepSpeed's shard rule: ceil(numel / world) elements per rank; rank r holds flat elements
/// [r * shard, (r + 1) * shard), the tail of the last shards past numel is padding.
inline int64_t shard_numel_for(int64_t numel, int world) {
  return (numel + world - 1) / world;
}

/// Gives `param` a storage of its own holding exactly its elements (contiguous, offset 0) so
/// that resizing that storage touches no other tensor. Keeps the Variable's identity.
void ensure_own_storage(const at::Tensor& param);
/// Whether the parameter's storage currently holds its data (false once released).
bool storage_is_allocated(const at::Tensor& param);
/// The parameter's storage as a flat tensor of `numel` elements (after resizing the storage to
/// at least that size). Writing it does not bump the parameter's version counter.
at::Tensor storage_as_flat(const at::Tensor& param, int64_t numel);
/// Frees the parameter's storage, keeping the StorageImpl (see Note [Release by storage resize]).
void free_storage(const at::Tensor& param);

// Note [Hierarchical gather]: under MiCS with mics_hierarchical_params_gather a shard group
// spans N nodes of L ranks, shard rank s = n * L + l. The gather goes in two steps, as
// DeepSpeed's _hierarchical_all_gather_params: across the nodes (the N ranks with local rank l
// gather their shards, so the slow links carry each shard once per node rather than once per
// rank) and then inside each node (the L ranks gather those [N, shard] blocks), after which
// the blocks are put in shard-rank order. It completes before it returns: the second step
// waits for the first, and the reordering for the second.

// Note [Secondary partition]: ZeRO++'s hpZ (zero_hpz_partition_size H). A parameter gathered
// from all W ranks is, when released, also kept as this rank's 1/H of it within its group of H
// consecutive ranks (one node, typically): padded / H elements, DeepSpeed's ds_secondary_tensor.
// Until the optimizer step changes the parameter, every later gather (the backward's, the next
// forward's when a step is skipped) all-gathers those over the H ranks instead of the W: the
// slow links carry the forward's gather only. refresh_gathered(), after each step and after a
// checkpoint load, drops them (DeepSpeed's invalidate_secondary_tensor). The cost is padded / H
// more elements per parameter and rank between its forward and the step.

// Note [Quantized gather]: ZeRO++'s qwZ (zero_quantized_weights). The unit fetches of a
// training step (forward, backward, their prefetches) carry each shard as blockwise int8 and
// its per-group steps (block_quantizer.h), and every rank, its own shard included, reads the
// parameter back from those: a quarter of fp32's bytes, half of bf16's, for weights within
// 0.4 % of each group's largest magnitude (0.8 % for those clamped). The optimizer steps the
// exact shards; only the forward and backward see the rounded weights. As in DeepSpeed, gathers
// that leave the parameter in place for other uses stay exact: the persistent parameters,
// their refresh after each step, zero::GatheredParameters. With one rank nothing is gathered,
// so nothing is quantized. Quantized gathers always take the coalesced path, which
// dequantizes once the collectives are done.

// Note [Quantized frozen shards]: ZeRO++'s zero_quantized_nontrainable_weights. A parameter
// that does not require grad keeps its shard as blockwise int8 with its groups' steps
// (block_quantizer.h), quantized once when the engine partitions the model: a quarter of fp32's
// bytes, half of bf16's, for the weights a fine-tuning run (LoRA) never steps. Every gather of
// it, whatever the path (a unit fetch, a persistent parameter, zero::GatheredParameters, one
// rank), carries those values and steps and reads them back: the model sees the same rounded
// weights everywhere, within 0.4 % of each group's largest magnitude (0.8 % for those clamped),
// as in DeepSpeed, which quantizes ds_tensor in _partition_param. Each shard has its own groups,
// so a coalesced gather reads each parameter's rows back on their own. A checkpoint holds the
// weights read back; loading a fragment equal to them keeps the shard as it is (a fresh
// rounding of rounded weights could move some by a step), another fragment is quantized anew.

// Note [Expert partitions]: AutoEP under ZeRO-3 (DeepSpeed's "autoep_expert" placement). Each
// rank holds the stacked weights of its E / P experts, which its expert-data-parallel group of
// W / P ranks (those with its expert-parallel rank) hold too: those weights are partitioned over
// that group, not over all W ranks, and gathered and reduce-scattered over it. Their gradients
// are still divided by W (DeepSpeed's _gradient_averaging_world_size): each expert saw the tokens
// of every rank. Every element of every expert then lives on exactly one rank of the world, so
// the gradient norm and the overflow vote over the data-parallel group stay exact. An expert
// parameter's optimizer param group holds experts only (moe_param_groups.h), so its sub-groups
// do too.

/// The ranks a parameter's shards are spread over: the data-parallel group, or under MiCS this
/// rank's shard group (stage3_groups.h). Shard r lives on group rank r.
struct ShardGroup {
  ShardGroup() = default;
  ShardGroup(comm::Group g) : group(std::move(g)) {}  // NOLINT: a plain group converts
  comm::Group group;
  /// Note [Hierarchical gather]: the ranks of this shard group with this rank's local rank (one
  /// per node), and those on this rank's node. Empty: one all-gather over `group`.
  comm::Group inter_node;
  comm::Group intra_node;
  /// Note [Secondary partition]: hpZ's group of H ranks; empty without hpZ.
  comm::Group secondary;
  /// Note [Quantized gather]: shards travel as blockwise int8.
  bool quantize_weights = false;
  int size() const { return group.size(); }
  int rank() const { return group.rank(); }
};

/// All-gathers every rank's `input` into `output` (rank-major, size() * input.numel()), in
/// one collective or in the two steps of Note [Hierarchical gather] (then synchronously).
comm::Handle all_gather_shards(at::Tensor& output, const at::Tensor& input, bool async,
                               const ShardGroup& group);

/// Shards up to this size are gathered together (Note [Coalesced gathers]).
constexpr int64_t kCoalesceShardBytes = int64_t{1} << 20;

/// One collective gathering several parameters (Note [Coalesced gathers]); defined in the .cpp.
struct CoalescedGather;

struct PartitionedParam {
  at::Tensor param;  // the model's Variable; its sizes never change
  std::string name;
  int64_t numel = 0;
  int64_t shard_numel = 0;  // ceil(numel / world)
  /// The partition group it is cut for: 0 the data-parallel one (or MiCS' shard group), 1
  /// AutoEP's expert-data-parallel group (Note [Expert partitions]); and that group's size.
  int partition = 0;
  int world = 1;
  at::Tensor shard;         // this rank's shard in the model dtype (DeepSpeed's ds_tensor)
  /// The dtype the shards travel in when gathered: torch_autocast's dtype for its
  /// lower-precision modules, else kUndefined (the shard's own).
  at::ScalarType gather_dtype = at::ScalarType::Undefined;
  bool trainable = false;   // stepped by the optimizer (requires grad and in a param group)
  bool persistent = false;  // stays gathered: small, or used outside any unit
  bool available = false;   // the full data is in the storage (or arriving: see `inflight`)
  int active_users = 0;     // unit calls that are running (forward or backward) and need it
  comm::Handle inflight;    // the all-gather filling the storage, while not yet waited for
  SideStream::Mark copied;  // the host-to-device copy filling it (world 1), while not waited for
  at::Tensor gather_target; // the flat padded storage the in-flight all-gather writes
  std::shared_ptr<CoalescedGather> coalesced;  // the shared collective filling it, if in flight
  /// Note [Secondary partition]: this rank's padded / H elements, while valid; else undefined.
  at::Tensor secondary;
  /// Note [Quantized frozen shards]: the shard as int8 blocks; `shard` is then undefined.
  QuantizedBlocks quantized;

  int64_t padded_numel(int group_size) const { return shard_numel * group_size; }
  int64_t padded_numel() const { return shard_numel * world; }
  bool kept_quantized() const { return quantized.values.defined(); }
};

/// Note [Quantized frozen shards]: keeps `p`'s shard as int8 blocks from now on.
void quantize_shard(PartitionedParam& p);
/// `p`'s shard values in the model dtype (those read back from the blocks: a new tensor).
at::Tensor shard_values(const PartitionedParam& p);
/// Writes `values` (shard_numel elements) into `p`'s shard; a quantized shard is quantized
/// anew unless `values` are what it reads back already.
void set_shard_values(PartitionedParam& p, const at::Tensor& values);
/// The bytes `p`'s shard takes in memory.
int64_t shard_bytes(const PartitionedParam& p);

/// Starts gathering `p` (asynchronously when `async`): allocates its storage at the padded size
/// and all-gathers every rank's shard into it, or, with `use_all_reduce`, all-reduces a
/// zero-filled buffer holding only this rank's shard (stage3_use_all_reduce_for_fetch_params).
/// `group`'s rank r holds shard r.
void start_gather(PartitionedParam& p, const ShardGroup& group, bool async, bool use_all_reduce);
/// start_gather for each of `params` that is not available, with one collective for the small
/// shards of each dtype (Note [Coalesced gathers]). Returns the number of collectives issued.
int64_t start_gathers(const std::vector<PartitionedParam*>& params, const ShardGroup& group,
                      bool async, bool use_all_reduce);
/// start_gathers for parameters of either partition (Note [Expert partitions]): those of
/// `groups[k]` gathered over it, partition 0's first. Returns the collectives issued.
int64_t start_partitioned_gathers(const std::vector<PartitionedParam*>& params,
                                  const std::vector<ShardGroup>& groups, bool async,
                                  bool use_all_reduce);
/// Waits for an in-flight gather of `p` (no-op if none): on a GPU, the current stream waits.
void finish_gather(PartitionedParam& p);
/// The host waits until no copy reads a host shard any more (Note [Offloaded shards to the
/// device]): before it rewrites one (the optimizer step, an NVMe buffer's reuse).
void wait_for_shard_copies();
/// Releases `p`'s storage (waits for an in-flight gather first).
void release(PartitionedParam& p);
/// Note [Secondary partition]: before `p` (gathered) is released, keeps its secondary
/// partition unless it has one or `group` has no secondary group.
void keep_secondary(PartitionedParam& p, const ShardGroup& group);

}  // namespace deepspeed::runtime
