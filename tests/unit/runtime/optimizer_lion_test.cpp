// deepspeed::optim::Lion against a double-precision reference of FusedLion's update (reference
// §3.4), including its sign convention at c == 0 and weight decay; two groups.
#include <cmath>

#include <gtest/gtest.h>

#include "deepspeed/optimizers.h"
#include "optimizer_test_data.h"

namespace deepspeed::optim {
namespace {

using testdata::max_abs_diff;
using testdata::tensor;
using testdata::values;

struct LionReference {
  LionOptions o;
  std::vector<double> p, m;

  LionReference(LionOptions options, std::vector<double> p0)
      : o(options), p(std::move(p0)), m(p.size()) {}

  void step(const std::vector<double>& g) {
    const auto [b1, b2] = o.betas;
    for (size_t i = 0; i < p.size(); ++i) {
      const double c = b1 * m[i] + (1 - b1) * g[i];
      p[i] = p[i] * (1 - o.lr * o.weight_decay) + (c > 0 ? -o.lr : o.lr);
      m[i] = b2 * m[i] + (1 - b2) * g[i];
    }
  }
};

void expect_matches_reference(LionOptions o, at::ScalarType dtype, double tol) {
  at::Tensor param = tensor(values(31, 21), dtype).requires_grad_();
  Lion opt({param}, o);
  LionReference ref(o, testdata::to_vector(param));
  for (int s = 0; s < 5; ++s) {
    auto g = values(31, 800 + s);
    g[3] = 0.0;  // with zero momentum, c == 0 on the first step: FusedLion adds +lr
    param.mutable_grad() = tensor(g, dtype);
    opt.step();
    ref.step(g);
  }
  EXPECT_LE(max_abs_diff(param, ref.p), tol);
  EXPECT_EQ(opt.find_state(param)->step, 5);
}

TEST(OptimizerLion, MatchesReference) {
  LionOptions o;
  o.lr = 0.01;
  expect_matches_reference(o, at::kDouble, 1e-12);
  expect_matches_reference(o, at::kFloat, 1e-6);
  o.weight_decay = 0.5;
  o.betas = {0.95, 0.98};
  expect_matches_reference(o, at::kDouble, 1e-12);
  expect_matches_reference(o, at::kFloat, 1e-6);
}

TEST(OptimizerLion, ZeroUpdateDirectionAddsLr) {
  at::Tensor p = torch::zeros({2}, torch::requires_grad());
  LionOptions o;
  o.lr = 0.1;
  Lion opt({p}, o);
  p.mutable_grad() = torch::tensor({0.0f, 1.0f});
  opt.step();
  EXPECT_FLOAT_EQ(p[0].item<float>(), 0.1f);
  EXPECT_FLOAT_EQ(p[1].item<float>(), -0.1f);
}

TEST(OptimizerLion, TwoGroupsUseTheirOwnHyperParameters) {
  at::Tensor a = tensor(values(9, 22), at::kDouble).requires_grad_();
  at::Tensor b = tensor(values(5, 23), at::kDouble).requires_grad_();
  LionOptions oa;
  oa.lr = 0.02;
  oa.weight_decay = 0.1;
  LionOptions ob;
  ob.lr = 0.001;
  ob.betas = {0.5, 0.6};
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<at::Tensor>{a}, std::make_unique<GroupOptions>(oa.group()));
  groups.emplace_back(std::vector<at::Tensor>{b}, std::make_unique<GroupOptions>(ob.group()));
  Lion opt(std::move(groups));
  LionReference ra(oa, testdata::to_vector(a));
  LionReference rb(ob, testdata::to_vector(b));
  for (int s = 0; s < 4; ++s) {
    auto ga = values(9, 900 + s);
    auto gb = values(5, 950 + s);
    a.mutable_grad() = tensor(ga, at::kDouble);
    b.mutable_grad() = tensor(gb, at::kDouble);
    opt.step();
    ra.step(ga);
    rb.step(gb);
  }
  EXPECT_LE(max_abs_diff(a, ra.p), 1e-12);
  EXPECT_LE(max_abs_diff(b, rb.p), 1e-12);
}

}  // namespace
}  // namespace deepspeed::optim
