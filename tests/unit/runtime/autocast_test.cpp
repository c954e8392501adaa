// Autocast in C++: AutocastScope against LibTorch's autocast state, the engine's torch_autocast
// (forward dtype, the caller's own autocast, the lower-precision-safe parameters, the dtype
// checks), and torch's GradScaler schedule for fp16 autocast.
#include "deepspeed/autocast.h"

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <torch/version.h>

#include "deepspeed/checkpointing.h"
#include "deepspeed/deepspeed.h"
#include "runtime/precision/autocast_params.h"
#include "runtime/precision/grad_scaler.h"
#include "support/amp_net.h"
#include "support/expect_throw.h"

namespace deepspeed {
namespace {

constexpr auto kCpu = c10::DeviceType::CPU;

at::Tensor matmul_of_floats() {
  return torch::mm(torch::ones({2, 3}), torch::ones({3, 2}));
}

TEST(AutocastScope, CastsInsideAndRestoresOnExit) {
  ASSERT_FALSE(autocast_enabled(kCpu));
  const auto before = autocast_dtype(kCpu);
  {
    AutocastScope scope(kCpu, at::kBFloat16);
    EXPECT_TRUE(autocast_enabled(kCpu));
    EXPECT_EQ(matmul_of_floats().scalar_type(), at::kBFloat16);
    {
      AutocastScope off(kCpu, std::nullopt, /*enabled=*/false);  // a nested opt-out
      EXPECT_FALSE(autocast_enabled(kCpu));
      EXPECT_EQ(matmul_of_floats().scalar_type(), at::kFloat);
    }
    EXPECT_TRUE(autocast_enabled(kCpu));
    EXPECT_EQ(matmul_of_floats().scalar_type(), at::kBFloat16);
  }
  EXPECT_FALSE(autocast_enabled(kCpu));
  EXPECT_EQ(autocast_dtype(kCpu), before);
  EXPECT_EQ(matmul_of_floats().scalar_type(), at::kFloat);
}

TEST(AutocastScope, ExitsWhenTheBodyThrows) {
  try {
    AutocastScope scope(kCpu, at::kBFloat16);
    throw std::runtime_error("forward failed");
  } catch (const std::runtime_error&) {
  }
  EXPECT_FALSE(autocast_enabled(kCpu));
}

TEST(AutocastScope, RefusesWhatLibTorchCannotRun) {
  EXPECT_EQ(default_autocast_dtype(kCpu), at::kBFloat16);
  EXPECT_EQ(default_autocast_dtype(c10::DeviceType::CUDA), at::kHalf);
  EXPECT_THROW_WITH(AutocastScope(kCpu, at::kFloat), UsageError, "not a lower precision");
  EXPECT_THROW_WITH(AutocastScope(c10::DeviceType::Meta), UsageError, "not supported");
  if (TORCH_VERSION_MAJOR < 2) {
    EXPECT_FALSE(autocast_supported(kCpu, at::kHalf));
    EXPECT_THROW_WITH(AutocastScope(kCpu, at::kHalf), UsageError, "BFloat16 only");
  } else {
    EXPECT_TRUE(autocast_supported(kCpu, at::kHalf));
  }
  EXPECT_FALSE(autocast_enabled(kCpu));  // a refused scope changed nothing
}

TEST(AutocastParams, ModuleClassNames) {
  const std::string linear = torch::nn::Linear(2, 2)->name();
  const std::string conv = torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 1, 1))->name();
  for (const char* n : {"torch.nn.Linear", "torch.nn.modules.linear.Linear", "torch::nn::Linear",
                        "torch::nn::LinearImpl"}) {
    EXPECT_TRUE(runtime::names_module_class(n, linear)) << n << " vs " << linear;
  }
  EXPECT_TRUE(runtime::names_module_class("torch.nn.modules.conv.Conv2d", conv));
  EXPECT_FALSE(runtime::names_module_class("torch.nn.Conv1d", conv));
  const std::string bilinear = torch::nn::Bilinear(2, 2, 2)->name();
  EXPECT_FALSE(runtime::names_module_class("torch.nn.Linear", bilinear));
  EXPECT_FALSE(runtime::names_module_class("Linear", linear));  // a class needs its package
  EXPECT_TRUE(runtime::names_module_class("my.models.Block", "my::models::BlockImpl"));
  EXPECT_TRUE(runtime::names_module_class("my::models::Block", "my::models::Block"));
  EXPECT_FALSE(runtime::names_module_class("my.models.Block", "other::Block"));
}

DeepSpeedConfig autocast_config(const std::string& section) {
  return DeepSpeedConfig::from_string(
      R"({"train_batch_size": 1, "torch_autocast": )" + section + "}", 1);
}

TEST(AutocastParams, DefaultListMarksTheLinearLayersOwnParameters) {
  testing::AmpNetImpl model;
  std::vector<std::string> unmatched;
  auto marked = runtime::autocast_comm_dtypes(model, autocast_config(R"({"enabled": true})"),
                                              at::kBFloat16, &unmatched);
  EXPECT_TRUE(unmatched.empty());  // the default list's Conv entries are not reported
  ASSERT_EQ(marked.size(), 4u);     // fc1 and fc2, weight and bias; not the gain
  for (auto* layer : {&model.fc1, &model.fc2}) {
    for (const auto& p : (*layer)->parameters()) {
      EXPECT_EQ(runtime::comm_dtype_of(marked, p, at::kFloat), at::kBFloat16);
    }
  }
  EXPECT_EQ(runtime::comm_dtype_of(marked, model.gain, at::kFloat), at::kFloat);

  auto none = runtime::autocast_comm_dtypes(
      model, autocast_config(R"({"lower_precision_safe_modules": []})"), at::kBFloat16, nullptr);
  EXPECT_TRUE(none.empty());  // an explicit empty list marks nothing, as in DeepSpeed
  auto listed = runtime::autocast_comm_dtypes(
      model, autocast_config(R"({"lower_precision_safe_modules": ["torch.nn.Linear", "my.Gone"]})"),
      at::kHalf, &unmatched);
  EXPECT_EQ(listed.size(), 4u);
  EXPECT_EQ(unmatched, std::vector<std::string>{"my.Gone"});
}

