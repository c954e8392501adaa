// torch_autocast against PyTorch's own AMP (Debian's python3-torch: the same LibTorch build):
// the network of autocast_python_test.py, trained by the engine with torch_autocast bf16 under
// ZeRO stages 0-3 on one rank, gives Python's losses and weights. Under stage 3 the Linear
// layers' shards are gathered in bf16, so their weights read back as Python's rounded to bf16.
// Where LibTorch 1.x sums bf16 products in bf16 (no oneDNN: AVX2-only CPUs, or the avx2 variant
// of this test), the engine's fp32-accumulating products replace ATen's and Python's results
// are only approached (docs/precision.md).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "deepspeed/deepspeed.h"
#include "deepspeed/zero3.h"
#include "runtime/precision/cpu_bf16_matmul.h"
#include "support/amp_net.h"
#include "support/run_command.h"

namespace deepspeed {
namespace {

using testing::AmpNetImpl;
using testing::run_command;

constexpr int kSteps = 4;

struct Training {
  std::vector<double> losses;
  std::map<std::string, at::Tensor> params;
};

Training python_amp() {
  auto r = run_command(std::string(DS_PYTHON) + " " + DS_AUTOCAST_PY + " --steps " +
                       std::to_string(kSteps));
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  Training run;
  if (r.exit_code != 0) return run;
  const auto j = nlohmann::json::parse(r.out);
  run.losses = j.at("losses").get<std::vector<double>>();
  for (const auto& [name, values] : j.at("params").items()) {
    run.params[name] = torch::tensor(values.get<std::vector<double>>()).to(torch::kFloat);
  }
  return run;
}

Training engine_amp(int stage, bool autocast) {
  auto model = std::make_shared<AmpNetImpl>();
  json cfg = {{"train_batch_size", 4},
              {"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.05}}}}},
              {"zero_allow_untested_optimizer", true},
              {"zero_optimization", {{"stage", stage}}}};
  if (autocast) cfg["torch_autocast"] = {{"enabled", true}, {"dtype", "bfloat16"}};
  auto [engine, opt, sched] = initialize(model, cfg);
  Training run;
  for (int step = 0; step < kSteps; ++step) {
    auto [x, y] = testing::amp_batch(step);
    at::Tensor loss = engine->forward(x, y);
    engine->backward(loss);
    engine->step();
    run.losses.push_back(loss.item<double>());
  }
  zero::GatheredParameters gathered(*model);
  for (const auto& p : model->named_parameters()) {
    run.params[p.key()] = p.value().detach().reshape({-1}).clone();
  }
  return run;
}

bool is_linear(const std::string& name) { return name.rfind("fc", 0) == 0; }

TEST(AutocastPython, EveryStageTrainsAsPyTorchAmp) {
  static const auto probe = run_command(std::string(DS_PYTHON) + " -c 'import torch'");
  if (probe.exit_code != 0) GTEST_SKIP() << "SKIPPED: no python3-torch: " << probe.err;
  const Training python = python_amp();
  ASSERT_EQ(python.losses.size(), static_cast<size_t>(kSteps));
  for (int stage : {0, 1, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const Training ours = engine_amp(stage, /*autocast=*/true);
    // The same kernels in the same order: equal, up to the last bit of the fp32 loss. With our
    // products in place of ATen's bf16-summing ones, within bf16's precision of them.
    const bool own_products = runtime::Fp32AccumulatingBf16Matmul::active();
    const double loss_tol = own_products ? 2e-2 : 1e-7;
    const double param_tol = own_products ? 2e-3 : 1e-7;
    for (int s = 0; s < kSteps; ++s) {
      EXPECT_NEAR(ours.losses[s], python.losses[s], loss_tol * std::abs(python.losses[s])) << s;
    }
    for (const auto& [name, expected] : python.params) {
      at::Tensor want = stage == 3 && is_linear(name) ? expected.to(at::kBFloat16).to(at::kFloat)
                                                      : expected;
      EXPECT_TRUE(torch::allclose(ours.params.at(name), want, 0, param_tol))
          << name << ": max diff " << (ours.params.at(name) - want).abs().max().item<double>();
    }
  }
  // Without torch_autocast the same network trains in fp32: the losses part at bf16's precision.
  const Training fp32 = engine_amp(0, /*autocast=*/false);
  double largest = 0;
  for (int s = 0; s < kSteps; ++s) {
    largest = std::max(largest, std::abs(fp32.losses[s] - python.losses[s]));
  }
  EXPECT_GT(largest, 1e-5);
}

}  // namespace
}  // namespace deepspeed
