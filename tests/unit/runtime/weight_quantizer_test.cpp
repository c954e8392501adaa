// ZeRO++'s blockwise int8 quantizer (Note [Blockwise int8]): group sizes, the values and steps
// against a scalar rendering of the rule, the error bound, and reading rows back.
#include "runtime/zero/weight_quantizer.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace deepspeed::runtime {
namespace {

TEST(WeightQuantizer, GroupsHoldAtMost8000ElementsInMultiplesOf8) {
  EXPECT_EQ(quantization_group_numel(0), 8);
  EXPECT_EQ(quantization_group_numel(1), 8);
  EXPECT_EQ(quantization_group_numel(13), 16);
  EXPECT_EQ(quantization_group_numel(8000), 8000);
  EXPECT_EQ(quantization_group_numel(8001), 4008);  // two groups of ceil(8001 / 2), rounded up
  EXPECT_EQ(quantization_group_numel(16000), 8000);
  EXPECT_EQ(quantization_group_numel(1000000), 8000);
  EXPECT_EQ(quantization_group_numel(1000001), 7944);  // 126 groups
}

// The rule one element at a time, in float: step = 1 / (128 / max), q = clamp(rint(x * 128 /
// max)), a group of zeros keeping a step of 1.
struct Expected {
  std::vector<int8_t> values;
  std::vector<float> steps;
};

Expected scalar_quantize(const torch::Tensor& flat) {
  const torch::Tensor x = flat.to(torch::kFloat).contiguous();
  const float* v = x.data_ptr<float>();
  const int64_t n = x.numel();
  const int64_t g = quantization_group_numel(n);
  const int64_t groups = std::max<int64_t>((n + g - 1) / g, 1);
  Expected e;
  for (int64_t k = 0; k < groups; ++k) {
    float max = 0.0f;
    for (int64_t i = k * g; i < std::min(n, (k + 1) * g); ++i) max = std::max(max, std::fabs(v[i]));
    const float scale = max == 0.0f ? 1.0f : 128.0f / max;
    e.steps.push_back(1.0f / scale);
    for (int64_t i = k * g; i < (k + 1) * g; ++i) {
      const float q = i < n ? std::nearbyint(v[i] * scale) : 0.0f;
      e.values.push_back(static_cast<int8_t>(std::min(127.0f, std::max(-128.0f, q))));
    }
  }
  return e;
}

TEST(WeightQuantizer, MatchesTheRuleElementByElement) {
  torch::manual_seed(7);
  for (auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf, torch::kDouble}) {
    for (int64_t n : {1, 13, 8000, 8001, 20011}) {
      // Magnitudes over several decades, and exact halves of a step to test the rounding.
      torch::Tensor x = (torch::randn({n}) * torch::pow(10.0, torch::randint(-3, 3, {n})));
      if (n >= 4) x.narrow(0, 0, 4).copy_(torch::tensor({1.0, -0.5, 0.5 / 128 * 3, 0.25}));
      x = x.to(dtype);
      const QuantizedBlocks q = quantize_blocks(x);
      const Expected e = scalar_quantize(x);
      ASSERT_EQ(q.values.scalar_type(), torch::kChar);
      ASSERT_EQ(q.scales.scalar_type(), torch::kFloat);
      ASSERT_EQ(q.values.numel(), static_cast<int64_t>(e.values.size()));
      ASSERT_EQ(q.scales.numel(), static_cast<int64_t>(e.steps.size()));
      EXPECT_TRUE(torch::equal(q.values, torch::tensor(e.values, torch::kChar)))
          << torch::toString(dtype) << " " << n;
      EXPECT_TRUE(torch::equal(q.scales, torch::tensor(e.steps)))
          << torch::toString(dtype) << " " << n;
    }
  }
}

TEST(WeightQuantizer, ReadsBackWithinHalfAStepExceptTheClampedLargest) {
  torch::manual_seed(3);
  const int64_t n = 3 * 8000;
  torch::Tensor x = torch::randn({n}) * torch::linspace(0.01, 10.0, n);
  const QuantizedBlocks q = quantize_blocks(x);
  const torch::Tensor back = dequantize_blocks(q.values.view({1, -1}), q.scales.view({1, -1}),
                                               torch::kFloat).view({-1}).narrow(0, 0, n);
  const torch::Tensor groups = x.view({3, -1});
  const torch::Tensor max = groups.abs().amax(1, true);
  const torch::Tensor error = (back.view({3, -1}) - groups).abs();
  const torch::Tensor clamped = groups.eq(max);  // the positive largest loses a whole step
  EXPECT_TRUE(error.le(max / 256 * 1.0001).logical_or(clamped).all().item<bool>());
  EXPECT_TRUE(error.le(max / 128 * 1.0001).all().item<bool>());
  EXPECT_FALSE(torch::equal(back, x));  // it does round
  // A group of zeros reads back as zeros, with a step of 1.
  const QuantizedBlocks zeros = quantize_blocks(torch::zeros({10}));
  EXPECT_TRUE(zeros.values.eq(0).all().item<bool>());
  EXPECT_EQ(zeros.scales.item<float>(), 1.0f);
}

TEST(WeightQuantizer, DequantizesEachRowWithItsOwnSteps) {
  const int64_t n = 100;  // one group of 104 per row
  std::vector<QuantizedBlocks> rows;
  std::vector<torch::Tensor> values, steps;
  for (double magnitude : {0.001, 1.0, 300.0}) {
    rows.push_back(quantize_blocks(torch::linspace(-magnitude, magnitude / 2, n)));
    values.push_back(rows.back().values);
    steps.push_back(rows.back().scales);
  }
  const torch::Tensor back =
      dequantize_blocks(torch::stack(values), torch::stack(steps), torch::kBFloat16);
  ASSERT_EQ(back.sizes(), (std::vector<int64_t>{3, 104}));
  ASSERT_EQ(back.scalar_type(), torch::kBFloat16);
  for (int64_t r = 0; r < 3; ++r) {
    const torch::Tensor want = (values[r].to(torch::kFloat) * steps[r]).to(torch::kBFloat16);
    EXPECT_TRUE(torch::equal(back[r], want)) << r;
  }
}

}  // namespace
}  // namespace deepspeed::runtime
