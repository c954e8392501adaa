// exp_avg_mask (DeepSpeed's param-group key) in the engine on 2 Gloo ranks, fp32 and fp16, for
// each 1-bit optimizer: after the freeze the masked momentum entries are exactly zero and the
// masked weights stay where they were (weight decay 0), while the unmasked ones train on.
#include "deepspeed/deepspeed.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deepspeed/onebit.h"
#include "support/multi_rank.h"
#include "support/onebit_fp16_model.h"

namespace deepspeed {
namespace {

using testing::OneBitFp16Model;
using testing::run_ranks;

json masked_config(const std::string& type, bool fp16) {
  json params = {{"lr", 0.01}, {"weight_decay", 0.0}};
  if (type == "ZeroOneAdam") {
    params.update({{"var_freeze_step", 4}, {"var_update_scaler", 2}, {"local_step_scaler", 2},
                   {"local_step_clipper", 2}});
  } else {
    params["freeze_step"] = 2;
  }
  json cfg = {{"train_batch_size", 2},
              {"optimizer", {{"type", type}, {"params", params}}},
              {"steps_per_print", 1000}};
  if (fp16) cfg["fp16"] = {{"enabled", true}, {"initial_scale_power", 8}};
  return cfg;
}

TEST(OneBitMaskDist, MaskedMomentumStaysZeroAndMaskedWeightsStayPut) {
  run_ranks(2, [](int rank, int) {
    for (bool fp16 : {false, true}) {
      for (const std::string type : {"OneBitAdam", "ZeroOneAdam", "OneBitLamb"}) {
        const std::string what = type + (fp16 ? " fp16" : " fp32");
        auto model = std::make_shared<OneBitFp16Model>();
        // Columns 30..36 of w: their gradients are not zero, the mask alone keeps them still.
        auto mask = torch::ones({3, 37});
        mask.narrow(1, 30, 7).zero_();
        std::vector<ParamGroup> groups{ParamGroup{{model->b}},
                                       ParamGroup{{model->w}, json::object(), mask}};
        auto engine = initialize(model, masked_config(type, fp16), groups).engine;
        auto step = [&](int64_t s) {
          auto [x, y] = testing::onebit_fp16_batch(s, rank);
          const auto dtype = model->w.scalar_type();
          engine->backward(engine->forward(x.to(dtype), y.to(dtype)));
          engine->step();
        };
        // The last uncompressed update of the masked elements: the freeze (0/1 Adam: its
        // variance freeze; its local steps move every element until the next synchronization).
        const int64_t frozen_after = type == "ZeroOneAdam" ? 5 : 2;
        for (int64_t s = 0; s < frozen_after; ++s) step(s);
        const auto w_at_freeze = model->w.detach().to(torch::kFloat).clone();
        for (int64_t s = frozen_after; s < 8; ++s) step(s);  // step 8: a 0/1 Adam synchronization
        auto* cc = dynamic_cast<onebit::CompressedCommunication*>(engine->optimizer());
        ASSERT_FALSE(cc->backward_allreduce_enabled()) << what;
        const auto w_now = model->w.detach().to(torch::kFloat);
        const auto masked = mask.eq(0);
        const double moved_masked = (w_now - w_at_freeze).abs().masked_select(masked).max().item<double>();
        const double moved_free = (w_now - w_at_freeze).abs().masked_select(~masked).max().item<double>();
        // 0/1 Adam undoes the local updates at a synchronization: p - sum(updates) rounds.
        const double slack = type == "ZeroOneAdam" ? (fp16 ? 1e-3 : 1e-6) : 0.0;
        EXPECT_LE(moved_masked, slack) << what;
        EXPECT_GT(moved_free, 1e-3) << what << ": the unmasked weights did not train";
        // The momentum of w (under fp16 the optimizer holds the group's flat fp32 master or,
        // for 1-bit LAMB, a per-parameter master).
        auto* opt = dynamic_cast<optim::DsOptimizer*>(engine->optimizer());
        auto* state = opt->find_state(opt->param_groups().at(1).params().at(0));
        ASSERT_NE(state, nullptr) << what;
        auto m = state->tensor("exp_avg").reshape({-1}).narrow(0, 0, 3 * 37).view({3, 37});
        EXPECT_EQ(m.masked_select(masked).abs().max().item<double>(), 0.0) << what;
        EXPECT_GT(m.masked_select(~masked).abs().max().item<double>(), 0.0) << what;
      }
    }
  });
}

}  // namespace
}  // namespace deepspeed
