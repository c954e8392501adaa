// Re-partitioning ZeRO checkpoint data for a different layout: the flat fp32 masters and the
// optimizer's per-element states that W_old ranks saved are cut into parameters by name, then
// laid out again as this engine's flats (any world size, param-group split, round-robin order or
// sub_group_size). This is what lets a checkpoint written by W ranks resume on W' ranks, and a
// checkpoint written by Python DeepSpeed load into our flat groups. One routine,
// repartition_zero_state, serves stages 1/2 and 3; they differ only in how a saved flat is cut
// into parameters and how this rank's flat is laid out (RepartitionLayout).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include "deepspeed/checkpoint.h"
#include "runtime/zero/zero_optimizer.h"

namespace deepspeed::runtime {

/// One parameter's saved elements (1-D, fp32 or the state's dtype) and its shape.
struct SavedParam {
  at::Tensor flat;
  checkpoint::Shape shape;
};
using SavedParams = std::map<std::string, SavedParam>;

/// What differs between the stages' layouts. "Saved flat k" is the inner optimizer's parameter k
/// in the saved files (a flat group for stages 1/2, a sub-group for stage 3); "own flat g" this
/// engine's.
struct RepartitionLayout {
  /// Adds saved flat k's parameters to `out`; `per_rank` holds every saved rank's piece of it
  /// (its fp32 masters or one per-element optimizer state), in rank order.
  std::function<void(size_t k, const std::vector<at::Tensor>& per_rank, SavedParams* out)> split;
  /// This rank's own flat g in `dtype`, filled by name from `saved`; padding zero.
  std::function<at::Tensor(size_t g, const SavedParams& saved, at::ScalarType dtype)> assemble;
  /// The saved flat that saved param group `pg` lists as parameter id `id`.
  std::function<size_t(size_t pg, int64_t id)> saved_flat_of;
  size_t own_flats = 0;
  /// Per own flat: the inner optimizer's param group it belongs to (a saved group of the same
  /// index).
  std::vector<size_t> own_param_group;
};

/// What the saved ranks hold.
struct SavedZeroRanks {
  std::vector<std::vector<at::Tensor>> masters;  // [rank][saved flat]: fp32 masters
  /// [rank]: the inner optimizer's state dict ({state, param_groups}); empty when the
  /// optimizer state is not wanted. The caller checked that rank 0's has both keys and enough
  /// param groups.
  std::vector<c10::IValue> optimizer_states;
  /// [saved flat]: a 1-D state tensor of this many elements (rank 0's) is per-element state,
  /// re-laid like the masters; any other value (step counts) is taken from rank 0 as it is.
  std::vector<int64_t> state_numel;
  std::string source;  // the file errors name
};

struct RepartitionedZeroState {
  std::vector<at::Tensor> masters;  // per own flat: this rank's fp32 partition (padding zero)
  c10::IValue optimizer_state;      // the inner optimizer's state dict for the own flats, or None
};

/// Re-lays the saved masters and optimizer state for this engine's flats. Optimizer state: each
/// saved param group keeps its options, lists the own flats of that group, and gives each of
/// them the state its saved flats had (scalars from the group's first saved flat with state).
/// Throws CheckpointError naming saved.source.
RepartitionedZeroState repartition_zero_state(const SavedZeroRanks& saved,
                                              const RepartitionLayout& layout);

/// Cuts one saved param group into parameters. `full` is the group's flat vector: every saved
/// rank's partition concatenated in rank order (padding, if any, only at the end); `shapes`
/// are the group's param_shapes in flattening order. Adds the parameters to `out`. Throws
/// CheckpointError naming `source` when `full` holds fewer elements than the shapes need or a
/// name repeats across groups.
void split_saved_group(const at::Tensor& full, const checkpoint::ShapeDict& shapes,
                       const std::string& source, SavedParams* out);

/// This rank's partition of `layout` (layout.partition_numel elements; padding zero) filled by
/// parameter name from `saved`, in `dtype`. Throws CheckpointError naming `source` and listing
/// the first parameters that are missing or whose shape differs.
at::Tensor assemble_partition(const FlatGroupLayout& layout, const SavedParams& saved,
                              at::ScalarType dtype, const std::string& source);

/// Whether `layout` flattens exactly the parameters `shapes` lists, in the same order and with
/// the same shapes, over `partitions` ranks: then a saved rank's partition is this rank's as is.
bool same_layout(const FlatGroupLayout& layout, const checkpoint::ShapeDict& shapes,
                 int64_t partitions);

// ---- ZeRO-3: each parameter's ceil(numel / W) shard sits at the same offset of every rank's
// flat (reference §6.4, stage 3) ----

/// One parameter in a stage-3 sub-group flat.
struct Stage3Slot {
  std::string name;
  checkpoint::Shape shape;
  int64_t shard_numel = 0;  // ceil(numel / W) for the W the flat was built for
  int64_t offset = 0;       // its shard's first element in the flat
};

/// The slots of a saved sub-group: `shapes` in order, shards of ceil(numel / world) laid end to
/// end (DeepSpeed's fp32_flat_groups layout).
std::vector<Stage3Slot> stage3_slots(const checkpoint::ShapeDict& shapes, int64_t world);

/// Rebuilds parameters from one saved sub-group: `flats[r]` is rank r's flat (all W ranks).
/// Adds them to `out`. Throws CheckpointError naming `source` when a flat is too short.
void split_stage3_flats(const std::vector<at::Tensor>& flats,
                        const std::vector<Stage3Slot>& slots, const std::string& source,
                        SavedParams* out);

/// Rank `rank`'s flat of `numel` elements for `slots` (built for this world size) from `saved`,
/// in `dtype`; padding zero. Throws CheckpointError listing the first missing or reshaped
/// parameters.
at::Tensor assemble_stage3_flat(const std::vector<Stage3Slot>& slots, int64_t numel, int rank,
                                const SavedParams& saved, at::ScalarType dtype,
                                const std::string& source);

}  // namespace deepspeed::runtime
