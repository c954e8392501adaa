// DeepSpeed's BF16_Optimizer gradient accumulation (Note [fp32 gradient accumulation]): bf16
// with ZeRO stage 1 and data_types.grad_accum_dtype "fp32" sums the micro-steps' gradients in
// fp32, with bf16.immediate_grad_update during backward, on 2 Gloo ranks.
//
// Both ranks train on the same samples and reduce in fp32, so the averaged gradient is each
// rank's own sum bit for bit (s/2 + s/2 is exact): the engine must end with the parameters of
// one process that adds each micro-step's bf16 gradients in fp32 and steps fp32 masters with
// DeepSpeed's AdamW. A bf16 sum (ZeRO's own stage 1, grad_accum_dtype unset) ends elsewhere:
// that is checked too, against a process that lets param.grad sum the micro-steps.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "deepspeed/deepspeed.h"
#include "deepspeed/optimizers.h"
#include "support/bf16_params.h"
#include "support/multi_rank.h"
#include "support/odd_sized_net.h"

namespace deepspeed {
namespace {

using testing::expect_bf16_params_equal;
using testing::params_of;
using testing::run_ranks;

constexpr int kSteps = 4;
constexpr int kAccumulation = 4;
constexpr double kLr = 0.01;
constexpr double kWeightDecay = 0.1;

using Net = testing::OddSizedNet;

struct Case {
  bool fp32_accumulation = true;  // data_types.grad_accum_dtype "fp32" (else unset)
  bool immediate = false;         // bf16.immediate_grad_update
};

json config(const Case& c) {
  json bf16 = {{"enabled", true}};
  if (c.immediate) bf16["immediate_grad_update"] = true;
  json j = {{"train_micro_batch_size_per_gpu", 2},
            {"gradient_accumulation_steps", kAccumulation},
            {"communication_data_type", "fp32"},
            {"optimizer",
             {{"type", "AdamW"}, {"params", {{"lr", kLr}, {"weight_decay", kWeightDecay}}}}},
            {"zero_optimization", {{"stage", 1}, {"reduce_bucket_size", 40}}},
            {"bf16", bf16}};
  if (c.fp32_accumulation) j["data_types"] = {{"grad_accum_dtype", "fp32"}};
  return j;
}

// The same samples on every rank; a larger spread than randn's so that the micro-steps'
// gradients differ in magnitude and their bf16 sums round.
at::Tensor batch(int step, int micro) {
  torch::manual_seed(1000 + 10 * step + micro);
  return (torch::randn({2, 7}) * (1 + micro)).to(torch::kBFloat16);
}

// One process: the bf16 model's gradients summed in fp32 (or by param.grad, in bf16), fp32
// masters stepped by DeepSpeed's AdamW and written back rounded.
std::vector<at::Tensor> one_process(bool fp32_sums) {
  auto model = std::make_shared<Net>();
  model->to(torch::kBFloat16);
  std::vector<at::Tensor> masters;
  for (auto& p : model->parameters()) masters.push_back(p.detach().to(torch::kFloat));
  optim::AdamOptions options;
  options.lr = kLr;
  options.weight_decay = kWeightDecay;
  optim::Adam adam(masters, options, /*adam_w_mode=*/true);
  for (int s = 0; s < kSteps; ++s) {
    std::vector<at::Tensor> sums;
    for (auto& m : masters) sums.push_back(torch::zeros_like(m));
    model->zero_grad(/*set_to_none=*/true);
    for (int m = 0; m < kAccumulation; ++m) {
      (model->forward(batch(s, m)) / static_cast<double>(kAccumulation)).backward();
      if (!fp32_sums) continue;
      auto params = model->parameters();
      for (size_t i = 0; i < params.size(); ++i) {
        sums[i].add_(params[i].grad());
        params[i].mutable_grad() = at::Tensor();
      }
    }
    auto params = model->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      masters[i].mutable_grad() = fp32_sums ? sums[i] : params[i].grad().to(torch::kFloat);
    }
    adam.step();
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) params[i].copy_(masters[i]);
  }
  return params_of(*model);
}

struct Trained {
  std::vector<at::Tensor> params;
  MemoryStats memory;
  int fc2_grads_seen_in_backward = 0;  // micro-steps where fc2.weight.grad was still held
};

Trained train(const Case& c) {
  auto model = std::make_shared<Net>();
  Trained out;
  auto engine = initialize(model, config(c)).engine;
  model->on_hidden_grad = [&] {
    if (model->fc2->weight.grad().defined()) ++out.fc2_grads_seen_in_backward;
  };
  for (int s = 0; s < kSteps; ++s) {
    for (int m = 0; m < kAccumulation; ++m) {
      engine->backward(engine->forward(batch(s, m)));
      engine->step();
    }
  }
  out.params = params_of(*model);
  out.memory = engine->memory_stats();
  return out;
}

bool all_equal(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  bool same = a.size() == b.size();
  for (size_t i = 0; same && i < a.size(); ++i) same = torch::equal(a[i], b[i]);
  return same;
}

// The engines train first: on a CPU without oneDNN's bf16 GEMM the first one replaces LibTorch's
// bf16 matmul for the whole process (docs/precision.md), the references' included.
void fp32_sums_match_one_process(int, int) {
  const Trained fp32 = train(Case{});
  const Trained bf16 = train(Case{/*fp32_accumulation=*/false, /*immediate=*/false});
  const auto fp32_reference = one_process(/*fp32_sums=*/true);
  const auto bf16_reference = one_process(/*fp32_sums=*/false);
  // Otherwise the comparisons below could not tell the two accumulations apart.
  ASSERT_FALSE(all_equal(fp32_reference, bf16_reference));

  expect_bf16_params_equal(fp32.params, fp32_reference, "grad_accum_dtype fp32");
  // After backward, the bf16 gradients are added and released; the next backward reaches
  // the hidden activation with fc2's new gradient still held.
  EXPECT_EQ(fp32.fc2_grads_seen_in_backward, kSteps * kAccumulation);

  expect_bf16_params_equal(bf16.params, bf16_reference, "grad_accum_dtype unset (bf16 sums)");
  // The sums' fp32 buffers: 4 bytes per parameter element on top.
  EXPECT_EQ(fp32.memory.grad_bytes - bf16.memory.grad_bytes, 146 * 4);
}

void immediate_update_adds_during_backward(int, int) {
  const Trained immediate = train(Case{/*fp32_accumulation=*/true, /*immediate=*/true});
  // The same sums, bit for bit.
  expect_bf16_params_equal(immediate.params, one_process(/*fp32_sums=*/true),
                           "immediate_grad_update");
  // fc2's gradient was added and freed before backward went on to fc1.
  EXPECT_EQ(immediate.fc2_grads_seen_in_backward, 0);
}

TEST(Bf16GradAccumulationDist, Fp32SumsMatchOneProcessOn2Ranks) {
  run_ranks(2, fp32_sums_match_one_process);
}

TEST(Bf16GradAccumulationDist, ImmediateGradUpdateAddsDuringBackwardOn2Ranks) {
  run_ranks(2, immediate_update_adds_during_backward);
}

}  // namespace
}  // namespace deepspeed
