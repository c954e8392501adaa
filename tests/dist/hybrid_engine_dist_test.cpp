// The hybrid engine (hybrid_engine.enabled) on 2 Gloo ranks under ZeRO-3: generate() with
// pin_parameters gathers the partitioned parameters once per generation, however many forwards
// it runs, where without it every forward gathers every layer again; both generate the same
// values. And the ranks' generators start equal (rank 0's), as DeepSpeed synchronises them.
#include "deepspeed/deepspeed.h"

#include <map>
#include <string>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "support/logged_collectives.h"
#include "support/multi_rank.h"

namespace deepspeed {
namespace {

using testing::run_ranks;

// A stand-in for an autoregressive model: generate() feeds each forward's output back in.
struct LoopNetImpl : torch::nn::Module {
  LoopNetImpl() {
    torch::manual_seed(5);
    body = register_module(
        "body",
        torch::nn::Sequential(torch::nn::Linear(4, 16), torch::nn::Functional(torch::tanh),
                              torch::nn::Linear(16, 4), torch::nn::Functional(torch::tanh)));
  }
  torch::Tensor forward(const torch::Tensor& x) { return body->forward(x); }
  torch::Tensor generate(torch::Tensor x, int64_t steps) {
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> out;
    for (int64_t i = 0; i < steps; ++i) out.push_back(x = forward(x));
    return torch::stack(out);
  }
  torch::nn::Sequential body{nullptr};
};

json config(bool pin_parameters) {
  return {{"train_batch_size", 4},
          {"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.1}}}}},
          {"zero_allow_untested_optimizer", true},
          {"comms_logger", {{"enabled", true}}},
          {"hybrid_engine", {{"enabled", true}, {"pin_parameters", pin_parameters}}},
          {"zero_optimization",
           {{"stage", 3},
            {"stage3_param_persistence_threshold", 0},
            {"stage3_max_reuse_distance", 0},
            {"stage3_prefetch_bucket_size", 0}}}};
}

int64_t all_gathers() {
  int64_t n = 0;
  for (const auto& [bytes, count] : testing::logged_message_sizes("all_gather")) n += count;
  return n;
}

struct Generation {
  torch::Tensor values;
  int64_t all_gathers;
};

Generation generate(bool pin_parameters, int64_t steps) {
  auto model = std::make_shared<LoopNetImpl>();
  auto engine = initialize(model, config(pin_parameters)).engine;
  engine->eval();
  comm::reset_comms_log();
  const auto x = torch::linspace(-1, 1, 8).view({2, 4}) * (comm::get_rank() + 1);
  Generation g{engine->generate(x, steps), all_gathers()};
  comm::configure_comms_logger({});
  return g;
}

TEST(HybridEngineDist, PinnedParametersAreGatheredOncePerGeneration) {
  run_ranks(2, [](int, int) {
    const Generation pinned2 = generate(true, 2), pinned6 = generate(true, 6);
    const Generation layered2 = generate(false, 2), layered6 = generate(false, 6);
    EXPECT_TRUE(torch::equal(pinned6.values, layered6.values));
    EXPECT_TRUE(torch::equal(pinned6.values.slice(0, 0, 2), pinned2.values));
    // Gathered once: the same collectives for 2 forwards as for 6.
    EXPECT_GT(pinned2.all_gathers, 0);
    EXPECT_EQ(pinned6.all_gathers, pinned2.all_gathers);
    // Layer by layer: every forward gathers the two Linear layers again.
    EXPECT_EQ(layered6.all_gathers, 3 * layered2.all_gathers);
    EXPECT_GE(layered2.all_gathers, 2 * 2);
    EXPECT_LT(pinned6.all_gathers, layered6.all_gathers);
  });
}

TEST(HybridEngineDist, RanksStartFromRankZerosGenerator) {
  run_ranks(2, [](int rank, int) {
    for (bool hybrid : {false, true}) {
      auto model = std::make_shared<LoopNetImpl>();
      torch::manual_seed(100 + rank);
      json c = config(true);
      c["hybrid_engine"]["enabled"] = hybrid;
      auto engine = initialize(model, c).engine;
      auto draw = torch::rand({4});
      std::vector<torch::Tensor> all{torch::empty({4}), torch::empty({4})};
      comm::all_gather(all, draw);
      EXPECT_EQ(torch::equal(all[0], all[1]), hybrid) << "hybrid " << hybrid;
    }
  });
}

}  // namespace
}  // namespace deepspeed
