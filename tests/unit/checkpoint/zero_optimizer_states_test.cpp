// ZeroOptimizerStates: DeepSpeed's keys and Python objects, the round trip, files written by
// Python DeepSpeed (enum zero_stage, int partition_count), and the resume world-size rule.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "deepspeed/checkpoint.h"
#include "support/expect_throw.h"
#include "synthetic_checkpoint.h"

namespace deepspeed::checkpoint {
namespace {

using c10::IValue;

TEST(ZeroOptimizerStates, WritesDeepSpeedsKeysAndObjects) {
  auto file = testing::synthetic_optimizer_file(testing::example_checkpoint(3), 2);
  file.optimizer_state_dict.loss_scaler.cur_scale = 4096;
  IValue v = file.to_ivalue();
  std::vector<std::string> top;
  for (const auto& e : v.toGenericDict()) top.push_back(e.key().toStringRef());
  EXPECT_EQ(top, (std::vector<std::string>{"optimizer_state_dict", "ds_config", "ds_version"}));
  auto d = v.toGenericDict().at("optimizer_state_dict").toGenericDict();
  std::vector<std::string> keys;
  for (const auto& e : d) keys.push_back(e.key().toStringRef());
  EXPECT_EQ(keys, (std::vector<std::string>{
                      "loss_scaler", "dynamic_loss_scale", "overflow", "clip_grad",
                      "base_optimizer_state", "single_partition_of_fp32_groups", "zero_stage",
                      "group_paddings", "partition_count", "ds_version", "param_slice_mappings"}));
  auto scaler = as_python_object(d.at("loss_scaler"));
  ASSERT_TRUE(scaler.has_value());
  EXPECT_EQ(scaler->class_path, "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler");
  EXPECT_EQ(scaler->state.at("cur_scale").toDouble(), 4096.0);
  EXPECT_EQ(scaler->state.at("cur_hysteresis").toInt(), 2);
  EXPECT_EQ(as_python_object(scaler->state.at("dtype"))->class_path, "torch.float16");
  EXPECT_TRUE(d.at("zero_stage").isInt());
  // Group 0 has 65 elements; W = 3 pads it to 66: rank 2 owns [44, 66), 21 real + 1 padding.
  // Group 1 has 8, padded to 12: rank 2 owns [8, 12), all padding.
  EXPECT_EQ(d.at("group_paddings").toListRef()[0].toInt(), 1);
  EXPECT_EQ(d.at("group_paddings").toListRef()[1].toInt(), 4);
  EXPECT_EQ(d.at("single_partition_of_fp32_groups").toListRef()[0].toTensor().numel(), 21);
  EXPECT_EQ(d.at("single_partition_of_fp32_groups").toListRef()[1].toTensor().numel(), 0);
  auto mapping = d.at("param_slice_mappings").toListRef()[0].toGenericDict();
  auto address = as_python_object(mapping.at("block.0.bias"));
  ASSERT_TRUE(address.has_value());
  EXPECT_EQ(address->class_path, "deepspeed.utils.tensor_fragment.fragment_address");
  EXPECT_EQ(address->state.at("numel").toInt(), 5);
  EXPECT_EQ(address->state.at("start").toInt(), 16);  // elements 60..64, slice starts at 44
}

TEST(ZeroOptimizerStates, RoundTripsThroughBytes) {
  auto file = testing::synthetic_optimizer_file(testing::example_checkpoint(2), 1);
  file.optimizer_state_dict.extra = {{"base_optimizer_state_step", IValue(5)}};
  auto back = ZeroOptimizerFile::from_ivalue(load_from_string(save_to_string(file.to_ivalue())),
                                             "rank1.pt");
  const auto& a = file.optimizer_state_dict;
  const auto& b = back.optimizer_state_dict;
  EXPECT_EQ(b.zero_stage, 2);
  EXPECT_TRUE(b.loss_scaler.dynamic);
  EXPECT_EQ(b.loss_scaler.scale_window, a.loss_scaler.scale_window);
  EXPECT_EQ(b.loss_scaler.dtype, at::kHalf);
  EXPECT_EQ(b.clip_grad, 1.0);
  ASSERT_EQ(b.single_partition_of_fp32_groups.size(), 2u);
  for (size_t g = 0; g < 2; ++g) {
    EXPECT_TRUE(at::equal(b.single_partition_of_fp32_groups[g], a.single_partition_of_fp32_groups[g]));
  }
  EXPECT_EQ(b.group_paddings, a.group_paddings);
  EXPECT_EQ(b.partition_count, (std::vector<int64_t>{2, 2}));
  ASSERT_EQ(b.param_slice_mappings.size(), 2u);
  EXPECT_EQ(b.param_slice_mappings[0]["block.0.weight"].numel,
            a.param_slice_mappings[0]["block.0.weight"].numel);
  ASSERT_EQ(b.extra.size(), 1u);
  EXPECT_EQ(b.extra[0].first, "base_optimizer_state_step");
  auto state = b.base_optimizer_state.toGenericDict().at("state").toGenericDict();
  EXPECT_EQ(state.at(int64_t{1}).toGenericDict().at("step").toInt(), 3);
  EXPECT_EQ(back.ds_config["zero_optimization"]["stage"], 2);
}

// Note [Elastic ZeRO checkpoints]: rank 2 of 3 holds padding in both groups (group 1 nothing
// else), which the elastic layout drops and the rigid one gets back as zeros.
TEST(ZeroOptimizerStates, ElasticLayoutDropsThePaddingAndKeepsTheStep) {
  const auto rigid = testing::synthetic_optimizer_file(testing::example_checkpoint(3), 2);
  auto z = rigid.optimizer_state_dict;
  EXPECT_FALSE(z.elastic());
  auto as_tensor = z;
  as_tensor.make_elastic(/*step_as_tensor=*/true);
  const IValue tensor_step =
      as_tensor.base_optimizer_state.toListRef()[0].toGenericDict().at("step");
  ASSERT_TRUE(tensor_step.isTensor());
  EXPECT_EQ(tensor_step.toTensor().dim(), 0);
  EXPECT_EQ(tensor_step.toTensor().scalar_type(), at::kFloat);
  EXPECT_EQ(tensor_step.toTensor().item<double>(), 3.0);
  z.make_elastic(/*step_as_tensor=*/false);
  ASSERT_TRUE(z.elastic());
  const auto groups = z.base_optimizer_state.toListRef();
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].toGenericDict().at("exp_avg").toTensor().numel(), 21);  // 22 - 1 padding
  EXPECT_EQ(groups[1].toGenericDict().at("exp_avg").toTensor().numel(), 0);
  EXPECT_EQ(groups[0].toGenericDict().at("step").toInt(), 3);
  ASSERT_EQ(z.extra.size(), 1u);
  EXPECT_EQ(z.extra[0].first, "base_optimizer_state_step");
  EXPECT_EQ(z.extra[0].second.toInt(), 3);

