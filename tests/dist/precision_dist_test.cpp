// Mixed precision on Gloo ranks: an inf in one rank's gradient skips the step on every rank and
// leaves parameters and optimizer state bit-identical, with DeepSpeed's loss-scale sequence;
// bf16 with ZeRO 0/1/2 agrees across stages and tracks fp32.
#include "deepspeed/deepspeed.h"

#include <cstdlib>
#include <limits>

#include <gtest/gtest.h>
#include <torch/serialize.h>
#include <torch/torch.h>

#include "deepspeed/optimizers.h"
#include "support/multi_rank.h"
#include "support/tiny_model.h"

namespace deepspeed {
namespace {

using testing::run_ranks;

// Elementwise only: Debian's LibTorch 1.13 has no fp16 matmul on CPU, but fp16 elementwise
// kernels, which is all the loss-scaling machinery needs.
struct Elementwise : torch::nn::Module {
  Elementwise() {
    torch::manual_seed(3);
    w = register_parameter("w", torch::randn({37}));
    b = register_parameter("b", torch::randn({37}) * 0.1);
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& y) {
    return (w * x + b - y).pow(2).mean();
  }
  torch::Tensor w, b;
};

std::pair<torch::Tensor, torch::Tensor> batch(int64_t step, int rank) {
  auto g = torch::arange(37, torch::kFloat) * 0.1 + step * 0.37 + rank;
  return {torch::sin(g), torch::cos(g * 0.5)};
}

std::vector<at::Tensor> snapshot(torch::nn::Module& m, torch::optim::Optimizer& opt) {
  std::vector<at::Tensor> out;
  for (auto& p : m.parameters()) out.push_back(p.detach().clone());
  auto state = optim::optimizer_state_dict(opt).toGenericDict().at("state").toGenericDict();
  for (const auto& entry : state) {
    for (const auto& field : entry.value().toGenericDict()) {
      if (field.value().isTensor()) out.push_back(field.value().toTensor().clone());
    }
  }
  return out;
}

void expect_identical(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << "tensor " << i;
}

TEST(PrecisionDist, InfOnOneRankSkipsTheStepEverywhere) {
  run_ranks(2, [](int rank, int) {
    for (int stage : {0, 1, 2}) {
      auto model = std::make_shared<Elementwise>();
      json cfg = {{"train_batch_size", 2},
                  {"fp16", {{"enabled", true}, {"initial_scale_power", 8}}},
                  {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.01}}}}},
                  {"scheduler", {{"type", "WarmupLR"},
                                 {"params", {{"warmup_min_lr", 0.001}, {"warmup_num_steps", 10},
                                             {"warmup_type", "linear"}}}}},
                  {"zero_optimization", {{"stage", stage}}}};
      auto [engine, opt, sched] = initialize(model, cfg);
      ASSERT_EQ(model->w.scalar_type(), at::kHalf);
      auto run = [&, e = engine](int64_t step, bool poison) {
        auto [x, y] = batch(step, rank);
        if (poison && rank == 1) x[5] = std::numeric_limits<float>::infinity();
        e->backward(e->forward(x.to(at::kHalf), y.to(at::kHalf)));
        e->step();
      };
      run(0, false);
      EXPECT_EQ(engine->loss_scale(), 256.0);
      const auto before = snapshot(*model, *opt);
      const double lr_before = engine->get_lr()[0];
      // ZeRO's scaler (stages 1/2) has hysteresis 2 by default: the first overflow spends it, the
      // second halves. Stage 0 follows DeepSpeed's FP16_Optimizer: every overflow halves.
      const double after_first = stage == 0 ? 128.0 : 256.0;
      run(1, true);
      expect_identical(snapshot(*model, *opt), before);
      EXPECT_EQ(engine->skipped_steps(), 1) << "stage " << stage;
      EXPECT_EQ(engine->loss_scale(), after_first) << "stage " << stage;
      EXPECT_EQ(engine->get_lr()[0], lr_before);  // the schedule does not advance
      EXPECT_EQ(engine->global_steps(), 2);
      run(2, true);
      expect_identical(snapshot(*model, *opt), before);
      EXPECT_EQ(engine->skipped_steps(), 2);
      EXPECT_EQ(engine->loss_scale(), after_first / 2) << "stage " << stage;
      run(3, false);
      EXPECT_FALSE(torch::equal(model->w.detach(), before[0])) << "a clean step updates";
      EXPECT_GT(engine->get_lr()[0], lr_before);
    }
  });
}

// Linear layers in bf16 (CPU matmul exists for bf16): ZeRO 0, 1 and 2 agree, and bf16 training
// tracks fp32 training's loss.
// TinyNet's layers with a hand-written squared error (LibTorch 1.13 has no bf16 mse_loss on CPU).
struct TinyBf16 : torch::nn::Module {
  TinyBf16() {
    torch::manual_seed(11);
    fc1 = register_module("fc1", torch::nn::Linear(4, 8));
    fc2 = register_module("fc2", torch::nn::Linear(8, 2));
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& y) {
    return (fc2(torch::tanh(fc1(x))) - y).pow(2).mean();
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

double train_tiny(int rank, int world, int stage, bool bf16, std::vector<at::Tensor>* params) {
  auto model = std::make_shared<TinyBf16>();
  json cfg = {{"train_micro_batch_size_per_gpu", 4},
              {"gradient_accumulation_steps", 2},
              {"gradient_clipping", 1.0},
              {"bf16", {{"enabled", bf16}}},
              {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.01}}}}},
              {"zero_optimization", {{"stage", stage}, {"reduce_bucket_size", 24}}}};
  auto [engine, opt, sched] = initialize(model, cfg);
  double loss = 0.0;
  const auto dtype = bf16 ? at::kBFloat16 : at::kFloat;
  for (int s = 0; s < 60; ++s) {
    for (int m = 0; m < 2; ++m) {
      auto [x, y] = testing::tiny_batch((s * 2 + m) * 4 * world + rank * 4, 4);
      auto l = engine->backward(engine->forward(x.to(dtype), y.to(dtype)));
      loss = l.to(at::kFloat).item<double>() * 2;
      engine->step();
    }
  }
  for (auto& p : model->parameters()) params->push_back(p.detach().to(at::kFloat).clone());
  return loss;
}

TEST(PrecisionDist, Bf16StagesAgreeAndTrackFp32) {
  run_ranks(2, [](int rank, int world) {
    std::vector<at::Tensor> p0, p1, p2, p32;
    const double l0 = train_tiny(rank, world, 0, true, &p0);
    const double l1 = train_tiny(rank, world, 1, true, &p1);
    const double l2 = train_tiny(rank, world, 2, true, &p2);
    const double l32 = train_tiny(rank, world, 2, false, &p32);
    for (size_t i = 0; i < p0.size(); ++i) {
      // One bf16 ulp (2^-8 relative) per step can separate stages: the reduction order differs.
      EXPECT_LE((p1[i] - p0[i]).abs().max().item<double>(), 0.05) << "stage 1 vs 0, tensor " << i;
      EXPECT_LE((p2[i] - p0[i]).abs().max().item<double>(), 0.05) << "stage 2 vs 0, tensor " << i;
    }
    // Stated tolerance: the bf16 loss after 60 steps within 10% (relative) of fp32's.
    EXPECT_NEAR(l2, l32, 0.1 * l32 + 1e-3) << "bf16 " << l2 << " fp32 " << l32;
    EXPECT_NEAR(l0, l32, 0.1 * l32 + 1e-3) << "bf16 " << l0 << " fp32 " << l32;
  });
}

}  // namespace
}  // namespace deepspeed
