// ZeRO-Offload (offload_optimizer.device "cpu") with ZeRO 1 and 2 on 2 Gloo ranks: the same
// parameters after K steps as without offload, bit for bit (both run the CPU-Adam kernel: the
// config's Adam is FusedAdam without offload and DeepSpeedCPUAdam with it, one kernel here);
// DeepSpeed's zero_force_ds_cpu_optimizer rule for client optimizers; the memory report's
// host-held optimizer bytes; and the offload keys this build refuses, by name.
#include "deepspeed/deepspeed.h"
#include "deepspeed/optimizers.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "support/expect_throw.h"
#include "support/multi_rank.h"

namespace deepspeed {
namespace {

using testing::run_ranks;

constexpr int kSteps = 4;
constexpr int kGas = 2;

// Two Linear layers of awkward sizes (the parameter count is odd: partitions get padding).
struct Net : torch::nn::Module {
  Net() {
    torch::manual_seed(99);
    fc1 = register_module("fc1", torch::nn::Linear(7, 13));
    fc2 = register_module("fc2", torch::nn::Linear(13, 3));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return torch::tanh(fc2(torch::tanh(fc1(x)))).pow(2).mean();
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

json config(int stage, bool offload, const std::string& dtype) {
  json zero = {{"stage", stage}, {"reduce_bucket_size", 40}};
  if (offload) zero["offload_optimizer"] = {{"device", "cpu"}, {"pin_memory", true}};
  json cfg = {{"train_micro_batch_size_per_gpu", 2},
              {"gradient_accumulation_steps", kGas},
              {"gradient_clipping", 0.5},
              {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.01}, {"weight_decay", 0.1}}}}},
              {"zero_optimization", zero}};
  if (dtype == "bf16") cfg["bf16"] = {{"enabled", true}};
  return cfg;
}

// Trains on this rank's slice of a fixed data set; returns the parameters (as fp32) and the
// memory figures after the last step.
std::pair<std::vector<at::Tensor>, MemoryStats> train(int rank, const json& cfg) {
  auto model = std::make_shared<Net>();
  auto engine = initialize(model, cfg).engine;
  torch::manual_seed(1000 + rank);
  for (int s = 0; s < kSteps * kGas; ++s) {
    engine->backward(engine->forward(torch::randn({2, 7}).to(model->fc1->weight.scalar_type())));
    engine->step();
  }
  std::vector<at::Tensor> out;
  for (auto& p : model->parameters()) out.push_back(p.detach().to(torch::kFloat).clone());
  return {out, engine->memory_stats()};
}

// One rank's body: with and without offload, then compare (template arguments, not environment
// variables, carry the case into the rank processes).
template <int kStage, bool kBf16>
void offload_matches_on_rank(int rank, int) {
  const std::string dtype = kBf16 ? "bf16" : "fp32";
  auto [plain, plain_mem] = train(rank, config(kStage, false, dtype));
  auto [offloaded, mem] = train(rank, config(kStage, true, dtype));
  ASSERT_EQ(plain.size(), offloaded.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_TRUE(torch::equal(plain[i], offloaded[i]))
        << "stage " << kStage << " " << dtype << ", tensor " << i << ": max difference "
        << (plain[i] - offloaded[i]).abs().max().item<double>();
  }
  // The report shows the optimizer's host-held bytes: Adam's two moments of the owned fp32
  // partition, plus the fp32 master copy when the model trains in bf16.
  EXPECT_EQ(plain_mem.offloaded_optimizer_bytes, 0);
  EXPECT_GT(mem.optimizer_state_bytes, 0);
  EXPECT_EQ(mem.offloaded_optimizer_bytes, mem.optimizer_state_bytes + mem.master_param_bytes);
  if (kBf16) {
    EXPECT_GT(mem.master_param_bytes, 0);
  }
}

TEST(OffloadDist, CpuOffloadStage1MatchesNoOffloadOn2Ranks) {
  run_ranks(2, offload_matches_on_rank<1, false>);
}
TEST(OffloadDist, CpuOffloadStage2MatchesNoOffloadOn2Ranks) {
  run_ranks(2, offload_matches_on_rank<2, false>);
}
TEST(OffloadDist, CpuOffloadStage3MatchesNoOffloadOn2Ranks) {
  run_ranks(2, offload_matches_on_rank<3, false>);
}
TEST(OffloadDist, CpuOffloadStage2Bf16MatchesNoOffloadOn2Ranks) {
  run_ranks(2, offload_matches_on_rank<2, true>);
}

