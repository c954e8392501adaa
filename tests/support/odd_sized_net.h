// OddSizedNet: two Linear layers of awkward sizes (7 -> 13 -> 3: 146 parameters, 130 in the
// weights and 16 in the biases, so that ZeRO's partitions get padding), for the offload,
// master-weight and gradient-accumulation tests.
#pragma once

#include <functional>

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>

namespace deepspeed::testing {

struct OddSizedNet : torch::nn::Module {
  OddSizedNet() {
    torch::manual_seed(99);
    fc1 = register_module("fc1", torch::nn::Linear(7, 13));
    fc2 = register_module("fc2", torch::nn::Linear(13, 3));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor hidden = fc1(x);
    if (on_hidden_grad && hidden.requires_grad()) {
      hidden.register_hook([this](const torch::Tensor& g) {
        on_hidden_grad();
        return g;
      });
    }
    return torch::tanh(fc2(torch::tanh(hidden))).pow(2).mean();
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  /// When set, runs when backward reaches the hidden activation: after fc2's gradients were
  /// accumulated, before fc1's.
  std::function<void()> on_hidden_grad;
};

}  // namespace deepspeed::testing
