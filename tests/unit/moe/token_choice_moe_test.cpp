// TokenChoiceMoE (deepspeed/auto_ep.h) against a per-token loop written from transformers'
// MixtralSparseMoeBlock and DeepSpeed's TokenChoiceTopKRouter: softmax or sigmoid scores in fp32,
// the top-k experts, their scores normalised and scaled, each chosen expert's SwiGLU weighted
// after ("post") or before ("pre") it runs. Outputs and every gradient agree.
#include "deepspeed/auto_ep.h"
#include "deepspeed/errors.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace deepspeed {
namespace {

at::Tensor reference(moe::TokenChoiceMoEImpl& m, const at::Tensor& x) {
  const auto& o = m.options();
  const at::Tensor flat = x.reshape({-1, x.size(-1)});
  std::vector<at::Tensor> rows;
  for (int64_t t = 0; t < flat.size(0); ++t) {
    const at::Tensor xt = flat[t];
    const at::Tensor logits = at::matmul(m.gate->weight, xt).to(at::kFloat);
    const at::Tensor s = o.score_func == "softmax" ? logits.softmax(0) : logits.sigmoid();
    auto [top, idx] = s.topk(o.top_k);
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
  EXPECT_EQ(m->ep_groups(), nullptr);
  EXPECT_EQ(m->num_local_experts(), 4);
  EXPECT_EQ(m->experts->w1.sizes(), (std::vector<int64_t>{4, 10, 6}));
  EXPECT_EQ(m->experts->w2.sizes(), (std::vector<int64_t>{4, 6, 10}));
  // Not sharded: expert parameters are the engine's ordinary ones.
  EXPECT_TRUE(moe::expert_param_groups(*m).empty());
}

}  // namespace
}  // namespace deepspeed
