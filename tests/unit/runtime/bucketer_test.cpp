// The shared bucket plan and gradient hooks of the reducers (runtime/zero/bucketer.h), in one
// process: the plan's closing rule, and hooks that fire once per backward and go with their owner.
#include "runtime/zero/bucketer.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace deepspeed::runtime {
namespace {

using Items = std::vector<std::vector<size_t>>;

TEST(PlanBuckets, ReverseOrderClosesBeforeTheLimitIsExceeded) {
  // Items 0..4 of sizes 3, 4, 2, 5, 1, limit 6: from the back 4+3 (1+5), 2+1 (2+4), 0 (3).
  BucketPlan plan = plan_buckets({3, 4, 2, 5, 1}, 6);
  EXPECT_EQ(plan.items, (Items{{4, 3}, {2, 1}, {0}}));
  EXPECT_EQ(plan.bucket_of, (std::vector<size_t>{2, 1, 1, 0, 0}));
  EXPECT_EQ(plan.slot_of, (std::vector<size_t>{0, 1, 0, 1, 0}));
  // Exactly at the limit still fits; one item over the limit gets a bucket of its own.
  EXPECT_EQ(plan_buckets({3, 3}, 6).items, (Items{{1, 0}}));
  EXPECT_EQ(plan_buckets({2, 9, 2}, 6).items, (Items{{2}, {1}, {0}}));
  EXPECT_TRUE(plan_buckets({}, 6).items.empty());
}

TEST(PlanBuckets, DifferentKeysNeverShareABucket) {
  EXPECT_EQ(plan_buckets({1, 1, 1, 1}, 100, {0, 0, 1, 1}).items, (Items{{3, 2}, {1, 0}}));
  EXPECT_EQ(plan_buckets({1, 1, 1}, 100, {0, 1, 0}).items, (Items{{2}, {1}, {0}}));
}

TEST(GradReadyHooks, FireOncePerBackwardAfterAccumulationAndGoWithTheirOwner) {
  torch::Tensor a = torch::ones({3}, torch::requires_grad());
  torch::Tensor b = torch::ones({2}, torch::requires_grad());
  std::vector<std::pair<size_t, double>> fired;  // index, its accumulated gradient's sum
  std::vector<at::Tensor> params{a, b};
  {
    GradReadyHooks hooks(params, [&](size_t i) {
      fired.emplace_back(i, params[i].grad().sum().item<double>());
    });
    (a.sum() * 2 + b.sum() * 5).backward();
    ASSERT_EQ(fired.size(), 2u);
    for (const auto& [i, sum] : fired) EXPECT_EQ(sum, i == 0 ? 6.0 : 10.0);
    (a.sum() * 2).backward();  // b gets no gradient: only a's hook fires
    ASSERT_EQ(fired.size(), 3u);
    EXPECT_EQ(fired.back().first, 0u);
    EXPECT_EQ(fired.back().second, 12.0);  // accumulated: 6 + 6
  }
  (a.sum() + b.sum()).backward();  // hooks removed with their owner
  EXPECT_EQ(fired.size(), 3u);
}

}  // namespace
}  // namespace deepspeed::runtime