  // Through the bytes, then back with the running optimizer's hyper-parameters.
  auto file = rigid;
  file.optimizer_state_dict = z;
  auto back = ZeroOptimizerFile::from_ivalue(load_from_string(save_to_string(file.to_ivalue())),
                                             "rank2.pt").optimizer_state_dict;
  ASSERT_TRUE(back.elastic());
  const Dict rigid_base = rigid.optimizer_state_dict.base_optimizer_state.toGenericDict();
  back.make_rigid(rigid_base.at("param_groups"), "rank2.pt");
  ASSERT_FALSE(back.elastic());
  const Dict want = rigid_base.at("state").toGenericDict();
  const Dict got = back.base_optimizer_state.toGenericDict().at("state").toGenericDict();
  for (int64_t g = 0; g < 2; ++g) {
    const at::Tensor w = want.at(g).toGenericDict().at("exp_avg").toTensor();
    const at::Tensor t = got.at(g).toGenericDict().at("exp_avg").toTensor();
    ASSERT_EQ(t.numel(), w.numel()) << "group " << g;
    const int64_t real = back.single_partition_of_fp32_groups[static_cast<size_t>(g)].numel();
    EXPECT_TRUE(at::equal(t.narrow(0, 0, real), w.narrow(0, 0, real)));
    EXPECT_EQ(t.narrow(0, real, t.numel() - real).abs().sum().item<double>(), 0.0);
    EXPECT_EQ(got.at(g).toGenericDict().at("step").toInt(), 3);
  }

