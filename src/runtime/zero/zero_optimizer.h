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
//   flat_layout() ...          what a checkpoint saves and restores (flat groups, fp32 masters)
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "deepspeed/comm.h"
#include "deepspeed/config.h"

namespace torch::optim {
class Optimizer;
}
namespace torch::nn {
class Module;
}

namespace deepspeed::runtime {

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
};

/// Counters tests and logs use to see what a backward did.
struct ReductionStats {
  int64_t buckets_launched = 0;              // in the last backward
  int64_t buckets_launched_from_hooks = 0;   // of those, issued while autograd was running
  int64_t reductions_issued = 0;             // collectives issued in the last backward
};

class ZeroOptimizer {
 public:
  virtual ~ZeroOptimizer() = default;

  virtual void begin_backward(bool boundary) = 0;
  virtual void end_backward(bool boundary) = 0;
  virtual double grad_norm_squared() = 0;
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

  // Checkpoints. A stage without flat groups (stage 0 in fp32: the optimizer steps the
  // parameters themselves) has an empty layout and no masters.
  /// The flat groups, in the inner optimizer's group order (one flat parameter per group).
  virtual std::vector<FlatGroupLayout> flat_layout() const { return {}; }
  /// This rank's fp32 master slice of flat group `g` (padding included): the inner optimizer's
  /// parameter itself, so writing it changes what the next step starts from.
  virtual at::Tensor master_partition(size_t /*g*/) { return {}; }
  /// After the masters were written: copies every rank's master slice into the model's
  /// parameters (cast to the model dtype) and re-replicates them.
  virtual void masters_to_params() {}
  /// The reverse: every master slice from the model's current parameters (DeepSpeed's
  /// refresh_fp32_params / _restore_from_bit16_weights).
  virtual void params_to_masters() {}
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
  std::shared_ptr<torch::nn::Module> module;        // the model (stage 3 finds its units)
  /// The data-parallel group: gradients are averaged over it, partitions are its ranks (the
  /// world without an mpu). ZeRO code asks it, never the world, for sizes and ranks.
  comm::Group dp_group;
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