TEST(AutocastParams, DtypeForTheDevice) {
  EXPECT_EQ(runtime::torch_autocast_dtype(autocast_config("{}"), kCpu), at::kBFloat16);
  EXPECT_EQ(runtime::torch_autocast_dtype(autocast_config("{}"), c10::DeviceType::CUDA), at::kHalf);
  EXPECT_EQ(runtime::torch_autocast_dtype(autocast_config(R"({"dtype": "fp16"})"),
                                          c10::DeviceType::CUDA),
            at::kHalf);
  if (TORCH_VERSION_MAJOR < 2) {
    EXPECT_THROW_WITH(
        runtime::torch_autocast_dtype(autocast_config(R"({"dtype": "float16"})"), kCpu),
        ConfigError, "torch_autocast.dtype is Half");
  }
}

json engine_config(bool autocast) {
  json cfg = {{"train_batch_size", 4}, {"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.1}}}}}};
  if (autocast) cfg["torch_autocast"] = {{"enabled", true}, {"dtype", "bf16"}};
  return cfg;
}

TEST(AutocastEngine, ForwardRunsUnderTheConfiguredAutocastOnly) {
  auto linear = torch::nn::Linear(3, 2);
  auto [engine, opt, sched] = initialize(linear.ptr(), engine_config(true));
  EXPECT_EQ(engine->torch_autocast_dtype(), at::kBFloat16);
  EXPECT_EQ(engine->forward(torch::ones({4, 3})).scalar_type(), at::kBFloat16);
  EXPECT_FALSE(autocast_enabled(kCpu));
  EXPECT_EQ(linear->weight.scalar_type(), at::kFloat);  // the weights stay fp32
  {
    // The caller's own autocast (another dtype) gives way to the config's.
    AutocastScope outside(kCpu, at::kBFloat16);
    EXPECT_EQ(engine->forward(torch::ones({4, 3})).scalar_type(), at::kBFloat16);
  }
}

TEST(AutocastEngine, CallersAutocastIsTurnedOffWhenTheConfigHasNone) {
  auto linear = torch::nn::Linear(3, 2);
  auto [engine, opt, sched] = initialize(linear.ptr(), engine_config(false));
  EXPECT_EQ(engine->torch_autocast_dtype(), std::nullopt);
  AutocastScope outside(kCpu, at::kBFloat16);
  EXPECT_EQ(engine->forward(torch::ones({4, 3})).scalar_type(), at::kFloat);
  EXPECT_TRUE(autocast_enabled(kCpu));  // and on again after the engine's forward
}

TEST(AutocastEngine, Fp16OnTheCpuNeedsLibTorch2) {
  if (TORCH_VERSION_MAJOR >= 2) GTEST_SKIP() << "LibTorch 2.x runs fp16 autocast on the CPU";
  json cfg = engine_config(true);
  cfg["torch_autocast"]["dtype"] = "fp16";
  EXPECT_THROW_WITH(initialize(torch::nn::Linear(3, 2).ptr(), cfg), ConfigError,
                    "torch_autocast.dtype is Half");
}

TEST(AutocastCheckpointing, RecomputesUnderTheForwardsAutocast) {
  // Backward runs outside autocast: the recomputation must re-enter the forward's, or the
  // gradients would be those of an fp32 forward.
  auto grads = [](bool checkpointed) {
    testing::AmpNetImpl model;
    auto [x, y] = testing::amp_batch(0);
    at::Tensor loss;
    {
      AutocastScope scope(kCpu, at::kBFloat16);
      auto hidden = [&](const at::Tensor& in) { return torch::gelu(model.fc1(in)) * model.gain; };
      at::Tensor h = checkpointed ? checkpointing::checkpoint(hidden, x) : hidden(x);
      loss = torch::nn::functional::mse_loss(model.fc2(h), y);
    }
    loss.backward();
    return std::vector<at::Tensor>{model.fc1->weight.grad(), model.gain.grad()};
  };
  const auto plain = grads(false);
  const auto recomputed = grads(true);
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(torch::equal(plain[i], recomputed[i])) << i;
}

TEST(TorchGradScaler, FollowsGradScalersSchedule) {
  runtime::GradScalerOptions o;
  o.growth_interval = 3;
  runtime::TorchGradScaler scaler(o);
  EXPECT_EQ(scaler.loss_scale(), 65536.0);
  // torch 2.11's GradScaler kernel, torch._amp_update_scale_(scale, tracker, found_inf, 2.0,
  // 0.5, 3) from 65536, over these overflow flags leaves these scales:
  const std::vector<bool> overflow = {false, false, false, true, false, false, false, false,
                                      false, false};
  const std::vector<double> want = {65536, 65536, 131072, 65536, 65536, 65536, 131072,
                                    131072, 131072, 262144};
  for (size_t i = 0; i < overflow.size(); ++i) {
    scaler.update_scale(overflow[i]);
    EXPECT_EQ(scaler.loss_scale(), want[i]) << "after update " << i;
  }
  EXPECT_EQ(scaler.cur_iter(), 10);
  EXPECT_TRUE(scaler.dynamic());
}

}  // namespace
}  // namespace deepspeed
