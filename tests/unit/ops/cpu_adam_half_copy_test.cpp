// The bf16/fp16 copy that CPU-Adam writes in the same pass: rounding to nearest even at every
// tie, overflow, subnormals, infinities and NaN, on every path, against independent reference
// conversions (cpu_adam_test_util.h). A step with lr = 0 leaves the parameters as they are, so
// the copy is exactly the conversion of the chosen inputs.
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "cpu_adam_test_util.h"
#include "ops/cpu_adam/cpu_adam.h"

namespace deepspeed::ops {
namespace {

float from_bits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
uint32_t to_bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}

void add_with_neighbours(std::vector<float>& out, float x) {
  out.push_back(x);
  out.push_back(std::nextafter(x, 0.0f));
  out.push_back(std::nextafter(x, std::numeric_limits<float>::infinity()));
}

std::vector<float> special_values() {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> v = {0.0f, -0.0f, inf, -inf, std::numeric_limits<float>::quiet_NaN(),
                          -std::numeric_limits<float>::quiet_NaN(), from_bits(0x7FC12345),
                          from_bits(0xFFE00001), std::numeric_limits<float>::max(),
                          -std::numeric_limits<float>::max(), std::numeric_limits<float>::min(),
                          std::numeric_limits<float>::denorm_min(), 1.0f, -1.0f, 65504.0f,
                          65519.0f, 65520.0f, 65536.0f, 1e6f};
  add_with_neighbours(v, 65520.0f);
  add_with_neighbours(v, std::ldexp(1.0f, -25));  // half of the smallest fp16 subnormal: ties to 0
  add_with_neighbours(v, std::ldexp(1.0f, -14));  // smallest normal fp16
  return v;
}

// bf16 ties and near-ties in every binade, both signs: x.8000 (tie), x.7FFF, x.8001.
std::vector<float> bf16_ties() {
  std::vector<float> v;
  for (uint32_t high = 0; high < 0x10000; high += 3) {  // every third pattern keeps it fast
    for (uint32_t low : {0x7FFFu, 0x8000u, 0x8001u}) v.push_back(from_bits(high << 16 | low));
  }
  return v;
}

// fp16 ties: the midpoint between every pair of neighbouring halves (exact in fp32), and the
// floats on either side of it, for both signs; the last midpoint (65520) rounds to infinity.
std::vector<float> fp16_ties() {
  std::vector<float> v;
  auto half_value = [](uint32_t k) {
    const uint32_t exponent = k >> 10, mantissa = k & 0x3FFu;
    return exponent == 0 ? std::ldexp(static_cast<double>(mantissa), -24)
                         : std::ldexp(static_cast<double>(1024 + mantissa), exponent - 25);
  };
  for (uint32_t k = 0; k < 0x7BFF; ++k) {
    const float mid = static_cast<float>((half_value(k) + half_value(k + 1)) / 2);
    add_with_neighbours(v, mid);
    add_with_neighbours(v, -mid);
  }
  return v;
}

std::vector<float> random_patterns(size_t count) {
  std::mt19937 rng(7);
  std::vector<float> v(count);
  for (auto& x : v) x = from_bits(static_cast<uint32_t>(rng()));
  return v;
}

void expect_copy_matches_reference(SimdLevel level, HalfKind kind, const std::vector<float>& in) {
  const int64_t n = static_cast<int64_t>(in.size());
  testing::AdamBuffers b(n, 1);
  for (int64_t i = 0; i < n; ++i) {
    b.param[i] = in[static_cast<size_t>(i)];
    b.grad[i] = 0.0f;
    b.exp_avg[i] = 0.0f;
    b.exp_avg_sq[i] = 0.0f;
  }
  AdamStep s;
  s.lr = 0.0f;  // p + (-0) * (0 / eps): the parameters stay as they are
  adam_update(s, b.param.data(), b.grad.data(), b.exp_avg.data(), b.exp_avg_sq.data(), n,
              HalfCopy{b.half.data(), kind}, level);
  ASSERT_TRUE(b.guards_intact());
  int failures = 0;
  for (int64_t i = 0; i < n && failures < 10; ++i) {
    const float x = in[static_cast<size_t>(i)];
    if (!std::isnan(x)) {
      ASSERT_EQ(to_bits(b.param[i]), to_bits(x)) << "lr = 0 must leave parameter " << i << " as is";
    }
    const uint16_t expected = kind == HalfKind::kBF16 ? testing::reference_bf16(b.param[i])
                                                      : testing::reference_fp16(b.param[i]);
    if (b.half[i] != expected) {
      ++failures;
      ADD_FAILURE() << simd_level_name(level) << (kind == HalfKind::kBF16 ? " bf16" : " fp16")
                    << " of 0x" << std::hex << to_bits(b.param[i]) << " (" << b.param[i]
                    << "): got 0x" << b.half[i] << ", expected 0x" << expected;
    }
  }
}

class CpuAdamHalfCopy : public ::testing::TestWithParam<SimdLevel> {};

TEST_P(CpuAdamHalfCopy, Bf16RoundsToNearestEvenAndCanonicalizesNan) {
  DS_SKIP_UNLESS_CPU_HAS(GetParam());
  expect_copy_matches_reference(GetParam(), HalfKind::kBF16, special_values());
  expect_copy_matches_reference(GetParam(), HalfKind::kBF16, bf16_ties());
  expect_copy_matches_reference(GetParam(), HalfKind::kBF16, random_patterns(50000));
}

TEST_P(CpuAdamHalfCopy, Fp16IsIeeeRoundToNearestEvenWithSubnormalsAndInfinity) {
  DS_SKIP_UNLESS_CPU_HAS(GetParam());
  expect_copy_matches_reference(GetParam(), HalfKind::kFP16, special_values());
  expect_copy_matches_reference(GetParam(), HalfKind::kFP16, fp16_ties());
  expect_copy_matches_reference(GetParam(), HalfKind::kFP16, random_patterns(50000));
}

TEST(CpuAdamHalfCopyReference, KnownValues) {
  // Pins the references themselves to hand-checked values, so that a wrong reference cannot
  // silently agree with a wrong kernel.
  EXPECT_EQ(testing::reference_bf16(1.0f), 0x3F80);
  EXPECT_EQ(testing::reference_bf16(from_bits(0x3F808000)), 0x3F80);  // tie, even stays
  EXPECT_EQ(testing::reference_bf16(from_bits(0x3F818000)), 0x3F82);  // tie, odd rounds up
  EXPECT_EQ(testing::reference_bf16(from_bits(0x3F808001)), 0x3F81);
  EXPECT_EQ(testing::reference_bf16(std::numeric_limits<float>::max()), 0x7F80);
  EXPECT_EQ(testing::reference_bf16(-std::numeric_limits<float>::quiet_NaN()), 0x7FC0);
  EXPECT_EQ(testing::reference_fp16(1.0f), 0x3C00);
  EXPECT_EQ(testing::reference_fp16(-2.0f), 0xC000);
  EXPECT_EQ(testing::reference_fp16(65504.0f), 0x7BFF);
  EXPECT_EQ(testing::reference_fp16(65519.0f), 0x7BFF);
  EXPECT_EQ(testing::reference_fp16(65520.0f), 0x7C00);
  EXPECT_EQ(testing::reference_fp16(1.0f + std::ldexp(1.0f, -11)), 0x3C00);  // tie, even
  EXPECT_EQ(testing::reference_fp16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);  // tie, odd
  EXPECT_EQ(testing::reference_fp16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(testing::reference_fp16(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(testing::reference_fp16(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 units: tie, even
  EXPECT_EQ(testing::reference_fp16(std::numeric_limits<float>::quiet_NaN()), 0x7E00);
}

INSTANTIATE_TEST_SUITE_P(Paths, CpuAdamHalfCopy, ::testing::ValuesIn(testing::kAllLevels),
                         [](const ::testing::TestParamInfo<SimdLevel>& info) {
                           return std::string(simd_level_name(info.param));
                         });

}  // namespace
}  // namespace deepspeed::ops
