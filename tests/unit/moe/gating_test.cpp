// DeepSpeed's top-1 / top-2 gating: capacity, which tokens are dropped, slot placement, the
// combine weights and the load-balancing loss, on hand-made routings and fixed logits. The
// expected values are computed here from the formulas (deepspeed/moe/sharded_moe.py), not by
// the code under test.
#include "deepspeed/moe.h"

#include <cmath>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace deepspeed::moe {
namespace {

// Logits that route token s to first[s] (and to second[s] as the runner-up).
torch::Tensor routing_logits(const std::vector<int64_t>& first, const std::vector<int64_t>& second,
                             int64_t E) {
  const int64_t S = static_cast<int64_t>(first.size());
  auto logits = torch::zeros({S, E});
  for (int64_t s = 0; s < S; ++s) {
    logits[s][first[s]] = 4.0 + 0.01 * s;  // distinct gate values per token
    if (!second.empty()) logits[s][second[s]] = 2.0;
  }
  return logits;
}

// Tokens whose combine weights are all zero were dropped.
int64_t dropped_tokens(const GateOutput& g) {
  return (g.combine_weights.sum({1, 2}) == 0).sum().item<int64_t>();
}

TEST(MoECapacity, IsTheCeilOfTokensPerExpertTimesFactorWithAFloor) {
  EXPECT_EQ(capacity(10, 4, 1.0, 0), 3);    // ceil(2.5)
  EXPECT_EQ(capacity(10, 4, 1.0, 4), 4);    // min_capacity
  EXPECT_EQ(capacity(64, 4, 1.25, 4), 20);  // ceil(16 * 1.25)
  EXPECT_EQ(capacity(64, 8, 2 * 1.0, 4), 16);  // top-2 doubles the factor
  EXPECT_EQ(capacity(7, 2, 0.5, 1), 2);     // ceil(1.75)
}

TEST(MoETop1, DropsTheTokensBeyondEachExpertsCapacity) {
  const std::vector<int64_t> route{0, 0, 0, 0, 0, 0, 0, 1, 1, 2, 0, 0};
  const int64_t E = 3, S = 12;
  for (bool rts : {false, true}) {
    for (double cf : {0.5, 1.0, 2.0}) {
      GateOutput g = top1gating(routing_logits(route, {}, E), cf, 0, {}, "None", true, rts);
      const int64_t C = capacity(S, E, cf, 0);
      EXPECT_EQ(g.capacity, C);
      std::vector<int64_t> count(E, 0);
      for (auto e : route) count[e] += 1;
      int64_t expected = 0;
      for (auto c : count) expected += std::max<int64_t>(0, c - C);
      EXPECT_EQ(dropped_tokens(g), expected) << "cf " << cf << " rts " << rts;
      EXPECT_TRUE(torch::equal(g.exp_counts, torch::tensor({9, 2, 1}, torch::kLong)));
      // Every slot holds at most one token, and each kept token sits in its own expert.
      EXPECT_LE(g.dispatch_mask.sum(0).max().item<int64_t>(), 1);
      for (int64_t s = 0; s < S; ++s) {
        EXPECT_EQ(g.dispatch_mask[s].sum(1).nonzero().numel() <= 1, true);
        if (g.dispatch_mask[s].any().item<bool>()) {
          EXPECT_TRUE(g.dispatch_mask[s][route[s]].any().item<bool>());
        }
      }
    }
  }
}

TEST(MoETop1, WithoutRandomSelectionTheFirstTokensWinInOrder) {
  const std::vector<int64_t> route{1, 0, 1, 1, 0, 1, 1, 1};
  GateOutput g = top1gating(routing_logits(route, {}, 2), 1.0, 0, {}, "None", true, false);
  ASSERT_EQ(g.capacity, 4);
  // Expert 1's tokens in order are 0, 2, 3, 5, 6, 7: slots 0..3 go to 0, 2, 3, 5.
  const std::vector<int64_t> kept{0, 2, 3, 5};
  for (size_t c = 0; c < kept.size(); ++c) {
    EXPECT_TRUE(g.dispatch_mask[kept[c]][1][c].item<bool>()) << "slot " << c;
  }
  EXPECT_FALSE(g.dispatch_mask[6].any().item<bool>());
  EXPECT_FALSE(g.dispatch_mask[7].any().item<bool>());
  // The weight is the token's softmax probability of its expert.
  auto probs = torch::softmax(routing_logits(route, {}, 2), 1);
  EXPECT_FLOAT_EQ(g.combine_weights[2][1][1].item<float>(), probs[2][1].item<float>());
}

TEST(MoETop1, WithoutDroppingTheCapacityIsTheBusiestExpert) {
  const std::vector<int64_t> route{0, 0, 0, 0, 0, 1, 2, 0};
  GateOutput g = top1gating(routing_logits(route, {}, 3), 1.0, 4, {}, "None", false, true);
  EXPECT_EQ(g.capacity, 6);
  EXPECT_EQ(dropped_tokens(g), 0);
}

TEST(MoETop1, UsedTokenMasksTokensOutOfRouting) {
  const std::vector<int64_t> route{0, 1, 0, 1};
  auto used = torch::tensor({1.0f, 0.0f, 1.0f, 1.0f});
  GateOutput g = top1gating(routing_logits(route, {}, 2), 2.0, 0, used, "None", true, false);
  EXPECT_TRUE(torch::equal(g.exp_counts, torch::tensor({2, 1}, torch::kLong)));
  EXPECT_FALSE(g.dispatch_mask[1].any().item<bool>());
}

TEST(MoETop1, RefusesFewerTokensThanMinCapacity) {
  EXPECT_THROW(top1gating(torch::zeros({3, 2}), 1.0, 4), UsageError);
}

TEST(MoETop2, SecondChoicesTakeTheSlotsAfterTheFirstOnes) {
  // Expert 0 is every token's first choice, expert 1 their second: C = max(ceil(2*6/3), 0) = 4.
  const std::vector<int64_t> first{0, 0, 0, 1, 0, 2};
  const std::vector<int64_t> second{1, 1, 2, 0, 1, 1};
  const int64_t E = 3, S = 6;
  for (double cf : {0.5, 1.0, 2.0}) {
    GateOutput g = top2gating(routing_logits(first, second, E), cf, 0, true, nullptr, false);
    const int64_t C = capacity(S, E, cf * 2, 0);
    EXPECT_EQ(g.capacity, C);
    std::vector<int64_t> c1(E, 0), c2(E, 0);
    for (auto e : first) c1[e] += 1;
    for (auto e : second) c2[e] += 1;
    int64_t kept = 0;
    for (int64_t e = 0; e < E; ++e) {
      kept += std::min(c1[e], C) + std::clamp<int64_t>(C - c1[e], 0, c2[e]);
    }
    EXPECT_EQ(g.dispatch_mask.sum().item<int64_t>(), kept) << "cf " << cf;
    EXPECT_TRUE(torch::equal(g.exp_counts, torch::tensor({5, 5, 2}, torch::kLong)));
  }
  // With room for all: token 3's second choice (expert 0) sits after expert 0's 4 first choices.
  GateOutput g = top2gating(routing_logits(first, second, E), 2.0, 0, true, nullptr, false);
  EXPECT_TRUE(g.dispatch_mask[3][0][4].item<bool>());
  // Both weights of a token renormalised to sum to 1.
  auto w = g.combine_weights.sum({1, 2});
  EXPECT_TRUE(torch::allclose(w, torch::ones({S})));
}

TEST(MoETop2, WithoutDroppingNothingIsDropped) {
  const std::vector<int64_t> first{0, 0, 0, 0, 0, 0};
  const std::vector<int64_t> second{1, 1, 1, 1, 2, 1};
  GateOutput g = top2gating(routing_logits(first, second, 3), 0.1, 0, false, nullptr, false);
  EXPECT_EQ(g.capacity, 6);
  EXPECT_EQ(g.dispatch_mask.sum().item<int64_t>(), 12);
}

TEST(MoEAuxLoss, MatchesDeepSpeedsFormulaOnFixedLogits) {
  torch::manual_seed(7);
  const int64_t S = 37, E = 5;
  auto logits = torch::randn({S, E}).to(torch::kDouble).to(torch::kFloat);
  auto probs = torch::softmax(logits.to(torch::kDouble), 1);
  auto first = probs.argmax(1);
  std::vector<double> me(E, 0.0), ce(E, 0.0);
  for (int64_t s = 0; s < S; ++s) {
    for (int64_t e = 0; e < E; ++e) me[e] += probs[s][e].item<double>() / S;
    ce[first[s].item<int64_t>()] += 1.0 / S;
  }
  double top1 = 0.0, top2 = 0.0;
  for (int64_t e = 0; e < E; ++e) {
    top1 += me[e] * ce[e] * E;          // E * sum_e me * ce
    top2 += me[e] * ce[e] / E * E * E;  // E^2 * mean_e me * ce
  }
  GateOutput g1 = top1gating(logits, 1.0, 4, {}, "None", true, true);
  GateOutput g2 = top2gating(logits, 1.0, 4, true, nullptr, true);
  EXPECT_NEAR(g1.l_aux.item<double>(), top1, 1e-6);
  EXPECT_NEAR(g2.l_aux.item<double>(), top2, 1e-6);
  // The loss reaches the gate's logits.
  auto leaf = logits.clone().requires_grad_(true);
  top1gating(leaf, 1.0, 4).l_aux.backward();
  EXPECT_GT(leaf.grad().abs().sum().item<double>(), 0.0);
}

TEST(MoEExpertGroups, LayOutRanksAsDeepSpeed) {
  // E + D (default): expert-parallel groups are consecutive, expert-data-parallel strided.
  auto ed = expert_group_ranks(8, 2, false);
  EXPECT_EQ(ed.expert_parallel,
            (std::vector<std::vector<int>>{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(ed.expert_data_parallel,
            (std::vector<std::vector<int>>{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  // D + E (use_data_before_expert_parallelism).
  auto de = expert_group_ranks(8, 2, true);
  EXPECT_EQ(de.expert_data_parallel,
            (std::vector<std::vector<int>>{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(de.expert_parallel,
            (std::vector<std::vector<int>>{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  auto all = expert_group_ranks(4, 4, false);
  EXPECT_EQ(all.expert_parallel, (std::vector<std::vector<int>>{{0, 1, 2, 3}}));
  EXPECT_EQ(all.expert_data_parallel.size(), 4u);
  EXPECT_THROW(expert_group_ranks(6, 4, false), UsageError);
}

}  // namespace
}  // namespace deepspeed::moe
