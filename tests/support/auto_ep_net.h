// AutoEpNet: a small model around one TokenChoiceMoE (4 experts, hidden 8, width 12) for the
// AutoEP tests (auto_ep_dist_test, and deepspeed_autoep_interop_test, whose Python side defines
// the same module). The block is a ZeRO-3 unit: gathered around its forward and backward under
// stage 3, a plain module otherwise. Seeded, so every rank and process builds the same weights.
#pragma once

#include <memory>

#include <torch/torch.h>

#include "deepspeed/auto_ep.h"
#include "deepspeed/zero3.h"

namespace deepspeed::testing {

constexpr int64_t kAutoEpHidden = 8, kAutoEpFfn = 12, kAutoEpExperts = 4;

class AutoEpNetImpl : public torch::nn::Module {
 public:
  AutoEpNetImpl() {
    torch::manual_seed(11);
    moe::TokenChoiceOptions o;
    o.num_experts = kAutoEpExperts;
    in = register_module("in", torch::nn::Linear(kAutoEpHidden, kAutoEpHidden));
    block = register_module("moe", std::make_shared<zero::Unit<moe::TokenChoiceMoEImpl>>(
                                       kAutoEpHidden, kAutoEpFfn, o));
    out = register_module("out", torch::nn::Linear(kAutoEpHidden, kAutoEpHidden));
  }
  at::Tensor forward(const at::Tensor& x, const at::Tensor& y) {
    return torch::mse_loss(out(block->forward(torch::tanh(in(x)))), y);
  }
  torch::nn::Linear in{nullptr}, out{nullptr};
  std::shared_ptr<zero::Unit<moe::TokenChoiceMoEImpl>> block;
};
TORCH_MODULE(AutoEpNet);

}  // namespace deepspeed::testing
