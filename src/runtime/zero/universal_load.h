// checkpoint.load_universal: a rank's part of a universal checkpoint (ds_to_universal's output,
// include/deepspeed/universal_checkpoint.h) read into a ZeroLoadPlan, so that the stage's
// apply_checkpoint installs it as it would a checkpoint of its own shape. Each rank slices its
// tensor-parallel piece of every parameter and optimizer state from the full tensors (by the
// live parameter's mark), then lays its data-parallel partition out by name; so the
// tensor-parallel and data-parallel sizes may differ from the saving run's.
#pragma once

#include "runtime/zero/flat_zero_optimizer.h"
#include "runtime/zero/zero_checkpoint.h"

namespace deepspeed::runtime {

/// Reads ctx.tag_dir (a universal checkpoint folder) into `plan`, calling ctx.check_model_states.
/// `zero`: the engine's stage 0-2 optimizer, or nullptr without an optimizer. Changes nothing.
/// Throws CheckpointError naming the missing folder, file or parameter.
void read_universal_checkpoint(const ZeroCheckpointContext& ctx, FlatZeroOptimizer* zero,
                               int tp_rank, int tp_size, ZeroLoadPlan* plan);

}  // namespace deepspeed::runtime
