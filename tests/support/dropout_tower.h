// DropoutTower: a small stack of residual blocks with dropout in each (an MLP block and a
// one-head attention block alternate), for the activation-checkpointing tests: its gradients
// depend on every dropout mask, so a recomputation with other masks shows.
#pragma once

#include <torch/torch.h>

#include <cmath>
#include <memory>
#include <vector>

#include "deepspeed/checkpointing.h"

namespace deepspeed::testing {

struct TowerBlockImpl : torch::nn::Module {
  TowerBlockImpl(int64_t width, bool attention, double p) : attention_(attention), p_(p) {
    ln = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})));
    fc1 = register_module("fc1", torch::nn::Linear(width, attention ? 3 * width : 4 * width));
    fc2 = register_module("fc2", torch::nn::Linear(attention ? width : 4 * width, width));
  }
  // x: [batch, seq, width]
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = fc1(ln(x));
    if (attention_) {
      auto qkv = h.chunk(3, -1);
      auto att = torch::matmul(qkv[0], qkv[1].transpose(-2, -1)) / std::sqrt(double(x.size(-1)));
      att = torch::dropout(torch::softmax(att, -1), p_, is_training());
      h = torch::matmul(att, qkv[2]);
    } else {
      h = torch::dropout(torch::gelu(h), p_, is_training());
    }
    return x + torch::dropout(fc2(h), p_, is_training());
  }
  bool attention_;
  double p_;
  torch::nn::LayerNorm ln{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(TowerBlock);

struct DropoutTower : torch::nn::Module {
  DropoutTower(int layers, int64_t width, double p = 0.2, uint64_t seed = 7) {
    torch::manual_seed(seed);
    for (int i = 0; i < layers; ++i) {
      blocks.push_back(register_module("h" + std::to_string(i), TowerBlock(width, i % 2 == 1, p)));
    }
  }
  /// The blocks in order, each through checkpointing::checkpoint when `checkpointed`.
  torch::Tensor forward(torch::Tensor x, bool checkpointed) {
    for (auto& b : blocks)
      x = checkpointed ? checkpointing::checkpoint_module(b, x) : b->forward(x);
    return x;
  }
  std::vector<TowerBlock> blocks;
};

/// Each parameter's gradient, in registration order (undefined ones as empty tensors).
inline std::vector<torch::Tensor> gradients(torch::nn::Module& m) {
  std::vector<torch::Tensor> out;
  for (const auto& p : m.parameters())
    out.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
  return out;
}

}  // namespace deepspeed::testing
