// Stage3SubGroup layout and per-sub-group step (see stage3_sub_group.h).
#include "runtime/zero/stage3_sub_group.h"

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include "deepspeed/optimizers.h"
#include "runtime/zero/stage3_param.h"
#include "util/check.h"

namespace deepspeed::runtime {

std::vector<Stage3SubGroup> build_sub_groups(const std::vector<std::vector<size_t>>& group_params,
                                             std::vector<PartitionedParam>& params,
                                             int64_t sub_group_size, at::ScalarType model_dtype,
                                             at::ScalarType grad_dtype,
                                             const at::TensorOptions& options,
                                             const SubGroupAllocation& allocation,
                                             std::optional<at::TensorOptions> shard_options) {
  const at::TensorOptions model_options = shard_options.value_or(options);
  const bool same_device = model_options.device() == options.device();
  std::vector<Stage3SubGroup> out;
  for (size_t g = 0; g < group_params.size(); ++g) {
    Stage3SubGroup current;
    current.param_group = g;
    auto close = [&] {
      if (current.entries.empty()) return;
      out.push_back(std::move(current));
      current = Stage3SubGroup{};
      current.param_group = g;
    };
    for (size_t i : group_params[g]) {
      if (!current.entries.empty() && current.partition != params[i].partition) close();
      current.partition = params[i].partition;
      current.world = params[i].world;
      current.entries.push_back(SubGroupEntry{i, current.numel, params[i].shard_numel});
      current.numel += params[i].shard_numel;
      // Matches DeepSpeed: a sub-group closes once it reaches sub_group_size elements.
      if (current.numel >= sub_group_size) close();
    }
    close();
  }
  for (auto& sg : out) {
    const auto master_options = options.dtype(allocation.master_dtype);
    sg.master = allocation.deferred ? at::empty({0}, master_options)
                                    : at::zeros({sg.numel}, master_options);
    if (!allocation.own_shards) {
      sg.model_flat = model_dtype == allocation.master_dtype && !allocation.separate_master &&
                              same_device
                          ? sg.master
                          : at::zeros({sg.numel}, model_options.dtype(model_dtype));
    }
    if (!allocation.deferred) allocate_grad(sg, grad_dtype, options);
    for (const auto& e : sg.entries) {
      params[e.param].shard = allocation.own_shards ? at::Tensor()
                                                    : sg.model_flat.narrow(0, e.offset, e.numel);
    }
  }
  return out;
}

void allocate_grad(Stage3SubGroup& sg, at::ScalarType grad_dtype, const at::TensorOptions& options) {
  sg.grad = at::zeros({sg.numel}, options.dtype(grad_dtype));
  if (grad_dtype == sg.master.scalar_type()) sg.master.mutable_grad() = sg.grad;
}

void step_sub_group(torch::optim::Optimizer& optimizer, std::vector<Stage3SubGroup>& groups,
                    size_t index) {
  Stage3SubGroup& sg = groups[index];
  auto& param_groups = optimizer.param_groups();
  DS_INTERNAL_ASSERT(sg.param_group < param_groups.size(), "sub-group of a missing param group");
  // The optimizer steps every parameter its groups list: for this call they list this
  // sub-group's master alone. State is keyed by tensor, so the others' is untouched.
  std::vector<std::vector<at::Tensor>> saved;
  saved.reserve(param_groups.size());
  for (auto& group : param_groups) {
    saved.push_back(group.params());
    group.params().clear();
  }
  param_groups[sg.param_group].params() = {sg.master};
  const bool cast_grad = sg.grad.scalar_type() != sg.master.scalar_type();
  if (cast_grad) sg.master.mutable_grad() = sg.grad.to(sg.master.scalar_type());
  // A 16-bit model_flat in host memory (the CPU engine, or offload_param on a GPU) is written by
  // CPU-Adam in the same pass as the update (Note [Fused copy-out]) instead of a pass of its own
  // over the masters afterwards. Registered for this step alone: model_flat may be re-pointed
  // (NVMe) or absent by the next one.
  auto* ds = dynamic_cast<optim::DsOptimizer*>(&optimizer);
  const bool copy_out = ds != nullptr && sg.model_flat.defined() && sg.model_flat.is_cpu() &&
                        sg.master.is_cpu() && sg.model_flat.is_contiguous() &&
                        sg.model_flat.numel() == sg.master.numel() &&
                        (sg.model_flat.scalar_type() == at::kBFloat16 ||
                         sg.model_flat.scalar_type() == at::kHalf);
  if (copy_out) ds->set_copy_out(sg.master, sg.model_flat);
  bool written = false;
  try {
    optimizer.step();
    written = copy_out && ds->wrote_copy_out(sg.master);
  } catch (...) {
    for (size_t g = 0; g < param_groups.size(); ++g) param_groups[g].params() = saved[g];
    if (copy_out) ds->set_copy_out(sg.master, at::Tensor());
    throw;
  }
  if (copy_out) ds->set_copy_out(sg.master, at::Tensor());
  for (size_t g = 0; g < param_groups.size(); ++g) param_groups[g].params() = std::move(saved[g]);
  if (cast_grad) sg.master.mutable_grad() = at::Tensor();
  if (!written && sg.model_flat.defined() && !sg.model_flat.is_same(sg.master)) {
    sg.model_flat.copy_(sg.master);
  }
}

}  // namespace deepspeed::runtime
