// Mixed precision end to end: the example GPT (train_gpt under the deepspeed launcher, 2 ranks,
// the committed Austen fixture) trained in fp32 and in bf16 under ZeRO stages 0 and 2; bf16's
// loss curve must track fp32's. fp16 runs too where LibTorch has fp16 matmul on CPU.
// The tolerance and the measurements behind it: docs/precision.md, "Loss curves against fp32".
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>
#include <torch/version.h>

#include "support/run_command.h"
#include "support/temp_dir.h"
#include "support/test_port.h"

namespace deepspeed {
namespace {

using testing::run_command;

constexpr int kSteps = 300;
// Curves are compared as moving averages over kWindow optimizer steps, from step kWindow on.
constexpr int kWindow = 20;
// Measured max deviation of the averaged bf16 curve: 0.25% (stage 0), 0.24% (stage 2). bf16
// without fp32 master weights (updates rounded into bf16 weights) drifts to 1.9-2.0%, so 1%
// leaves 4x margin either way.
constexpr double kTolerance = 0.01;
// fp32 under ZeRO-2 reduces in another order than stage 0: measured < 0.0001%.
constexpr double kFp32StageTolerance = 1e-3;

const nlohmann::json kFp32 = nlohmann::json::object();

// The training loss of every optimizer step (averaged over ranks) of one train_gpt run.
std::vector<double> train(const testing::TempDir& dir, const std::string& name,
                          const nlohmann::json& precision, int stage) {
  // lr 2e-4: updates are a few bf16 ulps of the weights, so master weights matter.
  nlohmann::json config = {
      {"train_micro_batch_size_per_gpu", 1},
      {"gradient_accumulation_steps", 2},
      {"steps_per_print", kSteps},
      {"gradient_clipping", 1.0},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 2e-4}, {"weight_decay", 0.0}}}}},
      {"zero_optimization", {{"stage", stage}}}};
  config.update(precision);
  testing::write_text_file(dir.file(name + ".json"), config.dump());
  const std::string cmd =
      std::string("OMP_NUM_THREADS=1 ") + DS_LAUNCHER_BIN + " --num_gpus 2 --master_port " +
      std::to_string(testing::reserve_port()) + " " + DS_TRAIN_GPT_BIN +
      " --deepspeed_config " + dir.file(name + ".json") + " --data " + dir.file("corpus.txt") +
      " --steps " + std::to_string(kSteps) +
      " --n_layer 2 --n_head 2 --n_embd 32 --seq_len 32 --compact_vocab --eval_batches 1" +
      " --metrics_file " + dir.file(name + ".jsonl");
  auto r = run_command(cmd);
  EXPECT_EQ(r.exit_code, 0) << name << ": " << r.out << r.err;
  std::vector<double> losses;
  std::ifstream metrics(dir.file(name + ".jsonl"));
  std::string line;
  while (std::getline(metrics, line)) {
    losses.push_back(nlohmann::json::parse(line)["loss"].get<double>());
  }
  EXPECT_EQ(losses.size(), static_cast<size_t>(kSteps)) << name << ": " << r.out << r.err;
  return losses;
}

std::vector<double> moving_average(const std::vector<double>& x) {
  std::vector<double> out;
  double sum = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    sum += x[i];
    if (i >= static_cast<size_t>(kWindow)) sum -= x[i - kWindow];
    out.push_back(sum / static_cast<double>(std::min<size_t>(i + 1, kWindow)));
  }
  return out;
}

// max over steps >= kWindow of |ma(got) - ma(want)| / ma(want); prints it for the docs.
double max_relative_deviation(const std::vector<double>& got, const std::vector<double>& want,
                              const std::string& what) {
  if (got.size() != want.size() || got.size() < static_cast<size_t>(kWindow)) return INFINITY;
  const auto a = moving_average(got), b = moving_average(want);
  double worst = 0.0;
  size_t at = 0;
  for (size_t i = kWindow - 1; i < a.size(); ++i) {
    const double d = std::abs(a[i] - b[i]) / b[i];
    if (d > worst) {
      worst = d;
      at = i + 1;
    }
  }
  std::printf("%s: max deviation of the %d-step moving average from fp32: %.4f%% at step %zu; "
              "final %.4f vs %.4f\n",
              what.c_str(), kWindow, 100.0 * worst, at, a.back(), b.back());
  return worst;
}

class PrecisionE2E : public ::testing::Test {
 protected:
  void SetUp() override {
    std::ifstream src(DS_FIXTURE_TEXT);
    std::ofstream(dir_.file("corpus.txt")) << src.rdbuf();
  }
  testing::TempDir dir_;
};

TEST_F(PrecisionE2E, Bf16LossCurveTracksFp32UnderZero0And2) {
  const auto fp32_z0 = train(dir_, "fp32_z0", kFp32, 0);
  const auto fp32_z2 = train(dir_, "fp32_z2", kFp32, 2);
  const nlohmann::json bf16 = {{"bf16", {{"enabled", true}}}};
  const auto bf16_z0 = train(dir_, "bf16_z0", bf16, 0);
  const auto bf16_z2 = train(dir_, "bf16_z2", bf16, 2);
  ASSERT_EQ(fp32_z0.size(), static_cast<size_t>(kSteps));
  // The comparison means something only if the model learned: ~7.0 -> ~6.0 nats.
  const auto ma = moving_average(fp32_z0);
  EXPECT_LT(ma.back(), fp32_z0.front() - 0.5);
  EXPECT_LE(max_relative_deviation(fp32_z2, fp32_z0, "fp32 ZeRO-2"), kFp32StageTolerance);
  EXPECT_LE(max_relative_deviation(bf16_z0, fp32_z0, "bf16 ZeRO-0"), kTolerance);
  EXPECT_LE(max_relative_deviation(bf16_z2, fp32_z0, "bf16 ZeRO-2"), kTolerance);
}

bool cpu_has_fp16_matmul() {
  try {
    auto a = torch::ones({2, 2}, torch::kHalf);
    (void)torch::matmul(a, a);
    return true;
  } catch (const c10::Error&) {
    return false;
  }
}

TEST_F(PrecisionE2E, Fp16WithDynamicLossScalingTracksFp32) {
  if (!cpu_has_fp16_matmul()) {
    GTEST_SKIP() << "LibTorch " << TORCH_VERSION
                 << " has no fp16 matmul on CPU (\"addmm_impl_cpu_\" not implemented for "
                    "'Half'), so the GPT cannot train in fp16 here; the loss scaler is tested "
                    "on an elementwise model in precision_dist_test";
  }
  const auto fp32_z0 = train(dir_, "fp32_z0", kFp32, 0);
  // Dynamic scaling (loss_scale 0); early overflow skips shift the curve by a few steps only.
  const nlohmann::json fp16 = {{"fp16", {{"enabled", true}, {"loss_scale", 0}}}};
  EXPECT_LE(max_relative_deviation(train(dir_, "fp16_z0", fp16, 0), fp32_z0, "fp16 ZeRO-0"),
            kTolerance);
  EXPECT_LE(max_relative_deviation(train(dir_, "fp16_z2", fp16, 2), fp32_z0, "fp16 ZeRO-2"),
            kTolerance);
}

}  // namespace
}  // namespace deepspeed
