// How the engine finds a model's MoE layers and their expert parameters, and gives the layers
// their process groups (DeepSpeed's engine: _configure_distributed_model's
// set_deepspeed_parallelism, is_moe_param / group_name).
#include <algorithm>
#include <map>

#include "deepspeed/auto_ep.h"
#include "deepspeed/moe.h"
#include "util/check.h"

namespace deepspeed::moe {

std::vector<std::shared_ptr<MoEImpl>> moe_layers(torch::nn::Module& module) {
  std::vector<std::shared_ptr<MoEImpl>> out;
  for (const auto& m : module.modules(/*include_self=*/true)) {
    if (auto moe = std::dynamic_pointer_cast<MoEImpl>(m)) out.push_back(moe);
  }
  return out;
}

std::vector<ExpertParamGroup> expert_param_groups(torch::nn::Module& module) {
  std::vector<ExpertParamGroup> out;
  std::map<std::string, size_t> index;
  for (const auto& layer : moe_layers(module)) {
    const ExpertGroups* g = layer->ep_groups();
    DS_CHECK(g != nullptr, UsageError, "MoE layer (ep_size ", layer->options().ep_size,
             ") has no groups yet; call set_deepspeed_parallelism() or deepspeed::initialize");
    auto [it, inserted] = index.emplace(g->name, out.size());
    if (inserted) out.push_back(ExpertParamGroup{g, {}});
    for (auto& p : layer->expert_parameters()) {
      if (p.requires_grad()) out[it->second].params.push_back(p);
    }
  }
  // AutoEP's sharded token-choice layers (a whole layer's experts are ordinary parameters).
  for (const auto& item : token_choice_layers(module)) {
    const ExpertGroups* g = item.second->ep_groups();
    if (g == nullptr) continue;
    auto [it, inserted] = index.emplace(g->name, out.size());
    if (inserted) out.push_back(ExpertParamGroup{g, {}});
    for (auto& p : item.second->expert_parameters()) {
      if (p.requires_grad()) out[it->second].params.push_back(p);
    }
  }
  return out;
}

std::vector<ExpertParamGroup> configure_moe(torch::nn::Module& module,
                                            bool use_data_before_expert_parallelism,
                                            const comm::Group& data_parallel_group) {
  const auto layers = moe_layers(module);
  if (layers.empty()) return {};
  for (const auto& layer : layers) {
    DS_CHECK(data_parallel_group.size() % layer->options().ep_size == 0, UsageError,
             "MoE: ep_size (", layer->options().ep_size,
             ") must divide the data-parallel world size (", data_parallel_group.size(), ")");
    // Groups set before initialize (set_deepspeed_parallelism without a data-parallel group)
    // span the world: with model parallelism they would mix model-parallel peers.
    if (const ExpertGroups* g = layer->ep_groups()) {
      const auto& dp = data_parallel_group.ranks();
      for (int r : g->expert_parallel.ranks()) {
        DS_CHECK(std::find(dp.begin(), dp.end(), r) != dp.end(), UsageError, "MoE layer (",
                 g->name, "): its expert-parallel group holds rank ", r, ", outside this "
                 "rank's data-parallel group; with model parallelism let deepspeed::initialize "
                 "set the groups (or pass the data-parallel group to set_deepspeed_parallelism)");
      }
      continue;
    }
    layer->set_deepspeed_parallelism(use_data_before_expert_parallelism, &data_parallel_group);
  }
  return expert_param_groups(module);
}

}  // namespace deepspeed::moe
