// TokenNet: the random-LTD tests' model. A stack of tanh(Linear) layers over [batch, seq, width]
// hidden states whose training forward runs every layer through RandomLayerTokenDrop, as a
// transformer's blocks would, and records how many tokens each layer saw; plus its data.
#pragma once

#include <string>
#include <vector>

#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>

#include "deepspeed/forward_kwargs.h"
#include "deepspeed/random_ltd.h"

namespace deepspeed::testing {

struct TokenNetImpl : torch::nn::Module {
  TokenNetImpl(int64_t layers, int64_t width, uint64_t seed = 7) {
    torch::manual_seed(seed);
    for (int64_t i = 0; i < layers; ++i) {
      blocks.push_back(
          register_module("layer" + std::to_string(i), torch::nn::Linear(width, width)));
    }
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& y,
                        const ForwardKwargs& kwargs) {
    const RandomLayerTokenDrop ltd(kwargs.random_ltd, x, is_training());
    seen_tokens.clear();
    torch::Tensor h = x;
    for (size_t i = 0; i < blocks.size(); ++i) {
      h = ltd.forward(static_cast<int64_t>(i), h, [&](const torch::Tensor& in) {
        seen_tokens.push_back(in.size(1));
        return torch::tanh(blocks[i](in));
      });
    }
    return torch::nn::functional::mse_loss(h, y);
  }
  std::vector<torch::nn::Linear> blocks;
  std::vector<int64_t> seen_tokens;  // per layer, in the last forward
};

/// Samples first .. first+count-1 of a fixed synthetic set: [count, seq, width] inputs and
/// targets, identical in every process.
inline std::pair<torch::Tensor, torch::Tensor> token_batch(int64_t first, int64_t count,
                                                           int64_t seq, int64_t width) {
  auto i = torch::arange(first * seq * width, (first + count) * seq * width, torch::kDouble)
               .view({count, seq, width});
  return {torch::sin(i * 0.37).to(torch::kFloat), torch::cos(i * 0.11).to(torch::kFloat)};
}

}  // namespace deepspeed::testing
