// module_state_dict / load_module_state_dict on a nested torch::nn module.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn.h>

#include "deepspeed/checkpoint.h"
#include "support/expect_throw.h"

namespace deepspeed::checkpoint {
namespace {

struct Block : torch::nn::Module {
  Block() {
    linear = register_module("linear", torch::nn::Linear(3, 2));
    norm = register_module("norm", torch::nn::BatchNorm1d(2));
    scale = register_parameter("scale", torch::ones({2}));
  }
  torch::nn::Linear linear{nullptr};
  torch::nn::BatchNorm1d norm{nullptr};
  at::Tensor scale;
};

TEST(ModuleState, PyTorchKeyOrderParametersThenBuffersThenChildren) {
  Block block;
  std::vector<std::string> keys;
  for (const auto& item : module_state_dict(block)) keys.push_back(item.key());
  EXPECT_EQ(keys, (std::vector<std::string>{
                      "scale", "linear.weight", "linear.bias", "norm.weight", "norm.bias",
                      "norm.running_mean", "norm.running_var", "norm.num_batches_tracked"}));
  EXPECT_EQ(module_buffer_names(block),
            (std::vector<std::string>{"norm.running_mean", "norm.running_var",
                                      "norm.num_batches_tracked"}));
}

TEST(ModuleState, LoadCopiesValuesAndReportsMissingAndUnexpected) {
  Block source, target;
  {
    at::NoGradGuard g;
    for (auto& p : source.parameters()) p.uniform_();
  }
  TensorDict state = module_state_dict(source);
  auto r = load_module_state_dict(target, state, /*strict=*/true, "ckpt.pt");
  EXPECT_TRUE(r.missing_keys.empty() && r.unexpected_keys.empty());
  EXPECT_TRUE(at::equal(target.linear->weight, source.linear->weight));
  EXPECT_FALSE(target.linear->weight.is_same(source.linear->weight));

  TensorDict partial;
  partial.insert("scale", at::full({2}, 7.0));
  partial.insert("extra", at::zeros({1}));
  EXPECT_THROW_WITH(load_module_state_dict(target, partial, true, "ckpt.pt"), CheckpointError,
                    "ckpt.pt: error loading the module state dict: missing keys [\"linear.weight\"");
  r = load_module_state_dict(target, partial, /*strict=*/false, "ckpt.pt");
  EXPECT_EQ(r.unexpected_keys, std::vector<std::string>{"extra"});
  EXPECT_EQ(r.missing_keys.size(), 7u);
  EXPECT_EQ(target.scale[0].item<float>(), 7.0f);

  TensorDict wrong;
  wrong.insert("scale", at::zeros({3}));
  EXPECT_THROW_WITH(load_module_state_dict(target, wrong, false, "ckpt.pt"), CheckpointError,
                    "size mismatch for \"scale: checkpoint shape [3], model shape [2]\"");
}

}  // namespace
}  // namespace deepspeed::checkpoint
