// ZeroOptimizer: what the engine asks of a ZeRO stage. The engine owns the step's order
// (forward, backward, clip, optimizer, schedule); a stage owns where gradients and optimizer
// states live and which collectives move them.
//
//   begin_backward(boundary)   arm gradient hooks for the coming backward
//   end_backward(boundary)     after autograd: flush the reductions still pending
//   grad_norm_squared()        sum of squares of the averaged gradient over every rank
//   scale_gradients(coef)      multiply the averaged gradient (clipping)
//   optimizer_step()           the inner optimizer on what this rank owns, then re-replicate
//   zero_grad()                drop gradients
//   local_overflow()           inf/nan in this rank's gradient (fp16 loss scaling)
//   memory()                   bytes this rank holds, by kind
//   model_states_file_name() ... its own checkpoint files: what it saves, how it reads a
//                              checkpoint into a ZeroLoadPlan, how it applies one
//                              (zero_checkpoint.h)
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include "deepspeed/comm.h"
#include "deepspeed/config.h"
#include "deepspeed/errors.h"
#include "runtime/zero/comm_dtypes.h"
#include "runtime/zero/stage3_groups.h"

namespace torch::optim {
class Optimizer;
}
namespace torch::nn {
class Module;
}

namespace deepspeed::checkpoint {
struct ModelStates;
}

namespace deepspeed::runtime {

struct ZeroCheckpointContext;
struct ZeroLoadPlan;

/// Bytes held on this rank, by kind (see docs/zero.md for the formula per stage).
struct ZeroMemory {
  int64_t param_bytes = 0;            // model parameters (the flat buffers under ZeRO 1/2)
  int64_t master_param_bytes = 0;     // fp32 master copies kept apart from the parameters
  int64_t grad_bytes = 0;             // gradients kept between backward and step
  int64_t optimizer_state_bytes = 0;  // the inner optimizer's state tensors
  int64_t bucket_bytes = 0;           // reduction / gather buffers
  int64_t padding_elements = 0;       // flat-buffer padding (alignment to 2*W elements)
  /// offload_optimizer.device "cpu": the fp32 masters (separate copies only) and optimizer state
  /// the CPU optimizer keeps in host memory; 0 without offload (docs/offload.md).
  int64_t offloaded_optimizer_bytes = 0;
  /// offload_optimizer.device "nvme" (stage 3): masters and optimizer state in swap files now,
  /// and the swap buffers holding sub-groups in memory during a step.
  int64_t nvme_optimizer_bytes = 0;
  int64_t swap_buffer_bytes = 0;
  /// offload_param (stage 3): parameter shards kept in host memory / in swap files now.
  int64_t offloaded_param_bytes = 0;
  int64_t nvme_param_bytes = 0;
};

/// One flattened optimizer param group as a checkpoint sees it (reference §6.2-6.3): parameters
/// laid end to end in `params` order, zero padding at the end, rank r owning elements
/// [r * partition_numel, (r + 1) * partition_numel).
struct FlatGroupLayout {
  std::vector<std::pair<std::string, std::vector<int64_t>>> params;  // name, shape
  int64_t numel = 0;            // the parameters' elements, padding excluded
  int64_t partition_numel = 0;  // elements per partition, padding included
  int partitions = 1;           // W for ZeRO 1/2; 1 for 16-bit stage 0 (replicated)
  int partition = 0;            // the slice this rank owns
  /// An MoE expert group's flat ("ep_size_<e>"): partitioned over the expert-data-parallel
  /// group, not the data-parallel one. Empty for dense groups.
  std::string expert_group;
};

/// Counters tests and logs use to see what a backward did.
struct ReductionStats {
  int64_t buckets_launched = 0;              // in the last backward
  int64_t buckets_launched_from_hooks = 0;   // of those, issued while autograd was running
  int64_t reductions_issued = 0;             // collectives issued in the last backward
  /// ZeRO-Offload with host buffers beside a device: reduced gradient ranges (stages 1/2) or
  /// buckets (stage 3) whose copy to the host started during the last backward, without a host
  /// wait (Note [Overlapped offload copies], Note [Stage-3 gradients to the host]).
  int64_t host_copies_in_backward = 0;
  /// sparse_gradients (stage 0): embedding rows this rank all-gathered in the last reduction.
  int64_t sparse_rows_sent = 0;
};

class ZeroOptimizer {
 public:
  virtual ~ZeroOptimizer() = default;

