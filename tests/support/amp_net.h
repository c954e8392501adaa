// AmpNet: the network of tests/e2e/autocast_python_test.py, for torch_autocast tests: two
// Linear layers (lower-precision-safe modules) around a gain vector (not one), weights and
// batches from closed formulas that Python computes to the same bits.
#pragma once

#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>

namespace deepspeed::testing {

struct AmpNetImpl : torch::nn::Module {
  AmpNetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(16, 32));
    gain = register_parameter("gain", torch::ones({32}));
    fc2 = register_module("fc2", torch::nn::Linear(32, 8));
    torch::NoGradGuard no_grad;
    int k = 0;
    for (auto& p : parameters()) {  // gain, fc1.weight, fc1.bias, fc2.weight, fc2.bias
      p.copy_((torch::sin(torch::arange(p.numel(), torch::kFloat) * 0.37 + k) * 0.3)
                  .reshape(p.sizes()));
      ++k;
    }
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& y) {
    return torch::nn::functional::mse_loss(fc2(torch::gelu(fc1(x)) * gain), y);
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::Tensor gain;
};

/// The micro-batch of `step` (4 samples); `offset` shifts the inputs (another rank's data).
inline std::pair<torch::Tensor, torch::Tensor> amp_batch(int64_t step, double offset = 0.0) {
  auto x = torch::sin(torch::arange(4 * 16, torch::kFloat) * 0.11 + (step * 0.7 + offset))
               .reshape({4, 16});
  auto y = torch::cos(torch::arange(4 * 8, torch::kFloat) * 0.23 + static_cast<double>(step))
               .reshape({4, 8}) * 0.5;
  return {x, y};
}

}  // namespace deepspeed::testing
