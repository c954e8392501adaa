// ZeRO++'s blockwise quantizer (Note [Blockwise quantization]): group sizes, the values and
// steps against a scalar rendering of the rule for 8 and 4 bits (and the 4-bit packing), the
// error bound, and reading rows back.
#include "runtime/zero/block_quantizer.h"

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace deepspeed::runtime {
namespace {

TEST(BlockQuantizer, GroupsHoldAtMostTheTargetInMultiplesOf8) {
  EXPECT_EQ(quantization_group_numel(0), 8);
  EXPECT_EQ(quantization_group_numel(1), 8);
  EXPECT_EQ(quantization_group_numel(13), 16);
  EXPECT_EQ(quantization_group_numel(8000), 8000);
  EXPECT_EQ(quantization_group_numel(8001), 4008);  // two groups of ceil(8001 / 2), rounded up
  EXPECT_EQ(quantization_group_numel(16000), 8000);
  EXPECT_EQ(quantization_group_numel(1000000), 8000);
  EXPECT_EQ(quantization_group_numel(1000001), 7944);  // 126 groups
  EXPECT_EQ(quantization_group_numel(5000, 2048), 1672);  // 3 groups
}

// The rule one element at a time, in float: with h = 2^(bits - 1), step = 1 / (h / max),
// q = clamp(rint(x * h / max), -h, h - 1), a group of zeros keeping a step of 1. 4 bits: the
// unpacked values.
struct Expected {
  std::vector<int8_t> values;
  std::vector<float> steps;
};

Expected scalar_quantize(const torch::Tensor& flat, int bits, int64_t target) {
  const torch::Tensor x = flat.to(torch::kFloat).contiguous();
  const float* v = x.data_ptr<float>();
  const int64_t n = x.numel();
  const int64_t g = quantization_group_numel(n, target);
  const int64_t groups = std::max<int64_t>((n + g - 1) / g, 1);
  const float h = bits == 8 ? 128.0f : 8.0f;
  Expected e;
  for (int64_t k = 0; k < groups; ++k) {
    float max = 0.0f;
    for (int64_t i = k * g; i < std::min(n, (k + 1) * g); ++i) max = std::max(max, std::fabs(v[i]));
    const float scale = max == 0.0f ? 1.0f : h / max;
    e.steps.push_back(1.0f / scale);
    for (int64_t i = k * g; i < (k + 1) * g; ++i) {
      const float q = i < n ? std::nearbyint(v[i] * scale) : 0.0f;
      e.values.push_back(static_cast<int8_t>(std::min(h - 1, std::max(-h, q))));
    }
  }
  return e;
}

// 4 bits: byte i holds value 2i in its low half and 2i + 1 in its high half, two's complement.
std::vector<int8_t> unpack(const torch::Tensor& packed) {
  std::vector<int8_t> out;
  const torch::Tensor b = packed.contiguous();
  for (int64_t i = 0; i < b.numel(); ++i) {
    const auto byte = static_cast<uint8_t>(b.data_ptr<int8_t>()[i]);
    for (int nibble : {byte & 15, byte >> 4}) {
      out.push_back(static_cast<int8_t>(nibble >= 8 ? nibble - 16 : nibble));
    }
  }
  return out;
}

TEST(BlockQuantizer, MatchesTheRuleElementByElement) {
  torch::manual_seed(7);
  for (auto [bits, target] : {std::pair<int, int64_t>{8, kWeightGroupNumel}, {4, 2048}}) {
    for (auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf, torch::kDouble}) {
      for (int64_t n : {1, 13, 8000, 8001, 20011}) {
        // Magnitudes over several decades, and exact halves of a step to test the rounding.
        torch::Tensor x = (torch::randn({n}) * torch::pow(10.0, torch::randint(-3, 3, {n})));
        if (n >= 4) x.narrow(0, 0, 4).copy_(torch::tensor({1.0, -0.5, 0.5 / 128 * 3, 0.25}));
        x = x.to(dtype);
        const QuantizedBlocks q = quantize_blocks(x, bits, target);
        const Expected e = scalar_quantize(x, bits, target);
        const std::string what = std::to_string(bits) + " bits " + torch::toString(dtype) + " " +
                                 std::to_string(n);
        ASSERT_EQ(q.values.scalar_type(), torch::kChar);
        ASSERT_EQ(q.scales.scalar_type(), torch::kFloat);
        ASSERT_EQ(q.values.numel() * (bits == 8 ? 1 : 2), static_cast<int64_t>(e.values.size()));
        ASSERT_EQ(q.scales.numel(), static_cast<int64_t>(e.steps.size()));
        const std::vector<int8_t> got =
            bits == 8 ? std::vector<int8_t>(q.values.data_ptr<int8_t>(),
                                            q.values.data_ptr<int8_t>() + q.values.numel())
                      : unpack(q.values);
        EXPECT_EQ(got, e.values) << what;
        EXPECT_TRUE(torch::equal(q.scales, torch::tensor(e.steps))) << what;
        // Read back: each value times its group's step.
        const torch::Tensor back = dequantize_blocks(
            q.values.view({1, -1}), q.scales.view({1, -1}), torch::kFloat, bits)[0];
        const int64_t g = quantization_group_numel(n, target);
        const torch::Tensor want =
            torch::tensor(e.values, torch::kChar).to(torch::kFloat).view({-1, g}) *
            torch::tensor(e.steps).view({-1, 1});
        EXPECT_TRUE(torch::equal(back, want.view({-1}))) << what;
      }
    }
  }
}

TEST(BlockQuantizer, ReadsBackWithinHalfAStepExceptTheClampedLargest) {
  torch::manual_seed(3);
  const int64_t n = 3 * 8000;
  torch::Tensor x = torch::randn({n}) * torch::linspace(0.01, 10.0, n);
  for (auto [bits, half_range] : {std::pair<int, double>{8, 128}, {4, 8}}) {
    const QuantizedBlocks q = quantize_blocks(x, bits);
    const torch::Tensor back = dequantize_blocks(q.values.view({1, -1}), q.scales.view({1, -1}),
                                                 torch::kFloat, bits).view({-1}).narrow(0, 0, n);
    const torch::Tensor groups = x.view({3, -1});
    const torch::Tensor max = groups.abs().amax(1, true);
    const torch::Tensor error = (back.view({3, -1}) - groups).abs();
    // Positive values within half a step of the largest are clamped to h - 1 steps.
    const torch::Tensor clamped = groups.ge(max * (half_range - 0.5) / half_range);
    const torch::Tensor half_step = max / (2 * half_range) * 1.0001;
    EXPECT_TRUE(error.le(half_step).logical_or(clamped).all().item<bool>()) << bits;
    EXPECT_TRUE(error.le(2 * half_step).all().item<bool>()) << bits;
    EXPECT_FALSE(torch::equal(back, x));  // it does round
  }
  // A group of zeros reads back as zeros, with a step of 1.
  const QuantizedBlocks zeros = quantize_blocks(torch::zeros({10}));
  EXPECT_TRUE(zeros.values.eq(0).all().item<bool>());
  EXPECT_EQ(zeros.scales.item<float>(), 1.0f);
}

TEST(BlockQuantizer, DequantizesEachRowWithItsOwnSteps) {
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
