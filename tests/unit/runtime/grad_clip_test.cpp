// Global-norm clipping against a direct computation (DeepSpeed's clip_grad_norm_ semantics).
#include "runtime/grad_clip.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace deepspeed::runtime {
namespace {

TEST(GradClip, NormIsL2OverAllGradsAndClipScalesByCoefficient) {
  auto a = torch::zeros({2}, torch::requires_grad());
  auto b = torch::zeros({1}, torch::requires_grad());
  auto c = torch::zeros({1}, torch::requires_grad());  // no grad: counts as zero
  a.mutable_grad() = torch::tensor({3.0f, 0.0f});
  b.mutable_grad() = torch::tensor({4.0f});
  std::vector<at::Tensor> ps{a, b, c};
  double norm = global_grad_norm(ps);
  EXPECT_NEAR(norm, 5.0, 1e-6);
  double coef = clip_grads_by_norm(ps, norm, 1.0);
  EXPECT_NEAR(coef, 1.0 / (5.0 + 1e-6), 1e-12);
  EXPECT_NEAR(a.grad()[0].item<double>(), 3.0 / (5.0 + 1e-6), 1e-6);
  EXPECT_NEAR(b.grad()[0].item<double>(), 4.0 / (5.0 + 1e-6), 1e-6);
}

TEST(GradClip, NoClipBelowThresholdOrWhenDisabled) {
  auto a = torch::zeros({1}, torch::requires_grad());
  a.mutable_grad() = torch::tensor({0.5f});
  std::vector<at::Tensor> ps{a};
  EXPECT_DOUBLE_EQ(clip_grads_by_norm(ps, 0.5, 1.0), 1.0);
  EXPECT_DOUBLE_EQ(clip_grads_by_norm(ps, 0.5, 0.0), 1.0);
  EXPECT_FLOAT_EQ(a.grad()[0].item<float>(), 0.5f);
}

}  // namespace
}  // namespace deepspeed::runtime
