// Re-partitioning ZeRO-1/2 checkpoint data for a different layout: the flat fp32 masters and the
// optimizer's per-element states that W_old ranks saved are cut into parameters by name, then
// laid out again as this engine's flat groups (any world size, param-group split or round-robin
// order). This is what lets a checkpoint written by W ranks resume on W' ranks, and a checkpoint
// written by Python DeepSpeed load into our flat groups.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "deepspeed/checkpoint.h"
#include "runtime/zero/zero_optimizer.h"

namespace deepspeed::runtime {

/// One parameter's saved elements (1-D, fp32 or the state's dtype) and its shape.
struct SavedParam {
  at::Tensor flat;
  checkpoint::Shape shape;
};
using SavedParams = std::map<std::string, SavedParam>;

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
