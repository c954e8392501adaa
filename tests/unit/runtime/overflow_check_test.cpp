// has_inf_or_nan on every floating dtype a gradient can have, on the values that must and must
// not count as overflow (fp16's largest finite value, sums that overflow fp16, subnormals,
// negative nan), on strided views, and over lists; any_rank_overflow without a process group.
// The 2-rank vote is in tests/dist/overflow_check_dist_test.cpp.
#include "runtime/precision/overflow_check.h"

#include <cmath>
#include <cstdint>
#include <limits>

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace deepspeed::runtime {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

at::Tensor with_value_at(at::ScalarType dtype, int64_t n, int64_t pos, float value) {
  auto t = torch::randn({n}).to(dtype);
  t[pos] = value;
  return t;
}

// fp16 bit patterns, to reach values a float -> half cast would not produce.
at::Tensor half_from_bits(std::initializer_list<int> bits) {
  std::vector<int16_t> v;
  for (int b : bits) v.push_back(static_cast<int16_t>(static_cast<uint16_t>(b)));
  return torch::tensor(v, torch::kShort).view(torch::kHalf);
}

class HasInfOrNan : public ::testing::TestWithParam<at::ScalarType> {};

TEST_P(HasInfOrNan, DetectsInfMinusInfAndNanAnywhere) {
  const at::ScalarType dt = GetParam();
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{4097}}) {
    EXPECT_FALSE(has_inf_or_nan(torch::randn({n}).to(dt))) << n;
    for (int64_t pos : {int64_t{0}, n / 2, n - 1}) {
      EXPECT_TRUE(has_inf_or_nan(with_value_at(dt, n, pos, kInf))) << n << " inf at " << pos;
      EXPECT_TRUE(has_inf_or_nan(with_value_at(dt, n, pos, -kInf))) << n << " -inf at " << pos;
      EXPECT_TRUE(has_inf_or_nan(with_value_at(dt, n, pos, kNan))) << n << " nan at " << pos;
    }
  }
}

TEST_P(HasInfOrNan, DetectsOppositeInfinitiesWhoseSumIsNan) {
  auto t = torch::zeros({10}).to(GetParam());
  t[2] = kInf;
  t[7] = -kInf;
  EXPECT_TRUE(has_inf_or_nan(t));
}

TEST_P(HasInfOrNan, LargeFiniteValuesAreNotOverflow) {
  // 4097 copies of fp16's largest finite value: their sum overflows fp16, not fp32/bf16.
  auto t = torch::full({4097}, 65504.0f).to(GetParam());
  EXPECT_FALSE(has_inf_or_nan(t));
  EXPECT_FALSE(has_inf_or_nan(-t));
}

TEST_P(HasInfOrNan, SeesThroughStridedViews) {
  auto base = torch::randn({64, 33}).to(GetParam());
  base[5][31] = kNan;
  EXPECT_TRUE(has_inf_or_nan(base.t()));                         // transposed
  EXPECT_TRUE(has_inf_or_nan(base.slice(1, 1, 33, 2)));          // every other column
  EXPECT_FALSE(has_inf_or_nan(base.slice(1, 0, 33, 2)));         // the nan is not in it
  EXPECT_FALSE(has_inf_or_nan(base.slice(0, 6, 64)));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, HasInfOrNan,
                         ::testing::Values(at::kFloat, at::kHalf, at::kBFloat16, at::kDouble),
                         [](const auto& info) { return std::string(c10::toString(info.param)); });

TEST(HasInfOrNanFp16, ExponentBitEdgeCases) {
  // 0x7BFF = 65504 (max finite), 0xFBFF = -65504, 0x0001 smallest subnormal, 0x8000 = -0.
  EXPECT_FALSE(has_inf_or_nan(half_from_bits({0x7BFF, 0xFBFF, 0x0001, 0x8000, 0x3C00})));
  EXPECT_TRUE(has_inf_or_nan(half_from_bits({0x3C00, 0x7C00})));  // +inf
  EXPECT_TRUE(has_inf_or_nan(half_from_bits({0x3C00, 0xFC00})));  // -inf
  EXPECT_TRUE(has_inf_or_nan(half_from_bits({0x7E00})));          // quiet nan
  EXPECT_TRUE(has_inf_or_nan(half_from_bits({0x7C01})));          // signalling nan
  EXPECT_TRUE(has_inf_or_nan(half_from_bits({0xFE01, 0x0000})));  // negative nan
}

TEST(HasInfOrNanFp16, OverflowOfFloatToHalfCastIsDetected) {
  // A gradient of 70000 in fp32 becomes inf in fp16: the usual loss-scaling overflow.
  auto t = torch::tensor({1.0f, 70000.0f}).to(torch::kHalf);
  EXPECT_TRUE(has_inf_or_nan(t));
}

TEST(HasInfOrNanList, AnyTensorInTheListCounts) {
  std::vector<at::Tensor> ok{torch::randn({5}), torch::randn({3}).to(torch::kHalf),
                             torch::randn({4}).to(torch::kBFloat16)};
  EXPECT_FALSE(has_inf_or_nan(ok));
  for (size_t i = 0; i < ok.size(); ++i) {
    auto bad = ok;
    bad[i] = bad[i].clone();
    bad[i][0] = kNan;
    EXPECT_TRUE(has_inf_or_nan(bad)) << "nan in tensor " << i;
  }
  auto one = std::vector<at::Tensor>{with_value_at(torch::kFloat, 9, 8, -kInf)};
  EXPECT_TRUE(has_inf_or_nan(one));
}

TEST(HasInfOrNanList, UndefinedEmptyAndIntegerTensorsHoldNoOverflow) {
  EXPECT_FALSE(has_inf_or_nan(std::vector<at::Tensor>{}));
  EXPECT_FALSE(has_inf_or_nan(at::Tensor()));
  EXPECT_FALSE(has_inf_or_nan(torch::empty({0})));
  EXPECT_FALSE(has_inf_or_nan(torch::empty({0}, torch::kHalf)));
  EXPECT_FALSE(has_inf_or_nan(torch::arange(10, torch::kLong)));
  std::vector<at::Tensor> mixed{at::Tensor(), torch::empty({0}, torch::kHalf),
                                torch::arange(3, torch::kInt), torch::ones({2})};
  EXPECT_FALSE(has_inf_or_nan(mixed));
  mixed.push_back(torch::full({2}, kInf, torch::kHalf));
  EXPECT_TRUE(has_inf_or_nan(mixed));
}

TEST(HasInfOrNanList, GradientsOfAHalfModelAfterAnOverflowingBackward) {
  // The situation loss scaling guards against: a scaled loss whose fp16 gradient overflows.
  auto w = torch::ones({4}, torch::TensorOptions().dtype(torch::kHalf).requires_grad(true));
  auto x = torch::full({4}, 300.0f).to(torch::kHalf);
  ((w * x).sum() * 1024.0).backward();  // d/dw = 300 * 1024 = 307200 > 65504
  EXPECT_TRUE(has_inf_or_nan(std::vector<at::Tensor>{w.grad()}));
  w.mutable_grad() = at::Tensor();
  ((w * x).sum() * 128.0).backward();  // 38400 fits
  EXPECT_FALSE(has_inf_or_nan(std::vector<at::Tensor>{w.grad()}));
}

TEST(AnyRankOverflow, WithoutProcessGroupIsTheLocalFlag) {
  EXPECT_TRUE(any_rank_overflow(true));
  EXPECT_FALSE(any_rank_overflow(false));
}

}  // namespace
}  // namespace deepspeed::runtime
