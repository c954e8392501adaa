// Stage bounds against DeepSpeed's: partition_uniform and partition_balanced on hand-picked
// weights (values printed by tests/golden/pipe_partition_golden.py from DeepSpeed edaa7221), and
// PipelineModule's three methods on layer specs (parameters, uniform, type:<regex>), and the
// partition's description.
#include "deepspeed/pipe.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "support/expect_throw.h"

namespace deepspeed::pipe {
namespace {

using V = std::vector<int>;

TEST(PipePartition, UniformMatchesDeepSpeed) {
  EXPECT_EQ(partition_uniform(10, 4), (V{0, 3, 6, 8, 10}));
  EXPECT_EQ(partition_uniform(3, 4), (V{0, 1, 2, 3, 3}));
  EXPECT_EQ(partition_uniform(8, 2), (V{0, 4, 8}));
  EXPECT_EQ(partition_uniform(7, 3), (V{0, 3, 5, 7}));
}

TEST(PipePartition, BalancedMatchesDeepSpeed) {
  using W = std::vector<double>;
  EXPECT_EQ(partition_balanced(W(8, 1.0), 2), (V{0, 4, 8}));
  EXPECT_EQ(partition_balanced(W{100, 10, 10, 10, 10, 100}, 2), (V{0, 3, 6}));
  EXPECT_EQ(partition_balanced(W{100, 10, 10, 10, 10, 100}, 3), (V{0, 1, 5, 6}));
  EXPECT_EQ(partition_balanced(W{5, 1, 1, 1, 1, 1, 1, 5}, 4), (V{0, 1, 4, 7, 8}));
  EXPECT_EQ(partition_balanced(W{0, 1, 1, 1, 1, 0}, 2), (V{0, 3, 6}));
  EXPECT_EQ(partition_balanced(W{0, 1, 1, 1, 1, 1, 0}, 2), (V{0, 4, 7}));
  EXPECT_EQ(partition_balanced(W{3, 3, 3}, 4), (V{0, 1, 2, 3, 3}));
  EXPECT_EQ(partition_balanced(W{0, 1, 1, 1, 1, 0, 0}, 2), (V{0, 3, 7}));
  EXPECT_EQ(partition_balanced(W{0, 1, 1, 1, 1, 0, 0}, 4), (V{0, 2, 3, 4, 7}));
  EXPECT_EQ(partition_balanced(W{0, 1, 1, 1, 1, 0, 0}, 3), (V{0, 3, 4, 7}));
}

// Layers whose trainable parameter counts are 4160, 2112 x 4, 64 and 0.
std::vector<LayerSpec> gpt_like_specs() {
  std::vector<LayerSpec> specs;
  specs.push_back(LayerSpec::of<torch::nn::Linear>("Embedding", torch::nn::LinearOptions(64, 64)));
  for (int i = 0; i < 4; ++i) {
    specs.push_back(LayerSpec::of<torch::nn::Linear>("Block", torch::nn::LinearOptions(32, 64)));
  }
  specs.push_back(LayerSpec::of<torch::nn::LayerNorm>(
      "LayerNorm", torch::nn::LayerNormOptions(std::vector<int64_t>{32})));
  specs.push_back(LayerSpec::function("Head", [](const at::Tensor& x) { return x; }));
  return specs;
}

TEST(PipePartition, MethodsOnLayerSpecsMatchDeepSpeed) {
  auto specs = gpt_like_specs();
  // parameters: DeepSpeed's partition_balanced of [4160, 2112, 2112, 2112, 2112, 64, 0].
  EXPECT_EQ(partition_layers(specs, "parameters", 2), (V{0, 2, 7}));
  EXPECT_EQ(partition_layers(specs, "parameters", 4), (V{0, 1, 3, 4, 7}));
  EXPECT_EQ(partition_layers(specs, "uniform", 2), (V{0, 4, 7}));
  EXPECT_EQ(partition_layers(specs, "Uniform", 3), (V{0, 3, 5, 7}));
  // type:<regex>, searched case-insensitively in the type name: [0, 1, 1, 1, 1, 0, 0].
  EXPECT_EQ(partition_layers(specs, "type:block", 2), (V{0, 3, 7}));
  EXPECT_EQ(partition_layers(specs, "type:^BLO", 4), (V{0, 2, 3, 4, 7}));
}

TEST(PipePartition, DescribedAsDeepSpeedPrintsIt) {
  auto specs = gpt_like_specs();
  const std::vector<std::string> expected{"Partitioning pipeline stages with method type:block",
                                          "stage=0 layers=3",
                                          "     0: Embedding",
                                          "     1: Block",
                                          "     2: Block",
                                          "stage=1 layers=4",
                                          "     3: Block",
                                          "     4: Block",
                                          "     5: LayerNorm",
                                          "     6: Head"};
  EXPECT_EQ(describe_partition(specs, partition_layers(specs, "type:block", 2), "type:block"),
            expected);
}

TEST(PipePartition, BadMethodsAndTooManyStagesAreConfigErrors) {
  auto specs = gpt_like_specs();
  EXPECT_THROW_WITH(partition_layers(specs, "profile", 2), ConfigError,
                    "partition_method \"profile\" is not implemented");
  EXPECT_THROW_WITH(partition_layers(specs, "type:attention", 2), ConfigError,
                    "matches no layer type");
  EXPECT_THROW_WITH(partition_layers(specs, "uniform", 8), ConfigError,
                    "8 stages for 7 layers");
}

}  // namespace
}  // namespace deepspeed::pipe
