// A downstream trainer built against the installed deepspeed-cpp: ZeRO-2 AdamW on a small
// regression model over the ranks the launcher starts, checked against plain LibTorch (AdamW on
// the whole global batch in one process). Prints "trainer: rank R ok max_abs_diff=X" and exits 0
// when every parameter matches within 1e-5.
#include <cstdio>
#include <vector>

#include <deepspeed/deepspeed.h>
#include <torch/torch.h>

namespace {

struct NetImpl : torch::nn::Module {
  NetImpl() : fc1(register_module("fc1", torch::nn::Linear(8, 16))),
              fc2(register_module("fc2", torch::nn::Linear(16, 1))) {}
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& y) {
    return torch::mse_loss(fc2(torch::tanh(fc1(x))), y);
  }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Net);

constexpr int kSteps = 5;
constexpr int kMicro = 4;

// Rank r's micro-batch at step s: the same wherever it is computed.
std::pair<torch::Tensor, torch::Tensor> batch(int rank, int step) {
  auto g = torch::arange(0, kMicro * 8, torch::kFloat).reshape({kMicro, 8}) +
           static_cast<float>(100 * step + 10 * rank);
  return {torch::sin(g * 0.37), torch::cos(g.sum(1, true) * 0.01)};
}

}  // namespace

int main() {
  try {
    const char* config = R"({
      "train_micro_batch_size_per_gpu": 4,
      "zero_optimization": {"stage": 2},
      "gradient_clipping": 0.0,
      "optimizer": {"type": "AdamW",
                    "params": {"lr": 0.01, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0}}
    })";
    torch::manual_seed(7);
    Net reference_net;
    torch::manual_seed(7);
    Net net;
    auto [engine, optimizer, scheduler] = deepspeed::initialize(net.ptr(), std::string(config));
    const int rank = deepspeed::comm::get_rank();
    const int world = deepspeed::comm::get_world_size();
    for (int step = 0; step < kSteps; ++step) {
      auto [x, y] = batch(rank, step);
      engine->backward(engine->forward(x, y));
      engine->step();
    }
    // Plain LibTorch on the global batch: DeepSpeed averages the ranks' gradients, which is the
    // gradient of the mean loss over all ranks' equal-sized micro-batches.
    torch::optim::AdamW reference_opt(reference_net->parameters(),
                                      torch::optim::AdamWOptions(0.01).weight_decay(0.0));
    for (int step = 0; step < kSteps; ++step) {
      std::vector<torch::Tensor> xs, ys;
      for (int r = 0; r < world; ++r) {
        auto [x, y] = batch(r, step);
        xs.push_back(x);
        ys.push_back(y);
      }
      reference_opt.zero_grad();
      reference_net->forward(torch::cat(xs), torch::cat(ys)).backward();
      reference_opt.step();
    }
    double max_diff = 0.0;
    auto got = net->parameters();
    auto want = reference_net->parameters();
    for (size_t i = 0; i < got.size(); ++i) {
      max_diff = std::max(max_diff, (got[i] - want[i]).abs().max().item<double>());
    }
    const bool ok = max_diff <= 1e-5;
    std::printf("trainer: rank %d of %d %s max_abs_diff=%.3g\n", rank, world, ok ? "ok" : "MISMATCH",
                max_diff);
    engine.reset();
    deepspeed::comm::destroy_process_group();
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trainer: error: %s\n", e.what());
    return 1;
  }
}
