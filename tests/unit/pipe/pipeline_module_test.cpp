// PipelineModule in one process (one stage): DeepSpeed's parameter names, one shared module per
// tied key, seed_layers making the weights independent of the partition, the layers a
// checkpoint saves, and the options refused before any communication.
#include "deepspeed/pipe.h"

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

TEST(PipelineModule, ActivationCheckpointIntervalIsRefusedByName) {
  auto o = one_stage();
  o.activation_checkpoint_interval = 2;
  EXPECT_THROW_WITH(PipelineModule(testing::tiny_pipe_specs(), o), NotSupportedError,
                    "activation_checkpoint_interval 2");
  o.activation_checkpoint_interval = 0;
  o.partition_method = "type:nothing";
  EXPECT_THROW_WITH(PipelineModule(testing::tiny_pipe_specs(), o), ConfigError,
                    "matches no layer type");
}

}  // namespace
}  // namespace deepspeed::pipe
