// The profiler on the example GPT (examples/train_gpt/gpt_model.h) against an analytic count.
//
// Counted per block (B batch, T tokens, C width, nh heads), DeepSpeed's rules: ln_1, ln_2:
// 5BTC each; c_attn 2BTC*3C + 3BTC (bias); q@k^T and att@v 2BT^2C each; the 1/sqrt(hd) scale
// and softmax B*nh*T^2 each; c_proj 2BTC^2 + BTC; c_fc 2BTC*4C + 4BTC; mlp.c_proj 2BTC*4C + BTC;
// gelu 4BTC; two residual adds BTC each. Outside the blocks: wte+wpe BTC, ln_f 5BTC, the tied
// output projection 2BTCV (no bias).
// Not counted (no arithmetic, or as DeepSpeed): embedding lookups, masked_fill, views, and the
// cross-entropy loss.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deepspeed/profiler.h"
#include "gpt_model.h"

namespace deepspeed::profiling {
namespace {

using examples::GptConfig;
using examples::GptImpl;

TEST(GptFlops, TotalEqualsAnalyticCount) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(0);
  GptConfig cfg;
  cfg.vocab_size = 96;
  cfg.block_size = 16;
  cfg.n_layer = 2;
  cfg.n_head = 2;
  cfg.n_embd = 16;
  auto model = std::make_shared<GptImpl>(cfg);
  const int64_t B = 3, T = 12, C = cfg.n_embd, V = cfg.vocab_size, L = cfg.n_layer, nh = cfg.n_head;
  auto idx = torch::randint(V, {B, T}, torch::kLong);
  auto targets = torch::randint(V, {B, T}, torch::kLong);

  FlopsProfiler prof(model);
  prof.start_profile();
  model->forward(idx, targets);
  prof.stop_profile();

  const int64_t attn_macs = B * T * C * 3 * C + 2 * B * T * T * C + B * T * C * C;
  const int64_t attn_flops = 2 * attn_macs + 2 * B * nh * T * T + B * T * (3 * C + C);
  const int64_t mlp_macs = 2 * B * T * C * 4 * C;
  const int64_t mlp_flops = 2 * mlp_macs + B * T * 4 * C + B * T * (4 * C + C);
  const int64_t block_flops = attn_flops + mlp_flops + 2 * 5 * B * T * C + 2 * B * T * C;
  const int64_t total_macs = L * (attn_macs + mlp_macs) + B * T * C * V;
  const int64_t total_flops = L * block_flops + B * T * C + 5 * B * T * C + 2 * B * T * C * V;
  EXPECT_EQ(prof.get_total_macs(), total_macs);
  EXPECT_EQ(prof.get_total_flops(), total_flops);
  EXPECT_EQ(prof.get_total_params(), model->num_parameters());

  // Per module (Note [Op attribution]): attention and MLP internals lie between their own
  // Linears, so they are exact; a block's second residual add is only known to be in "h".
  EXPECT_EQ(prof.module_profile("h.0.attn").flops, attn_flops);
  EXPECT_EQ(prof.module_profile("h.1.mlp").flops, mlp_flops);
  EXPECT_EQ(prof.module_profile("h.0").flops, block_flops - B * T * C);
  EXPECT_EQ(prof.module_profile("h.0.attn.c_attn").macs, B * T * C * 3 * C);
  EXPECT_EQ(prof.module_profile("wte").params, V * C);
  EXPECT_EQ(prof.module_profile("wte").flops, 0);

  const std::string report = prof.model_profile_string(1, ProfileContext{}, -1, 3, true);
  EXPECT_NE(report.find("\n  (h): ModuleList(\n"), std::string::npos) << report;
  EXPECT_NE(report.find("(c_attn): Linear("), std::string::npos) << report;
  EXPECT_NE(report.find("depth 3:"), std::string::npos) << report;
}

}  // namespace
}  // namespace deepspeed::profiling
