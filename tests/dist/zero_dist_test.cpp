// ZeRO stages 1 and 2 on N Gloo ranks: the same parameters after K steps as stage 0 and as a
// single process (gradient accumulation, clipping, a parameter count that W does not divide,
// frozen and unused parameters, two param groups), for every reduction variant the
// zero_optimization keys select; the per-rank memory follows the ZeRO formula; reductions start
// while backward still runs.
#include "deepspeed/deepspeed.h"

#include <cstdlib>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "runtime/zero/zero_optimizer.h"
#include "support/multi_rank.h"
#include "support/tiny_model.h"

namespace deepspeed {
namespace {

using testing::run_ranks;
using testing::TinyNetImpl;
using testing::tiny_batch;

constexpr int kSteps = 5;
constexpr int kMicro = 1;
constexpr int kGas = 2;
constexpr double kClip = 0.05;

// Two groups with their own hyper-parameters: weights decay, biases do not (and learn faster).
std::unique_ptr<torch::optim::Optimizer> two_group_adamw(torch::nn::Module& m) {
  std::vector<at::Tensor> weights, biases;
  for (auto& p : m.named_parameters()) {
    (p.key().find("bias") != std::string::npos ? biases : weights).push_back(p.value());
  }
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(weights, std::make_unique<torch::optim::AdamWOptions>(
                                   torch::optim::AdamWOptions(0.01).weight_decay(0.1)));
  groups.emplace_back(biases, std::make_unique<torch::optim::AdamWOptions>(
                                  torch::optim::AdamWOptions(0.02).weight_decay(0.0)));
  return std::make_unique<torch::optim::AdamW>(std::move(groups),
                                              torch::optim::AdamWOptions(0.01));
}

// Rank r of W trains on its own slice of every global batch. `zero` is the zero_optimization
// section. Returns the final parameters (every module parameter, frozen ones included) and, last,
// the global gradient norm of every step: Adam is blind to a gradient's scale, the norm is not.
// With `config_groups` the optimizer comes from the config over deepspeed::ParamGroup groups
// (DeepSpeed's model_parameters), else from the client (two_group_adamw).
std::vector<at::Tensor> train(int rank, int world, int micro, const json& zero,
                              int64_t model_seed, bool config_groups = false) {
  auto model = std::make_shared<TinyNetImpl>(model_seed);
  json cfg = {{"train_micro_batch_size_per_gpu", micro},
              {"gradient_accumulation_steps", kGas},
              {"gradient_clipping", kClip},
              {"zero_optimization", zero}};
  std::shared_ptr<ModuleEngine<TinyNetImpl>> engine;
  if (config_groups) {
    cfg["optimizer"] = {{"type", "AdamW"}, {"params", {{"lr", 0.01}, {"weight_decay", 0.1}}}};
    std::vector<ParamGroup> groups(2);
    for (auto& p : model->named_parameters()) {
      groups[p.key().find("bias") != std::string::npos ? 1 : 0].params.push_back(p.value());
    }
    groups[1].options = {{"lr", 0.02}, {"weight_decay", 0.0}};
    engine = initialize(model, cfg, groups).engine;
  } else {
    engine = initialize(model, cfg, two_group_adamw(*model)).engine;
  }
  const int64_t global = static_cast<int64_t>(micro) * kGas * world;
  std::vector<double> norms;
  for (int s = 0; s < kSteps; ++s) {
    for (int m = 0; m < kGas; ++m) {
      auto [x, y] =
          tiny_batch(s * global + (static_cast<int64_t>(rank) * kGas + m) * micro, micro);
      engine->backward(engine->forward(x, y));
      engine->step();
    }
    norms.push_back(*engine->get_global_grad_norm());
  }
  std::vector<at::Tensor> out;
  for (auto& p : model->parameters()) out.push_back(p.detach().clone());
  out.push_back(torch::tensor(norms, torch::kDouble));
  return out;
}

std::string out_file(int rank) {
  return testing::rank_output_dir() + "/params" + std::to_string(rank) + ".pt";
}

void expect_match(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& want,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    // fp32 on CPU: within 1e-6 relative (the reduction order differs from one process).
    auto tol = want[i].abs() * 1e-6 + 1e-7;
    auto excess = ((got[i] - want[i]).abs() - tol).max().item<double>();
    EXPECT_LE(excess, 0.0) << what << ": tensor " << i << " differs by "
                           << (got[i] - want[i]).abs().max().item<double>();
  }
}

// Runs `zero` on `world` ranks and checks every rank against one process with stage 0.
void check_against_single_process(int world, const json& zero, bool config_groups = false) {
  testing::RunOptions o;
  o.env.push_back({"DS_TEST_ZERO", zero.dump()});
  o.env.push_back({"DS_TEST_CONFIG_GROUPS", config_groups ? "1" : "0"});
  run_ranks(world, [](int rank, int w) {
    json z = json::parse(std::getenv("DS_TEST_ZERO"));
    const bool groups = std::string(std::getenv("DS_TEST_CONFIG_GROUPS")) == "1";
    torch::save(train(rank, w, kMicro, z, 4321 + rank, groups), out_file(rank));
  }, o);
  auto reference = train(0, 1, kMicro * world, json{{"stage", 0}}, 4321, config_groups);
  for (int r = 0; r < world; ++r) {
    std::vector<at::Tensor> got;
    torch::load(got, out_file(r));
    expect_match(got, reference, zero.dump() + " on " + std::to_string(world) + " ranks, rank " +
                                     std::to_string(r));
  }
}

// Small buckets: several per backward, parameters split across buckets and partitions.
json stage(int s) { return json{{"stage", s}, {"reduce_bucket_size", 24}}; }

TEST(ZeroDist, Stage1MatchesSingleProcessOn2Ranks) { check_against_single_process(2, stage(1)); }
TEST(ZeroDist, Stage1MatchesSingleProcessOn3Ranks) { check_against_single_process(3, stage(1)); }
TEST(ZeroDist, Stage1MatchesSingleProcessOn4Ranks) { check_against_single_process(4, stage(1)); }
TEST(ZeroDist, Stage2MatchesSingleProcessOn2Ranks) { check_against_single_process(2, stage(2)); }
TEST(ZeroDist, Stage2MatchesSingleProcessOn3Ranks) { check_against_single_process(3, stage(2)); }
TEST(ZeroDist, Stage2MatchesSingleProcessOn4Ranks) { check_against_single_process(4, stage(2)); }
TEST(ZeroDist, Stage0MatchesSingleProcessOn3Ranks) { check_against_single_process(3, stage(0)); }

TEST(ZeroDist, Stage2ReduceToOwnersWithOverlapMatches) {
  json z = stage(2);
  z["use_multi_rank_bucket_allreduce"] = false;  // dist.reduce of each owner's range
  z["overlap_comm"] = true;
  z["allgather_bucket_size"] = 8;
  check_against_single_process(3, z);
}

TEST(ZeroDist, Stage2AllReduceNoContiguousRoundRobinBroadcastMatches) {
  json z = stage(2);
  z["reduce_scatter"] = false;
  z["contiguous_gradients"] = false;
  z["round_robin_gradients"] = true;
  z["allgather_partitions"] = false;
  check_against_single_process(3, z);
}

TEST(ZeroDist, Stage2WithConfigOptimizerOverParamGroupsMatches) {
  check_against_single_process(3, stage(2), /*config_groups=*/true);
}

TEST(ZeroDist, Stage1OverlapWithLargeBucketMatches) {
  json z = {{"stage", 1}, {"overlap_comm", true}};
  check_against_single_process(2, z);
}

// A stack of Linear layers: every parameter gets a gradient, in reverse order.
struct Stack : torch::nn::Module {
  explicit Stack(int64_t width = 32, int layers = 4) {
    torch::manual_seed(7);
    for (int i = 0; i < layers; ++i) {
      fcs.push_back(register_module("fc" + std::to_string(i), torch::nn::Linear(width, width)));
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& fc : fcs) x = torch::tanh(fc(x));
    return x.pow(2).mean();
  }
  std::vector<torch::nn::Linear> fcs;
};

TEST(ZeroDist, ReductionsAreLaunchedFromHooksDuringBackward) {
  run_ranks(2, [](int rank, int) {
    for (int s : {0, 1, 2}) {
      auto model = std::make_shared<Stack>();
      json cfg = {{"train_batch_size", 4},
                  {"optimizer", {{"type", "AdamW"}}},
                  {"zero_optimization",
                   {{"stage", s}, {"reduce_bucket_size", 1056}, {"overlap_comm", true}}}};
      auto [engine, opt, sched] = initialize(model, cfg);
      engine->backward(engine->forward(torch::randn({2, 32})));
      auto st = engine->reduction_stats();
      // 4 layers of 32*32+32 = 1056 elements: one bucket per layer; all but the last layer's
      // (fc0, the end of backward) are issued from the gradient hooks.
      EXPECT_EQ(st.buckets_launched, 4) << "stage " << s;
      EXPECT_GE(st.buckets_launched_from_hooks, 3) << "stage " << s;
      engine->step();
    }
  });
}

TEST(ZeroDist, MemoryFollowsTheZeroFormula) {
  run_ranks(2, [](int rank, int world) {
    const int64_t psi = 4 * (32 * 32 + 32);  // 4224 parameters
    const int64_t padded = (psi + 2 * world - 1) / (2 * world) * (2 * world);
    const int64_t part = padded / world;
    MemoryStats m[3];
    for (int s : {0, 1, 2}) {
      auto model = std::make_shared<Stack>();
      json cfg = {{"train_micro_batch_size_per_gpu", 2},
                  {"gradient_accumulation_steps", 2},
                  {"optimizer", {{"type", "AdamW"}}},
                  {"zero_optimization", {{"stage", s}, {"reduce_bucket_size", 1000}}}};
      auto [engine, opt, sched] = initialize(model, cfg);
      for (int micro = 0; micro < 2; ++micro) {
        engine->backward(engine->forward(torch::randn({2, 32})));
        engine->step();
      }
      // Mid-accumulation: the gradients a stage keeps between micro-steps.
      engine->backward(engine->forward(torch::randn({2, 32})));
      m[s] = engine->memory_stats();
      engine->step();
      EXPECT_FALSE(engine->memory_report().empty());
    }
    // Stage 0: 4 bytes of parameters and of gradients, 8 of Adam state per parameter.
    EXPECT_EQ(m[0].param_bytes, 4 * psi);
    EXPECT_EQ(m[0].grad_bytes, 4 * psi);
    EXPECT_EQ(m[0].optimizer_state_bytes, 8 * psi);
    // Stage 1: optimizer state for the owned slice only; full gradients between micro-steps,
    // plus the owned gradient partition.
    EXPECT_EQ(m[1].param_bytes, 4 * padded);
    EXPECT_EQ(m[1].optimizer_state_bytes, 8 * part);
    EXPECT_EQ(m[1].grad_bytes, 4 * psi + 4 * part);
    // Stage 2: gradients too, for the owned slice only (plus the stated reduction buffer).
    EXPECT_EQ(m[2].optimizer_state_bytes, 8 * part);
    EXPECT_EQ(m[2].grad_bytes, 4 * part);
    EXPECT_EQ(m[2].comm_buffer_bytes, 4 * 1024);  // one buffer of the largest bucket (a weight)
    EXPECT_EQ(m[2].padding_elements, padded - psi);
    const int64_t overhead = m[2].comm_buffer_bytes + 12 * m[2].padding_elements;
    EXPECT_LE(m[2].grad_bytes + m[2].optimizer_state_bytes,
              (m[0].grad_bytes + m[0].optimizer_state_bytes) / world + overhead);
  });
}

TEST(ZeroDist, UnusedParameterIsAnErrorWhenNotIgnored) {
  testing::RunOptions o;
  o.expect_failure = true;
  auto results = run_ranks(2, [](int, int) {
    auto model = std::make_shared<TinyNetImpl>();
    json cfg = {{"train_batch_size", 2},
                {"optimizer", {{"type", "AdamW"}}},
                {"zero_optimization", {{"stage", 2}, {"ignore_unused_parameters", false}}}};
    auto [engine, opt, sched] = initialize(model, cfg);
    auto [x, y] = tiny_batch(0, 1);
    engine->backward(engine->forward(x, y));
  }, o);
  for (const auto& r : results) {
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.output.find("'unused.weight' got no gradient"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("ignore_unused_parameters"), std::string::npos) << r.output;
  }
}

TEST(ZeroDist, ReduceScatterRefusesPrescaleAndPredivide) {
  run_ranks(2, [](int, int) {
    for (const char* extra : {R"({"prescale_gradients": true})",
                              R"({"gradient_predivide_factor": 2.0})"}) {
      json cfg = {{"train_batch_size", 2},
                  {"optimizer", {{"type", "AdamW"}}},
                  {"zero_optimization", {{"stage", 2}}}};
      cfg.update(json::parse(extra));
      try {
        initialize(std::make_shared<TinyNetImpl>(), cfg);
        ADD_FAILURE() << "expected a ConfigError for " << extra;
      } catch (const ConfigError& e) {
        EXPECT_NE(std::string(e.what()).find("reduce scatter"), std::string::npos) << e.what();
      }
    }
  });
}

TEST(ZeroDist, UntestedOptimizerNeedsTheConfigKey) {
  run_ranks(2, [](int, int) {
    auto model = std::make_shared<TinyNetImpl>();
    json cfg = {{"train_batch_size", 2}, {"zero_optimization", {{"stage", 1}}}};
    auto sgd = [&] {
      return std::make_unique<torch::optim::SGD>(model->parameters(),
                                                 torch::optim::SGDOptions(0.1));
    };
    try {
      initialize(model, cfg, sgd());
      ADD_FAILURE() << "expected a ConfigError";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("zero_allow_untested_optimizer"), std::string::npos);
    }
    cfg["zero_allow_untested_optimizer"] = true;
    auto [engine, opt, sched] = initialize(model, cfg, sgd());
    auto [x, y] = tiny_batch(0, 1);
    engine->backward(engine->forward(x, y));
    engine->step();
  });
}

}  // namespace
}  // namespace deepspeed
