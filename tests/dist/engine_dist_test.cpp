// The ZeRO-0 engine on N Gloo ranks against a single-process reference: same parameters after K
// steps; DeepSpeed's gradient-averaging formulas (mean, sum, prescale, predivide); an elastic
// batch on 1, 2 and 4 ranks.
#include "deepspeed/deepspeed.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "support/multi_rank.h"
#include "support/tiny_model.h"

namespace deepspeed {
namespace {

using testing::run_ranks;
using testing::TinyNetImpl;
using testing::tiny_batch;

json engine_config(int micro, int gas, double clip) {
  return json{{"train_micro_batch_size_per_gpu", micro},
              {"gradient_accumulation_steps", gas},
              {"gradient_clipping", clip},
              {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.01}, {"weight_decay", 0.01}}}}},
              // Small buckets: several buckets, launched from hooks during backward.
              {"zero_optimization", {{"stage", 0}, {"reduce_bucket_size", 40}}}};
}

// Each rank trains on its own slice of every global batch: rank r of W takes samples
// [step*B + r*micro*gas ...). Returns the final parameters.
std::vector<at::Tensor> train(int rank, int world, int micro, int gas, int steps, double clip,
                              int64_t model_seed) {
  auto model = std::make_shared<TinyNetImpl>(model_seed);
  auto [engine, optimizer, sched] = initialize(model, engine_config(micro, gas, clip));
  const int64_t global = static_cast<int64_t>(micro) * gas * world;
  for (int s = 0; s < steps; ++s) {
    for (int m = 0; m < gas; ++m) {
      auto [x, y] = tiny_batch(s * global + (static_cast<int64_t>(rank) * gas + m) * micro, micro);
      engine->backward(engine->forward(x, y));
      engine->step();
    }
  }
  std::vector<at::Tensor> out;
  for (auto& p : model->parameters()) out.push_back(p.detach().clone());
  return out;
}

void save_params(int rank, const std::vector<at::Tensor>& ps) {
  torch::save(ps, testing::rank_output_dir() + "/params" + std::to_string(rank) + ".pt");
}

std::vector<at::Tensor> load_params(int rank) {
  std::vector<at::Tensor> ps;
  torch::load(ps, testing::rank_output_dir() + "/params" + std::to_string(rank) + ".pt");
  return ps;
}

void expect_match(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& want,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    double diff = (got[i] - want[i]).abs().max().item<double>();
    EXPECT_LE(diff, 2e-6) << what << ": tensor " << i << " max abs diff " << diff;
  }
}

// Ranks build their model from a per-rank seed: only the broadcast from rank 0 makes them agree.
TEST(EngineDist, TwoRanksMatchOneRankWithDoubleMicroBatch) {
  constexpr int kSteps = 6;
  run_ranks(2, [](int rank, int world) {
    save_params(rank, train(rank, world, /*micro=*/2, /*gas=*/1, kSteps, 0.0, 1234 + rank));
  });
  auto reference = train(0, 1, /*micro=*/4, 1, kSteps, 0.0, 1234);
  expect_match(load_params(0), reference, "rank 0");
  expect_match(load_params(1), reference, "rank 1");
}

TEST(EngineDist, FourRanksWithAccumulationAndClippingMatchOneRank) {
  constexpr int kSteps = 4;
  run_ranks(4, [](int rank, int world) {
    save_params(rank, train(rank, world, /*micro=*/1, /*gas=*/2, kSteps, /*clip=*/0.05, 99 + rank));
  });
  auto reference = train(0, 1, /*micro=*/8, 1, kSteps, 0.05, 99);
  for (int r = 0; r < 4; ++r) expect_match(load_params(r), reference, "rank " + std::to_string(r));
}

