// See moe_params.h.
#include "runtime/moe_params.h"

#include <map>
#include <set>

#include <ATen/ATen.h>
#include <torch/utils.h>

#include "deepspeed/linear.h"
#include "deepspeed/moe.h"
#include "util/check.h"

namespace deepspeed::runtime {

namespace {

// The ep_sizes of every rank's MoE layers, ascending: one MAX all-reduce over the world of a
// presence list indexed by ep_size (an ep_size divides a data-parallel size, so it is at most
// the world; a larger one is left to configure_moe's error).
std::vector<int64_t> ep_sizes_of_every_rank(torch::nn::Module& module) {
  const int world = comm::get_world_size();
  at::Tensor present = at::zeros({world + 1}, at::kLong);
  for (const auto& layer : moe::moe_layers(module)) {
    const int64_t ep = layer->options().ep_size;
    if (ep >= 1 && ep <= world) present[ep] = 1;
  }
  comm::all_reduce(present, comm::ReduceOp::kMax);
  std::vector<int64_t> out;
  for (int64_t ep = 1; ep <= world; ++ep) {
    if (present[ep].item<int64_t>() != 0) out.push_back(ep);
  }
  return out;
}

}  // namespace

void configure_moe_layers(torch::nn::Module& module, const DeepSpeedConfig& config,
                          const comm::Group& dp_group, int pipeline_stages) {
  const bool data_before_expert =
      config.raw.is_object() && config.raw.value("use_data_before_expert_parallelism", false);
  if (pipeline_stages > 1) {
    // Making a group is collective over the world, and a stage without MoE layers (or with
    // other ep_sizes) would otherwise skip the calls the other stages make.
    for (int64_t ep : ep_sizes_of_every_rank(module)) {
      if (dp_group.size() % ep == 0) {
        moe::create_expert_and_data_parallel(ep, data_before_expert, &dp_group);
      }
    }
  }
  moe::configure_moe(module, data_before_expert, dp_group);
}

std::vector<ExpertParams> moe_expert_params(torch::nn::Module& module) {
  std::vector<ExpertParams> out;
  for (auto& g : moe::expert_param_groups(module)) {
    out.push_back(ExpertParams{g.groups->name, g.params, g.groups->expert_parallel,
                               g.groups->expert_data_parallel});
  }
  return out;
}

namespace {

void broadcast_flat(const std::vector<at::Tensor>& params, const comm::Group& group) {
  if (group.size() <= 1 || params.empty()) return;
  // One flat broadcast per dtype keeps this a handful of collectives whatever the number of
  // tensors.
  torch::NoGradGuard no_grad;
  std::map<at::ScalarType, std::vector<at::Tensor>> by_dtype;
  for (const auto& p : params) by_dtype[p.scalar_type()].push_back(p);
  for (auto& [dtype, ps] : by_dtype) {
    std::vector<at::Tensor> flat_views;
    for (auto& p : ps) flat_views.push_back(p.detach().reshape({-1}));
    at::Tensor flat = at::cat(flat_views);
    comm::broadcast(flat, group.global_rank(0), false, group);
    int64_t off = 0;
    for (auto& p : ps) {
      p.detach().view({-1}).copy_(flat.narrow(0, off, p.numel()));
      off += p.numel();
    }
  }
}

}  // namespace

void broadcast_module_parameters(torch::nn::Module& module, const comm::Group& dp_group) {
  if (dp_group.size() == 1) return;
  std::set<const void*> experts;
  for (const auto& e : moe_expert_params(module)) {
    for (const auto& p : e.params) experts.insert(p.unsafeGetTensorImpl());
    broadcast_flat(e.params, e.expert_data_parallel);
  }
  std::vector<at::Tensor> dense;
  for (auto& p : module.parameters()) {
    // A sharded LoRA base weight differs on every rank by design (DeepSpeed skips it too).
    if (!experts.count(p.unsafeGetTensorImpl()) && !linear::is_sharded_base_weight(p)) {
      dense.push_back(p);
    }
  }
  broadcast_flat(dense, dp_group);
}

}  // namespace deepspeed::runtime
