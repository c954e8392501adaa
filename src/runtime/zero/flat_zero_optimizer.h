// FlatZeroOptimizer: stages 0, 1 and 2, whose fp32 masters (when separate from the parameters)
// are flat groups cut into data-parallel partitions (FlatGroupLayout), and their checkpoints in
// DeepSpeed's layout (reference §6.2-6.3):
//  - stage 0: data-parallel rank 0 writes mp_rank_XX_model_states.pt with the optimizer in its
//    'optimizer' part (16-bit: FP16_Optimizer's or FP16_UnfusedOptimizer's dict with the
//    replicated fp32 masters, as DeepSpeed wraps this optimizer: unfused_fp16_layout.h), and
//    param_shapes (beyond DeepSpeed: ds_to_universal names the optimizer's state by it);
//  - stages 1/2: the same file with param_shapes (and from stage 2 the frozen parameters), plus
//    one [bf16_]zero_pp_rank_<r>_mp_rank_XX_optim_states.pt per rank with its fp32 partitions
//    and the inner optimizer's state. A checkpoint of another data-parallel size or layout is
//    re-partitioned (repartition.h).
// Stage 0 in fp32 has no flat groups (the optimizer steps the parameters themselves).
// With MoE layers (use_moe_checkpoint), DeepSpeed's MoE layout (moe_checkpoint.h): experts in
// their own files, the model states without them, and at stage 0 the optimizer in
// expp_rank_<ep rank>_mp_rank_XX_optim_states.pt (each expert-parallel rank's differs); stages
// 1/2 keep their zero_pp_rank files, expert flats partitioned over the expert-data-parallel group.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "deepspeed/checkpoint.h"
#include "runtime/zero/zero_checkpoint.h"
#include "runtime/zero/zero_optimizer.h"

namespace deepspeed::runtime {

class FlatZeroOptimizer : public ZeroOptimizer {
 public:
  /// `stage`: 0, 1 or 2 (zero_optimization.stage); `dp_rank` / `dp_size`: this rank's place in
  /// the data-parallel group, whose size is the partition count.
  FlatZeroOptimizer(int stage, int dp_rank, int dp_size)
      : stage_(stage), dp_rank_(dp_rank), dp_size_(dp_size) {}

  /// The flat groups, in the inner optimizer's group order (one flat parameter per group).
  virtual std::vector<FlatGroupLayout> flat_layout() const { return {}; }
  /// This rank's fp32 master slice of flat group `g` (padding included): the inner optimizer's
  /// parameter itself, so writing it changes what the next step starts from.
  virtual at::Tensor master_partition(size_t /*g*/) { return {}; }
  /// Every master slice from the model's current parameters (DeepSpeed's refresh_fp32_params /
  /// _restore_from_bit16_weights).
  virtual void params_to_masters() {}

  std::string model_states_file_name(bool writes_replicated, int mp_rank) const override;
  void add_model_states(const ZeroCheckpointContext& ctx,
                        checkpoint::ModelStates* states) override;
  std::optional<std::pair<std::string, c10::IValue>> optimizer_states_file(
      const ZeroCheckpointContext& ctx) override;
  void read_checkpoint(const ZeroCheckpointContext& ctx, ZeroLoadPlan* plan) override;
  void apply_checkpoint(const ZeroCheckpointContext& ctx, const ZeroLoadPlan& plan,
                        std::vector<std::string>* restored) override;

 protected:
  /// The model has MoE layers: checkpoints take DeepSpeed's MoE layout. The expp_rank files
  /// follow the expert group with the largest ep_size, as DeepSpeed's. `expert_of`: per
  /// optimizer param group, the index in `experts` of its expert group or -1
  /// (split_moe_param_groups); saved param groups are marked as DeepSpeed marks its MoE groups.
  void use_moe_checkpoint(std::shared_ptr<torch::nn::Module> module,
                          const std::vector<ExpertParams>& experts,
                          const std::vector<int>& expert_of);
  /// ZeRO-1 that DeepSpeed trains with BF16_Optimizer (bf16_optimizer_layout.h): the rank files
  /// take its keys (not with MoE layers, which keep ZeRO's).
  void use_bf16_optimizer_checkpoint() { bf16_optimizer_ = true; }

 private:
  c10::IValue stage0_optimizer_state(const ZeroCheckpointContext& ctx);
  /// Per optimizer group, its parameters' names and shapes in flattening order: ZeRO's
  /// param_shapes, also written at stage 0 (DeepSpeed writes None there) so that
  /// ds_to_universal can tell which parameter each piece of the optimizer's state belongs to.
  /// Empty at fp32 stage 0 when an optimizer parameter is not one of the module's.
  std::vector<checkpoint::ShapeDict> param_shapes(const ZeroCheckpointContext& ctx) const;
  c10::IValue base_optimizer_state(const ZeroCheckpointContext& ctx) const;
  checkpoint::ZeroOptimizerFile zero_optimizer_file(const ZeroCheckpointContext& ctx);
  void read_stage0_optimizer(const c10::IValue& optimizer, const std::string& path,
                             ZeroLoadPlan* plan);
  void read_expert_optimizer(const ZeroCheckpointContext& ctx, ZeroLoadPlan* plan);
  void read_partitions(const ZeroCheckpointContext& ctx, ZeroLoadPlan* plan);
  /// Stage 0 from BF16_Optimizer's rank files: every rank's partitions joined into the flats.
  void read_bf16_optimizer_files(const ZeroCheckpointContext& ctx, ZeroLoadPlan* plan);
  bool bf16_layout() const { return bf16_optimizer_ && !moe_; }

  int stage_;
  int dp_rank_;
  int dp_size_;
  bool bf16_optimizer_ = false;
  struct MoeCheckpoint {
    std::shared_ptr<torch::nn::Module> module;
    int ep_size = 0, ep_rank = 0;  // the largest expert group's
    std::optional<comm::Group> expert_data_parallel;  // the largest expert group's
    std::vector<std::string> group_names;  // per optimizer param group; "" for dense groups
  };
  std::optional<MoeCheckpoint> moe_;
};

/// The model states every data-parallel rank of model-parallel rank ctx.mp_rank reads
/// (mp_rank_XX_model_states.pt) into `plan`, then ctx.check_model_states. Also what an engine
/// without an optimizer (no ZeRO stage) loads.
void read_replicated_model_states(const ZeroCheckpointContext& ctx, ZeroLoadPlan* plan);

}  // namespace deepspeed::runtime