// An elastic config (DeepSpeed's `elasticity`): batch 8 for 1, 2 and 4 ranks, each size with its
// own micro-batch and accumulation. Each rank reads them from its engine and trains on its slice.
std::vector<at::Tensor> train_elastic(int rank, int world, int steps) {
  json cfg = {{"elasticity",
               {{"enabled", true},
                {"max_train_batch_size", 8},
                {"micro_batch_sizes", {1, 2}},
                {"min_gpus", 1},
                {"max_gpus", 4},
                {"version", 0.1}}},
              {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.01}}}}}};
  auto model = std::make_shared<TinyNetImpl>(7 + rank);
  auto [engine, optimizer, sched] = initialize(model, cfg);
  const int64_t micro = engine->train_micro_batch_size_per_gpu();
  const int64_t gas = engine->gradient_accumulation_steps();
  EXPECT_EQ(engine->train_batch_size(), 8);
  EXPECT_EQ(micro * gas * world, 8);
  for (int s = 0; s < steps; ++s) {
    for (int64_t m = 0; m < gas; ++m) {
      auto [x, y] = tiny_batch(s * 8 + (rank * gas + m) * micro, micro);
      engine->backward(engine->forward(x, y));
      engine->step();
    }
  }
  std::vector<at::Tensor> out;
  for (auto& p : model->parameters()) out.push_back(p.detach().clone());
  return out;
}

// The reference runs after run_ranks(): rank processes never return from it.
void expect_elastic_ranks_match_one_rank(int world) {
  constexpr int kSteps = 4;
  run_ranks(world, [](int rank, int world) {
    save_params(rank, train_elastic(rank, world, kSteps));
  });
  auto reference = train_elastic(0, 1, kSteps);
  for (int r = 0; r < world; ++r) {
    expect_match(load_params(r), reference,
                 std::to_string(world) + " ranks, rank " + std::to_string(r));
  }
}

TEST(EngineDist, ElasticBatchOnTwoRanksMatchesOneRank) { expect_elastic_ranks_match_one_rank(2); }
TEST(EngineDist, ElasticBatchOnFourRanksMatchesOneRank) { expect_elastic_ranks_match_one_rank(4); }

// loss = sum(w * x_r) with x_r = (r+1) * [1, 2]: the gradient each rank sees is x_r.
struct LinearSum : torch::nn::Module {
  LinearSum() { w = register_parameter("w", torch::zeros({2})); }
  torch::Tensor forward(const torch::Tensor& x) { return (w * x).sum(); }
  torch::Tensor w;
};

void check_averaging(const std::string& extra_json, float expected_factor) {
  testing::RunOptions o;
  o.env.push_back({"DS_TEST_EXTRA", extra_json});
  o.env.push_back({"DS_TEST_FACTOR", std::to_string(expected_factor)});
  run_ranks(2, [](int rank, int world) {
    json cfg = {{"train_batch_size", 2},
                {"gradient_clipping", 0.0},
                {"optimizer", {{"type", "AdamW"}}}};
    cfg.update(json::parse(std::getenv("DS_TEST_EXTRA")));
    float factor = std::stof(std::getenv("DS_TEST_FACTOR"));
    auto model = std::make_shared<LinearSum>();
    auto [engine, opt, sched] = initialize(model, cfg);
    auto x = torch::tensor({1.0f, 2.0f}) * static_cast<float>(rank + 1);
    engine->backward(engine->forward(x));
    // mean over ranks of x_r = 1.5 * [1, 2]; "sum" gives 3 * [1, 2].
    auto want = torch::tensor({1.0f, 2.0f}) * factor;
    EXPECT_TRUE(torch::allclose(model->w.grad(), want)) << model->w.grad() << " vs " << want;
    engine->step();
  }, o);
}

TEST(EngineDist, GradientAveragingMean) { check_averaging("{}", 1.5f); }
TEST(EngineDist, GradientAveragingSum) { check_averaging(R"({"gradient_allreduce_op": "sum"})", 3.0f); }
TEST(EngineDist, GradientAveragingPrescale) { check_averaging(R"({"prescale_gradients": true})", 1.5f); }
TEST(EngineDist, GradientAveragingPredivide) {
  check_averaging(R"({"gradient_predivide_factor": 4.0})", 1.5f);
}

TEST(EngineDist, ConfigForWrongWorldSizeIsRejectedWithBothNumbers) {
  run_ranks(2, [](int, int) {
    // train_batch_size 8 with micro 8 and GAS 1 only fits one rank.
    json cfg = {{"train_batch_size", 8}, {"train_micro_batch_size_per_gpu", 8},
                {"gradient_accumulation_steps", 1}};
    try {
      initialize(std::make_shared<LinearSum>(), cfg);
      ADD_FAILURE() << "expected a ConfigError";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("train_batch_size (8) != train_micro_batch_size_per_gpu "
                                           "(8) * gradient_accumulation_steps (1) * data-parallel "
                                           "size (2) = 16"),
                std::string::npos)
          << e.what();
    }
  });
}

}  // namespace
}  // namespace deepspeed
