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

namespace deepspeed::runtime {
namespace {

// A ZeRO partition's worth of elements: the sum of squares is exact to double rounding, where a
// float accumulation drifts (LibTorch 1.13's CPU norm()).
TEST(GradClip, SquaredNormAccumulatesInDoubleOverLargeTensors) {
  const int64_t n = 30'000'001;
  const float v = 0.1f;
  const double exact = static_cast<double>(n) * static_cast<double>(v) * static_cast<double>(v);
  at::Tensor big = torch::full({n}, v);
  EXPECT_NEAR(squared_l2_norm(big), exact, exact * 1e-8);
  const double torch_norm = big.norm().item<double>();
  std::printf("float norm()^2 relative error %.3g, ours %.3g\n",
              torch_norm * torch_norm / exact - 1.0, squared_l2_norm(big) / exact - 1.0);
  // Other paths: bf16 (chunked through double), a strided view, an empty tensor.
  at::Tensor bf = torch::full({3 * (int64_t{1} << 20) + 5}, 0.5, torch::kBFloat16);
  EXPECT_DOUBLE_EQ(squared_l2_norm(bf), 0.25 * static_cast<double>(bf.numel()));
  at::Tensor strided = torch::arange(10, torch::kFloat).view({5, 2}).t();
  EXPECT_DOUBLE_EQ(squared_l2_norm(strided), 285.0);
  EXPECT_EQ(squared_l2_norm(torch::empty({0})), 0.0);
}

}  // namespace
}  // namespace deepspeed::runtime
