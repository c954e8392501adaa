// The MoE layer on one process (ep_size 1): output = sum over the chosen experts of gate weight x
// expert(token), checked against a per-token loop; dropped tokens give zeros; PR-MoE's residual
// mix; DeepSpeed's parameter names; eval capacity; option errors.
#include "deepspeed/moe.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace deepspeed::moe {
namespace {

torch::nn::AnyModule linear_expert(int64_t d) { return torch::nn::AnyModule(torch::nn::Linear(d, d)); }

// Gives local expert i weights of its own (DeepSpeed's deep copies start equal).
void distinct_experts(MoEImpl& moe) {
  torch::NoGradGuard ng;
  int64_t i = 0;
  for (auto& m : *moe.deepspeed_moe->experts->deepspeed_experts) {
    torch::manual_seed(100 + i++);
    for (auto& p : m->parameters()) p.copy_(torch::randn(p.sizes()) * 0.3);
  }
}

torch::Tensor expert_out(MoEImpl& moe, int64_t e, const torch::Tensor& x) {
  auto m = moe.deepspeed_moe->experts->deepspeed_experts[e];
  return m->as<torch::nn::Linear>()->forward(x);
}

TEST(MoELayer, Top1OutputIsTheGateWeightTimesTheChosenExpert) {
  const int64_t d = 6, E = 4;
  torch::manual_seed(3);
  MoEOptions o;
  o.num_experts = E;
  o.k = 1;
  o.drop_tokens = false;
  MoE moe(d, linear_expert(d), o);
  distinct_experts(*moe);
  auto x = torch::randn({2, 5, d});
  auto [out, l_aux, counts] = moe->forward(x);
  ASSERT_EQ(out.sizes(), x.sizes());
  auto flat = x.reshape({-1, d});
  auto probs = torch::softmax(moe->deepspeed_moe->gate->wg(flat), 1);
  auto expected = torch::zeros_like(flat);
  for (int64_t s = 0; s < flat.size(0); ++s) {
    const int64_t e = probs[s].argmax().item<int64_t>();
    expected[s] = probs[s][e] * expert_out(*moe, e, flat[s].unsqueeze(0))[0];
  }
  EXPECT_TRUE(torch::allclose(out.reshape({-1, d}), expected, 1e-5, 1e-6));
  EXPECT_EQ(counts.sum().item<int64_t>(), 10);
  EXPECT_EQ(l_aux.dim(), 0);
}

TEST(MoELayer, Top2OutputMixesBothExpertsByRenormalisedWeights) {
  const int64_t d = 4, E = 3;
  torch::manual_seed(5);
  MoEOptions o;
  o.num_experts = E;
  o.k = 2;
  o.drop_tokens = false;
  o.top2_2nd_expert_sampling = false;
  MoE moe(d, linear_expert(d), o);
  distinct_experts(*moe);
  auto x = torch::randn({7, d});
  auto out = std::get<0>(moe->forward(x));
  auto probs = torch::softmax(moe->deepspeed_moe->gate->wg(x), 1);
  for (int64_t s = 0; s < 7; ++s) {
    auto top = std::get<1>(probs[s].topk(2));
    const int64_t a = top[0].item<int64_t>(), b = top[1].item<int64_t>();
    auto pa = probs[s][a], pb = probs[s][b];
    auto want = (pa * expert_out(*moe, a, x[s].unsqueeze(0))[0] +
                 pb * expert_out(*moe, b, x[s].unsqueeze(0))[0]) / (pa + pb);
    EXPECT_TRUE(torch::allclose(out[s], want, 1e-5, 1e-6)) << "token " << s;
  }
}

TEST(MoELayer, DroppedTokensGiveZeros) {
  const int64_t d = 4;
  MoEOptions o;
  o.num_experts = 2;
  o.capacity_factor = 0.5;  // C = ceil(8 / 2 * 0.5) = 2 per expert: at least 4 tokens dropped
  o.min_capacity = 0;
  o.use_rts = false;
  MoE moe(d, linear_expert(d), o);
  torch::manual_seed(1);
  auto x = torch::randn({8, d});
  auto [out, l_aux, counts] = moe->forward(x);
  auto dropped = [&](int64_t cap) {
    return (counts - cap).clamp_min(0).sum().item<int64_t>();
  };
  EXPECT_EQ((out.abs().sum(1) == 0).sum().item<int64_t>(), dropped(2));
  // Eval mode takes eval_capacity_factor (1.0: C = 4).
  moe->eval();
  auto [out_eval, l_eval, counts_eval] = moe->forward(x);
  EXPECT_TRUE(torch::equal(counts_eval, counts));
  EXPECT_EQ((out_eval.abs().sum(1) == 0).sum().item<int64_t>(), dropped(4));
}

TEST(MoELayer, ResidualMixesTheDenseMlpByALearnedCoefficient) {
  const int64_t d = 4;
  MoEOptions o;
  o.num_experts = 2;
  o.use_residual = true;
  o.drop_tokens = false;
  torch::nn::Linear dense(d, d);
  MoE moe(d, torch::nn::AnyModule(dense), o);
  auto x = torch::randn({5, d});
  auto out = std::get<0>(moe->forward(x));
  auto moe_only = moe->deepspeed_moe->forward(x);
  auto coef = torch::softmax(moe->coefficient(x), -1);
  auto want = moe_only * coef.narrow(-1, 0, 1) + dense(x) * coef.narrow(-1, 1, 1);
  EXPECT_TRUE(torch::allclose(out, want, 1e-5, 1e-6));
}

TEST(MoELayer, NamesItsParametersAsDeepSpeed) {
  MoEOptions o;
  o.num_experts = 2;
  o.use_residual = true;
  MoE moe(4, linear_expert(4), o);
  std::vector<std::string> names;
  for (auto& p : moe->named_parameters()) names.push_back(p.key());
  const std::vector<std::string> want{
      "deepspeed_moe.gate.wg.weight",
      "deepspeed_moe.experts.deepspeed_experts.0.weight",
      "deepspeed_moe.experts.deepspeed_experts.0.bias",
      "deepspeed_moe.experts.deepspeed_experts.1.weight",
      "deepspeed_moe.experts.deepspeed_experts.1.bias",
      "mlp.weight",
      "mlp.bias",
      "coefficient.weight",
      "coefficient.bias"};
  EXPECT_EQ(names, want);
  EXPECT_EQ(moe->expert_parameters().size(), 4u);
  EXPECT_EQ(moe_layers(*moe).size(), 1u);
}

TEST(MoELayer, GradientsReachGateAndChosenExpertsOnly) {
  const int64_t d = 4;
  MoEOptions o;
  o.num_experts = 4;
  o.drop_tokens = false;
  MoE moe(d, linear_expert(d), o);
  distinct_experts(*moe);
  torch::manual_seed(2);
  auto x = torch::randn({5, d});  // at least min_capacity (4) tokens, as DeepSpeed asserts
  auto [out, l_aux, counts] = moe->forward(x);
  (out.sum() + l_aux).backward();
  EXPECT_GT(moe->deepspeed_moe->gate->wg->weight.grad().abs().sum().item<double>(), 0.0);
  for (int64_t e = 0; e < 4; ++e) {
    auto w = moe->deepspeed_moe->experts->deepspeed_experts[e]->parameters()[0];
    const bool used = counts[e].item<int64_t>() > 0;
    const double g = w.grad().defined() ? w.grad().abs().sum().item<double>() : 0.0;
    EXPECT_EQ(g > 0.0, used) << "expert " << e;
  }
}

TEST(MoELayer, RejectsBadOptionsByName) {
  MoEOptions o;
  o.num_experts = 3;
  o.ep_size = 2;
  EXPECT_THROW(MoE(4, linear_expert(4), o), UsageError);
  o = {};
  o.k = 3;
  EXPECT_THROW(MoE(4, linear_expert(4), o), NotSupportedError);
  o = {};
  o.noisy_gate_policy = "Gaussian";
  EXPECT_THROW(MoE(4, linear_expert(4), o), UsageError);
  // ep_size > 1 needs its groups before forward.
  o = {};
  o.num_experts = 2;
  o.ep_size = 2;
  MoE moe(4, linear_expert(4), o);
  EXPECT_THROW(moe->forward(torch::randn({4, 4})), UsageError);
}

TEST(MoELayer, NoisyPoliciesRunAndStayNearTheirInputs) {
  for (const char* policy : {"Jitter", "RSample"}) {
    MoEOptions o;
    o.num_experts = 4;
    o.noisy_gate_policy = policy;
    o.drop_tokens = false;
    MoE moe(4, linear_expert(4), o);
    auto x = torch::randn({16, 4});
    auto [out, l_aux, counts] = moe->forward(x);
    EXPECT_EQ(counts.sum().item<int64_t>(), 16) << policy;
    EXPECT_TRUE(torch::isfinite(out).all().item<bool>()) << policy;
  }
}

}  // namespace
}  // namespace deepspeed::moe
