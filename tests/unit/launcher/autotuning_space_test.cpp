// The autotuner's pure parts: DeepSpeed's micro-batch list, the knob space with the user's fixed
// keys and merged look-alikes, the memory prediction from the engine's formula, the tuner orders,
// the experiment's program arguments and the launcher flags it is run with.
#include "autotuning_space.h"

#include <gtest/gtest.h>

#include <set>

#include "autotuner.h"
#include "autotuning_experiment.h"
#include "runtime/memory_formula.h"
#include "usage_error.h"

namespace deepspeed::launcher {
namespace {

using nlohmann::json;
using Args = std::vector<std::string>;

TEST(AutotuningSpace, MicroBatchListMatchesDeepSpeed) {
  // get_tuning_micro_batch_size_list(1, 16, 3) with 16 samples per rank: 8, 10, 12, 14 by stride
  // 2, of which only 8 needs other accumulation steps (2) than the largest size (1); then 16.
  EXPECT_EQ(tuning_micro_batch_sizes(1, 16, 3, 16), (std::vector<int64_t>{8, 16}));
  EXPECT_EQ(tuning_micro_batch_sizes(1, 4, 3, 4), (std::vector<int64_t>{2, 4}));
  // 64 samples per rank: 8, 10, 12 need 8, 6, 5 steps; 14 needs 4, as 16 does.
  EXPECT_EQ(tuning_micro_batch_sizes(1, 16, 4, 64), (std::vector<int64_t>{8, 10, 12, 16}));
  EXPECT_EQ(tuning_micro_batch_sizes(1, 1, 3, 1), (std::vector<int64_t>{1}));
  // Sizes whose accumulation equals the largest one's are left out (here 64 / 24..31 = 2).
  EXPECT_EQ(tuning_micro_batch_sizes(1, 32, 2, 64), (std::vector<int64_t>{16, 32}));
  EXPECT_TRUE(tuning_micro_batch_sizes(0, 8, 3, 8).empty());
}

TEST(AutotuningSpace, KnobSpaceIsDeepSpeedsWithoutFixedKeysAndLookAlikes) {
  // Stage 1 of a big model: DeepSpeed's 3 x 3 bucket grid.
  EXPECT_EQ(zero_knob_configs(1, json::object(), 2000000000).size(), 9u);
  // A 10M-parameter model: every bucket size of 5e7 and more holds all gradients: one value each.
  EXPECT_EQ(zero_knob_configs(1, json::object(), 10000000).size(), 1u);
  // Stage 2: DeepSpeed's 2*2*3*3*2 = 72; with a small model 2*2*1*1*2 = 8.
  EXPECT_EQ(zero_knob_configs(2, json::object(), 2000000000).size(), 72u);
  EXPECT_EQ(zero_knob_configs(2, json::object(), 10000000).size(), 8u);
  // A key the user set is fixed: not tuned.
  const auto fixed = zero_knob_configs(2, json{{"overlap_comm", true}, {"stage", "all"}}, 10000000);
  EXPECT_EQ(fixed.size(), 4u);
  for (const auto& k : fixed) EXPECT_FALSE(k.contains("overlap_comm")) << k;
  // Stage 3 does not read allgather_partitions / allgather_bucket_size.
  const auto s3 = zero_knob_configs(3, json::object(), 2000000000);
  EXPECT_EQ(s3.size(), 2u * 2u * 3u * 2u);
  for (const auto& k : s3) EXPECT_FALSE(k.contains("allgather_partitions")) << k;
  std::set<std::string> distinct;
  for (const auto& k : s3) distinct.insert(k.dump());
  EXPECT_EQ(distinct.size(), s3.size());
}

json gpt_config(int64_t stage, int64_t mbs) {
  return {{"train_micro_batch_size_per_gpu", mbs},
          {"gradient_accumulation_steps", 1},
          {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}}},
          {"zero_optimization", {{"stage", stage}, {"reduce_bucket_size", 1000}}}};
}

TEST(AutotuningSpace, PredictionIsTheFormulaPlusCalibratedRest) {
  const int64_t psi = 1000000;
  ModelInfo info;
  info.num_params = psi;
  info.largest_param_numel = 100000;
  info.activation_bytes_per_sample = 3000000;
  // The profile run at ZeRO-3, micro-batch 1 peaked at 50 MB.
  info.peak_bytes = 50000000;
  info.profile_config = gpt_config(3, 1);
  MemoryPredictor p(info, 2);
  // Exact on the profile run itself.
  EXPECT_EQ(p.predict(gpt_config(3, 1)), info.peak_bytes);
  // ZeRO-0 adds its model states by the engine's formula: 4+4+8 bytes per parameter and a bucket.
  DeepSpeedConfig c0 = DeepSpeedConfig::from_json(gpt_config(0, 1), 2);
  const int64_t s0 =
      estimate_model_state_bytes(model_state_inputs(c0, psi, 100000, /*on_cpu=*/true)).total_peak();
  EXPECT_EQ(s0, 16 * psi);  // its gradients are views of its buckets: counted once
  EXPECT_EQ(p.model_state_bytes(gpt_config(0, 1)), s0);
  EXPECT_EQ(p.predict(gpt_config(0, 4)) - p.predict(gpt_config(0, 1)), 3 * info.activation_bytes_per_sample);
  EXPECT_GT(p.predict(gpt_config(0, 1)), p.predict(gpt_config(1, 1)));
  EXPECT_GT(p.predict(gpt_config(1, 1)), p.predict(gpt_config(2, 1)));
  // The largest micro-batch: the last one whose prediction fits.
  const int64_t budget = p.predict(gpt_config(2, 5)) + 10;
  EXPECT_EQ(p.max_micro_batch(gpt_config(2, 1), budget), 5);
  EXPECT_EQ(p.max_micro_batch(gpt_config(0, 1), p.predict(gpt_config(0, 1)) - 1), 0);
}

