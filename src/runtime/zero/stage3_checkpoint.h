// ZeRO-3 checkpoints in DeepSpeed's layout (reference §6.1-6.3): every rank writes
// zero_pp_rank_<r>_mp_rank_00_model_states.pt (parameters as 0-element placeholders, buffers,
// param_shapes per sub-group, its frozen-parameter shards) and
// [bf16_]zero_pp_rank_<r>_mp_rank_00_optim_states.pt (zero_stage 3, fp32_flat_groups = its fp32
// sub-group flats, the inner optimizer's state, the loss scaler). zero_to_fp32 consolidates them.
// Reading re-lays the shards for this engine's sub-groups, so a checkpoint loads on another
// number of ranks (or another sub_group_size) too. The engine (engine_checkpoint.cpp) decides
// when; this file knows what.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include "deepspeed/checkpoint.h"
#include "runtime/zero/stage3.h"

namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}

namespace deepspeed::runtime {

/// Sets the stage-3 parts of a rank's model states: `module` parameters replaced by 0-element
/// placeholders (their data lives in the shards), param_shapes per sub-group,
/// frozen_param_shapes / frozen_param_fragments (this rank's shards) unless excluded.
void fill_zero3_model_states(Stage3ZeroOptimizer& zero, const torch::nn::Module& module,
                             bool exclude_frozen_parameters, checkpoint::ModelStates* states);

/// The optimizer file's dict: {"optimizer_state_dict": {zero_stage: 3, loss_scaler,
/// dynamic_loss_scale, overflow, partition_count, optimizer_state_dict, fp32_flat_groups},
/// "ds_config", "ds_version"}.
c10::IValue zero3_optimizer_file(Stage3ZeroOptimizer& zero, torch::optim::Optimizer& optimizer,
                                 const checkpoint::LossScalerState& scaler, bool python_objects,
                                 const nlohmann::json& ds_config);

/// A stage-3 checkpoint read and re-laid for this rank, not yet applied.
struct Zero3Restore {
  std::vector<at::Tensor> fp32;              // per sub-group: this rank's fp32 flat
  c10::IValue optimizer_state;               // None unless asked for
  std::vector<at::Tensor> frozen;            // per frozen_shards() entry: this rank's shard
  checkpoint::LossScalerState loss_scaler;
  int64_t saved_world = 0;
  checkpoint::ModelStates states;            // this rank's model states (rank 0's when resharding)
  std::string model_file;
};

/// Reads `tag_dir` (every data-parallel rank's files when the data-parallel size or the
/// sub-group layout differs, only this rank's otherwise), the files of model-parallel rank
/// `mp_rank`. Throws CheckpointError naming the file and the problem.
Zero3Restore read_zero3_checkpoint(Stage3ZeroOptimizer& zero, const std::string& tag_dir,
                                   bool bf16, bool want_optimizer_state, int mp_rank = 0);

/// Writes what `restore` holds into the stage's fp32 flats and frozen shards, then the model's
/// parameters (masters_to_params). The optimizer state is the caller's (it loads atomically).
void apply_zero3_restore(Stage3ZeroOptimizer& zero, const Zero3Restore& restore);

}  // namespace deepspeed::runtime