// Matches DeepSpeed's _configure_optimizer: with offload, a client optimizer other than
// DeepSpeedCPUAdam/CPULion is refused unless zero_force_ds_cpu_optimizer is false; then it
// trains like the same optimizer without offload.
TEST(OffloadDist, ClientOptimizerFollowsZeroForceDsCpuOptimizer) {
  run_ranks(2, [](int rank, int) {
    auto run = [&](bool offload, bool force) {
      json cfg = config(2, offload, "fp32");
      cfg.erase("optimizer");
      cfg["zero_force_ds_cpu_optimizer"] = force;
      auto model = std::make_shared<Net>();
      auto opt = std::make_unique<torch::optim::AdamW>(model->parameters(),
                                                      torch::optim::AdamWOptions(0.01));
      auto engine = initialize(model, cfg, std::move(opt)).engine;
      torch::manual_seed(7 + rank);
      for (int s = 0; s < kGas * 2; ++s) {
        engine->backward(engine->forward(torch::randn({2, 7})));
        engine->step();
      }
      std::vector<at::Tensor> out;
      for (auto& p : model->parameters()) out.push_back(p.detach().clone());
      return out;
    };
    EXPECT_THROW_WITH(run(true, true), ConfigError,
                      "You are using ZeRO-Offload with a client provided optimizer "
                      "(torch::optim::AdamW)");
    EXPECT_THROW_WITH(run(true, true), ConfigError, "\"zero_force_ds_cpu_optimizer\": false");
    auto plain = run(false, true);
    auto offloaded = run(true, false);
    for (size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(torch::equal(plain[i], offloaded[i]));
    // deepspeed::optim::Adam is DeepSpeedCPUAdam: accepted as it is.
    json cfg = config(2, true, "fp32");
    cfg.erase("optimizer");
    auto model = std::make_shared<Net>();
    auto adam = std::make_unique<optim::Adam>(model->parameters());
    EXPECT_NO_THROW(initialize(model, cfg, std::move(adam)));
  });
}

// Single process: what this build refuses, by key.
TEST(OffloadConfig, RefusesWhatItDoesNotImplementByName) {
  auto init = [](json zero) {
    json cfg = {{"train_batch_size", 2},
                {"optimizer", {{"type", "AdamW"}}},
                {"zero_optimization", zero}};
    return initialize(std::make_shared<Net>(), cfg);
  };
  EXPECT_THROW_WITH(init({{"stage", 0}, {"offload_optimizer", {{"device", "cpu"}}}}),
                    ConfigError, "offload_optimizer needs zero_optimization.stage 1, 2 or 3");
  EXPECT_THROW_WITH(init({{"stage", 2},
                          {"offload_optimizer", {{"device", "nvme"}, {"nvme_path", "/tmp"}}}}),
                    NotSupportedError,
                    "offload_optimizer.device \"nvme\" with ZeRO stage 2 (DeepSpeed swaps "
                    "optimizer state with stage 3 only)");
  EXPECT_THROW_WITH(init({{"stage", 1}, {"offload_optimizer", {{"device", "cpu"}, {"ratio", 0.5}}}}),
                    NotSupportedError, "offload_optimizer.ratio < 1");
  EXPECT_THROW_WITH(
      init({{"stage", 2}, {"offload_optimizer", {{"device", "cpu"}, {"super_offload", true}}}}),
      NotSupportedError, "offload_optimizer.super_offload");
  EXPECT_THROW_WITH(init({{"stage", 2}, {"offload_param", {{"device", "cpu"}}}}),
                    NotSupportedError, "offload_param.device");
  // Accepted: the keys that mean nothing without a GPU or NVMe (docs/offload.md).
  EXPECT_NO_THROW(init({{"stage", 2},
                        {"offload_optimizer",
                         {{"device", "cpu"}, {"pin_memory", false}, {"buffer_count", 2},
                          {"fast_init", true}, {"pipeline_read", true}}}}));
  EXPECT_NO_THROW(init({{"stage", 1}, {"cpu_offload", true}}));  // deprecated spelling
}

}  // namespace
}  // namespace deepspeed
