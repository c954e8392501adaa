// Stage3ZeroOptimizer: what ZeRO stage 3 exposes beyond the ZeroOptimizer interface, for
// its checkpoints (each rank's fp32 shards in DeepSpeed's stage-3 fp32_flat_groups layout, the
// parameters' names and shapes in that order, the inner optimizer's state over the shards;
// written and read in stage3_checkpoint.cpp), offload (one sub-group stepped at a time) and
// tests (gather counters). make_stage3() (zero_optimizer.h) returns one.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "deepspeed/comm.h"
#include "runtime/zero/stage3_coordinator.h"
#include "runtime/zero/stage3_sub_group.h"
#include "runtime/zero/zero_checkpoint.h"
#include "runtime/zero/zero_optimizer.h"

namespace deepspeed::runtime {

/// One trainable parameter as a stage-3 checkpoint sees it.
struct Stage3ParamInfo {
  std::string name;
  std::vector<int64_t> shape;
  int64_t numel = 0;        // unpartitioned
  int64_t shard_numel = 0;  // ceil(numel / W), the elements each rank holds (padding included;
                            // W is the expert-data-parallel size for AutoEP's experts)
  size_t sub_group = 0;     // where this rank's shard lives
  int64_t offset = 0;       // its first element in that sub-group's flat
};

class Stage3ZeroOptimizer : public ZeroOptimizer {
 public:
  /// The sub-groups in step order; sub_groups()[i].master is this rank's master shard flat
  /// (DeepSpeed's fp32_flat_groups[i]: fp32, or 16-bit under Note [Low-precision masters]) and
  /// the inner optimizer's parameter for it.
  virtual std::vector<Stage3SubGroup>& sub_groups() = 0;
  /// Trainable parameters in sub-group order (DeepSpeed's param_shapes for stage 3).
  virtual std::vector<Stage3ParamInfo> param_infos() const = 0;
  /// Frozen (untrained) parameters: name and this rank's shard in the model dtype (the
  /// values read back where kept quantized, Note [Quantized frozen shards]). DeepSpeed's
  /// frozen_param_fragments.
  virtual std::vector<std::pair<std::string, at::Tensor>> frozen_shards() = 0;
  /// Frozen parameters' names and sizes in frozen_shards()' order (sub_group and offset unset),
  /// without reading a shard back: all that a load needs to place the saved fragments.
  virtual std::vector<Stage3ParamInfo> frozen_param_infos() const = 0;
  /// Writes frozen parameter k's shard (frozen_shards() order); it changes the parameter once
  /// gathered again (refresh_gathered_params() re-gathers the persistent ones).
  virtual void set_frozen_shard(size_t k, const at::Tensor& values) = 0;
  /// Inner optimizer + write-back for one sub-group (see stage3_sub_group.h).
  virtual void step_sub_group(size_t index) = 0;
  /// After the optimizer step: refreshes the parameters that are gathered (persistent ones).
  virtual void refresh_gathered_params() = 0;
  /// After the fp32 flats were written: every rank's shards of the model's parameters from
  /// them (cast to the model dtype), and the gathered ones refreshed.
  virtual void masters_to_params() = 0;
  virtual CoordinatorStats coordinator_stats() const = 0;
  /// The partition count (the data-parallel size, or MiCS' shard size) and this rank's rank
  /// in that partition group.
  virtual int world_size() const = 0;
  virtual int rank() const = 0;
  /// Whether some sub-group holds AutoEP's experts, cut for their expert-data-parallel group
  /// (Note [Expert partitions] in stage3_param.h).
  bool has_expert_partition() {
    for (const auto& sg : sub_groups()) {
      if (sg.partition != 0) return true;
    }
    return false;
  }
  /// The group the sub-groups of `partition` are cut for (0: the partition group above, 1:
  /// AutoEP's expert-data-parallel group), and the latter's name ("ep_size_<P>"; empty without).
  virtual const comm::Group& partition_group(int partition) const = 0;
  virtual std::string expert_group_name() const = 0;
  /// Whether this rank writes its files: all do, but under MiCS only the first replica of
  /// each shard (DeepSpeed saves the first shard group's files; the others hold copies), or
  /// with checkpoint.use_node_local_storage the first on each node.
  virtual bool writes_checkpoint() const = 0;

  // Checkpoints in DeepSpeed's stage-3 layout (stage3_checkpoint.cpp): every rank that
  // writes_checkpoint() writes, as partition rank <r>,
  // zero_pp_rank_<r>_mp_rank_XX_model_states.pt (parameters as 0-element placeholders, buffers,
  // param_shapes per sub-group, its frozen-parameter shards) and
  // [bf16_]zero_pp_rank_<r>_mp_rank_XX_optim_states.pt (zero_stage 3, fp32_flat_groups = its
  // fp32 sub-group flats, the inner optimizer's state, the loss scaler). Reading re-lays the
  // shards for this engine's sub-groups, so a checkpoint loads on another number of ranks (or
  // another sub_group_size) too.
  std::string model_states_file_name(bool writes_replicated, int mp_rank) const override;
  void add_model_states(const ZeroCheckpointContext& ctx,
                        checkpoint::ModelStates* states) override;
  std::optional<std::pair<std::string, c10::IValue>> optimizer_states_file(
      const ZeroCheckpointContext& ctx) override;
  void read_checkpoint(const ZeroCheckpointContext& ctx, ZeroLoadPlan* plan) override;
  void apply_checkpoint(const ZeroCheckpointContext& ctx, const ZeroLoadPlan& plan,
                        std::vector<std::string>* restored) override;
};

}  // namespace deepspeed::runtime
