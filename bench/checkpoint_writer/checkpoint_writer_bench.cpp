// What a checkpoint costs a training run under each checkpoint.writer (docs/checkpoints.md
// "Writers"): one process trains an MLP of --layers Linear(H, H) layers under ZeRO --stage and,
// per round, times --steps training steps alone and the same steps after a save_checkpoint
// (committed at the end, as the next save would). The difference is the checkpoint's cost to
// training; the save_checkpoint call alone is how long training stops. Prints one JSON line per
// round; bench/checkpoint_writer/run.sh runs it per writer beside DeepSpeed's own.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>

#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include "deepspeed/deepspeed.h"

namespace {

namespace ds = deepspeed;
using Clock = std::chrono::steady_clock;

struct MlpImpl : torch::nn::Module {
  MlpImpl(int64_t hidden, int64_t layers) {
    torch::manual_seed(0);
    for (int64_t i = 0; i < layers; ++i) {
      stack->push_back(torch::nn::Linear(hidden, hidden));
      stack->push_back(torch::nn::Functional(torch::tanh));
    }
    register_module("stack", stack);
  }
  torch::Tensor forward(const torch::Tensor& x) { return stack->forward(x).pow(2).mean(); }
  torch::nn::Sequential stack;
};

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

int64_t folder_bytes(const std::string& dir) {
  int64_t total = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (e.is_regular_file()) total += static_cast<int64_t>(e.file_size());
  }
  return total;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("checkpoint.writer's cost to training");
  int64_t hidden = 2048, layers = 12, batch = 64, steps = 4, rounds = 5, stage = 1;
  std::string writer = "none", dir, name;
  app.add_option("--hidden", hidden);
  app.add_option("--layers", layers);
  app.add_option("--batch", batch);
  app.add_option("--steps", steps, "training steps timed after each save");
  app.add_option("--rounds", rounds);
  app.add_option("--stage", stage, "ZeRO stage");
  app.add_option("--writer", writer, "checkpoint.writer as JSON, or none");
  app.add_option("--dir", dir, "where checkpoints go (emptied after each round)")->required();
  app.add_option("--name", name, "the variant's name in the output");
  CLI11_PARSE(app, argc, argv);

  ds::json cfg = {{"train_batch_size", batch},
                  {"optimizer", {{"type", "Adam"}, {"params", {{"lr", 1e-4}}}}},
                  {"zero_optimization", {{"stage", stage}}},
                  {"steps_per_print", 1000000}};
  if (writer != "none") cfg["checkpoint"] = {{"writer", ds::json::parse(writer)}};
  auto engine = ds::initialize(std::make_shared<MlpImpl>(hidden, layers), cfg).engine;
  torch::manual_seed(1);
  const torch::Tensor x = torch::randn({batch, hidden});
  const auto train = [&](int64_t n) {
    for (int64_t s = 0; s < n; ++s) {
      engine->backward(engine->forward(x));
      engine->step();
    }
  };
  train(2);  // the optimizer's states exist from the first step on
  for (int64_t r = 0; r < rounds; ++r) {
    auto start = Clock::now();
    train(steps);
    const double alone = seconds_since(start);
    std::filesystem::remove_all(dir);
    start = Clock::now();
    engine->save_checkpoint(dir);
    const double call = seconds_since(start);
    train(steps);
    engine->commit_decoupled_checkpoint();  // no-op unless decoupled (else the first step did)
    const double with_save = seconds_since(start);
    std::printf("{\"variant\": \"%s\", \"round\": %lld, \"steps_s\": %.4f, "
                "\"steps_with_save_s\": %.4f, \"save_call_s\": %.4f, \"bytes\": %lld}\n",
                name.c_str(), static_cast<long long>(r), alone, with_save, call,
                static_cast<long long>(folder_bytes(dir)));
    std::fflush(stdout);
  }
  std::filesystem::remove_all(dir);
  return 0;
}
