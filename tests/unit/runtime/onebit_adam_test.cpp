// OneBitAdam on one process: ds_config's type, parameters and defaults, DeepSpeed's
// compatibility rules, warm-up equal to Adam without bias correction, and the frozen variance.
#include "deepspeed/onebit.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deepspeed/config.h"
#include "runtime/optim/onebit/onebit_config.h"
#include "runtime/optim/optimizer_factory.h"
#include "support/expect_throw.h"

namespace deepspeed {
namespace {

// Warm-up is the same algorithm as Adam/LAMB without bias correction; the two differ by float
// rounding only (CPU-Adam's kernel and FusedLamb's tensor ops order their operations
// differently): a few ulps of parameters of magnitude ~1, far below one update (lr 0.01).
constexpr double kWarmupTolerance = 1e-5;

OptimizerConfig cfg(const std::string& type, const std::string& params = "{}") {
  return OptimizerConfig{true, type, json::parse(params), false};
}

TEST(OneBitAdamConfig, TypeDefaultsAndParameters) {
  auto p = torch::zeros({5}, torch::requires_grad());
  auto opt = optim::build_optimizer(cfg("onebitadam"), {p}, "cfg");
  auto* ob = dynamic_cast<onebit::OneBitAdam*>(opt.get());
  ASSERT_NE(ob, nullptr);
  EXPECT_EQ(ob->type_name(), "OnebitAdam");
  // DeepSpeed's defaults.
  EXPECT_EQ(ob->settings().freeze_step, 100000);
  EXPECT_EQ(ob->settings().comm_backend_name, "nccl");
  EXPECT_FALSE(ob->settings().cuda_aware);
  auto& g = ob->group_options(0);
  EXPECT_EQ(g.number("lr"), 1e-3);
  EXPECT_EQ(g.pair("betas"), std::make_pair(0.9, 0.999));
  EXPECT_EQ(g.number("eps"), 1e-8);
  EXPECT_EQ(g.number("weight_decay"), 0.0);
  EXPECT_TRUE(g.flag("bias_correction"));

  auto opt2 = optim::build_optimizer(
      cfg("OneBitAdam", R"({"lr": 0.1, "freeze_step": 7, "cuda_aware": true,
                            "comm_backend_name": "mpi", "weight_decay": 0.5})"),
      {p}, "cfg");
  auto* ob2 = dynamic_cast<onebit::OneBitAdam*>(opt2.get());
  EXPECT_EQ(ob2->settings().freeze_step, 7);
  EXPECT_EQ(ob2->settings().comm_backend_name, "mpi");
  EXPECT_TRUE(ob2->settings().cuda_aware);
  EXPECT_EQ(ob2->group_options(0).number("weight_decay"), 0.5);
}

TEST(OneBitAdamConfig, BadParametersAreRefusedByKey) {
  using optim::check_optimizer_supported;
  EXPECT_THROW_WITH(check_optimizer_supported(cfg("OneBitAdam", R"({"comm_backend_name": "gloo"})"), "cfg"),
                    ConfigError, "cfg: optimizer.params.comm_backend_name is \"gloo\"; expected \"nccl\"");
  EXPECT_THROW_WITH(check_optimizer_supported(cfg("OneBitAdam", R"({"freeze_step": -1})"), "cfg"),
                    ConfigError, "optimizer.params.freeze_step is -1; expected an integer >= 0");
  EXPECT_THROW_WITH(check_optimizer_supported(cfg("OneBitAdam", R"({"amsgrad": true})"), "cfg"),
                    ConfigError, "1-bit Adam does not support the AMSGrad variant");
  EXPECT_THROW_WITH(check_optimizer_supported(cfg("OneBitAdam", R"({"var_freeze_step": 3})"), "cfg"),
                    ConfigError, "optimizer.params.var_freeze_step is not a parameter of OneBitAdam");
}

TEST(OneBitAdamConfig, ZeroAndBf16AreRefusedFp16Runs) {
  auto check = [](const std::string& text) {
    auto c = DeepSpeedConfig::from_string(text, 1);
    c.check_supported();
  };
  check(R"({"train_batch_size": 8, "optimizer": {"type": "OneBitAdam"}})");
  EXPECT_THROW_WITH(check(R"({"train_batch_size": 8, "optimizer": {"type": "OneBitAdam"},
                             "zero_optimization": {"stage": 1}})"),
                    ConfigError, "optimizer.type \"OneBitAdam\" is not compatible with ZeRO "
                                 "(zero_optimization.stage is 1)");
  EXPECT_THROW_WITH(check(R"({"train_batch_size": 8, "optimizer": {"type": "OneBitAdam"},
                             "bf16": {"enabled": true}})"),
                    NotSupportedError, "does not run with bf16");
  for (const char* type : {"OneBitAdam", "ZeroOneAdam", "OneBitLamb"}) {
    // DeepSpeed's tutorials run all three under fp16.
    check(std::string(R"({"train_batch_size": 8, "fp16": {"enabled": true}, "optimizer": {"type": ")") +
          type + "\"}}");
    EXPECT_THROW_WITH(check(std::string(R"({"train_batch_size": 8, "bf16": {"enabled": true},
                                         "optimizer": {"type": ")") + type + "\"}}"),
                      NotSupportedError, "set bf16.enabled to false");
    EXPECT_THROW_WITH(check(std::string(R"({"train_batch_size": 8, "fp16": {"enabled": true},
                                         "zero_optimization": {"stage": 2},
                                         "optimizer": {"type": ")") + type + "\"}}"),
                      ConfigError, "is not compatible with ZeRO (zero_optimization.stage is 2)");
  }
}

// exp_avg_mask: a param-group key of the 1-bit optimizers only, one parameter's numel.
TEST(OneBitAdamConfig, ExpAvgMaskIsCheckedWhenTheOptimizerIsBuilt) {
  auto w = torch::zeros({4, 3}, torch::requires_grad());
  auto b = torch::zeros({3}, torch::requires_grad());
  ParamGroup masked{{w}, json::object(), torch::ones({4, 3})};
  auto opt = optim::build_optimizer(cfg("OneBitAdam"), {ParamGroup{{b}}, masked}, "cfg",
                                    optim::OptimizerBuildOptions{});
  auto* cc = dynamic_cast<onebit::CompressedCommunication*>(opt.get());
  ASSERT_NE(cc, nullptr);
  EXPECT_FALSE(cc->exp_avg_mask(0).defined());
  EXPECT_TRUE(cc->exp_avg_mask(1).equal(torch::ones({4, 3})));
  // A flattened mask (DeepSpeed's BERT example flattens it for FP16_Optimizer) works too.
  ParamGroup flat{{w}, json::object(), torch::ones({12})};
  EXPECT_NO_THROW(optim::build_optimizer(cfg("ZeroOneAdam"), {flat}, "cfg",
                                         optim::OptimizerBuildOptions{}));
  ParamGroup both{{w, b}, json::object(), torch::ones({4, 3})};
  EXPECT_THROW_WITH(optim::build_optimizer(cfg("OneBitLamb"), {both}, "cfg",
                                           optim::OptimizerBuildOptions{}),
                    ConfigError, "param group 0: exp_avg_mask has 12 elements (shape [4, 3]) "
                                 "but parameter 1 has 3");
  EXPECT_THROW_WITH(optim::build_optimizer(cfg("Adam"), {masked}, "cfg",
                                           optim::OptimizerBuildOptions{}),
                    ConfigError, "exp_avg_mask is a param-group key of the 1-bit optimizers");
}

// Warm-up: Adam without bias correction and with decoupled weight decay; after freeze_step the
// variance stops changing (one process: the compressed all-reduce is the identity).
TEST(OneBitAdam, WarmupEqualsAdamThenTheVarianceFreezes) {
  torch::manual_seed(5);
  auto a = torch::randn({37}).requires_grad_();
  auto b = a.detach().clone().requires_grad_();
  optim::AdamOptions ao;
  ao.lr = 0.01;
  ao.weight_decay = 0.1;
  ao.bias_correction = false;
  optim::Adam adam({a}, ao, /*adam_w_mode=*/true);
  optim::GroupOptions go;
  go.set("lr", 0.01).set("bias_correction", true).set("betas", std::make_pair(0.9, 0.999));
  go.set("eps", 1e-8).set("weight_decay", 0.1);
  onebit::OneBitSettings settings;
  settings.freeze_step = 4;
  onebit::OneBitAdam onebit({torch::optim::OptimizerParamGroup({b})}, go, settings);
  for (int s = 0; s < 4; ++s) {
    auto g = torch::randn({37});
    a.mutable_grad() = g.clone();
    b.mutable_grad() = g.clone();
    adam.step();
    onebit.step();
    EXPECT_LE((a - b).abs().max().item<double>(), kWarmupTolerance) << "step " << s;
  }
  EXPECT_FALSE(onebit.backward_allreduce_enabled());
  auto v = onebit.find_state(b)->tensor("exp_avg_sq").clone();
  auto m = onebit.find_state(b)->tensor("exp_avg").clone();
  auto g = torch::randn({37});
  b.mutable_grad() = g.clone();
  auto before = b.detach().clone();
  onebit.step();
  EXPECT_TRUE(torch::equal(onebit.find_state(b)->tensor("exp_avg_sq"), v));
  auto m_new = m * 0.9 + g * 0.1;
  EXPECT_TRUE(torch::allclose(onebit.find_state(b)->tensor("exp_avg"), m_new));
  auto want = before - 0.01 * (m_new / (v.sqrt() + 1e-8) + 0.1 * before);
  EXPECT_TRUE(torch::allclose(b.detach(), want, 1e-6, 1e-7));
  // Error buffers have DeepSpeed's sizes for a world of one: padded to 8, one chunk.
  EXPECT_EQ(onebit.find_state(b)->tensor("worker_error").numel(), 40);
  EXPECT_EQ(onebit.find_state(b)->tensor("server_error").numel(), 40);
}

TEST(ZeroOneAdamConfig, TypeDefaultsAndParameters) {
  auto p = torch::zeros({5}, torch::requires_grad());
  auto opt = optim::build_optimizer(cfg("ZeroOneAdam"), {p}, "cfg");
  auto* z = dynamic_cast<onebit::ZeroOneAdam*>(opt.get());
  ASSERT_NE(z, nullptr);
  EXPECT_EQ(z->type_name(), "ZeroOneAdam");
  // DeepSpeed's defaults.
  EXPECT_EQ(z->settings().var_freeze_step, 100000);
  EXPECT_EQ(z->settings().var_update_scaler, 16);
  EXPECT_EQ(z->settings().local_step_scaler, 32678);
  EXPECT_EQ(z->settings().local_step_clipper, 16);
  EXPECT_EQ(z->settings().comm_backend_name, "nccl");
  auto opt2 = optim::build_optimizer(
      cfg("zerooneadam", R"({"var_freeze_step": 9, "var_update_scaler": 3,
                             "local_step_scaler": 5, "local_step_clipper": 4})"), {p}, "cfg");
  auto* z2 = dynamic_cast<onebit::ZeroOneAdam*>(opt2.get());
  EXPECT_EQ(z2->settings().var_freeze_step, 9);
  EXPECT_EQ(z2->settings().var_update_scaler, 3);
  EXPECT_EQ(z2->settings().local_step_scaler, 5);
  EXPECT_EQ(z2->settings().local_step_clipper, 4);
  EXPECT_THROW_WITH(optim::check_optimizer_supported(cfg("ZeroOneAdam", R"({"freeze_step": 3})"), "cfg"),
                    ConfigError, "optimizer.params.freeze_step is not a parameter of ZeroOneAdam");
  EXPECT_THROW_WITH(optim::check_optimizer_supported(cfg("ZeroOneAdam", R"({"local_step_clipper": 0})"), "cfg"),
                    ConfigError, "local_step_clipper is 0");
  EXPECT_THROW_WITH(DeepSpeedConfig::from_string(
                        R"({"train_batch_size": 8, "optimizer": {"type": "ZeroOneAdam"},
                            "zero_optimization": {"stage": 2}})", 1).check_supported(),
                    ConfigError, "is not compatible with ZeRO");
}

