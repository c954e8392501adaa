// Stage3SubGroup: the unit of ZeRO-3's optimizer step (reference §7.6 "Sub-groups"). Each
// optimizer param group's trainable parameters are taken in group order and their shards laid
// end to end; a sub-group closes once it holds sub_group_size elements or more. A sub-group
// owns its flat master shard (the inner optimizer's parameter: fp32, or 16-bit under Note
// [Low-precision masters]), its flat gradient and, for fp16/bf16 models with fp32 masters, its
// flat shard in the model dtype; each parameter's shard is a view of that flat (where the
// master has the model's dtype, the master itself, so the update lands in the shard).
//
// The layout per sub-group is DeepSpeed's fp32_flat_groups layout: parameter k's shard of
// ceil(numel_k / W) elements follows parameter k-1's, padding included.
//
// step_sub_group() runs the inner optimizer on one sub-group alone, so that a caller (CPU or
// NVMe offload) can bring one sub-group's state in, step it and put it back.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>

namespace torch::optim {
class Optimizer;
}

namespace deepspeed::runtime {

struct PartitionedParam;

struct SubGroupEntry {
  size_t param = 0;     // index into the stage's PartitionedParam list
  int64_t offset = 0;   // first element of its shard in the flat
  int64_t numel = 0;    // its shard's elements
};

struct Stage3SubGroup {
  size_t param_group = 0;  // the inner optimizer's param group it belongs to
  /// Its parameters' partition and that group's size (Note [Expert partitions] in
  /// stage3_param.h): a sub-group never mixes partitions.
  int partition = 0;
  int world = 1;
  std::vector<SubGroupEntry> entries;
  int64_t numel = 0;
  at::Tensor master;      // master shard (fp32, or 16-bit): the optimizer's parameter
  at::Tensor grad;        // gradient shard (grad_accum dtype); master.grad() when the dtypes match
  at::Tensor model_flat;  // shards in the model dtype (the master itself when dtypes match);
                          // undefined with own shards (see build_sub_groups)
};

/// How build_sub_groups allocates (offload changes it, see stage3.cpp).
struct SubGroupAllocation {
  /// An fp32 model gets an fp32 master apart from its shards too (NVMe offload swaps the master
  /// out while the shards stay for the all-gathers; DeepSpeed always keeps both).
  bool separate_master = false;
  /// offload_param "nvme", which swaps shards one by one: no model-dtype flat; each parameter's
  /// shard is a tensor of its own, left undefined here for the caller to fill (implies
  /// separate_master).
  bool own_shards = false;
  /// NVMe offload: the fp32 masters are empty handles and the gradient flats undefined; the
  /// caller allocates them one at a time (masters) or after the shards went to disk
  /// (gradients), so that construction never holds everything at once.
  bool deferred = false;
  /// The masters' dtype: fp32, or the model's 16-bit one (Note [Low-precision masters]).
  at::ScalarType master_dtype = at::kFloat;
};

/// Lays out sub-groups for `group_params` (per optimizer param group, indices into `params` of
/// trainable parameters, in group order), allocates the masters and gradients with `options`
/// and the model-dtype flats with `shard_options` (the same unless ZeRO-Offload keeps the
/// optimizer's flats in host memory and the shards on the GPU: the master is then separate), and
/// points every parameter's `shard` at its view of the model-dtype flat (contents zero).
std::vector<Stage3SubGroup> build_sub_groups(const std::vector<std::vector<size_t>>& group_params,
                                             std::vector<PartitionedParam>& params,
                                             int64_t sub_group_size, at::ScalarType model_dtype,
                                             at::ScalarType grad_dtype,
                                             const at::TensorOptions& options,
                                             const SubGroupAllocation& allocation = {},
                                             std::optional<at::TensorOptions> shard_options = {});

/// Allocates sub-group `sg`'s gradient flat (zeros) and, when it has the master's dtype,
/// attaches it to the master as its grad.
void allocate_grad(Stage3SubGroup& sg, at::ScalarType grad_dtype, const at::TensorOptions& options);

/// Runs `optimizer` on sub-group `index` alone (the other sub-groups' state is not touched),
/// then writes the updated master into the model-dtype flat (when there is one: with own shards
/// the caller writes them).
void step_sub_group(torch::optim::Optimizer& optimizer, std::vector<Stage3SubGroup>& groups,
                    size_t index);

}  // namespace deepspeed::runtime
