// LoCo's carried errors (Note [LoCo error feedback]): compensation, the blend with err_beta in 8
// bits, the rescale and drop that follow the loss scaler, and the reset every reset_T + 1
// reductions of a bucket. The exchange itself is in quantized_gradients_dist_test.
#include "runtime/zero/loco_error_feedback.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace deepspeed::runtime {
namespace {

// Rows over a few decades of magnitude, as gradients are.
torch::Tensor rows_of(int seed, int64_t d = 3, int64_t n = 700) {
  torch::manual_seed(seed);
  return torch::randn({d, n}) * torch::pow(10.0, torch::randint(-2, 2, {d, n}));
}

// What `e` adds to rows of zeros: the carried error, read back.
torch::Tensor carried(const StageError& e, int64_t d = 3, int64_t n = 700) {
  return e.compensate(torch::zeros({d, n}));
}

// The 8-bit keeping: within a step (1/128 of the largest magnitude of its group; a whole step
// for positive values clamped at 127 steps, Note [Blockwise quantization]); bounded here by the
// tensor's largest.
void expect_kept_in_8_bits(const torch::Tensor& got, const torch::Tensor& want) {
  const double bound = want.abs().max().item<double>() / 128 * 1.0001;
  EXPECT_LE((got - want).abs().max().item<double>(), bound);
}

TEST(LocoErrorFeedback, NothingCarriedCompensatesNothing) {
  StageError e;
  EXPECT_FALSE(e.carried());
  EXPECT_EQ(e.bytes(), 0);
  const torch::Tensor x = rows_of(1).to(torch::kBFloat16);
  const torch::Tensor c = e.compensate(x);
  EXPECT_EQ(c.scalar_type(), torch::kFloat);
  EXPECT_TRUE(torch::equal(c, x.to(torch::kFloat)));
}

TEST(LocoErrorFeedback, KeepsTheBlendOfTheCarriedAndTheNewRounding) {
  const double beta = 0.25;
  StageError e;
  const torch::Tensor sent = rows_of(2);
  const torch::Tensor read_back = sent + 0.01 * rows_of(3);
  // First: nothing carried, so the error kept is (1 - beta) times this rounding.
  e.update(sent, read_back, beta);
  ASSERT_TRUE(e.carried());
  const torch::Tensor first = carried(e);
  expect_kept_in_8_bits(first, (1 - beta) * (sent - read_back));
  // 3 rows of 700 in 8 bits: two groups of 1,056 values (one padded), one step each.
  EXPECT_EQ(e.bytes(), 2 * 1056 + 2 * 4);
  // Compensation adds what is carried to the rows.
  const torch::Tensor x = rows_of(4);
  EXPECT_TRUE(torch::allclose(e.compensate(x), x + first, 1e-6, 1e-7));
  // Second: beta times the carried error (as read back) plus (1 - beta) times the new rounding.
  const torch::Tensor read_back2 = sent - 0.02 * rows_of(5);
  e.update(sent, read_back2, beta);
  expect_kept_in_8_bits(carried(e), beta * first + (1 - beta) * (sent - read_back2));
  // beta 0: only the new rounding; beta 1: only the carried error.
  StageError fresh;
  fresh.update(sent, read_back, 0.0);
  expect_kept_in_8_bits(carried(fresh), sent - read_back);
  const torch::Tensor kept = carried(fresh);
  fresh.update(sent, read_back2, 1.0);
  expect_kept_in_8_bits(carried(fresh), kept);
}

TEST(LocoErrorFeedback, RescalesAndDropsWithTheLossScale) {
  LocoConfig config;
  config.err_beta = 0.0;
  LocoErrorFeedback loco(config, 2);
  const torch::Tensor sent = rows_of(6);
  LocoBucketErrors& b0 = loco.begin_reduction(0);
  EXPECT_EQ(b0.err_beta, 0.0);
  b0.intra_node.update(sent, sent.round(), 0.0);
  b0.inter_node.update(sent, sent.round(), 0.0);
  const torch::Tensor before = carried(b0.intra_node);
  EXPECT_EQ(loco.bytes(), 2 * b0.intra_node.bytes());
  loco.loss_scale_updated(false, 2.0);  // the scale doubled: so do the errors (exactly)
  EXPECT_TRUE(torch::equal(carried(b0.intra_node), 2 * before));
  EXPECT_TRUE(torch::equal(carried(b0.inter_node), 2 * before));
  loco.loss_scale_updated(true, 0.5);  // an overflow: every error is dropped
  EXPECT_FALSE(b0.intra_node.carried());
  EXPECT_FALSE(b0.inter_node.carried());
  EXPECT_EQ(loco.bytes(), 0);
}

TEST(LocoErrorFeedback, EachBucketRestartsEveryResetTPlusOneReductions) {
  LocoConfig config;
  config.reset_T = 2;
  LocoErrorFeedback loco(config, 2);
  const torch::Tensor sent = rows_of(7);
  std::vector<bool> carried_at_start;
  for (int k = 0; k < 7; ++k) {
    LocoBucketErrors& b = loco.begin_reduction(0);
    carried_at_start.push_back(b.intra_node.carried());
    b.intra_node.update(sent, sent.round(), config.err_beta);
    b.inter_node.update(sent, sent.round(), config.err_beta);
  }
  // As DeepSpeed counts: reductions 1 and 4 and 7 (every reset_T + 1 = 3) start from zero.
  EXPECT_EQ(carried_at_start,
            (std::vector<bool>{false, true, true, false, true, true, false}));
  // Bucket 1 was never reduced: it carries nothing, and counts on its own.
  EXPECT_FALSE(loco.begin_reduction(1).intra_node.carried());
  // After an overflow the count restarts as well: 3 reductions again before a reset.
  loco.loss_scale_updated(true, 0.5);
  carried_at_start.clear();
  for (int k = 0; k < 4; ++k) {
    LocoBucketErrors& b = loco.begin_reduction(0);
    carried_at_start.push_back(b.inter_node.carried());
    b.inter_node.update(sent, sent.round(), config.err_beta);
  }
  EXPECT_EQ(carried_at_start, (std::vector<bool>{false, true, true, false}));
}

}  // namespace
}  // namespace deepspeed::runtime
