// PipelineModule in one process (one stage): DeepSpeed's parameter names, one shared module per
// tied key, seed_layers making the weights independent of the partition, the layers a
// checkpoint saves, and the options refused before any communication.
#include "deepspeed/pipe.h"

#include "deepspeed/checkpointing.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "support/expect_throw.h"
#include "support/tiny_pipe_model.h"

namespace deepspeed::pipe {
namespace {

PipelineModuleOptions one_stage() {
  PipelineModuleOptions o;
  o.num_stages = 1;
  o.loss_fn = testing::tiny_pipe_loss;
  o.seed_layers = true;
  return o;
}

TEST(PipelineModule, OneStageHoldsEveryLayerUnderDeepSpeedsNames) {
  PipelineModule m(testing::tiny_pipe_specs(), one_stage());
  EXPECT_EQ(m.partitions(), (std::vector<int>{0, 7}));
  std::vector<std::string> names;
  for (const auto& p : m.named_parameters()) names.push_back(p.key());
  EXPECT_EQ(names, (std::vector<std::string>{"tied_modules.embed.weight", "1.fc.weight",
                                             "1.fc.bias", "2.fc.weight", "2.fc.bias",
                                             "3.fc.weight", "3.fc.bias", "4.fc.weight",
                                             "4.fc.bias", "5.weight", "5.bias"}));
  // Layer 0 is the tied module itself (saved as layer_00), the head a function of it.
  EXPECT_NE(m.layer_module(0), nullptr);
  EXPECT_EQ(m.layer_module(6), nullptr);
  EXPECT_EQ(m.stage_owner(6), 0);
}

TEST(PipelineModule, SeedLayersGivesTheReferenceWeightsAndForward) {
  PipelineModule m(testing::tiny_pipe_specs(), one_stage());
  testing::TinyPipeReferenceImpl ref;
  auto mine = m.named_parameters();
  for (const auto& p : ref.named_parameters()) {
    ASSERT_NE(mine.find(p.key()), nullptr) << p.key();
    EXPECT_TRUE(torch::equal(*mine.find(p.key()), p.value())) << p.key();
  }
  auto [x, y] = testing::tiny_pipe_batch(3, 2);
  EXPECT_TRUE(torch::equal(testing::tiny_pipe_loss(m.forward(x), y), ref.forward(x, y)));
}

// activation_checkpoint_interval runs every that many layers through checkpointing::checkpoint:
// same loss and gradients as without, and the recomputation really happens in backward.
TEST(PipelineModule, ActivationCheckpointIntervalGivesTheSameGradients) {
  auto grads_of = [](int interval, int64_t* recomputed) {
    auto o = one_stage();
    o.activation_checkpoint_interval = interval;
    PipelineModule m(testing::tiny_pipe_specs(), o);
    auto [x, y] = testing::tiny_pipe_batch(3, 2);
    const auto before = checkpointing::stats().recomputes;
    auto loss = testing::tiny_pipe_loss(m.forward(x), y);
    loss.backward();
    *recomputed = checkpointing::stats().recomputes - before;
    std::vector<at::Tensor> g{loss.detach()};
    for (const auto& p : m.parameters()) g.push_back(p.grad().clone());
    return g;
  };
  int64_t plain_calls = 0, every_two_calls = 0;
  const auto plain = grads_of(0, &plain_calls);
  const auto every_two = grads_of(2, &every_two_calls);
  EXPECT_EQ(plain_calls, 0);
  EXPECT_EQ(every_two_calls, 4);  // 7 layers in runs of 2, every run holding parameters
  ASSERT_EQ(plain.size(), every_two.size());
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(torch::equal(plain[i], every_two[i])) << i;

  auto o = one_stage();
  o.activation_checkpoint_interval = -1;
  EXPECT_THROW_WITH(PipelineModule(testing::tiny_pipe_specs(), o), ConfigError,
                    "activation_checkpoint_interval is -1");
  o.activation_checkpoint_interval = 0;
  o.partition_method = "type:nothing";
  EXPECT_THROW_WITH(PipelineModule(testing::tiny_pipe_specs(), o), ConfigError,
                    "matches no layer type");
}

}  // namespace
}  // namespace deepspeed::pipe
