// Dynamic batching on 2 Gloo ranks against one process: with the same train_batch_size (2 ranks
// x 1 micro-batch, or 1 rank x 2 accumulated micro-batches) both pack the same micro-batches;
// each rank trains on its share (DistributedSampler's dealing), the learning rate follows each
// batch's size, and after K steps the parameters equal the single process's.
#include "deepspeed/variable_batch.h"

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "deepspeed/deepspeed.h"
#include "support/multi_rank.h"
#include "support/tiny_model.h"

namespace deepspeed::data_sampling {
namespace {

using testing::rank_output_dir;
using testing::run_ranks;

constexpr int64_t kSamples = 60;
constexpr int kSteps = 6;

std::vector<int64_t> lengths() {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < kSamples; ++i) out.push_back((i * 37) % 23 + 5);
  return out;
}

json config(int64_t accumulation) {
  return {{"train_micro_batch_size_per_gpu", 1},
          {"gradient_accumulation_steps", accumulation},
          {"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.05}}}}},
          {"scheduler",
           {{"type", "WarmupLR"},
            {"params", {{"warmup_min_lr", 0.01}, {"warmup_max_lr", 0.05},
                        {"warmup_num_steps", 4}}}}},
          {"data_efficiency",
           {{"enabled", true},
            {"seed", 77},
            {"data_sampling",
             {{"enabled", true},
              {"dynamic_batching",
               {{"enabled", true},
                {"max_tokens", 45},
                {"max_batch_size", 4},
                {"sequence_picking_order", "random"},
                {"lr_scaling_method", "sqrt"}}}}}}}};
}

// Trains kSteps optimizer steps; returns the parameters and the rates the updates used.
std::pair<std::vector<torch::Tensor>, std::vector<double>> train(int64_t accumulation) {
  auto engine = initialize(std::make_shared<testing::TinyNetImpl>(), config(accumulation)).engine;
  auto loader = make_variable_batch_loader(*engine, lengths());
  std::vector<double> rates;
  for (int step = 0; step < kSteps; ++step) {
    rates.push_back(engine->optimizer()->param_groups()[0].options().get_lr());
    for (int64_t micro = 0; micro < accumulation; ++micro) {
      const auto mb = loader->next();
      EXPECT_TRUE(mb.has_value());
      if (!mb) break;
      EXPECT_EQ(mb->batch_id, step);
      std::vector<torch::Tensor> xs, ys;
      for (int64_t s : mb->samples) {
        auto [x, y] = testing::tiny_batch(s, 1);
        xs.push_back(x);
        ys.push_back(y);
      }
      engine->backward(engine->forward(torch::cat(xs), torch::cat(ys)));
      engine->step();
    }
  }
  std::vector<torch::Tensor> params;
  for (const auto& p : engine->module().parameters()) params.push_back(p.detach().clone());
  return {params, rates};
}

TEST(VariableBatchDist, TwoRanksTrainAsOneProcessAccumulatingTheirMicroBatches) {
  run_ranks(2, [](int rank, int) {
    const auto [params, rates] = train(1);
    if (rank != 0) return;
    torch::save(params, rank_output_dir() + "/params.pt");
    std::ofstream(rank_output_dir() + "/rates.json") << json(rates).dump();
  });
  const auto [reference, reference_rates] = train(2);
  std::vector<torch::Tensor> params;
  torch::load(params, rank_output_dir() + "/params.pt");
  std::ifstream in(rank_output_dir() + "/rates.json");
  const auto rates = json::parse(in).get<std::vector<double>>();
  EXPECT_EQ(rates, reference_rates);
  ASSERT_EQ(params.size(), reference.size());
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(torch::allclose(params[i], reference[i], 1e-5, 1e-6)) << "parameter " << i;
  }
  // The batches differ in size, so the rates are not the schedule's alone.
  auto engine = initialize(std::make_shared<testing::TinyNetImpl>(), config(2)).engine;
  const auto sizes = make_variable_batch_loader(*engine, lengths())->batches().batch_sizes;
  ASSERT_GE(sizes.size(), static_cast<size_t>(kSteps));
  EXPECT_NE(*std::min_element(sizes.begin(), sizes.begin() + kSteps),
            *std::max_element(sizes.begin(), sizes.begin() + kSteps));
}

}  // namespace
}  // namespace deepspeed::data_sampling