  // DeepSpeed's FusedAdam keeps its step in the param group: the state has none, the file has
  // it beside the state, and the rigid state gets it back.
  auto fused = z;
  c10::impl::GenericList no_step(c10::AnyType::get());
  for (const auto& group : fused.base_optimizer_state.toListRef()) {
    Dict copy = group.toGenericDict().copy();
    copy.erase("step");
    no_step.push_back(copy);
  }
  fused.base_optimizer_state = no_step;
  fused.extra = {{"base_optimizer_state_step", IValue(int64_t{7})}};
  fused.make_rigid(rigid_base.at("param_groups"), "fused.pt");
  const Dict fused_state = fused.base_optimizer_state.toGenericDict().at("state").toGenericDict();
  EXPECT_EQ(fused_state.at(int64_t{0}).toGenericDict().at("step").toInt(), 7);

  // A state that does not match its fp32 partition names the file and the group.
  auto wrong = z;
  wrong.single_partition_of_fp32_groups[0] = at::zeros({20});
  EXPECT_THROW_WITH(wrong.make_rigid(rigid_base.at("param_groups"), "rank2.pt"), CheckpointError,
                    "rank2.pt: base_optimizer_state[0]: 'exp_avg' has 21 elements, its fp32 "
                    "partition 20");
}

TEST(ZeroOptimizerStates, ReadsPythonDeepSpeedsForms) {
  Dict scaler_state = new_dict();
  scaler_state.insert("cur_scale", 1.0);
  scaler_state.insert("dynamic", false);
  Dict d = new_dict();
  d.insert("loss_scaler",
           python_object("deepspeed.runtime.fp16.loss_scaler.LossScaler", {}, scaler_state));
  d.insert("zero_stage", python_object("deepspeed.runtime.zero.config.ZeroStageEnum", {IValue(1)}));
  d.insert("partition_count", 4);  // older files: one int
  d.insert("base_optimizer_state", new_dict());
  c10::impl::GenericList groups(c10::AnyType::get());
  groups.push_back(at::zeros({3}));
  d.insert("single_partition_of_fp32_groups", groups);
  auto z = ZeroOptimizerStates::from_ivalue(d, "f.pt");
  EXPECT_EQ(z.zero_stage, 1);
  EXPECT_FALSE(z.loss_scaler.dynamic);
  EXPECT_EQ(z.partition_count, std::vector<int64_t>{4});
  EXPECT_THROW_WITH(z.check_partition_count(2, "f.pt"), CheckpointError,
                    "f.pt: written by 4 data-parallel ranks (param group 0), this job has 2");
  z.check_partition_count(4, "f.pt");

  d.insert_or_assign("zero_stage", 3);
  EXPECT_THROW_WITH(ZeroOptimizerStates::from_ivalue(d, "z3.pt"), NotSupportedError,
                    "zero_stage is 3");
}

// DeepSpeed's BF16_Optimizer writes no zero_stage (nor loss scaler) and keeps each partition's
// padding in it; in memory the partition is without, as ZeRO's.
TEST(ZeroOptimizerStates, ReadsAndWritesBf16OptimizersState) {
  Dict d = new_dict();
  d.insert("clip_grad", 1.0);
  d.insert("base_optimizer_state", new_dict());
  c10::impl::GenericList groups(c10::AnyType::get());
  groups.push_back(at::tensor({1.0f, 2.0f, 3.0f, 0.0f, 0.0f}));
  d.insert("single_partition_of_fp32_groups", groups);
  c10::impl::GenericList paddings(c10::AnyType::get());
  paddings.push_back(int64_t{2});
  d.insert("group_paddings", paddings);
  d.insert("partition_count", 2);
  d.insert("ds_version", "0.19.8");
  const auto z = ZeroOptimizerStates::from_ivalue(d, "bf16.pt");
  EXPECT_TRUE(z.bf16_optimizer);
  EXPECT_EQ(z.zero_stage, 1);
  ASSERT_EQ(z.single_partition_of_fp32_groups.size(), 1u);
  EXPECT_TRUE(z.single_partition_of_fp32_groups[0].equal(at::tensor({1.0f, 2.0f, 3.0f})));

  const Dict back = z.to_ivalue().toGenericDict();
  EXPECT_FALSE(back.contains("zero_stage"));
  EXPECT_FALSE(back.contains("loss_scaler"));
  const at::Tensor written = back.at("single_partition_of_fp32_groups").toListRef()[0].toTensor();
  EXPECT_TRUE(written.equal(at::tensor({1.0f, 2.0f, 3.0f, 0.0f, 0.0f})));
}

}  // namespace
}  // namespace deepspeed::checkpoint
