// checkpoint.load_universal: a rank's part of a universal checkpoint (ds_to_universal's output,
// include/deepspeed/universal_checkpoint.h) read into a ZeroLoadPlan, so that the stage's
// apply_checkpoint installs it as it would a checkpoint of its own shape. Each rank slices its
// tensor-parallel piece of every parameter and optimizer state from the full tensors (by the
// live parameter's mark), then lays its data-parallel partition out by name; so the
// tensor-parallel and data-parallel sizes may differ from the saving run's. Under ZeRO-3 each
// rank lays out its shards of every sub-group the same way.
#pragma once

#include "runtime/zero/flat_zero_optimizer.h"
#include "runtime/zero/stage3.h"
#include "runtime/zero/zero_checkpoint.h"

namespace deepspeed::runtime {

/// Reads ctx.tag_dir (a universal checkpoint folder) into `plan`, calling ctx.check_model_states.
/// `zero`: the engine's stage 0-2 optimizer, or nullptr without an optimizer. Changes nothing.
/// Throws CheckpointError naming the missing folder, file or parameter.
void read_universal_checkpoint(const ZeroCheckpointContext& ctx, FlatZeroOptimizer* zero,
                               int tp_rank, int tp_size, ZeroLoadPlan* plan);

/// The same for ZeRO-3 (no tensor parallelism): every sub-group's fp32 flat, its optimizer
/// state and the frozen shards of this data-parallel rank, cut from the full tensors by name.
void read_universal_checkpoint(const ZeroCheckpointContext& ctx, Stage3ZeroOptimizer& zero,
                               ZeroLoadPlan* plan);

}  // namespace deepspeed::runtime
