// The cross-rank overflow vote on Gloo ranks: one rank's inf/nan gradient makes every rank skip
// the step, so the dynamic loss scalers of all ranks stay in lockstep.
#include "runtime/precision/overflow_check.h"

#include <limits>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deepspeed/comm.h"
#include "runtime/precision/loss_scaler.h"
#include "support/multi_rank.h"

namespace deepspeed::runtime {
namespace {

using deepspeed::testing::run_ranks;

// Gradients of one rank at one step: a nan in an fp16 tensor when `bad`.
std::vector<at::Tensor> grads(bool bad) {
  std::vector<at::Tensor> g{torch::randn({4097}), torch::randn({7}).to(torch::kHalf)};
  if (bad) g[1][3] = std::numeric_limits<float>::quiet_NaN();
  return g;
}

TEST(OverflowCheckDist, OneRankOverflowingMakesEveryRankSkip) {
  run_ranks(2, [](int rank, int world) {
    // Step-by-step: which rank (-1 none, 2 both) sees a non-finite gradient.
    const std::vector<int> overflowing_rank = {1, -1, 0, 2, -1, -1, -1, 1};
    // Hand-derived for hysteresis 1, window 2, start 2^8, script O C O O C C C O:
    // O@0 128 | C@1 stable 0 | O@2 64 | O@3 32 | C@4 s0 | C@5 s1 | C@6 s2 -> 64 | O@7 32.
    const std::vector<double> want_scale = {128, 128, 64, 32, 32, 32, 64, 32};
    Fp16Config c;
    c.enabled = true;
    c.initial_scale_power = 8;
    c.loss_scale_window = 2;
    c.hysteresis = 1;
    auto scaler = make_loss_scaler(c);
    for (size_t step = 0; step < overflowing_rank.size(); ++step) {
      const int who = overflowing_rank[step];
      const bool local = has_inf_or_nan(grads(who == rank || who == 2));
      EXPECT_EQ(local, who == rank || who == 2) << "step " << step;
      const bool skip = any_rank_overflow(local);
      EXPECT_EQ(skip, who != -1) << "rank " << rank << " step " << step;
      scaler->update_scale(skip);
      EXPECT_EQ(scaler->loss_scale(), want_scale[step]) << "rank " << rank << " step " << step;
    }
    // Every rank ends with the same scaler state: max == min == mine, field by field.
    auto* d = dynamic_cast<DynamicLossScaler*>(scaler.get());
    ASSERT_NE(d, nullptr);
    auto mine = torch::tensor({d->loss_scale(), static_cast<double>(d->cur_iter()),
                               static_cast<double>(d->last_overflow_iter()),
                               static_cast<double>(d->cur_hysteresis())},
                              torch::kDouble);
    auto hi = mine.clone();
    auto lo = mine.clone();
    comm::all_reduce(hi, comm::ReduceOp::kMax);
    comm::all_reduce(lo, comm::ReduceOp::kMin);
    EXPECT_TRUE(torch::equal(hi, mine)) << "rank " << rank << " of " << world;
    EXPECT_TRUE(torch::equal(lo, mine)) << "rank " << rank << " of " << world;
    EXPECT_EQ(d->cur_iter(), 8);
    EXPECT_EQ(d->last_overflow_iter(), 7);
  });
}

TEST(OverflowCheckDist, ThreeRanksOnlyLastOverflows) {
  run_ranks(3, [](int rank, int world) {
    EXPECT_TRUE(any_rank_overflow(rank == world - 1));
    EXPECT_FALSE(any_rank_overflow(false));
    EXPECT_TRUE(any_rank_overflow(true));
    EXPECT_TRUE(any_rank_overflow(rank == 0));
  });
}

}  // namespace
}  // namespace deepspeed::runtime
