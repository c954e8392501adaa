// Training steps of a residual MLP stack (L blocks of D -> 4D -> D) with and without
// compression_training (bench_config.json: 8-bit weights in the forward, dynamic 8-bit
// activations into c_proj, topk row pruning of c_fc), as deepspeed_compression.py runs them
// with DeepSpeed's LinearLayer_Compress: forward, backward and an SGD step per step, the
// scheduler stepped after each. Prints "step_ms=<median> loss=<last>".
// Usage: compression_bench plain|compressed CONFIG STEPS [D L TOKENS]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "deepspeed/compression.h"

namespace dc = deepspeed::compression;

struct BlockImpl : torch::nn::Module {
  BlockImpl(int64_t d)
      : c_fc(register_module("c_fc", torch::nn::Linear(d, 4 * d))),
        c_proj(register_module("c_proj", torch::nn::Linear(4 * d, d))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return x + dc::linear(c_proj, torch::gelu(dc::linear(c_fc, x)));
  }
  torch::nn::Linear c_fc, c_proj;
};
TORCH_MODULE(Block);

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: compression_bench plain|compressed CONFIG STEPS [D L TOKENS]\n");
    return 2;
  }
  const bool compressed = std::string(argv[1]) == "compressed";
  const int steps = std::stoi(argv[3]);
  const int64_t d = argc > 4 ? std::stoll(argv[4]) : 256;
  const int64_t layers = argc > 5 ? std::stoll(argv[5]) : 4;
  const int64_t tokens = argc > 6 ? std::stoll(argv[6]) : 1024;
  torch::manual_seed(0);
  torch::nn::Sequential model;
  for (int64_t i = 0; i < layers; ++i) model->push_back(Block(d));
  std::unique_ptr<dc::CompressionScheduler> scheduler;
  if (compressed) {
    std::ifstream in(argv[2]);
    const auto cfg = dc::read_compression_config(deepspeed::json::parse(in), argv[2]);
    dc::init_compression(*model, cfg);
    scheduler = std::make_unique<dc::CompressionScheduler>(*model, cfg);
    scheduler->step(/*step_zero_check=*/true);
  }
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(1e-3));
  const torch::Tensor x = torch::randn({tokens / 64, 64, d});
  const torch::Tensor y = torch::randn({tokens / 64, 64, d});
  std::vector<double> ms;
  double loss = 0.0;
  for (int step = 0; step < steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    const torch::Tensor l = (model->forward(x) - y).pow(2).mean();
    l.backward();
    sgd.step();
    sgd.zero_grad();
    if (scheduler) scheduler->step();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                     .count());
    loss = l.item<double>();
  }
  ms.erase(ms.begin());  // the first step warms the allocator up
  std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
  std::printf("step_ms=%.3f loss=%.6f\n", ms[ms.size() / 2], loss);
  return 0;
}