  virtual void begin_backward(bool boundary) = 0;
  virtual void end_backward(bool boundary) = 0;
  virtual double grad_norm_squared() = 0;
  /// Leaves `params` out of this rank's grad_norm_squared() from now on (DeepSpeed's
  /// model-parallel rule: a parameter replicated over the tensor-parallel group counts on that
  /// group's rank 0 only). Stages 0-2; stage 3 refuses (AutoTP does not run with ZeRO-3).
  virtual void exclude_from_norm(const std::vector<at::Tensor>& /*params*/) {
    throw NotSupportedError(
        "tensor-parallel parameters with ZeRO stage 3: the gradient norm cannot leave the "
        "replicated parameters out of its sum; use ZeRO stage 0, 1 or 2 (as DeepSpeed's AutoTP)");
  }
  /// The boundary's gradients passed the overflow vote (where there is one) and are about to be
  /// measured and stepped; they carry `loss_scale` (1 without loss scaling). Muon's groups are
  /// orthogonalized here: DeepSpeed's order, after the overflow check and before the norm.
  virtual void before_grad_norm(double /*loss_scale*/) {}
  virtual void scale_gradients(double coef) = 0;
  virtual void optimizer_step() = 0;
  virtual void zero_grad() = 0;
  /// Whether this rank's averaged gradient holds an inf or nan (before any cross-rank vote).
  virtual bool local_overflow() = 0;
  virtual ZeroMemory memory() const = 0;
  virtual ReductionStats reduction_stats() const = 0;
  virtual int64_t num_buckets() const = 0;
  /// True while a backward on the boundary has armed hooks that end_backward did not settle.
  virtual bool backward_pending() const = 0;
  /// A pipeline's micro-batch backward ended (ZeroContext::pipeline). Where micro-steps are
  /// summed in fp32 (Note [fp32 gradient accumulation]) the gradients move there.
  virtual void end_micro_batch_backward() {}
  /// The fp32 sum of `param`'s gradients over this step's micro-steps, which the boundary will
  /// reduce, where there is one (marked as holding a gradient: the caller may write it, as
  /// the pipeline's tied-weight reduction does); undefined where param.grad holds the sum.
  virtual at::Tensor fp32_grad_sum(const at::Tensor& /*param*/) { return {}; }
  /// The loss scaler updated its scale: after an overflow (the step skipped), or to `ratio`
  /// times the last. Stage 3's LoCo errors follow it (Note [LoCo error feedback]).
  virtual void loss_scale_updated(bool /*overflow*/, double /*ratio*/) {}

