// What every gpu-labelled test shares: the skip without a GPU, a small model, a device switch.
#pragma once

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

namespace deepspeed::testing {

// Without a GPU (every CPU machine, CI included) the gpu tests skip and say where they run.
#define DS_REQUIRE_GPU()                                                                   \
  do {                                                                                     \
    if (!torch::cuda::is_available()) {                                                    \
      GTEST_SKIP() << "no CUDA GPU visible (or a CPU-only LibTorch): gpu-labelled tests "  \
                      "run on a GPU machine, see scripts/gpu_check.sh";                    \
    }                                                                                      \
  } while (0)

/// Sets DS_ACCELERATOR for the engines built while it lives ("cpu" or "cuda").
class AcceleratorScope {
 public:
  explicit AcceleratorScope(const char* accelerator) { setenv("DS_ACCELERATOR", accelerator, 1); }
  ~AcceleratorScope() { unsetenv("DS_ACCELERATOR"); }
  AcceleratorScope(const AcceleratorScope&) = delete;
  AcceleratorScope& operator=(const AcceleratorScope&) = delete;
};

/// An MLP with a LayerNorm: every parameter gets a gradient, sizes not multiples of 8.
struct GpuNetImpl : torch::nn::Module {
  explicit GpuNetImpl(int64_t width = 96, int64_t layers = 3, int64_t seed = 7) {
    torch::manual_seed(seed);
    in = register_module("in", torch::nn::Linear(20, width));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})));
    for (int64_t i = 0; i < layers; ++i) {
      hidden.push_back(register_module("h" + std::to_string(i), torch::nn::Linear(width, width)));
    }
    out = register_module("out", torch::nn::Linear(width, 5));
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& y) {
    auto h = norm(torch::tanh(in(x)));
    for (auto& l : hidden) h = torch::tanh(l(h)) + h;
    return torch::nn::functional::mse_loss(out(h).to(torch::kFloat), y);
  }
  torch::nn::Linear in{nullptr}, out{nullptr};
  torch::nn::LayerNorm norm{nullptr};
  std::vector<torch::nn::Linear> hidden;
};

/// Batch `index` of a fixed synthetic regression set, on the CPU (the engine moves it).
inline std::pair<torch::Tensor, torch::Tensor> gpu_net_batch(int64_t index, int64_t size) {
  auto g = torch::arange(index * size, (index + 1) * size, torch::kFloat).unsqueeze(1);
  auto cols = torch::arange(1, 21, torch::kFloat).unsqueeze(0);
  auto x = torch::sin(g * 0.37 + cols * 0.11);
  auto y = torch::cos(g * 0.05 + torch::arange(1, 6, torch::kFloat).unsqueeze(0) * 0.3);
  return {x, y};
}

}  // namespace deepspeed::testing