// One process: variance-update steps at 1, 2, 4, 6, 8 (the interval doubles after every two
// updates, up to var_freeze_step 8); before the doubling, every step is Adam without bias
// correction; after the freeze the variance stays.
TEST(ZeroOneAdam, VarianceUpdateScheduleAndWarmupEqualsAdam) {
  torch::manual_seed(9);
  auto a = torch::randn({21}).requires_grad_();
  auto b = a.detach().clone().requires_grad_();
  optim::AdamOptions ao;
  ao.lr = 0.01;
  ao.bias_correction = false;
  optim::Adam adam({a}, ao, true);
  auto opt = optim::build_optimizer(
      cfg("ZeroOneAdam", R"({"lr": 0.01, "var_freeze_step": 8, "var_update_scaler": 2})"), {b},
      "cfg");
  auto* z = dynamic_cast<onebit::ZeroOneAdam*>(opt.get());
  std::vector<bool> allreduce;
  torch::Tensor v_before;
  for (int s = 1; s <= 12; ++s) {
    allreduce.push_back(z->backward_allreduce_enabled());
    auto g = torch::randn({21});
    a.mutable_grad() = g.clone();
    b.mutable_grad() = g.clone();
    if (s <= 2) adam.step();
    if (s == 10) v_before = z->find_state(b)->tensor("exp_avg_sq").clone();
    z->step();
    if (s <= 2) EXPECT_LE((a - b).abs().max().item<double>(), kWarmupTolerance) << "step " << s;
  }
  EXPECT_TRUE(torch::equal(z->find_state(b)->tensor("exp_avg_sq"), v_before));
  const std::vector<bool> want = {true, true,  false, true,  false, true,
                                  false, true, false, false, false, false};
  EXPECT_EQ(allreduce, want);
}

