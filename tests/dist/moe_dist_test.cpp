// MoE with expert parallelism on Gloo ranks. With drop_tokens off, E = 4 experts: ep_size 2 on 2
// ranks, ep_size 2 and 4 on 4 ranks end with the same parameters (every expert, by global id,
// and the dense ones) and the same global gradient norms as ep_size 1 (experts replicated) on
// the same ranks, top-1 and top-2, with and without clipping; with the auxiliary loss off, as the
// single-process model trained on all ranks' tokens. A rank whose expert gets no token neither
// hangs nor moves it (ZeRO 0 and 2). ZeRO-3 is refused by name. ZeRO 1/2, fp16/bf16 and the
// checkpoints: moe_zero_dist_test; MoE in pipeline stages: pipe_moe_dist_test.
#include "deepspeed/deepspeed.h"
#include "deepspeed/moe.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "support/moe_net.h"
#include "support/multi_rank.h"

namespace deepspeed {
namespace {

using testing::run_ranks;

using namespace testing::moe_net;  // NOLINT: the shared MoE test model

void compare_ep_sizes(int world, const std::vector<int64_t>& ep_sizes, const Case& c) {
  share_dir();
  const std::string base = "w" + std::to_string(world) + "_k" + std::to_string(c.k);
  for (int64_t ep : ep_sizes) {
    const std::string tag = base + "_ep" + std::to_string(ep);
    run_ranks(world, [&](int rank, int w) { train_and_save(rank, w, ep, c, tag, kTokensPerRank); });
  }
  if (testing::in_rank_process()) return;
  for (int64_t ep : ep_sizes) {
    if (ep != 1) expect_same_training(base + "_ep1", base + "_ep" + std::to_string(ep));
  }
  expect_trained(base + "_ep1");
}

TEST(MoEDist, Top1EpSize2On2RanksEqualsReplicatedExperts) {
  compare_ep_sizes(2, {1, 2}, Case{1, true, 0.0});
}
TEST(MoEDist, Top2EpSize2On2RanksEqualsReplicatedExpertsWithClipping) {
  compare_ep_sizes(2, {1, 2}, Case{2, true, 0.05});
}
TEST(MoEDist, Top1EpSizes2And4On4RanksEqualReplicatedExpertsWithClipping) {
  compare_ep_sizes(4, {1, 2, 4}, Case{1, true, 0.05});
}
TEST(MoEDist, Top2EpSizes2And4On4RanksEqualReplicatedExperts) {
  compare_ep_sizes(4, {1, 2, 4}, Case{2, true, 0.0});
}

// Without the auxiliary loss (a product of per-rank means) the ranks' average gradient is the
// gradient of the whole batch: ep_size 2 on 2 ranks and 4 on 4 ranks train as one process
// seeing every token.
TEST(MoEDist, WithoutAuxLossExpertParallelEqualsTheSingleProcessModel) {
  share_dir();
  for (int64_t k : {1, 2}) {
    Case c{k, /*top2_sampling=*/false, 0.05, /*aux_coef=*/0.0};
    const std::string base = "single_k" + std::to_string(k);
    for (int world : {2, 4}) {
      run_ranks(1, [&](int rank, int) {
        train_and_save(rank, 1, 1, c, base + "_w" + std::to_string(world) + "_ref",
                       kTokensPerRank * world);
      });
      // One process over `world` ranks' tokens reads them in the same order.
      run_ranks(world, [&](int rank, int w) {
        train_and_save(rank, w, w, c, base + "_w" + std::to_string(w) + "_ep", kTokensPerRank);
      });
      if (!testing::in_rank_process()) {
        expect_same_training(base + "_w" + std::to_string(world) + "_ref",
                             base + "_w" + std::to_string(world) + "_ep");
      }
    }
  }
}

// Every token goes to expert 0 (a zero gate picks the first expert): rank 1's expert gets no
// token. Nobody hangs, its gradient is zero (it does not move), expert 0 does.
TEST(MoEDist, AnExpertWithoutTokensDoesNotHangAndGetsZeroGradients) {
  for (int stage : {0, 2}) {
  for (bool drop : {false, true}) {
    run_ranks(2, [drop, stage](int rank, int) {
      moe::MoEOptions o;
      o.num_experts = 2;
      o.ep_size = 2;
      o.drop_tokens = drop;
      o.capacity_factor = 2.0;
      auto model = std::make_shared<MoENetImpl>(o, 0.01);
      {
        torch::NoGradGuard ng;
        model->moe->deepspeed_moe->gate->wg->weight.zero_();
      }
      model->moe->deepspeed_moe->gate->wg->weight.set_requires_grad(false);
      json config{{"train_micro_batch_size_per_gpu", kTokensPerRank},
                  {"gradient_clipping", 1.0},
                  {"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.5}}}}},
                  {"zero_optimization", {{"stage", stage}}},
                  {"zero_allow_untested_optimizer", true}};
      auto [engine, opt, sched] = initialize(model, config);
      auto expert = model->moe->deepspeed_moe->experts->deepspeed_experts[0]->parameters();
      std::vector<at::Tensor> before;
      for (auto& p : expert) before.push_back(p.detach().clone());
      for (int s = 0; s < 3; ++s) {
        auto [x, y] = tokens((s * 2 + rank) * kTokensPerRank, kTokensPerRank);
        auto loss = engine->forward(x, y);
        auto counts = model->moe->deepspeed_moe->exp_counts;
        EXPECT_EQ(counts[1].item<int64_t>(), 0);
        engine->backward(loss);
        // ZeRO-2 keeps gradients in its partitions only: there the expert must not move.
        if (rank == 1 && stage == 0) {
          for (auto& p : expert) EXPECT_EQ(p.grad().abs().max().item<double>(), 0.0);
        }
        engine->step();
      }
      bool moved = false;
      for (size_t i = 0; i < expert.size(); ++i) moved |= !torch::equal(expert[i], before[i]);
      EXPECT_EQ(moved, rank == 0) << "rank " << rank << " drop_tokens " << drop << " stage " << stage;
    });
  }
  }
}

// DeepSpeed refuses MoE under ZeRO-3 (its MoE layers are not partitioned); so do we, by name.
TEST(MoEDist, RefusesZero3ByName) {
  run_ranks(2, [](int, int) {
    moe::MoEOptions o;
    o.num_experts = 2;
    auto model = std::make_shared<MoENetImpl>(o, 0.01);
    json config{{"train_micro_batch_size_per_gpu", 4},
                {"optimizer", {{"type", "Adam"}, {"params", {{"lr", 0.1}}}}},
                {"zero_optimization", {{"stage", 3}}}};
    try {
      initialize(model, config);
      ADD_FAILURE() << "ZeRO-3 with MoE was accepted";
    } catch (const NotSupportedError& e) {
      EXPECT_NE(std::string(e.what()).find("Stage 3"), std::string::npos) << e.what();
    }
  });
}

// 1-bit optimizers all-reduce every gradient over the data-parallel group by themselves, fp32 or
// fp16 (both stage-0 paths).
TEST(MoEDist, RefusesOneBitOptimizersByName) {
  run_ranks(2, [](int, int) {
    for (bool fp16 : {false, true}) {
      moe::MoEOptions o;
      o.num_experts = 2;
      o.ep_size = 2;
      auto model = std::make_shared<MoENetImpl>(o, 0.01);
      json config{{"train_micro_batch_size_per_gpu", 4},
                  {"optimizer", {{"type", "OneBitAdam"}, {"params", {{"lr", 0.1}, {"freeze_step", 2}}}}}};
      if (fp16) config["fp16"] = {{"enabled", true}};
      try {
        initialize(model, config);
        ADD_FAILURE() << "1-bit Adam with MoE was accepted (fp16 " << fp16 << ")";
      } catch (const NotSupportedError& e) {
        EXPECT_NE(std::string(e.what()).find("1-bit optimizers with MoE"), std::string::npos)
            << e.what();
      }
    }
  });
}

}  // namespace
}  // namespace deepspeed
