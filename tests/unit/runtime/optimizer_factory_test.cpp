// Optimizer selection from ds_config: DeepSpeed's Adam/AdamW rules and defaults (reference §3).
#include "runtime/optim/optimizer_factory.h"

#include <gtest/gtest.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

#include "support/expect_throw.h"

namespace deepspeed::optim {
namespace {

OptimizerConfig cfg(const std::string& type, const std::string& params = "{}") {
  return OptimizerConfig{true, type, json::parse(params), false};
}

TEST(OptimizerFactory, AdamMeansAdamWUnlessAdamWModeFalse) {
  at::Tensor p = torch::zeros({3}, torch::requires_grad());
  auto o = build_optimizer(cfg("Adam"), {p}, "cfg");
  EXPECT_NE(dynamic_cast<torch::optim::AdamW*>(o.get()), nullptr);
  o = build_optimizer(cfg("adam", R"({"adam_w_mode": false})"), {p}, "cfg");
  EXPECT_NE(dynamic_cast<torch::optim::Adam*>(o.get()), nullptr);
  o = build_optimizer(cfg("AdamW", R"({"adam_w_mode": false})"), {p}, "cfg");
  EXPECT_NE(dynamic_cast<torch::optim::AdamW*>(o.get()), nullptr);
}

TEST(OptimizerFactory, DeepSpeedDefaults) {
  auto p = parse_adam_params(cfg("AdamW"), "cfg");
  EXPECT_DOUBLE_EQ(p.lr, 1e-3);
  EXPECT_DOUBLE_EQ(p.beta1, 0.9);
  EXPECT_DOUBLE_EQ(p.beta2, 0.999);
  EXPECT_DOUBLE_EQ(p.eps, 1e-8);
  EXPECT_DOUBLE_EQ(p.weight_decay, 0.0);  // DeepSpeed's default, not torch's 0.01
  at::Tensor t = torch::zeros({3}, torch::requires_grad());
  auto o = build_optimizer(cfg("AdamW"), {t}, "cfg");
  auto& opts = static_cast<torch::optim::AdamWOptions&>(o->param_groups()[0].options());
  EXPECT_DOUBLE_EQ(opts.weight_decay(), 0.0);
}

TEST(OptimizerFactory, AdamWStepMatchesDeepSpeedFormula) {
  // One step from p=1, g=0.5, lr=0.1, wd=0.1: m=0.05, v=0.00025 (betas .9/.999), bias-corrected
  // m_hat=0.5, v_hat=0.25 -> p = 1 - 0.1*(0.5/(0.5+1e-8) + 0.1*1).
  at::Tensor p = torch::ones({1}, torch::requires_grad());
  auto o = build_optimizer(cfg("AdamW", R"({"lr": 0.1, "weight_decay": 0.1})"), {p}, "cfg");
  p.mutable_grad() = torch::full({1}, 0.5);
  o->step();
  EXPECT_NEAR(p.item<double>(), 1.0 - 0.1 * (0.5 / (0.5 + 1e-8) + 0.1), 1e-6);
}

TEST(OptimizerFactory, RejectsAmsgradAndBadBetas) {
  EXPECT_THROW_WITH(parse_adam_params(cfg("Adam", R"({"amsgrad": true})"), "cfg"), ConfigError,
                    "does not support amsgrad");
  EXPECT_THROW_WITH(parse_adam_params(cfg("Adam", R"({"betas": [0.9]})"), "cfg"), ConfigError,
                    "optimizer.params.betas is [0.9]; expected two numbers");
  EXPECT_THROW_WITH(parse_adam_params(cfg("Adam", R"({"lr": "fast"})"), "cfg"), ConfigError,
                    "optimizer.params.lr is \"fast\"; expected a number");
}

}  // namespace
}  // namespace deepspeed::optim