TEST(OneBitLambConfig, TypeDefaultsAndParameters) {
  auto p = torch::zeros({5}, torch::requires_grad());
  auto opt = optim::build_optimizer(cfg("OneBitLamb"), {p}, "cfg");
  auto* l = dynamic_cast<onebit::OneBitLamb*>(opt.get());
  ASSERT_NE(l, nullptr);
  EXPECT_EQ(l->type_name(), "OnebitLamb");
  // DeepSpeed's defaults.
  EXPECT_EQ(l->settings().freeze_step, 100000);
  EXPECT_EQ(l->settings().coeff_beta, 0.9);
  EXPECT_EQ(l->settings().factor_max, 4.0);
  EXPECT_EQ(l->settings().factor_min, 0.5);
  EXPECT_EQ(l->settings().factor_threshold, 0.1);
  EXPECT_EQ(l->group_options(0).number("max_coeff"), 10.0);
  EXPECT_EQ(l->group_options(0).number("min_coeff"), 0.01);
  auto opt2 = optim::build_optimizer(
      cfg("onebitlamb", R"({"freeze_step": 3, "coeff_beta": 0.5, "factor_max": 2.0,
                            "factor_min": 0.25, "factor_threshold": 0.2, "max_coeff": 3.0})"),
      {p}, "cfg");
  auto* l2 = dynamic_cast<onebit::OneBitLamb*>(opt2.get());
  EXPECT_EQ(l2->settings().freeze_step, 3);
  EXPECT_EQ(l2->settings().coeff_beta, 0.5);
  EXPECT_EQ(l2->settings().factor_max, 2.0);
  EXPECT_EQ(l2->settings().factor_min, 0.25);
  EXPECT_EQ(l2->settings().factor_threshold, 0.2);
  EXPECT_EQ(l2->group_options(0).number("max_coeff"), 3.0);
  EXPECT_THROW_WITH(optim::check_optimizer_supported(
                        cfg("OneBitLamb", R"({"factor_min": 5.0})"), "cfg"),
                    ConfigError, "factor_min (5) > factor_max (4)");
  EXPECT_THROW_WITH(optim::check_optimizer_supported(cfg("OneBitLamb", R"({"amsgrad": true})"), "cfg"),
                    ConfigError, "1-bit Lamb does not support the AMSGrad variant");
}

