// A model for the 1-bit optimizers under fp16: elementwise only (Debian's LibTorch 1.13 has no
// fp16 matmul on CPU), with a 2-D and a 1-D parameter so that per-parameter masters (1-bit
// LAMB) and flat group masters (1-bit Adam, 0/1 Adam) both have something to do.
#pragma once

#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/torch.h>

namespace deepspeed::testing {

struct OneBitFp16Model : torch::nn::Module {
  OneBitFp16Model() {
    torch::manual_seed(3);
    w = register_parameter("w", torch::randn({3, 37}) * 0.5);
    b = register_parameter("b", torch::randn({37}) * 0.1);
  }
  /// x: [3, 37], y: [37].
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& y) {
    return ((w * x).sum(0) + b - y).pow(2).mean();
  }
  torch::Tensor w, b;
};

/// Rank `rank`'s sample of step `step` (fp32; the same in every process).
inline std::pair<torch::Tensor, torch::Tensor> onebit_fp16_batch(int64_t step, int rank) {
  auto g = torch::arange(37, torch::kFloat) * 0.1 + static_cast<double>(step) * 0.37 + rank;
  auto x = torch::stack({torch::sin(g), torch::cos(g * 0.7), torch::sin(g * 1.3) * 0.5});
  // A target the model can fit: fixed weights applied to x, plus a little noise-free offset.
  auto y = (x * torch::linspace(-1.0, 1.0, 3).unsqueeze(1)).sum(0) + 0.3 * torch::cos(g * 0.5);
  return {x, y};
}

/// The fp32 loss of parameters {w, b} over both ranks' samples of steps [from, from + 8).
inline double onebit_fp16_eval_loss(const std::vector<torch::Tensor>& params, int64_t from,
                                    int /*rank*/) {
  torch::NoGradGuard no_grad;
  const auto& w = params.at(0);
  const auto& b = params.at(1);
  double sum = 0;
  int n = 0;
  for (int64_t s = from; s < from + 8; ++s) {
    for (int r = 0; r < 2; ++r) {
      auto [x, y] = onebit_fp16_batch(s, r);
      sum += ((w * x).sum(0) + b - y).pow(2).mean().item<double>();
      ++n;
    }
  }
  return sum / n;
}

}  // namespace deepspeed::testing
