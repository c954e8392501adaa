// Stage3SubGroup layout and per-sub-group step (see stage3_sub_group.h).
#include "runtime/zero/stage3_sub_group.h"

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

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
      current.entries.push_back(SubGroupEntry{i, current.numel, params[i].shard_numel});
      current.numel += params[i].shard_numel;
      // Matches DeepSpeed: a sub-group closes once it reaches sub_group_size elements.
      if (current.numel >= sub_group_size) close();
    }
    close();
  }
  for (auto& sg : out) {
    sg.fp32 = allocation.deferred ? at::empty({0}, options.dtype(at::kFloat))
                                  : at::zeros({sg.numel}, options.dtype(at::kFloat));
    if (!allocation.own_shards) {
      sg.model_flat = model_dtype == at::kFloat && !allocation.separate_master && same_device
                          ? sg.fp32
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
  if (grad_dtype == at::kFloat) sg.fp32.mutable_grad() = sg.grad;
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
  param_groups[sg.param_group].params() = {sg.fp32};
  const bool cast_grad = sg.grad.scalar_type() != at::kFloat;
  if (cast_grad) sg.fp32.mutable_grad() = sg.grad.to(at::kFloat);
  try {
    optimizer.step();
  } catch (...) {
    for (size_t g = 0; g < param_groups.size(); ++g) param_groups[g].params() = saved[g];
    throw;
  }
  for (size_t g = 0; g < param_groups.size(); ++g) param_groups[g].params() = std::move(saved[g]);
  if (cast_grad) sg.fp32.mutable_grad() = at::Tensor();
  if (sg.model_flat.defined() && !sg.model_flat.is_same(sg.fp32)) sg.model_flat.copy_(sg.fp32);
}

}  // namespace deepspeed::runtime