// Warm-up is LAMB without bias correction (FusedLamb with bias_correction false); then the
// trust ratio is the frozen running average times a factor bounded by factor_threshold.
TEST(OneBitLamb, WarmupEqualsLambThenFrozenCoefficients) {
  torch::manual_seed(11);
  auto a = torch::randn({4, 6}).requires_grad_();
  auto b = a.detach().clone().requires_grad_();
  optim::LambOptions lo;
  lo.lr = 0.01;
  lo.weight_decay = 0.01;
  lo.bias_correction = false;
  optim::Lamb lamb({a}, lo);
  auto opt = optim::build_optimizer(
      cfg("OneBitLamb", R"({"lr": 0.01, "weight_decay": 0.01, "freeze_step": 3})"), {b}, "cfg");
  auto* l = dynamic_cast<onebit::OneBitLamb*>(opt.get());
  double running = 0;
  for (int s = 1; s <= 3; ++s) {
    auto g = torch::randn({4, 6});
    a.mutable_grad() = g.clone();
    b.mutable_grad() = g.clone();
    lamb.step();
    l->step();
    EXPECT_LE((a - b).abs().max().item<double>(), kWarmupTolerance) << "step " << s;
    ASSERT_EQ(l->lamb_coeffs().size(), 1u);
    EXPECT_NEAR(l->lamb_coeffs()[0], lamb.lamb_coeffs()[0], 1e-5);
    running = 0.9 * running + 0.1 * l->lamb_coeffs()[0];
  }
  EXPECT_FALSE(l->backward_allreduce_enabled());
  auto& st = *l->find_state(b);
  EXPECT_TRUE(torch::equal(st.tensor("exp_avg_sq_fresh"), st.tensor("exp_avg_sq")));
  EXPECT_NEAR(st.tensor("lamb_coeff_freeze").item<double>(), running, 1e-5);
  auto v = st.tensor("exp_avg_sq").clone();
  for (int s = 4; s <= 6; ++s) {
    b.mutable_grad() = torch::randn({4, 6});
    const double last = st.tensor("last_factor").item<double>();
    l->step();
    const double factor = st.tensor("last_factor").item<double>();
    EXPECT_LE(factor, last * 1.1 + 1e-6);
    EXPECT_GE(factor, last * 0.9 - 1e-6);
    EXPECT_NEAR(l->lamb_coeffs()[0], running * factor, 1e-5);
    EXPECT_TRUE(torch::equal(st.tensor("exp_avg_sq"), v)) << "the variance is frozen";
  }
  EXPECT_EQ(st.tensor("scaling_coeff").item<float>(), 1.0f);  // one parameter: its own scale
  EXPECT_EQ(st.tensor("worker_error").numel(), 24);           // 24 elements, padded to 8s
}

}  // namespace
}  // namespace deepspeed
