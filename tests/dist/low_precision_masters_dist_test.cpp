// 16-bit master weights (bf16.bf16_master_weights_and_grads, bf16_optimizer_states,
// fp16.fp16_master_weights_and_grads; Note [Low-precision masters]) with ZeRO 1, 2 and 3 on 2
// Gloo ranks.
//
// Both ranks train on the same samples and reduce in fp32, so the averaged gradient is each
// rank's own bit for bit (g + g is exact, and so is halving it): the partitioned engine must then
// end with the parameters of one process that steps the bf16 model's own parameters with
// DeepSpeed's Adam, fp32 moments, and rounds them to bf16 after every update, exactly. A run
// with fp32 masters keeps the updates a bf16 parameter cannot hold and ends elsewhere (checked,
// so that the comparison can tell the two apart).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "deepspeed/checkpoint.h"
#include "deepspeed/deepspeed.h"
#include "deepspeed/optimizers.h"
#include "support/bf16_params.h"
#include "support/multi_rank.h"
#include "support/odd_sized_net.h"
#include "support/onebit_fp16_model.h"

namespace deepspeed {
namespace {

using testing::expect_bf16_params_equal;
using testing::params_of;
using testing::run_ranks;

constexpr int kSteps = 6;
constexpr double kLr = 0.01;
constexpr double kWeightDecay = 0.1;

using Net = testing::OddSizedNet;

struct Case {
  int stage = 2;
  bool offload = true;
  bool masters_16bit = true;       // bf16_master_weights_and_grads
  bool bf16_optimizer_states = false;
};

json config(const Case& c) {
  json zero = {{"stage", c.stage}, {"reduce_bucket_size", 40}};
  if (c.stage == 3) zero["stage3_param_persistence_threshold"] = 0;
  if (c.offload) zero["offload_optimizer"] = {{"device", "cpu"}};
  json bf16 = {{"enabled", true}};
  if (c.masters_16bit) bf16["bf16_master_weights_and_grads"] = true;
  if (c.bf16_optimizer_states) bf16["bf16_optimizer_states"] = true;
  return {{"train_micro_batch_size_per_gpu", 2},
          {"gradient_accumulation_steps", 1},
          {"communication_data_type", "fp32"},
          {"optimizer",
           {{"type", "AdamW"}, {"params", {{"lr", kLr}, {"weight_decay", kWeightDecay}}}}},
          {"zero_optimization", zero},
          {"bf16", bf16}};
}

// The same samples on every rank.
at::Tensor batch(int step) {
  torch::manual_seed(1000 + step);
  return torch::randn({2, 7}).to(torch::kBFloat16);
}

// One process: the bf16 model's parameters stepped by DeepSpeed's Adam in place.
std::vector<at::Tensor> one_process(int steps, bool fp32_moments) {
  auto model = std::make_shared<Net>();
  model->to(torch::kBFloat16);
  optim::AdamOptions options;
  options.lr = kLr;
  options.weight_decay = kWeightDecay;
  optim::Adam adam(model->parameters(), options, /*adam_w_mode=*/true);
  adam.set_fp32_optimizer_states(fp32_moments);
  for (int s = 0; s < steps; ++s) {
    adam.zero_grad();
    model->forward(batch(s)).backward();
    adam.step();
  }
  return params_of(*model);
}

struct Trained {
  std::vector<at::Tensor> params;
  MemoryStats memory;
};

Trained train(const Case& c, int steps) {
  auto model = std::make_shared<Net>();
  auto engine = initialize(model, config(c)).engine;
  for (int s = 0; s < steps; ++s) {
    engine->backward(engine->forward(batch(s)));
    engine->step();
  }
  return {params_of(*model), engine->memory_stats()};
}

template <int kStage>
void bf16_masters_match_one_process(int, int) {
  Case c;
  c.stage = kStage;
  const Trained got = train(c, kSteps);
  const std::string what = "stage " + std::to_string(kStage);
  expect_bf16_params_equal(got.params, one_process(kSteps, /*fp32_moments=*/true), what);
  // The masters are the model's own bf16 partitions: none kept apart.
  EXPECT_EQ(got.memory.master_param_bytes, 0) << what;
  EXPECT_GT(got.memory.optimizer_state_bytes, 0) << what;
  // fp32 masters end elsewhere: the comparison above can tell them apart.
  Case fp32_masters = c;
  fp32_masters.masters_16bit = false;
  const Trained other = train(fp32_masters, kSteps);
  bool differs = false;
  for (size_t i = 0; i < other.params.size(); ++i) {
    differs = differs || !torch::equal(other.params[i], got.params[i]);
  }
  EXPECT_TRUE(differs) << what << ": fp32 masters gave the same parameters";
  EXPECT_GT(other.memory.master_param_bytes, 0) << what;
}

TEST(LowPrecisionMastersDist, Bf16MastersStage1MatchOneProcessOn2Ranks) {
  run_ranks(2, bf16_masters_match_one_process<1>);
}
TEST(LowPrecisionMastersDist, Bf16MastersStage2MatchOneProcessOn2Ranks) {
  run_ranks(2, bf16_masters_match_one_process<2>);
}
TEST(LowPrecisionMastersDist, Bf16MastersStage3MatchOneProcessOn2Ranks) {
  run_ranks(2, bf16_masters_match_one_process<3>);
}

// bf16_optimizer_states: the moments in bf16 too. Without offload any optimizer steps on the
// device (here DeepSpeed's Adam, whose state follows its bf16 parameters); offloaded, CPU Adam
// keeps bf16 moments: half the state bytes of fp32 moments.
template <int kStage, bool kOffload>
void bf16_optimizer_states_match_one_process(int, int) {
  Case c;
  c.stage = kStage;
  c.offload = kOffload;
  c.bf16_optimizer_states = true;
  const Trained got = train(c, kSteps);
  const std::string what = "stage " + std::to_string(kStage) + (kOffload ? " offloaded" : "");
  expect_bf16_params_equal(got.params, one_process(kSteps, /*fp32_moments=*/false), what);
  Case fp32_moments = c;
  fp32_moments.offload = true;
  fp32_moments.bf16_optimizer_states = false;
  EXPECT_EQ(2 * got.memory.optimizer_state_bytes,
            train(fp32_moments, 1).memory.optimizer_state_bytes)
      << what;
}

TEST(LowPrecisionMastersDist, Bf16OptimizerStatesStage2OnDeviceOn2Ranks) {
  run_ranks(2, bf16_optimizer_states_match_one_process<2, false>);
}
TEST(LowPrecisionMastersDist, Bf16OptimizerStatesStage3OffloadedOn2Ranks) {
  run_ranks(2, bf16_optimizer_states_match_one_process<3, true>);
}

// The offload path of a model on a GPU (separate host masters and gradients, copies through a
// side stream), on CPU: host masters in bf16, the same parameters.
TEST(LowPrecisionMastersDist, Bf16MastersHostBuffersStage2On2Ranks) {
  testing::RunOptions options;
  options.env = {{"DS_TEST_OFFLOAD_HOST_BUFFERS_ON_CPU", "1"}};
  run_ranks(
      2,
      [](int, int) {
        Case c;
        const Trained got = train(c, kSteps);
        expect_bf16_params_equal(got.params, one_process(kSteps, true), "host buffers");
        // The host masters are bf16: 2 bytes per owned element, apart from the parameters.
        EXPECT_GT(got.memory.master_param_bytes, 0);
        EXPECT_EQ(got.memory.offloaded_optimizer_bytes,
                  got.memory.optimizer_state_bytes + got.memory.master_param_bytes);
        EXPECT_EQ(4 * got.memory.master_param_bytes, got.memory.optimizer_state_bytes);
      },
      options);
}

// Checkpoints keep the bf16 masters in DeepSpeed's keys (single_partition_of_fp32_groups /
// fp32_flat_groups hold bf16 tensors, as DeepSpeed's do) and the fp32 moments; a resume
// continues bit for bit.
template <int kStage>
void resume_is_exact(int rank, int) {
  Case c;
  c.stage = kStage;
  const std::string dir = testing::rank_output_dir() + "/ckpt";
  {
    auto model = std::make_shared<Net>();
    auto engine = initialize(model, config(c)).engine;
    for (int s = 0; s < 3; ++s) {
      engine->backward(engine->forward(batch(s)));
      engine->step();
    }
    engine->save_checkpoint(dir, std::string("t"));
  }
  auto model = std::make_shared<Net>();
  auto engine = initialize(model, config(c)).engine;
  engine->load_checkpoint(dir, std::string("t"));
  for (int s = 3; s < kSteps; ++s) {
    engine->backward(engine->forward(batch(s)));
    engine->step();
  }
  expect_bf16_params_equal(params_of(*model), one_process(kSteps, true), "resumed");
  const auto file = checkpoint::find_zero_optim_states_file(dir + "/t", rank, 0, true);
  const auto top = checkpoint::load(file).toGenericDict();
  const auto osd = top.at("optimizer_state_dict").toGenericDict();
  const char* key = kStage == 3 ? "fp32_flat_groups" : "single_partition_of_fp32_groups";
  for (const auto& m : osd.at(key).toList()) {
    EXPECT_EQ(m.get().toTensor().scalar_type(), torch::kBFloat16) << key;
  }
  const auto state = osd.at(kStage == 3 ? "optimizer_state_dict" : "base_optimizer_state")
                         .toGenericDict()
                         .at("state")
                         .toGenericDict();
  ASSERT_GT(state.size(), 0u);
  for (const auto& entry : state) {
    EXPECT_EQ(entry.value().toGenericDict().at("exp_avg").toTensor().scalar_type(),
              torch::kFloat);
  }
}

TEST(LowPrecisionMastersDist, Bf16MastersStage2ResumeIsExactOn2Ranks) {
  run_ranks(2, resume_is_exact<2>);
}
TEST(LowPrecisionMastersDist, Bf16MastersStage3ResumeIsExactOn2Ranks) {
  run_ranks(2, resume_is_exact<3>);
}

// fp16 masters: CPU Adam with fp32 moments under the dynamic loss scaler; the model (elementwise:
// Debian's LibTorch has no fp16 matmul on CPU) learns, and its fp16 parameters are the masters.
TEST(LowPrecisionMastersDist, Fp16MastersStage2TrainOn2Ranks) {
  run_ranks(2, [](int rank, int) {
    json cfg = config(Case{});
    cfg.erase("bf16");
    cfg["fp16"] = {{"enabled", true}, {"fp16_master_weights_and_grads", true},
                   {"initial_scale_power", 8}};
    auto model = std::make_shared<testing::OneBitFp16Model>();
    auto engine = initialize(model, cfg).engine;
    double first = 0.0, last = 0.0;
    for (int s = 0; s < 30; ++s) {
      auto [x, y] = testing::onebit_fp16_batch(s % 4, rank);
      auto loss = engine->forward(x.to(torch::kHalf), y.to(torch::kHalf));
      (s == 0 ? first : last) = loss.item<double>();
      engine->backward(loss);
      engine->step();
    }
    for (auto& p : model->parameters()) EXPECT_EQ(p.scalar_type(), torch::kHalf);
    EXPECT_EQ(engine->memory_stats().master_param_bytes, 0);
    EXPECT_LT(last, 0.5 * first) << "first loss " << first;
  });
}

}  // namespace
}  // namespace deepspeed