  // Checkpoints: each stage saves and reads its own part (zero_checkpoint.h). A save calls
  // add_model_states (where model_states_file_name is not empty) and optimizer_states_file; a
  // load calls read_checkpoint, loads plan.optimizer_state into the inner optimizer, then
  // apply_checkpoint.
  /// The model-states file this rank writes in the tag directory; "" when it writes none.
  /// `writes_replicated`: the engine chose this rank to write the files its data-parallel
  /// replicas share (Engine::writes_replicated_checkpoint_files).
  virtual std::string model_states_file_name(bool writes_replicated, int mp_rank) const = 0;
  /// Adds this stage's part to the model states the engine filled (module, counters, ...).
  virtual void add_model_states(const ZeroCheckpointContext& ctx,
                                checkpoint::ModelStates* states) = 0;
  /// This rank's optimizer-states file: its name in the tag directory and its contents; none
  /// where the stage keeps its optimizer in the model states.
  virtual std::optional<std::pair<std::string, c10::IValue>> optimizer_states_file(
      const ZeroCheckpointContext& ctx) = 0;
  /// Reads ctx.tag_dir into `plan` (calling ctx.check_model_states once), changing nothing.
  /// Throws CheckpointError naming the file and the problem.
  virtual void read_checkpoint(const ZeroCheckpointContext& ctx, ZeroLoadPlan* plan) = 0;
  /// After the engine loaded plan.optimizer_state into the inner optimizer: the module and
  /// the masters. Adds what it restored to `restored` (the load line), "module" first.
  virtual void apply_checkpoint(const ZeroCheckpointContext& ctx, const ZeroLoadPlan& plan,
                                std::vector<std::string>* restored) = 0;
  /// For the duration of a save or load: state kept in swap files between steps (ZeRO-3 NVMe
  /// offload) is brought into memory, and let go after. No-ops elsewhere.
  virtual void swap_in_optimizer_states() {}
  virtual void swap_out_optimizer_states() {}
  /// Writes the fp32 masters into the 16-bit parameters, after something replaced the masters
  /// (a 1-bit optimizer's rank-local parameters read from a checkpoint). No-op without masters.
  virtual void masters_to_params() {}
};

/// The expert parameters of the model's MoE layers of one ep_size (deepspeed::moe): their
/// gradients are averaged over the expert-data-parallel group (divided by the whole
/// data-parallel size), and their gradient norms summed over the expert-parallel group.
struct ExpertParams {
  std::string name;                  // "ep_size_<e>"
  std::vector<at::Tensor> params;    // this rank's experts' trainable parameters
  comm::Group expert_parallel;
  comm::Group expert_data_parallel;
};

/// What every stage needs to be built.
struct ZeroContext {
  const DeepSpeedConfig* config = nullptr;
  torch::optim::Optimizer* optimizer = nullptr;  // built over the model's trainable params
  std::vector<at::Tensor> trainable_params;      // every parameter requiring grad
  std::vector<std::string> param_names;          // same order, for messages
  at::ScalarType model_dtype = at::kFloat;       // fp32, or fp16/bf16 with fp32 master weights
  at::ScalarType communication_dtype = at::kFloat;  // dtype of the gradient reduction buckets
  at::ScalarType grad_accum_dtype = at::kFloat;     // dtype of the gradient partitions
  /// Master weights and the gradients the optimizer reads: fp32, or the model's 16-bit dtype
  /// (Note [Low-precision masters] in config/low_precision_masters.cpp; stages 1-3).
  at::ScalarType master_dtype = at::kFloat;
  std::shared_ptr<torch::nn::Module> module;        // the model (stage 3 finds its units)
  /// The data-parallel group: gradients are averaged over it, partitions are its ranks (the
  /// world without an mpu). ZeRO code asks it, never the world, for sizes and ranks.
  comm::Group dp_group;
  /// What a "mean" reduction divides by; 0: dp_group's size. Sequence parallelism sums over
  /// each sequence's ranks: the data-parallel size (DeepSpeed's dp_world_size / sp_size).
  int average_divisor = 0;
  /// MoE expert parameters (also listed in trainable_params); empty without MoE layers.
  std::vector<ExpertParams> expert_params;
  /// Parameters communicated in another dtype than communication_dtype (comm_dtypes.h).
  CommDtypes comm_dtypes;
  /// sparse_gradients: the embedding weights stage 0 reduces as rows (sparse_grad.h).
  std::unordered_set<const c10::TensorImpl*> sparse_gradients;
  /// MiCS (stage 3): partitions over a shard group, replicated across the others; dp_group
  /// stays the group the parameters are broadcast over and gradients averaged across.
  std::optional<MicsGroups> mics;
  /// ZeRO++ hpZ (stage 3): the group of zero_hpz_partition_size ranks that keeps secondary
  /// partitions (Note [Secondary partition] in stage3_param.h).
  std::optional<comm::Group> hpz_group;
  /// ZeRO++ qgZ (stage 3): the node groups of Note [Quantized reduction]; nullopt without qgZ
  /// or on one node.
  std::optional<NodeGroups> qgz_groups;
  /// The model is a pipe::PipelineModule: its engine runs each micro-batch's backward outside
  /// begin/end_backward and calls end_micro_batch_backward() after it.
  bool pipeline = false;
};

/// Stage 0: replicated. fp32 models all-reduce param.grad (GradReducer); fp16/bf16 models use the
/// flat machinery of stages 1/2 with a single replicated partition and fp32 master weights.
std::unique_ptr<ZeroOptimizer> make_stage0(const ZeroContext& context);
std::unique_ptr<ZeroOptimizer> make_stage1_2(const ZeroContext& context);
/// Stage 3: partitioned parameters gathered per unit (stage3.h, docs/zero.md).
std::unique_ptr<ZeroOptimizer> make_stage3(const ZeroContext& context);

/// Bytes of every tensor in the optimizer's state (0 before its first step).
int64_t optimizer_state_bytes(torch::optim::Optimizer& optimizer);

}  // namespace deepspeed::runtime