TEST(AutotuningSpace, TunerOrders) {
  std::vector<json> configs;
  for (int i = 0; i < 6; ++i) configs.push_back({{"a", i % 2 == 0}, {"b", i / 2}});
  TunerOrder grid("gridsearch", configs);
  std::vector<std::pair<size_t, double>> measured;
  for (size_t i = 0; i < configs.size(); ++i) {
    auto n = grid.next(measured);
    ASSERT_TRUE(n);
    EXPECT_EQ(*n, i);
    measured.emplace_back(*n, 1.0);
  }
  EXPECT_FALSE(grid.next(measured));
  // random: every configuration once, in some order.
  TunerOrder random("random", configs, 7);
  measured.clear();
  std::set<size_t> seen;
  while (auto n = random.next(measured)) {
    EXPECT_TRUE(seen.insert(*n).second);
    measured.emplace_back(*n, 0.0);
  }
  EXPECT_EQ(seen.size(), configs.size());
  // model_based: after the random start, the configuration the fitted model predicts best.
  // Metric = 10 * a + b: the best unmeasured is a=true, b=2 (index 4).
  TunerOrder model("model_based", configs, 1);
  measured = {{1, 0.0}, {2, 11.0}, {3, 1.0}, {5, 2.0}};
  auto n = model.next(measured);
  ASSERT_TRUE(n);
  EXPECT_EQ(*n, 4u);
}

TEST(AutotuningExperiment, ProgramArgsGetTheConfigAndMappedValues) {
  const json c = {{"train_micro_batch_size_per_gpu", 8}, {"zero_optimization", {{"stage", 2}}}};
  std::map<std::string, std::string> mappings{{"train_micro_batch_size_per_gpu", "--batch"},
                                              {"zero_optimization.stage", "--zero"}};
  EXPECT_EQ(experiment_program_args({"--deepspeed_config", "u.json", "--batch", "2"}, "/e/ds.json", c, mappings),
            (Args{"--deepspeed_config", "/e/ds.json", "--batch", "8", "--zero", "2"}));
  EXPECT_EQ(experiment_program_args({"--deepspeed_config=u.json"}, "/e/ds.json", c, {}),
            (Args{"--deepspeed_config=/e/ds.json"}));
  EXPECT_EQ(experiment_program_args({"--deepspeed", "u.json"}, "/e/ds.json", c, {}), (Args{"--deepspeed", "/e/ds.json"}));
  EXPECT_EQ(config_path_in_args({"--x", "--deepspeed_config", "a.json"}), "a.json");
  EXPECT_THROW(experiment_program_args({"--steps", "3"}, "/e/ds.json", c, {}), UsageError);
  EXPECT_TRUE(is_out_of_memory_text("[rank 1] error: [rank 1/2] out of memory during forward"));
  EXPECT_FALSE(is_out_of_memory_text("error: bad config"));
}

TEST(AutotuningExperiment, PortsStepByTheIndexThenByTheRetryStrideWithinTheValidRange) {
  EXPECT_EQ(experiment_port(29500, 0, 0), 29500);
  EXPECT_EQ(experiment_port(29500, 3, 0), 29503);
  EXPECT_EQ(experiment_port(29500, 3, 2), 29503 + 2 * kExperimentPortRetryStride);
  EXPECT_EQ(experiment_port(65535, 1, 0), 1024);  // wraps past 65535, never below 1024
  EXPECT_EQ(experiment_port(65000, 0, 1), 1024 + 65000 + kExperimentPortRetryStride - 65536);
  // c10d's bind failure, as torch 1.13 and 2.x word it.
  EXPECT_TRUE(is_port_in_use_text("The server socket has failed to bind to [::]:32890 (errno: 98 - Address "
                                  "already in use)."));
  EXPECT_TRUE(is_port_in_use_text("SocketError: EADDRINUSE"));
  EXPECT_FALSE(is_port_in_use_text("rendezvous failed: Connection refused"));
}

TEST(Autotuner, ExperimentsRunWithTheUsersFlagsButNotAutotuningOrThePort) {
  EXPECT_EQ(launcher_flags_without_autotuning({"--num_gpus", "2", "--autotuning", "tune", "--master_port", "1234",
                                               "prog", "--deepspeed_config", "c.json"},
                                              3),
            (Args{"--num_gpus", "2"}));
  EXPECT_EQ(launcher_flags_without_autotuning({"--autotuning=run", "-q", "prog"}, 1), (Args{"-q"}));
}

}  // namespace
}  // namespace deepspeed::launcher
