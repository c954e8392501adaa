// deepspeed::linear's base weight sharding on Gloo ranks: each rank keeps its own flat shard of
// the pretrained weight (the engine's broadcast leaves it alone), every forward gathers it, and
// training under ZeRO 0, 1 and 2 gives the LoRA adapters the unsharded run gives, bit for bit.
// Checkpoints leave the sharded base weights out and resume exactly; ZeRO-3 is refused by name.
#include "deepspeed/deepspeed.h"

#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "support/expect_throw.h"
#include "support/multi_rank.h"
#include "support/temp_dir.h"

namespace deepspeed {
namespace {

using linear::LoRAConfig;
using linear::OptimizedLinear;
using testing::run_ranks;

// The "pretrained" weights and the adapters' starting values, the same in every process.
at::Tensor fixed(std::vector<int64_t> shape, int64_t seed) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(seed));
  return torch::randn(shape, g) * 0.3;
}

struct LoraNetImpl : torch::nn::Module {
  explicit LoraNetImpl(int64_t shards) {
    LoRAConfig c;
    c.lora_r = 4;
    c.lora_alpha = 8.0;
    c.base_weight_sharding = shards;
    c.target_mods = {"fc"};
    fc1 = register_module("fc1", OptimizedLinear(8, 16, false, c, std::nullopt, at::kFloat));
    fc2 = register_module("fc2", OptimizedLinear(16, 4, false, c, std::nullopt, at::kFloat));
    fc1->load_base_weight(fixed({16, 8}, 1), "fc1");
    fc2->load_base_weight(fixed({4, 16}, 2), "fc2");
    torch::NoGradGuard no_grad;
    fc1->lora_weight_1->weight.copy_(fixed({4, 8}, 3));
    fc1->lora_weight_2->weight.copy_(fixed({16, 4}, 4));
    fc2->lora_weight_1->weight.copy_(fixed({4, 16}, 5));
    fc2->lora_weight_2->weight.copy_(fixed({4, 4}, 6));
  }
  at::Tensor forward(const at::Tensor& x, const at::Tensor& y) {
    return torch::nn::functional::mse_loss(fc2(torch::tanh(fc1(x))), y);
  }
  OptimizedLinear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(LoraNet);

std::pair<at::Tensor, at::Tensor> batch(int step, int rank) {
  return {fixed({2, 8}, 100 + step * 10 + rank), fixed({2, 4}, 200 + step * 10 + rank)};
}

json config(int stage) {
  return {{"train_micro_batch_size_per_gpu", 2},
          {"gradient_accumulation_steps", 1},
          {"optimizer", {{"type", "Adam"}, {"params", {{"lr", 0.01}}}}},
          {"zero_optimization", {{"stage", stage}}}};
}

std::vector<at::Tensor> adapters(LoraNet& net) {
  std::vector<at::Tensor> out;
  for (auto* l : {net->fc1.get(), net->fc2.get()}) {
    out.push_back(l->lora_weight_1->weight.detach().clone());
    out.push_back(l->lora_weight_2->weight.detach().clone());
  }
  return out;
}

TEST(OptimizedLinearDist, ShardedBaseWeightsTrainAsUnshardedUnderZero0To2) {
  run_ranks(2, [](int rank, int world) {
    auto fresh = LoraNet(1);
    const auto untrained = adapters(fresh);
    for (int stage : {0, 1, 2}) {
      std::vector<at::Tensor> result[2];
      for (int64_t shards : {int64_t{1}, int64_t{2}}) {
        auto net = LoraNet(shards);
        auto [engine, opt, sched] = initialize(net.ptr(), config(stage));
        if (shards == 2) {
          // The engine broadcast nothing over the shards: each rank keeps its own slice.
          EXPECT_EQ(net->fc1->weight.numel(), 16 * 8 / world);
          EXPECT_TRUE(torch::equal(net->fc1->weight,
                                   fixed({16, 8}, 1).reshape({-1}).chunk(world)[rank]));
          EXPECT_TRUE(linear::is_sharded_base_weight(net->fc1->weight));
        }
        for (int step = 0; step < 4; ++step) {
          auto [x, y] = batch(step, rank);
          engine->backward(engine->forward(x, y));
          engine->step();
        }
        EXPECT_TRUE(torch::equal(net->fc1->full_weight(), fixed({16, 8}, 1)));  // never stepped
        result[shards - 1] = adapters(net);
      }
      for (size_t i = 0; i < 4; ++i) {
        EXPECT_TRUE(torch::equal(result[0][i], result[1][i])) << "stage " << stage << " " << i;
        EXPECT_FALSE(torch::equal(result[0][i], untrained[i])) << "stage " << stage << " " << i;
      }
    }
  });
}

TEST(OptimizedLinearDist, CheckpointsLeaveShardsOutAndResumeExactly) {
  // One folder for the parent and its ranks: made by the parent, passed in the environment.
  std::optional<testing::TempDir> made;
  if (!testing::in_rank_process()) made.emplace("optimized_linear_ckpt");
  const std::string root = made ? made->path() : std::getenv("DS_TEST_CKPT_DIR");
  testing::RunOptions options;
  options.env.push_back({"DS_TEST_CKPT_DIR", root});
  const std::string save = root + "/ckpt";
  const auto file = [&](int rank) { return root + "/straight_" + std::to_string(rank) + ".pt"; };
  // Train 4 steps straight, and 2 steps, save, 2 more in new processes.
  run_ranks(2, [&](int rank, int) {
    auto net = LoraNet(2);
    auto [engine, opt, sched] = initialize(net.ptr(), config(1));
    for (int step = 0; step < 4; ++step) {
      if (step == 2) engine->save_checkpoint(save, "two");
      auto [x, y] = batch(step, rank);
      engine->backward(engine->forward(x, y));
      engine->step();
    }
    torch::save(adapters(net), file(rank));
  }, options);
  run_ranks(2, [&](int rank, int) {
    auto net = LoraNet(2);
    auto [engine, opt, sched] = initialize(net.ptr(), config(1));
    engine->load_checkpoint(save, "two");
    for (int step = 2; step < 4; ++step) {
      auto [x, y] = batch(step, rank);
      engine->backward(engine->forward(x, y));
      engine->step();
    }
    std::vector<at::Tensor> straight;
    torch::load(straight, file(rank));
    const auto resumed = adapters(net);
    for (size_t i = 0; i < 4; ++i) EXPECT_TRUE(torch::equal(resumed[i], straight[i])) << i;
  }, options);
  if (testing::in_rank_process()) return;
  const auto states = checkpoint::ModelStates::from_ivalue(
      checkpoint::load(save + "/two/mp_rank_00_model_states.pt"), "model states");
  EXPECT_EQ(states.module.find("fc1.weight"), nullptr);
  EXPECT_NE(states.module.find("fc1.lora_weight_1.weight"), nullptr);
}

TEST(OptimizedLinearDist, Zero3RefusesShardedBaseWeights) {
  run_ranks(2, [](int, int) {
    auto net = LoraNet(2);
    EXPECT_THROW_WITH(initialize(net.ptr(), config(3)), NotSupportedError,
                      "'fc1.weight' is an OptimizedLinear base weight sharded over the ranks");
  });
}

}  // namespace
}  // namespace deepspeed
