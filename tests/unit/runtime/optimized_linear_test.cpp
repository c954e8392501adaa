// deepspeed::linear::OptimizedLinear on one process: a plain Linear without LoRA; with LoRA
// y = x W^T + (alpha / r) B A x, B starting at zero, gradients reaching only A and B;
// delay_lora_init and init_lora(model); loading a pretrained weight (a module outside
// target_mods becomes a plain frozen Linear); the merged weight; a bias beside LoRA (frozen);
// refusals naming the setting.
// Base weight sharding is in tests/dist/optimized_linear_dist_test.cpp, DeepSpeed parity in
// tests/e2e/optimized_linear_parity_test.cpp.
#include "deepspeed/linear.h"

#include <cmath>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deepspeed/errors.h"
#include "support/expect_throw.h"

namespace deepspeed::linear {
namespace {

LoRAConfig lora(int64_t r = 4, double alpha = 8.0) {
  LoRAConfig c;
  c.lora_r = r;
  c.lora_alpha = alpha;
  return c;
}

TEST(OptimizedLinear, WithoutLoraIsAPlainTrainableLinear) {
  torch::manual_seed(3);
  OptimizedLinear ol(6, 5, /*bias=*/true, std::nullopt, std::nullopt, at::kFloat);
  torch::manual_seed(3);
  torch::nn::Linear ref(torch::nn::LinearOptions(6, 5).bias(true));
  EXPECT_TRUE(torch::equal(ol->weight, ref->weight));  // nn.Linear's initialisation
  EXPECT_TRUE(torch::equal(ol->bias, ref->bias));
  EXPECT_TRUE(ol->weight.requires_grad());
  const auto x = torch::randn({3, 6});
  EXPECT_TRUE(torch::allclose(ol(x), ref(x)));
  EXPECT_EQ(ol->named_parameters().size(), 2u);
  EXPECT_FALSE(ol->lora_enabled());
}

TEST(OptimizedLinear, LoraAddsScaledAdaptersAndTrainsOnlyThem) {
  torch::manual_seed(4);
  OptimizedLinear ol(6, 5, false, lora(4, 12.0), std::nullopt, at::kFloat);
  ASSERT_TRUE(ol->lora_enabled());
  EXPECT_DOUBLE_EQ(ol->scaling(), 3.0);
  std::vector<std::string> names;
  for (const auto& p : ol->named_parameters()) names.push_back(p.key());
  EXPECT_EQ(names, (std::vector<std::string>{"weight", "lora_weight_1.weight",
                                             "lora_weight_2.weight"}));
  EXPECT_FALSE(ol->weight.requires_grad());
  EXPECT_EQ(ol->lora_weight_1->weight.sizes(), (std::vector<int64_t>{4, 6}));
  EXPECT_EQ(ol->lora_weight_2->weight.sizes(), (std::vector<int64_t>{5, 4}));
  EXPECT_EQ(ol->lora_weight_2->weight.abs().sum().item<float>(), 0.0f);  // B starts at zero
  const auto x = torch::randn({3, 6});
  EXPECT_TRUE(torch::allclose(ol(x), torch::matmul(x, ol->weight.t())));
  {
    torch::NoGradGuard no_grad;
    ol->lora_weight_2->weight.normal_();
  }
  const auto a = ol->lora_weight_1->weight, b = ol->lora_weight_2->weight;
  const auto want =
      torch::matmul(x, ol->weight.t()) + 3.0 * torch::matmul(torch::matmul(x, a.t()), b.t());
  const auto y = ol(x);
  EXPECT_TRUE(torch::allclose(y, want, 1e-5, 1e-5));
  y.sum().backward();
  EXPECT_FALSE(ol->weight.grad().defined());
  EXPECT_TRUE(a.grad().defined() && b.grad().defined());
  // The merged weight is the plain Linear the adapters amount to.
  EXPECT_TRUE(torch::allclose(torch::matmul(x, ol->merged_weight().t()), y, 1e-5, 1e-5));
}

// Beyond DeepSpeed (it asserts bias=False with LoRA): the bias is part of the frozen base.
TEST(OptimizedLinear, LoraWithABiasKeepsItFrozenBesideTheBaseWeight) {
  torch::manual_seed(5);
  OptimizedLinear ol(6, 5, /*bias=*/true, lora(2, 4.0), std::nullopt, at::kFloat);
  std::vector<std::string> names;
  for (const auto& p : ol->named_parameters()) names.push_back(p.key());
  EXPECT_EQ(names, (std::vector<std::string>{"weight", "bias", "lora_weight_1.weight",
                                             "lora_weight_2.weight"}));
  ASSERT_EQ(ol->bias.sizes(), (std::vector<int64_t>{5}));
  EXPECT_GT(ol->bias.abs().sum().item<float>(), 0.0f);
  EXPECT_LE(ol->bias.abs().max().item<float>(), 1.0f / std::sqrt(6.0f));  // nn.Linear's bound
  {
    torch::NoGradGuard no_grad;
    ol->lora_weight_2->weight.normal_();
  }
  const auto x = torch::randn({3, 6});
  const auto a = ol->lora_weight_1->weight, b = ol->lora_weight_2->weight;
  const auto y = ol(x);
  EXPECT_TRUE(torch::allclose(
      y, torch::addmm(ol->bias, x, ol->weight.t()) + 2.0 * x.matmul(a.t()).matmul(b.t()),
      1e-5, 1e-5));
  y.sum().backward();
  EXPECT_FALSE(ol->bias.requires_grad());
  EXPECT_FALSE(ol->bias.grad().defined());
  EXPECT_TRUE(a.grad().defined() && b.grad().defined());
  // disable() keeps it: a plain frozen Linear with the same bias.
  const auto bias = ol->bias.clone();
  ol->load_base_weight(torch::randn({5, 6}), "lm_head");  // outside target_mods
  EXPECT_FALSE(ol->lora_enabled());
  EXPECT_TRUE(torch::equal(ol->bias, bias));
  EXPECT_TRUE(torch::allclose(ol(x), torch::addmm(bias, x, ol->weight.t())));
}

TEST(OptimizedLinear, DelayedInitAndInitLoraFreezeTheRestOfTheModel) {
  auto c = lora();
  c.delay_lora_init = true;
  auto model = std::make_shared<torch::nn::Module>();
  auto ol =
      model->register_module("q_proj", OptimizedLinear(6, 5, false, c, std::nullopt, at::kFloat));
  auto other = model->register_module("norm", torch::nn::Linear(5, 5));
  EXPECT_FALSE(ol->lora_weight_1);
  EXPECT_THROW_WITH(ol->forward(torch::randn({1, 6})), UsageError, "init_lora was never called");
  init_lora(*model);
  ASSERT_TRUE(ol->lora_weight_1);
  for (const auto& p : model->named_parameters()) {
    const bool adapter = p.key().find("lora_weight") != std::string::npos;
    EXPECT_EQ(p.value().requires_grad(), adapter) << p.key();
  }
  EXPECT_FALSE(other->weight.requires_grad());
}

TEST(OptimizedLinear, LoadsPretrainedWeightsAndDisablesModulesOutsideTheTargets) {
  const auto w = torch::randn({5, 6});
  OptimizedLinear q(6, 5, false, lora(), std::nullopt, at::kFloat);
  q->load_base_weight(w, "model.layers.0.self_attn.q_proj");
  EXPECT_TRUE(q->lora_enabled());
  EXPECT_TRUE(torch::equal(q->weight, w));
  OptimizedLinear head(6, 5, false, lora(), std::nullopt, at::kFloat);
  head->load_base_weight(w, "lm_head");
  EXPECT_FALSE(head->lora_enabled());  // DeepSpeed's disable(): a plain frozen Linear
  EXPECT_FALSE(head->lora_weight_1);
  EXPECT_EQ(head->named_parameters().size(), 1u);
  EXPECT_FALSE(head->weight.requires_grad());
  const auto x = torch::randn({2, 6});
  EXPECT_TRUE(torch::allclose(head(x), torch::matmul(x, w.t())));
  EXPECT_THROW_WITH(q->load_base_weight(torch::randn({6, 5}), "q_proj"), UsageError,
                    "OptimizedLinear q_proj: weight of shape [6, 5] does not fit [5, 6]");
}

TEST(OptimizedLinear, RefusesWhatDeepSpeedCannotDoHereByName) {
  EXPECT_THROW_WITH(OptimizedLinear(6, 5, false, std::nullopt, QuantizationConfig{}),
                    NotSupportedError, "quantization_config is not supported");
  auto offload = lora();
  offload.offload_ratio = 0.5;
  EXPECT_THROW_WITH(OptimizedLinear(6, 5, false, offload), NotSupportedError,
                    "LoRAConfig.offload / offload_ratio (0.5)");
  auto sharded = lora();
  sharded.base_weight_sharding = 2;  // no process group here
  EXPECT_THROW_WITH(OptimizedLinear(6, 5, false, sharded), UsageError,
                    "LoRAConfig.base_weight_sharding is 2; base weight sharding is only supported "
                    "across the world size");
  EXPECT_THROW_WITH(OptimizedLinear(6, 5, false, lora(0)), UsageError, "lora_r is 0");
}

}  // namespace
}  // namespace deepspeed::linear
