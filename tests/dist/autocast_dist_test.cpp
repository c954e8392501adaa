// torch_autocast on two Gloo ranks: the gradients of the lower-precision-safe modules (Linear)
// are reduced in bf16 under ZeRO 1-3 and in fp32 under stage 0, the others in fp32, as in
// DeepSpeed; under stage 3 the Linear shards are gathered in bf16. Each rank trains one SGD
// step on its own batch; the weights must equal, bit for bit, a reference computed here from
// the two ranks' autocast gradients and that reduction.
#include "deepspeed/deepspeed.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deepspeed/autocast.h"
#include "deepspeed/zero3.h"
#include "support/amp_net.h"
#include "support/multi_rank.h"

namespace deepspeed {
namespace {

using testing::AmpNetImpl;
using testing::run_ranks;

constexpr double kLr = 0.05;

at::Tensor bf16(const at::Tensor& t) { return t.to(at::kBFloat16).to(at::kFloat); }

// One rank's fp32 gradients of AmpNet under bf16 autocast, by name.
std::map<std::string, at::Tensor> autocast_grads(int rank) {
  AmpNetImpl model;
  auto [x, y] = testing::amp_batch(0, rank);
  {
    AutocastScope autocast(c10::DeviceType::CPU, at::kBFloat16);
    at::Tensor loss = model.forward(x, y);
    EXPECT_EQ(autocast_dtype(c10::DeviceType::CPU), at::kBFloat16);
    loss.backward();
  }
  std::map<std::string, at::Tensor> grads;
  for (const auto& p : model.named_parameters()) grads[p.key()] = p.value().grad().clone();
  return grads;
}

TEST(AutocastDist, LinearGradientsAreReducedInBf16UnderZeroAndGatheredInBf16UnderStage3) {
  run_ranks(2, [](int rank, int) {
    for (int stage : {0, 1, 2, 3}) {
      SCOPED_TRACE("stage " + std::to_string(stage));
      auto model = std::make_shared<AmpNetImpl>();
      std::map<std::string, at::Tensor> initial;
      for (const auto& p : model->named_parameters()) initial[p.key()] = p.value().detach().clone();
      json cfg = {{"train_batch_size", 8},
                  {"optimizer", {{"type", "SGD"}, {"params", {{"lr", kLr}}}}},
                  {"zero_allow_untested_optimizer", true},
                  {"torch_autocast", {{"enabled", true}}},
                  {"zero_optimization", {{"stage", stage}}}};
      auto [engine, opt, sched] = initialize(model, cfg);
      ASSERT_EQ(engine->torch_autocast_dtype(), at::kBFloat16);  // the CPU's default
      auto [x, y] = testing::amp_batch(0, rank);
      at::Tensor loss = engine->forward(x, y);
      EXPECT_FALSE(autocast_enabled(c10::DeviceType::CPU));  // only inside the forward
      engine->backward(loss);
      engine->step();

      const auto g0 = autocast_grads(0);
      const auto g1 = autocast_grads(1);
      zero::GatheredParameters gathered(*model);
      for (const auto& p : model->named_parameters()) {
        const std::string& name = p.key();
        const bool linear = name.rfind("fc", 0) == 0;
        // The bucket holds each rank's gradient divided by 2 (exact in bf16 too) and sums them.
        at::Tensor grad = g0.at(name) * 0.5 + g1.at(name) * 0.5;
        if (linear && stage > 0) grad = bf16(grad);  // summed in fp32, rounded once to bf16
        at::Tensor want = initial.at(name).add(grad, -kLr);
        if (linear && stage == 3) want = bf16(want);  // gathered in bf16
        EXPECT_TRUE(torch::equal(p.value(), want))
            << name << ": max diff " << (p.value() - want).abs().max().item<double>();
      }
    }
  });
}

}  // namespace
}  // namespace deepspeed
