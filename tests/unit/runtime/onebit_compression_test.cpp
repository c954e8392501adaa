// 1-bit compression on one process: the padded layout, sign packing (numpy's bit order), and
// error feedback (the error stays bounded, and compressing repeatedly transmits the mean).
#include "deepspeed/onebit.h"

#include <algorithm>
#include <numeric>

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace deepspeed {
namespace {

TEST(OneBitLayout, PadsToWholeByteChunksPerRank) {
  // unit = world * lcm(world, 8): 2 -> 16, 3 -> 72, 4 -> 32.
  for (auto [world, numel, padded] : std::vector<std::tuple<int, int64_t, int64_t>>{
           {2, 1, 16}, {2, 16, 16}, {2, 17, 32}, {3, 1, 72}, {3, 73, 144}, {4, 33, 64},
           {4, 4097, 4128}, {1, 5, 8}, {2, 0, 16}}) {
    auto l = onebit::compression_layout(numel, world);
    EXPECT_EQ(l.padded_numel, padded) << world << " " << numel;
    EXPECT_EQ(l.chunk_numel * world, l.padded_numel);
    EXPECT_EQ(l.chunk_numel % 8, 0);
    int64_t valid = 0;
    for (int r = 0; r < world; ++r) valid += l.valid_in_chunk(r);
    EXPECT_EQ(valid, numel);
  }
  auto l = onebit::compression_layout(73, 3);  // chunks of 48: 48 real, 25 real, 0 real
  EXPECT_EQ(l.valid_in_chunk(0), 48);
  EXPECT_EQ(l.valid_in_chunk(1), 25);
  EXPECT_EQ(l.valid_in_chunk(2), 0);
}

TEST(OneBitPacking, FirstElementIsTheMostSignificantBitAndZeroIsPositive) {
  auto x = torch::tensor({1.0f, -1.0f, 0.0f, -0.5f, -2.0f, -3.0f, -4.0f, 7.0f,
                          -1.0f, -1.0f, -1.0f, -1.0f, -1.0f, -1.0f, -1.0f, 0.25f});
  auto bits = onebit::pack_signs(x);
  ASSERT_EQ(bits.numel(), 2);
  EXPECT_EQ(bits[0].item<int>(), 0b10100001);
  EXPECT_EQ(bits[1].item<int>(), 0b00000001);
  auto back = onebit::unpack_signs(bits);
  EXPECT_TRUE(torch::equal(back, torch::where(x.ge(0), torch::ones_like(x), -torch::ones_like(x))));
}

TEST(OneBitPacking, RoundTripsRandomSigns) {
  torch::manual_seed(3);
  auto x = torch::randn({8 * 129});
  auto back = onebit::unpack_signs(onebit::pack_signs(x));
  EXPECT_TRUE(torch::equal(back, x.sign().where(x.ne(0), torch::ones_like(x))));
}

TEST(OneBitErrorFeedback, ErrorStaysBoundedAndTheMeanIsTransmitted) {
  // Compressing a stream of gradient-like vectors (a fixed direction plus noise) with error
  // feedback: the error reaches a steady size and stops growing, stays within a small multiple
  // of the inputs, and the sum of what was transmitted equals the sum of the inputs up to the
  // last error (what error feedback is for: the compression is unbiased over time).
  torch::manual_seed(7);
  const int64_t n = 1000;  // in a buffer of 1200: 200 padding elements
  auto error = torch::zeros({1200});
  auto sum_in = torch::zeros({n});
  auto sum_sent = torch::zeros({n});
  const int steps = 400;
  std::vector<double> max_error(steps);
  double max_input = 0;
  for (int k = 0; k < steps; ++k) {
    auto g = 0.5 * torch::randn({n}) + torch::linspace(-1, 1, n);
    max_input = std::max(max_input, g.abs().max().item<double>());
    auto x = torch::zeros({1200});
    x.narrow(0, 0, n).copy_(g);
    auto c = onebit::compress_with_error(x, error, n);
    sum_in += g;
    sum_sent += (onebit::unpack_signs(c.bits) * c.scale).narrow(0, 0, n);
    max_error[k] = error.abs().max().item<double>();
    EXPECT_TRUE(torch::equal(error.narrow(0, n, 200), torch::zeros({200})));
  }
  auto mean_of = [&](int from, int to) {
    return std::accumulate(max_error.begin() + from, max_error.begin() + to, 0.0) / (to - from);
  };
  EXPECT_LT(mean_of(200, 400), 1.25 * mean_of(100, 200)) << "the error keeps growing";
  const double worst = *std::max_element(max_error.begin(), max_error.end());
  EXPECT_LT(worst, 5 * max_input);
  // sum_in - sum_sent is exactly the final error (up to float accumulation).
  EXPECT_LT((sum_in - sum_sent - error.narrow(0, 0, n)).abs().max().item<double>(), 1e-3);
  EXPECT_LT(((sum_in - sum_sent) / steps).abs().max().item<double>(), worst / steps + 1e-5);
  // Without error feedback one compression is far off.
  auto g = torch::linspace(-1, 1, 992);
  EXPECT_GT((onebit::unpack_signs(onebit::pack_signs(g)) - g).abs().max().item<double>(), 0.5);
}

TEST(OneBitErrorFeedback, ConstantTensorCompressesExactly) {
  for (float c : {0.5f, -2.0f, 0.0f}) {
    auto x = torch::full({24}, c);
    auto error = torch::zeros({24});
    auto out = onebit::compress_with_error(x, error, 21);
    EXPECT_EQ(out.scale.item<float>(), std::abs(c));
    EXPECT_TRUE(torch::equal(error, torch::zeros({24}))) << c;
  }
}

}  // namespace
}  // namespace deepspeed
