// CPU-Adam against LibTorch's own optimizers, an oracle written by someone else: DeepSpeed's
// AdamW mode is torch::optim::AdamW, and its L2 mode is torch::optim::Adam with weight_decay
// (both add eps after the bias-corrected sqrt). Five steps, default path.
#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "ops/cpu_adam/cpu_adam.h"

namespace deepspeed::ops {
namespace {

struct TorchParityCase {
  bool adamw_mode;
  float weight_decay;
};

TEST(CpuAdamTorchParity, MatchesTorchOptimAdamAndAdamWOverFiveSteps) {
  constexpr int64_t n = 1027;
  constexpr float lr = 1e-2f, beta1 = 0.8f, beta2 = 0.99f, eps = 1e-6f;
  for (const TorchParityCase c : {TorchParityCase{true, 0.1f}, TorchParityCase{false, 0.1f},
                                  TorchParityCase{true, 0.0f}}) {
    torch::manual_seed(3);
    auto torch_param = torch::rand({n}) * 2 - 1;
    torch_param.set_requires_grad(true);
    std::vector<float> param(torch_param.data_ptr<float>(), torch_param.data_ptr<float>() + n);
    std::vector<float> exp_avg(n, 0.0f), exp_avg_sq(n, 0.0f);

    std::unique_ptr<torch::optim::Optimizer> opt;
    if (c.adamw_mode) {
      opt = std::make_unique<torch::optim::AdamW>(
          std::vector<at::Tensor>{torch_param},
          torch::optim::AdamWOptions(lr).betas({beta1, beta2}).eps(eps).weight_decay(
              c.weight_decay));
    } else {
      opt = std::make_unique<torch::optim::Adam>(
          std::vector<at::Tensor>{torch_param},
          torch::optim::AdamOptions(lr).betas({beta1, beta2}).eps(eps).weight_decay(
              c.weight_decay));
    }
    for (int64_t t = 1; t <= 5; ++t) {
      auto grad = torch::randn({n}) * 0.1;
      torch_param.mutable_grad() = grad.clone();
      opt->step();

      AdamStep s;
      s.lr = lr;
      s.beta1 = beta1;
      s.beta2 = beta2;
      s.eps = eps;
      s.weight_decay = c.weight_decay;
      s.adamw_mode = c.adamw_mode;
      s.step = t;
      adam_update(s, param.data(), grad.data_ptr<float>(), exp_avg.data(), exp_avg_sq.data(), n);
    }
    const auto expected = torch_param.detach().contiguous();
    const float* expected_data = expected.data_ptr<float>();
    double max_diff = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      max_diff = std::max(max_diff, std::abs(static_cast<double>(param[i]) - expected_data[i]));
    }
    // Parameters are O(1) and five steps move them by O(5 * lr): agreement to a few fp32 ulp.
    EXPECT_LT(max_diff, 1e-6) << (c.adamw_mode ? "AdamW" : "Adam (L2)")
                              << " weight_decay=" << c.weight_decay;
  }
}

}  // namespace
}  // namespace deepspeed::ops
