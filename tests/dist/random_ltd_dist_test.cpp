// Random-LTD on 2 Gloo ranks under ZeRO-2 against one process accumulating the same two
// micro-batches: the ranks draw their kept tokens from generators seeded alike, so the
// reference redraws them per micro-batch from the same seed; the parameters after K steps and
// the schedule's state must agree.
#include "deepspeed/deepspeed.h"

#include <algorithm>
#include <functional>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "support/multi_rank.h"
#include "support/token_net.h"

namespace deepspeed {
namespace {

using testing::run_ranks;

constexpr int kSteps = 5;
constexpr int64_t kSeq = 16, kWidth = 4, kMicro = 2;

json config(int gas, int stage) {
  return {{"train_micro_batch_size_per_gpu", kMicro},
          {"gradient_accumulation_steps", gas},
          {"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.2}}}}},
          {"zero_optimization", {{"stage", stage}}},
          {"zero_allow_untested_optimizer", true},  // SGD
          {"data_efficiency",
           {{"enabled", true},
            {"data_routing",
             {{"enabled", true},
              {"random_ltd",
               {{"enabled", true},
                {"total_layer_num", 3},
                {"random_ltd_layer_num", 2},
                {"random_ltd_layer_id", {0, 2}},
                {"model_mask_name", nullptr},
                {"model_type", "decoder"},
                {"hidden_state_order", "batch_seq_dim"},
                {"random_ltd_schedule",
                 {{"min_value", 4},
                  {"max_value", kSeq},
                  {"schedule_type", "fixed_linear"},
                  {"schedule_config", {{"require_steps", 4}, {"seq_per_step", 4}}}}}}}}}}}};
}

struct Trained {
  std::vector<at::Tensor> params;
  int64_t consumed_layer_tokens;
};

// Global batch `step` is samples [4 step, 4 step + 4): micro-batch j of it is samples
// 4 step + 2 j, +1. `micro_batches(step)` lists which this process trains on, in order.
// `reseed`: seed the generator before every micro-batch (else once per step, so that a second
// micro-batch draws other tokens).
Trained train(int stage, int gas, const std::function<std::vector<int>(int)>& micro_batches,
              bool reseed = true) {
  auto model = std::make_shared<testing::TokenNetImpl>(3, kWidth);
  auto engine = initialize(model, config(gas, stage)).engine;
  for (int step = 0; step < kSteps; ++step) {
    torch::manual_seed(100 + step);
    for (int j : micro_batches(step)) {
      if (reseed) torch::manual_seed(100 + step);  // every rank, every micro-batch alike
      auto [x, y] = testing::token_batch(4 * step + kMicro * j, kMicro, kSeq, kWidth);
      engine->backward(engine->forward(x, y));
      engine->step();
    }
  }
  Trained out{{}, engine->random_ltd_scheduler()->consumed_layer_tokens()};
  for (auto& p : model->parameters()) out.params.push_back(p.detach().clone());
  return out;
}

TEST(RandomLtdDist, TwoRanksUnderZero2MatchOneProcessAccumulatingTheirMicroBatches) {
  run_ranks(2, [](int rank, int) {
    const Trained t = train(/*stage=*/2, /*gas=*/1, [rank](int) { return std::vector<int>{rank}; });
    torch::save(t.params, testing::rank_output_dir() + "/params" + std::to_string(rank) + ".pt");
    EXPECT_EQ(t.consumed_layer_tokens, 4 * (2 * (4 + 4 + 8 + 12 + 16) + 5 * 16));
  });
  const Trained reference = train(0, /*gas=*/2, [](int) { return std::vector<int>{0, 1}; });
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<at::Tensor> got;
    torch::load(got, testing::rank_output_dir() + "/params" + std::to_string(rank) + ".pt");
    ASSERT_EQ(got.size(), reference.params.size());
    for (size_t i = 0; i < got.size(); ++i) {
      const double diff = (got[i] - reference.params[i]).abs().max().item<double>();
      EXPECT_LE(diff, 2e-6) << "rank " << rank << ": tensor " << i;
    }
  }
  // A second micro-batch that draws other tokens trains to other parameters: the check can
  // fail.
  const Trained other_draws =
      train(0, 2, [](int) { return std::vector<int>{0, 1}; }, /*reseed=*/false);
  double moved = 0;
  for (size_t i = 0; i < other_draws.params.size(); ++i) {
    const auto diff = (other_draws.params[i] - reference.params[i]).abs().max();
    moved = std::max(moved, diff.item<double>());
  }
  EXPECT_GT(moved, 1e-4);
}

}  // namespace
}  // namespace deepspeed
