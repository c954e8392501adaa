// Optimizer selection from ds_config (reference §3.1): DeepSpeed's type and adam_w_mode rules,
// defaults, param groups, offload variants, the ZeRO list, and errors that name the key.
#include "runtime/optim/optimizer_factory.h"

#include <gtest/gtest.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include "deepspeed/optimizers.h"
#include "runtime/optim/optimizer_params.h"
#include "support/expect_throw.h"

namespace deepspeed::optim {
namespace {

OptimizerConfig cfg(const std::string& type, const std::string& params = "{}") {
  return OptimizerConfig{true, type, json::parse(params), false};
}

at::Tensor param(int64_t n = 3) { return torch::zeros({n}, torch::requires_grad()); }

template <typename T>
T* as(const std::unique_ptr<torch::optim::Optimizer>& o) {
  return dynamic_cast<T*>(o.get());
}

TEST(OptimizerFactory, AdamMeansAdamWUnlessAdamWModeFalse) {
  // The 16-row table of DeepSpeed's test_adamw.py without offload (offload selects CPU-Adam,
  // which is the same class here).
  at::Tensor p = param();
  struct Row {
    const char* type;
    const char* params;
    bool torch_class;
    bool adam_w_mode;
  };
  for (const Row& r : {Row{"Adam", "{}", false, true},
                       Row{"Adam", R"({"adam_w_mode": false})", false, false},
                       Row{"AdamW", R"({"adam_w_mode": false})", false, true},
                       Row{"adamw", "{}", false, true},
                       Row{"Adam", R"({"torch_adam": true})", true, true},
                       Row{"Adam", R"({"torch_adam": true, "adam_w_mode": false})", true, false},
                       Row{"AdamW", R"({"torch_adam": true, "adam_w_mode": false})", true, true}}) {
    SCOPED_TRACE(std::string(r.type) + " " + r.params);
    for (bool offload : {false, true}) {
      auto o = build_optimizer(cfg(r.type, r.params), {ParamGroup{{p}}}, "cfg",
                               OptimizerBuildOptions{offload});
      if (r.torch_class) {
        EXPECT_EQ(as<torch::optim::AdamW>(o) != nullptr, r.adam_w_mode);
        EXPECT_EQ(as<torch::optim::Adam>(o) != nullptr, !r.adam_w_mode);
      } else {
        ASSERT_NE(as<Adam>(o), nullptr);
        EXPECT_EQ(as<Adam>(o)->adam_w_mode(), r.adam_w_mode);
      }
    }
  }
}

TEST(OptimizerFactory, DeepSpeedDefaults) {
  auto p = parse_adam_params(cfg("AdamW"), "cfg");
  EXPECT_DOUBLE_EQ(p.lr, 1e-3);
  EXPECT_DOUBLE_EQ(p.beta1, 0.9);
  EXPECT_DOUBLE_EQ(p.beta2, 0.999);
  EXPECT_DOUBLE_EQ(p.eps, 1e-8);
  EXPECT_DOUBLE_EQ(p.weight_decay, 0.0);  // DeepSpeed's default, not torch's 0.01
  auto o = build_optimizer(cfg("AdamW"), {param()}, "cfg");
  auto& g = static_cast<GroupOptions&>(o->param_groups()[0].options());
  EXPECT_DOUBLE_EQ(g.number("weight_decay"), 0.0);
  EXPECT_TRUE(g.flag("bias_correction"));
  // torch_adam keeps torch.optim's own defaults: AdamW decays by 0.01.
  o = build_optimizer(cfg("AdamW", R"({"torch_adam": true})"), {param()}, "cfg");
  EXPECT_DOUBLE_EQ(
      static_cast<torch::optim::AdamWOptions&>(o->param_groups()[0].options()).weight_decay(),
      0.01);
  // Each type's own defaults.
  o = build_optimizer(cfg("Adagrad"), {param()}, "cfg");
  EXPECT_DOUBLE_EQ(o->param_groups()[0].options().get_lr(), 1e-2);
  EXPECT_DOUBLE_EQ(static_cast<GroupOptions&>(o->param_groups()[0].options()).number("eps"), 1e-10);
  o = build_optimizer(cfg("Lamb"), {param()}, "cfg");
  EXPECT_DOUBLE_EQ(static_cast<GroupOptions&>(o->param_groups()[0].options()).number("max_coeff"),
                   10.0);
  EXPECT_DOUBLE_EQ(configured_lr(cfg("SGD"), "cfg"), 1e-3);
  EXPECT_DOUBLE_EQ(configured_lr(cfg("Lion", R"({"lr": 3e-4})"), "cfg"), 3e-4);
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

TEST(OptimizerFactory, EachTypeBuildsItsClass) {
  at::Tensor p = param();
  EXPECT_NE(as<Lamb>(build_optimizer(cfg("LAMB", R"({"eps_inside_sqrt": true})"), {p}, "cfg")),
            nullptr);
  EXPECT_TRUE(as<Lamb>(build_optimizer(cfg("lamb", R"({"eps_inside_sqrt": true})"), {p}, "cfg"))
                  ->eps_inside_sqrt());
  EXPECT_NE(as<Lion>(build_optimizer(cfg("Lion"), {p}, "cfg")), nullptr);
  EXPECT_NE(as<SGD>(build_optimizer(cfg("SGD", R"({"momentum": 0.9, "nesterov": true})"), {p},
                                    "cfg")),
            nullptr);
  // "Adagrad" is DeepSpeed's name first: torch semantics without offload, CPU-Adagrad with it.
  auto a = build_optimizer(cfg("Adagrad"), {ParamGroup{{p}}}, "cfg", OptimizerBuildOptions{false});
  ASSERT_NE(as<Adagrad>(a), nullptr);
  EXPECT_FALSE(as<Adagrad>(a)->cpu_adagrad());
  a = build_optimizer(cfg("adagrad"), {ParamGroup{{p}}}, "cfg", OptimizerBuildOptions{true});
  EXPECT_TRUE(as<Adagrad>(a)->cpu_adagrad());
}

TEST(OptimizerFactory, ParamGroupsOverrideConfigParams) {
  at::Tensor w = param(4), b = param(2), unused = param(1);
  std::vector<ParamGroup> groups = {
      {{w}, json()},  // null: no overrides
      {{}, json{{"lr", 5.0}}},  // empty: dropped
      {{b}, json{{"weight_decay", 0.0}, {"betas", {0.5, 0.6}}}},
  };
  auto o = build_optimizer(cfg("AdamW", R"({"lr": 0.1, "weight_decay": 0.1})"), groups, "cfg",
                           OptimizerBuildOptions{});
  ASSERT_EQ(o->param_groups().size(), 2u);
  auto& g0 = static_cast<GroupOptions&>(o->param_groups()[0].options());
  auto& g1 = static_cast<GroupOptions&>(o->param_groups()[1].options());
  EXPECT_DOUBLE_EQ(g0.get_lr(), 0.1);
  EXPECT_DOUBLE_EQ(g0.number("weight_decay"), 0.1);
  EXPECT_DOUBLE_EQ(g1.get_lr(), 0.1);
  EXPECT_DOUBLE_EQ(g1.number("weight_decay"), 0.0);
  EXPECT_EQ(g1.pair("betas"), std::make_pair(0.5, 0.6));
  // Python's defaults are optimizer.params: a group added later without options gets them.
  o->add_param_group(torch::optim::OptimizerParamGroup({unused}));
  EXPECT_DOUBLE_EQ(o->param_groups()[2].options().get_lr(), 0.1);

  // torch_adam takes per-group options too.
  o = build_optimizer(cfg("AdamW", R"({"torch_adam": true})"), groups, "cfg", {});
  EXPECT_DOUBLE_EQ(
      static_cast<torch::optim::AdamWOptions&>(o->param_groups()[1].options()).weight_decay(),
      0.0);
}

TEST(OptimizerFactory, ParamGroupErrorsNameTheGroup) {
  at::Tensor w = param(), b = param();
  std::vector<ParamGroup> twice = {{{w, b}, json::object()}, {{b}, json::object()}};
  EXPECT_THROW_WITH(build_optimizer(cfg("Adam"), twice, "cfg", {}), ConfigError,
                    "cfg: param group 1: parameter 0 is also parameter 1 of param group 0");
  std::vector<ParamGroup> unknown = {{{w}, json{{"momentum", 0.9}}}};
  EXPECT_THROW_WITH(build_optimizer(cfg("Adam"), unknown, "cfg", {}), ConfigError,
                    "cfg: param group 0: momentum is not a parameter of Adam (known: lr, "
                    "bias_correction, betas, eps, weight_decay, adam_w_mode, torch_adam, amsgrad, "
                    "set_grad_none)");
  std::vector<ParamGroup> wide = {{{w}, json{{"adam_w_mode", false}}}};
  EXPECT_THROW_WITH(build_optimizer(cfg("Adam"), wide, "cfg", {}), ConfigError,
                    "param group 0: adam_w_mode applies to the whole optimizer");
  std::vector<ParamGroup> bad = {{{w}, json{{"lr", -1.0}}}};
  EXPECT_THROW_WITH(build_optimizer(cfg("SGD"), bad, "cfg", {}), ConfigError,
                    "param group 0: lr is -1; expected >= 0");
  std::vector<ParamGroup> empty = {{{}, json::object()}};
  EXPECT_THROW_WITH(build_optimizer(cfg("SGD"), empty, "cfg", {}), UsageError,
                    "has no parameters to train");
}

TEST(OptimizerFactory, TypeErrorsNameTheType) {
  EXPECT_THROW_WITH(check_optimizer_supported(cfg("Foo"), "cfg"), ConfigError,
                    "optimizer.type \"Foo\" is not a supported DeepSpeed optimizer nor a "
                    "torch.optim class (known: Adam, AdamW, Lamb, Lion, Adagrad, SGD");
  EXPECT_THROW_WITH(check_optimizer_supported(cfg("sgd"), "cfg"), ConfigError,
                    "did you mean \"SGD\"?");
  for (const char* t : {"MuAdam", "MuAdamW", "MuSGD", "Adadelta", "RMSprop", "NAdam",
                        "SparseAdam"}) {
    EXPECT_THROW_WITH(check_optimizer_supported(cfg(t), "cfg"), NotSupportedError,
                      std::string("optimizer.type \"") + t + "\"");
    EXPECT_THROW_WITH(check_optimizer_supported(cfg(t), "cfg"), NotSupportedError,
                      "is not supported yet");
  }
}

TEST(OptimizerFactory, ParamErrorsNameTheKey) {
  EXPECT_THROW_WITH(check_optimizer_supported(cfg("Lion", R"({"eps": 1e-8})"), "cfg"),
                    ConfigError,
                    "cfg: optimizer.params.eps is not a parameter of Lion (known: lr, betas, "
                    "weight_decay, set_grad_none, fp32_optimizer_states)");
  EXPECT_THROW_WITH(check_optimizer_supported(cfg("Lamb", R"({"max_grad_norm": 1.0})"), "cfg"),
                    ConfigError, "optimizer.params.max_grad_norm is not supported as an "
                                 "optimizer parameter (DeepSpeed raises ValueError for it too); "
                                 "remove it and set the top-level \"gradient_clipping\"");
  EXPECT_THROW_WITH(check_optimizer_supported(cfg("Adam", R"({"amsgrad": true})"), "cfg"),
                    ConfigError, "does not support amsgrad");
  EXPECT_THROW_WITH(check_optimizer_supported(cfg("Adam", R"({"betas": [0.9]})"), "cfg"),
                    ConfigError, "optimizer.params.betas is [0.9]; expected two numbers");
  EXPECT_THROW_WITH(check_optimizer_supported(cfg("Adam", R"({"lr": "fast"})"), "cfg"),
                    ConfigError, "optimizer.params.lr is \"fast\"; expected a number");
  EXPECT_THROW_WITH(check_optimizer_supported(cfg("Adam", R"({"betas": [0.9, 1.0]})"), "cfg"),
                    ConfigError, "betas are [0.9, 1]; each must be in [0, 1)");
  EXPECT_THROW_WITH(
      check_optimizer_supported(cfg("SGD", R"({"nesterov": true, "momentum": 0})"), "cfg"),
      ConfigError, "optimizer.params.nesterov is true; torch.optim.SGD's Nesterov momentum");
  EXPECT_THROW_WITH(check_optimizer_supported(cfg("SGD", R"({"differentiable": true})"), "cfg"),
                    NotSupportedError, "optimizer.params.differentiable is true");
  EXPECT_THROW_WITH(check_optimizer_supported(cfg("Adam", R"({"bias_correction": false,
                                                             "torch_adam": true})"),
                                              "cfg"),
                    ConfigError, "bias_correction is not a parameter of Adam");
  // torch's implementation switches are accepted; null leaves the default.
  EXPECT_NO_THROW(check_optimizer_supported(cfg("SGD", R"({"lr": null, "foreach": null})"),
                                            "cfg"));
}

TEST(OptimizerFactory, AutoIsRefusedNamingTheFullKeyPath) {
  // Hugging Face fills these from its TrainingArguments; read as the default, an HF AdamW
  // config with "lr": "auto" trained at 1e-3.
  for (auto [params, key, expected] : {
           std::tuple{R"({"lr": "auto"})", "lr", "a number"},
           std::tuple{R"({"betas": "auto"})", "betas", "two numbers [beta1, beta2]"},
           std::tuple{R"({"eps": "auto"})", "eps", "a number"},
           std::tuple{R"({"weight_decay": "auto"})", "weight_decay", "a number"},
           std::tuple{R"({"bias_correction": "auto"})", "bias_correction", "true or false"},
           std::tuple{R"({"torch_adam": "auto"})", "torch_adam", "true or false"}}) {
    EXPECT_THROW_WITH(check_optimizer_supported(cfg("AdamW", params), "cfg"), ConfigError,
                      std::string("cfg: optimizer.params.") + key +
                          " is \"auto\"; \"auto\" is a placeholder that the Hugging Face "
                          "integration fills in before DeepSpeed reads the config, and this "
                          "build reads the config as written: give " + expected + " here");
  }
  EXPECT_THROW_WITH(check_optimizer_supported(cfg("SGD", R"({"foreach": "auto"})"), "cfg"),
                    ConfigError, "optimizer.params.foreach is \"auto\"");
  // In a param group too.
  const auto spec = resolve_optimizer(cfg("AdamW", R"({"lr": 0.1})"), "cfg", std::nullopt);
  EXPECT_THROW_WITH(resolve_group_options(spec, json::parse(R"({"lr": "auto"})"),
                                          "cfg: param group 0: ", std::nullopt),
                    ConfigError, "cfg: param group 0: lr is \"auto\"");
}

TEST(OptimizerFactory, OffloadSelectsTheCpuOptimizersParams) {
  at::Tensor p = param();
  const auto states = cfg("Adam", R"({"fp32_optimizer_states": true})");
  EXPECT_NO_THROW(check_optimizer_supported(states, "cfg"));  // either class at config time
  EXPECT_NO_THROW(build_optimizer(states, {ParamGroup{{p}}}, "cfg", OptimizerBuildOptions{true}));
  EXPECT_THROW_WITH(build_optimizer(states, {ParamGroup{{p}}}, "cfg", OptimizerBuildOptions{false}),
                    ConfigError,
                    "fp32_optimizer_states is not a parameter of Adam without "
                    "zero_optimization.offload_optimizer");
  EXPECT_THROW_WITH(
      build_optimizer(cfg("Adam", R"({"fp32_optimizer_states": false})"), {ParamGroup{{p}}}, "cfg",
                      OptimizerBuildOptions{true}),
      NotSupportedError, "fp32_optimizer_states is false");
  EXPECT_THROW_WITH(build_optimizer(cfg("Adagrad", R"({"lr_decay": 0.1})"), {ParamGroup{{p}}},
                                    "cfg", OptimizerBuildOptions{true}),
                    ConfigError, "lr_decay is not a parameter of Adagrad with "
                                 "zero_optimization.offload_optimizer");
}

TEST(OptimizerFactory, ZeroSupportedOptimizersFollowDeepSpeedsList) {
  at::Tensor p = param();
  for (const char* t : {"Adam", "AdamW", "Adagrad", "Lion"}) {
    EXPECT_TRUE(is_zero_supported_optimizer(*build_optimizer(cfg(t), {p}, "cfg"))) << t;
  }
  EXPECT_TRUE(is_zero_supported_optimizer(
      *build_optimizer(cfg("Adam", R"({"torch_adam": true})"), {p}, "cfg")));
  EXPECT_FALSE(is_zero_supported_optimizer(*build_optimizer(cfg("Lamb"), {p}, "cfg")));
  EXPECT_FALSE(is_zero_supported_optimizer(*build_optimizer(cfg("SGD"), {p}, "cfg")));
  EXPECT_TRUE(is_zero_supported_optimizer(torch::optim::Adagrad({p})));
  EXPECT_FALSE(is_zero_supported_optimizer(torch::optim::SGD({p}, torch::optim::SGDOptions(1))));
}

}  // namespace
}  // namespace deepspeed::optim
