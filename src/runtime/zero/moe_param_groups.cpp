// See moe_param_groups.h.
#include "runtime/zero/moe_param_groups.h"

#include <map>

#include <torch/optim/optimizer.h>

#include "util/check.h"

namespace deepspeed::runtime {

std::vector<int> split_moe_param_groups(torch::optim::Optimizer& optimizer,
                                        const std::vector<ExpertParams>& experts) {
  auto& groups = optimizer.param_groups();
  std::vector<int> expert_of(groups.size(), -1);
  if (experts.empty()) return expert_of;
  std::map<const void*, int> expert_index;
  for (size_t e = 0; e < experts.size(); ++e) {
    for (const auto& p : experts[e].params) expert_index[p.unsafeGetTensorImpl()] = static_cast<int>(e);
  }
  // Per original group, its expert parameters by expert group (in `experts` order).
  const size_t originals = groups.size();
  std::vector<std::vector<std::vector<at::Tensor>>> moved(originals);
  for (size_t g = 0; g < originals; ++g) {
    moved[g].resize(experts.size());
    std::vector<at::Tensor> dense;
    for (const auto& p : groups[g].params()) {
      auto it = expert_index.find(p.unsafeGetTensorImpl());
      if (it == expert_index.end()) {
        dense.push_back(p);
      } else {
        moved[g][static_cast<size_t>(it->second)].push_back(p);
      }
    }
    // A group holding one expert group's parameters alone is an MoE group already (the user
    // split them, as DeepSpeed asks of client optimizers): it stays where it is.
    size_t kinds = 0, only = 0;
    for (size_t e = 0; e < experts.size(); ++e) {
      if (moved[g][e].empty()) continue;
      ++kinds;
      only = e;
    }
    if (dense.empty() && kinds == 1) {
      expert_of[g] = static_cast<int>(only);
      moved[g][only].clear();
      continue;
    }
    groups[g].params() = std::move(dense);
  }
  for (size_t g = 0; g < originals; ++g) {
    for (size_t e = 0; e < experts.size(); ++e) {
      if (moved[g][e].empty()) continue;
      // add_param_group clones the options: the new group starts with the original's lr and
      // hyper-parameters, and a scheduler then sets every group alike.
      optimizer.add_param_group(
          torch::optim::OptimizerParamGroup(std::move(moved[g][e]), groups[g].options().clone()));
      expert_of.push_back(static_cast<int>(e));
    }
  }
  DS_INTERNAL_ASSERT(expert_of.size() == optimizer.param_groups().size(),
                     "split_moe_param_groups: group count mismatch");
  return expert_of;
}

}  // namespace deepspeed::runtime
