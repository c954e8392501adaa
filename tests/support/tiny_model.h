// TinyNet: a small deterministic model for engine tests (two Linear layers, one of them optional
// "unused" head, and an optional frozen layer), plus its data.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/functional/loss.h>

namespace deepspeed::testing {

struct TinyNetImpl : torch::nn::Module {
  explicit TinyNetImpl(int64_t seed = 1234) {
    torch::manual_seed(seed);
    fc1 = register_module("fc1", torch::nn::Linear(4, 8));
    fc2 = register_module("fc2", torch::nn::Linear(8, 2));
    unused = register_module("unused", torch::nn::Linear(8, 2));  // never gets a gradient
    frozen = register_module("frozen", torch::nn::Linear(4, 4));
    for (auto& p : frozen->parameters()) p.set_requires_grad(false);
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& y) {
    auto h = torch::tanh(fc1(x + frozen(x)));
    return torch::nn::functional::mse_loss(fc2(h), y);
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, unused{nullptr}, frozen{nullptr};
};

/// Sample i of a fixed synthetic regression set (identical in every process).
inline std::pair<torch::Tensor, torch::Tensor> tiny_batch(int64_t first, int64_t count) {
  auto g = torch::arange(first, first + count, torch::kFloat).unsqueeze(1);
  auto x = torch::cat({torch::sin(g), torch::cos(g * 0.7), torch::sin(g * 1.3), g * 0.01}, 1);
  auto y = torch::cat({torch::sin(g * 0.5), torch::cos(g * 0.3)}, 1);
  return {x, y};
}

}  // namespace deepspeed::testing
