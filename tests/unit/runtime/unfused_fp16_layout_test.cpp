// FP16_UnfusedOptimizer's per-parameter checkpoint layout (runtime/zero/unfused_fp16_layout.h):
// which optimizers DeepSpeed wraps that way, and the split of our flat masters and state into
// parameters and back, with the errors a file of another model gets.
#include "runtime/zero/unfused_fp16_layout.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deepspeed/checkpoint.h"
#include "deepspeed/errors.h"
#include "deepspeed/optimizers.h"
#include "support/expect_throw.h"

namespace deepspeed::runtime {
namespace {

namespace ckpt = checkpoint;
using List = c10::impl::GenericList;

// One group of a [2, 3] weight and a [2] bias, flattened with 3 elements of padding.
std::vector<FlatGroupLayout> one_group() {
  FlatGroupLayout g;
  g.params = {{"w", {2, 3}}, {"b", {2}}};
  g.numel = 8;
  g.partition_numel = 11;
  return {g};
}

at::Tensor flat(float from) {
  at::Tensor t = torch::arange(from, from + 11, torch::kFloat);
  t.narrow(0, 8, 3).zero_();  // padding
  return t;
}

// optim::optimizer_state_dict's shape over one flat parameter per group.
c10::IValue flat_state(bool with_state) {
  ckpt::Dict state = ckpt::new_dict();
  if (with_state) {
    ckpt::Dict entry = ckpt::new_dict();
    entry.insert("step", at::scalar_tensor(3.0, at::kFloat));
    entry.insert("exp_avg", flat(100));
    entry.insert("exp_avg_sq", flat(200));
    state.insert(int64_t{0}, entry);
  }
  ckpt::Dict group = ckpt::new_dict();
  group.insert("lr", 0.5);
  List ids(c10::AnyType::get());
  ids.push_back(int64_t{0});
  group.insert("params", ids);
  List groups(c10::AnyType::get());
  groups.push_back(group);
  ckpt::Dict out = ckpt::new_dict();
  out.insert("state", state);
  out.insert("param_groups", groups);
  return out;
}

TEST(UnfusedFp16Layout, DeepSpeedWrapsEveryOptimizerButItsFusedAdamUnfused) {
  std::vector<at::Tensor> params{torch::zeros({4}, torch::requires_grad())};
  optim::Adam fused(params);
  torch::optim::AdamW torch_adamw(params);
  optim::Lamb lamb(params);
  optim::SGD sgd(params);
  EXPECT_FALSE(deepspeed_wraps_unfused(fused));
  EXPECT_TRUE(deepspeed_wraps_unfused(torch_adamw));
  EXPECT_TRUE(deepspeed_wraps_unfused(lamb));
  EXPECT_TRUE(deepspeed_wraps_unfused(sgd));
}

TEST(UnfusedFp16Layout, SplitsEachGroupIntoItsParametersAndJoinsThemBack) {
  const auto layout = one_group();
  const PerParameterState split = split_into_parameters(layout, {flat(0)}, flat_state(true));

  const auto masters = split.fp32_groups.toListRef()[0].toListRef();
  ASSERT_EQ(masters.size(), 2u);
  EXPECT_TRUE(masters[0].toTensor().equal(torch::arange(0, 6, torch::kFloat).view({2, 3})));
  EXPECT_TRUE(masters[1].toTensor().equal(torch::arange(6, 8, torch::kFloat)));
  const auto sd = split.optimizer_state_dict.toGenericDict();
  const auto group = sd.at("param_groups").toListRef()[0].toGenericDict();
  EXPECT_EQ(group.at("lr").toDouble(), 0.5);
  ASSERT_EQ(group.at("params").toListRef().size(), 2u);
  EXPECT_EQ(group.at("params").toListRef()[1].toInt(), 1);
  const auto state = sd.at("state").toGenericDict();
  const auto bias = state.at(int64_t{1}).toGenericDict();
  EXPECT_TRUE(bias.at("exp_avg").toTensor().equal(torch::arange(106, 108, torch::kFloat)));
  EXPECT_TRUE(bias.at("exp_avg_sq").toTensor().equal(torch::arange(206, 208, torch::kFloat)));
  // Each parameter's step is its own tensor: torch's AdamW adds to it in place.
  const at::Tensor weight_step = state.at(int64_t{0}).toGenericDict().at("step").toTensor();
  EXPECT_EQ(weight_step.item<float>(), 3.0f);
  EXPECT_FALSE(weight_step.is_same(bias.at("step").toTensor()));

  const FlatState joined =
      join_parameters(layout, split.fp32_groups, split.optimizer_state_dict, "f.pt");
  ASSERT_EQ(joined.masters.size(), 1u);
  EXPECT_TRUE(joined.masters[0].equal(flat(0)));
  const auto jsd = joined.optimizer_state_dict.toGenericDict();
  const auto entry = jsd.at("state").toGenericDict().at(int64_t{0}).toGenericDict();
  EXPECT_TRUE(entry.at("exp_avg").toTensor().equal(flat(100)));
  EXPECT_TRUE(entry.at("exp_avg_sq").toTensor().equal(flat(200)));
  EXPECT_EQ(entry.at("step").toTensor().item<float>(), 3.0f);
  const auto jgroup = jsd.at("param_groups").toListRef()[0].toGenericDict();
  EXPECT_EQ(jgroup.at("params").toListRef().size(), 1u);
  EXPECT_EQ(jgroup.at("lr").toDouble(), 0.5);
}

TEST(UnfusedFp16Layout, NoStateBeforeTheFirstStep) {
  const auto layout = one_group();
  const PerParameterState split = split_into_parameters(layout, {flat(0)}, flat_state(false));
  EXPECT_EQ(split.optimizer_state_dict.toGenericDict().at("state").toGenericDict().size(), 0u);
  const FlatState joined =
      join_parameters(layout, split.fp32_groups, split.optimizer_state_dict, "f.pt");
  EXPECT_EQ(joined.optimizer_state_dict.toGenericDict().at("state").toGenericDict().size(), 0u);
}

TEST(UnfusedFp16Layout, AFileOfAnotherModelIsNamed) {
  const auto layout = one_group();
  const PerParameterState split = split_into_parameters(layout, {flat(0)}, flat_state(true));

  // One parameter fewer in the group.
  List short_group(c10::AnyType::get());
  short_group.push_back(split.fp32_groups.toListRef()[0].toListRef()[0]);
  List short_groups(c10::AnyType::get());
  short_groups.push_back(short_group);
  EXPECT_THROW_WITH(join_parameters(layout, short_groups, split.optimizer_state_dict, "f.pt"),
                    CheckpointError, "f.pt: 'optimizer' fp32_groups[0] holds 1 parameters");

  // A master of another shape.
  List reshaped(c10::AnyType::get());
  reshaped.push_back(torch::zeros({3, 2}));
  reshaped.push_back(torch::zeros({2}));
  List reshaped_groups(c10::AnyType::get());
  reshaped_groups.push_back(reshaped);
  EXPECT_THROW_WITH(
      join_parameters(layout, reshaped_groups, split.optimizer_state_dict, "f.pt"),
      CheckpointError, "parameter 'w' [2, 3]");

  // State for one parameter of the two.
  ckpt::Dict partial = split.optimizer_state_dict.toGenericDict().copy();
  ckpt::Dict state = partial.at("state").toGenericDict().copy();
  ASSERT_EQ(state.erase(int64_t{1}), 1u);
  partial.insert_or_assign("state", state);
  EXPECT_THROW_WITH(join_parameters(layout, split.fp32_groups, partial, "f.pt"), CheckpointError,
                    "1 of the 2 parameters of param group 0 have optimizer state");
}

}  // namespace
}  // namespace deepspeed::runtime
