// OddSizedNet: two Linear layers of awkward sizes (7 -> 13 -> 3: 146 parameters, 130 in the
// weights and 16 in the biases, so that ZeRO's partitions get padding), for the offload and
// master-weight tests.
#pragma once

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
    return torch::tanh(fc2(torch::tanh(fc1(x)))).pow(2).mean();
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

}  // namespace deepspeed::testing
