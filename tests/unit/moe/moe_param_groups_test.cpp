// split_moe_param_groups: DeepSpeed's MoE param groups for the flat ZeRO stages.
#include "runtime/zero/moe_param_groups.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace deepspeed::runtime {
namespace {

torch::Tensor param(int64_t n) { return torch::zeros({n}, torch::requires_grad()); }

ExpertParams expert_group(const std::string& name, std::vector<at::Tensor> params) {
  ExpertParams e;
  e.name = name;
  e.params = std::move(params);
  return e;
}

bool same(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!a[i].is_same(b[i])) return false;
  }
  return true;
}

TEST(MoEParamGroups, ExpertsLeaveEachGroupForGroupsOfTheirOwnWithTheOriginalOptions) {
  auto d0 = param(3), d1 = param(4), d2 = param(5);
  auto a0 = param(6), a1 = param(7), b0 = param(8);
  torch::optim::SGD opt({torch::optim::OptimizerParamGroup({d0, a0, d1, b0}),
                         torch::optim::OptimizerParamGroup({a1, d2})},
                        torch::optim::SGDOptions(0.1));
  static_cast<torch::optim::SGDOptions&>(opt.param_groups()[1].options()).lr(0.5);
  const auto expert_of = split_moe_param_groups(
      opt, {expert_group("ep_size_2", {a0, a1}), expert_group("ep_size_4", {b0})});
  // Originals first (dense only), then per original group its expert groups in `experts` order.
  EXPECT_EQ(expert_of, (std::vector<int>{-1, -1, 0, 1, 0}));
  auto& g = opt.param_groups();
  ASSERT_EQ(g.size(), 5u);
  EXPECT_TRUE(same(g[0].params(), {d0, d1}));
  EXPECT_TRUE(same(g[1].params(), {d2}));
  EXPECT_TRUE(same(g[2].params(), {a0}));
  EXPECT_TRUE(same(g[3].params(), {b0}));
  EXPECT_TRUE(same(g[4].params(), {a1}));
  const auto lr = [&](size_t i) {
    return static_cast<torch::optim::SGDOptions&>(g[i].options()).lr();
  };
  EXPECT_EQ(lr(2), 0.1);
  EXPECT_EQ(lr(3), 0.1);
  EXPECT_EQ(lr(4), 0.5);
}

TEST(MoEParamGroups, AGroupOfOneExpertGroupAloneStaysInPlace) {
  auto d0 = param(3), a0 = param(6), a1 = param(7);
  torch::optim::SGD opt({torch::optim::OptimizerParamGroup({d0}),
                         torch::optim::OptimizerParamGroup({a0, a1})},
                        torch::optim::SGDOptions(0.1));
  const auto expert_of = split_moe_param_groups(opt, {expert_group("ep_size_2", {a0, a1})});
  EXPECT_EQ(expert_of, (std::vector<int>{-1, 0}));
  ASSERT_EQ(opt.param_groups().size(), 2u);
  EXPECT_TRUE(same(opt.param_groups()[1].params(), {a0, a1}));
}

TEST(MoEParamGroups, WithoutExpertsNothingMoves) {
  auto d0 = param(3);
  torch::optim::SGD opt({torch::optim::OptimizerParamGroup({d0})}, torch::optim::SGDOptions(0.1));
  EXPECT_EQ(split_moe_param_groups(opt, {}), (std::vector<int>{-1}));
  EXPECT_EQ(opt.param_groups().size(), 1u);
}

}  // namespace
}  // namespace deepspeed::runtime
