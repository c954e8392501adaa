// TokenChoiceMoE (deepspeed/auto_ep.h) against a per-token loop written from transformers'
// MixtralSparseMoeBlock and DeepSpeed's TokenChoiceTopKRouter: softmax or sigmoid scores in fp32,
// the top-k experts, their scores normalised and scaled, each chosen expert's SwiGLU weighted
// after ("post") or before ("pre") it runs, and group-limited routing (DeepSeek's: the experts
// of a token's best groups only, groups scored by their best expert or their two best). Outputs
// and every gradient agree.
#include "deepspeed/auto_ep.h"
#include "deepspeed/errors.h"

#include <algorithm>
#include <limits>

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace deepspeed {
namespace {

// Token t's candidate scores: those of the experts in its num_limited_groups best groups, the
// others -inf, written as a loop over the groups.
at::Tensor candidates(const at::Tensor& s, const moe::TokenChoiceOptions& o) {
  if (o.num_expert_groups == 0) return s;
  const int64_t per = o.num_experts / o.num_expert_groups;
  std::vector<std::pair<float, int64_t>> groups;
  for (int64_t g = 0; g < o.num_expert_groups; ++g) {
    std::vector<float> v;
    for (int64_t e = g * per; e < (g + 1) * per; ++e) v.push_back(s[e].item<float>());
    std::sort(v.rbegin(), v.rend());
    groups.emplace_back(o.group_score_func == "max" ? v[0] : v[0] + v[1], g);
  }
  std::sort(groups.rbegin(), groups.rend());
  at::Tensor c = s.clone();
  for (size_t i = static_cast<size_t>(o.num_limited_groups); i < groups.size(); ++i) {
    c.slice(0, groups[i].second * per, (groups[i].second + 1) * per)
        .fill_(-std::numeric_limits<float>::infinity());
  }
  return c;
}

at::Tensor reference(moe::TokenChoiceMoEImpl& m, const at::Tensor& x) {
  const auto& o = m.options();
  const at::Tensor flat = x.reshape({-1, x.size(-1)});
  std::vector<at::Tensor> rows;
  for (int64_t t = 0; t < flat.size(0); ++t) {
    const at::Tensor xt = flat[t];
    const at::Tensor logits = at::matmul(m.gate->weight, xt).to(at::kFloat);
    const at::Tensor s = o.score_func == "softmax" ? logits.softmax(0) : logits.sigmoid();
    const at::Tensor bias =
        m.score_correction_bias.defined() ? m.score_correction_bias : at::zeros_like(s);
    const at::Tensor idx = std::get<1>(candidates(s + bias, o).topk(o.top_k));
    at::Tensor top = s.index_select(0, idx);
    if (o.route_norm) top = top / (top.sum() + 1e-20);
    top = top * o.route_scale;
    at::Tensor y = at::zeros_like(xt);
    for (int64_t j = 0; j < o.top_k; ++j) {
      const int64_t e = idx[j].item<int64_t>();
      const at::Tensor w = top[j].to(x.scalar_type());
      const at::Tensor in = o.score_apply == "pre" ? xt * w : xt;
      const auto& ex = *m.experts;
      at::Tensor out = at::matmul(ex.w2[e], at::silu(at::matmul(ex.w1[e], in)) *
                                                at::matmul(ex.w3[e], in));
      y = y + (o.score_apply == "post" ? out * w : out);
    }
    rows.push_back(y);
  }
  return at::stack(rows).view(x.sizes());
}

void expect_matches(const moe::TokenChoiceOptions& o, at::ScalarType dtype, double tol) {
  torch::manual_seed(3);
  moe::TokenChoiceMoE m(6, 10, o);
  if (o.score_correction_bias) {
    torch::NoGradGuard no_grad;
    m->score_correction_bias.copy_(torch::randn({o.num_experts}) * 0.3);
  }
  m->to(dtype);
  at::Tensor x = torch::randn({2, 5, 6}).to(dtype).requires_grad_(true);
  at::Tensor probe = torch::randn({2, 5, 6}).to(dtype);
  at::Tensor y = m->forward(x);
  (y * probe).sum().backward();
  std::vector<at::Tensor> grads{x.grad()};
  for (const auto& p : m->parameters()) grads.push_back(p.grad());
  x.mutable_grad().reset();
  m->zero_grad();
  at::Tensor ref = reference(*m, x);
  (ref * probe).sum().backward();
  auto close = [tol](const at::Tensor& a, const at::Tensor& b) {
    return torch::allclose(a.to(at::kFloat), b.to(at::kFloat), tol, tol);
  };
  EXPECT_TRUE(close(y, ref)) << o.score_func << " " << o.score_apply;
  EXPECT_TRUE(close(grads[0], x.grad())) << "input grad";
  size_t i = 1;
  for (const auto& p : m->named_parameters()) {
    EXPECT_TRUE(close(grads[i++], p.value().grad())) << p.key() << " " << o.score_apply;
  }
  EXPECT_EQ(m->tokens_per_expert().sum().item<int64_t>(), 10 * o.top_k);
}

TEST(TokenChoiceMoE, EqualsThePerTokenLoopOfMixtralsBlock) {
  moe::TokenChoiceOptions o;
  o.num_experts = 4;
  o.top_k = 2;
  expect_matches(o, at::kFloat, 1e-5);
  o.score_apply = "pre";
  expect_matches(o, at::kFloat, 1e-5);
  o.score_apply = "post";
  o.score_func = "sigmoid";
  o.route_norm = false;
  o.route_scale = 2.5;
  expect_matches(o, at::kFloat, 1e-5);
  o.top_k = 3;
  o.score_func = "softmax";
  expect_matches(o, at::kFloat, 1e-5);
  o.top_k = 2;
  expect_matches(o, at::kBFloat16, 3e-2);
}

TEST(TokenChoiceMoE, GroupLimitedRoutingChoosesWithinTheBestGroups) {
  moe::TokenChoiceOptions o;
  o.num_experts = 8;
  o.top_k = 2;
  o.score_func = "sigmoid";
  o.num_expert_groups = 4;
  o.num_limited_groups = 2;  // DeepSeek-V3's form: groups by their two best experts
  expect_matches(o, at::kFloat, 1e-5);
  o.group_score_func = "max";  // DeepSeek-V2's
  o.num_limited_groups = 1;
  o.score_func = "softmax";
  expect_matches(o, at::kFloat, 1e-5);
  o.top_k = 3;
  o.num_expert_groups = 2;
  expect_matches(o, at::kFloat, 1e-5);
  // DeepSeek-V3's correction bias, in the choice of groups and experts, not in the weights.
  o.score_correction_bias = true;
  o.score_func = "sigmoid";
  o.group_score_func = "top2_sum";
  o.num_expert_groups = 4;
  o.num_limited_groups = 2;
  o.top_k = 2;
  expect_matches(o, at::kFloat, 1e-5);
  o.score_correction_bias = false;
  // The limit weighs in: every token's two experts in one group of two is not what plain top-2
  // chooses for these tokens.
  const auto counts = [](const moe::TokenChoiceOptions& opts) {
    torch::manual_seed(3);
    moe::TokenChoiceMoE m(6, 10, opts);
    torch::manual_seed(4);
    m->forward(torch::randn({2, 5, 6}));
    return m->tokens_per_expert().clone();
  };
  moe::TokenChoiceOptions one_group = o;
  one_group.top_k = 2;
  one_group.num_expert_groups = 4;
  one_group.num_limited_groups = 1;
  moe::TokenChoiceOptions plain = one_group;
  plain.num_expert_groups = plain.num_limited_groups = 0;
  EXPECT_FALSE(torch::equal(counts(one_group), counts(plain)));
  // Within one group of two each token takes both: the counts of a group's experts are equal.
  const at::Tensor c = counts(one_group).view({4, 2});
  EXPECT_TRUE(torch::equal(c.select(1, 0), c.select(1, 1))) << c;

  const auto refused = [&](moe::TokenChoiceOptions bad, const std::string& needle) {
    try {
      moe::TokenChoiceMoE(6, 10, bad);
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto bad = one_group;
  bad.num_expert_groups = 3;
  refused(bad, "num_expert_groups (3) must divide num_experts (8)");
  bad = one_group;
  bad.num_limited_groups = 5;
  refused(bad, "num_limited_groups (5) must be in 1..num_expert_groups (4)");
  bad = one_group;
  bad.top_k = 3;
  refused(bad, "top_k (3) exceeds the 2 experts of num_limited_groups (1) groups of 2");
  bad = one_group;
  bad.group_score_func = "top2_sum";
  bad.num_expert_groups = 8;
  bad.top_k = 1;
  refused(bad, "top2_sum needs at least 2 experts per group, got 1");
  bad = one_group;
  bad.group_score_func = "mean";
  refused(bad, "group_score_func is 'mean'");
}

TEST(TokenChoiceMoE, RefusesBadOptionsAndWholeLayersHaveNoGroups) {
  moe::TokenChoiceOptions o;
  o.num_experts = 4;
  o.top_k = 5;
  EXPECT_THROW(moe::TokenChoiceMoE(6, 10, o), UsageError);
  o.top_k = 2;
  o.score_func = "relu";
  EXPECT_THROW(moe::TokenChoiceMoE(6, 10, o), UsageError);
  o.score_func = "softmax";
  moe::TokenChoiceMoE m(6, 10, o);
  EXPECT_FALSE(m->score_correction_bias.defined());
  o.score_correction_bias = true;
  moe::TokenChoiceMoE biased(6, 10, o);
  EXPECT_TRUE(biased->named_buffers().contains("gate.e_score_correction_bias"));
  // It steers the choice: a large bias on expert 3 puts every token there.
  {
    torch::NoGradGuard no_grad;
    biased->score_correction_bias[3] = 100.0;
  }
  biased->forward(torch::randn({5, 6}));
  EXPECT_EQ(biased->tokens_per_expert()[3].item<int64_t>(), 5);
  EXPECT_EQ(m->ep_groups(), nullptr);
  EXPECT_EQ(m->num_local_experts(), 4);
  EXPECT_EQ(m->experts->w1.sizes(), (std::vector<int64_t>{4, 10, 6}));
  EXPECT_EQ(m->experts->w2.sizes(), (std::vector<int64_t>{4, 6, 10}));
  // Not sharded: expert parameters are the engine's ordinary ones.
  EXPECT_TRUE(moe::expert_param_groups(*m).empty());
}

}  // namespace
}  // namespace deepspeed
