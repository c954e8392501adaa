// deepspeed::optim::Lamb against a double-precision reference of FusedLamb's update (reference
// §3.3): trust ratio and its clamp, eps inside/outside the sqrt, bias correction, two groups.
#include <algorithm>
#include <cmath>

#include <gtest/gtest.h>

#include "deepspeed/optimizers.h"
#include "optimizer_test_data.h"

namespace deepspeed::optim {
namespace {

using testdata::max_abs_diff;
using testdata::tensor;
using testdata::values;

constexpr int kSteps = 5;

struct LambReference {
  LambOptions o;
  bool eps_inside_sqrt;
  std::vector<double> p, m, v;
  int64_t t = 0;
  double last_coeff = 0;

  LambReference(LambOptions options, bool inside, std::vector<double> p0)
      : o(options), eps_inside_sqrt(inside), p(std::move(p0)), m(p.size()), v(p.size()) {}

  void step(const std::vector<double>& g) {
    ++t;
    const auto [b1, b2] = o.betas;
    std::vector<double> u(p.size());
    for (size_t i = 0; i < p.size(); ++i) {
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      const double denom = eps_inside_sqrt ? std::sqrt(v[i] + o.eps) : std::sqrt(v[i]) + o.eps;
      u[i] = m[i] / denom + o.weight_decay * p[i];
    }
    const double w_norm = testdata::norm(p);
    const double u_norm = testdata::norm(u);
    double r = 1.0;
    if (w_norm != 0 && u_norm != 0) r = std::clamp(w_norm / u_norm, o.min_coeff, o.max_coeff);
    last_coeff = r;
    double step_size = o.lr;
    if (o.bias_correction) {
      step_size = o.lr * std::sqrt(1 - std::pow(b2, t)) / (1 - std::pow(b1, t));
    }
    for (size_t i = 0; i < p.size(); ++i) p[i] -= step_size * r * u[i];
  }
};

struct Case {
  LambOptions o;
  bool eps_inside_sqrt;
};

// Returns the reference's last trust ratio.
double expect_matches_reference(const Case& c, at::ScalarType dtype, double tol) {
  at::Tensor param = tensor(values(29, 11), dtype).requires_grad_();
  Lamb opt({param}, c.o, c.eps_inside_sqrt);
  LambReference ref(c.o, c.eps_inside_sqrt, testdata::to_vector(param));
  for (int s = 0; s < kSteps; ++s) {
    auto g = values(29, 500 + s);
    param.mutable_grad() = tensor(g, dtype);
    opt.step();
    ref.step(g);
  }
  EXPECT_LE(max_abs_diff(param, ref.p), tol);
  const auto coeffs = opt.lamb_coeffs();
  EXPECT_EQ(coeffs.size(), 1u);
  if (!coeffs.empty()) EXPECT_NEAR(coeffs[0], ref.last_coeff, tol * 100);
  return ref.last_coeff;
}

TEST(OptimizerLamb, MatchesReference) {
  LambOptions plain;
  plain.lr = 0.01;
  plain.weight_decay = 0.01;
  // ||p||/||u|| is about 0.2 here: max_coeff 0.1 and min_coeff 3 clamp it.
  LambOptions clamped = plain;
  clamped.max_coeff = 0.1;
  LambOptions floor = plain;
  floor.min_coeff = 3.0;
  floor.max_coeff = 10.0;
  LambOptions no_bc = plain;
  no_bc.bias_correction = false;
  no_bc.eps = 1e-3;
  for (const Case& c : {Case{plain, false}, Case{no_bc, false}, Case{no_bc, true},
                        Case{plain, true}}) {
    double r = expect_matches_reference(c, at::kDouble, 1e-12);
    EXPECT_GT(r, plain.min_coeff);
    EXPECT_LT(r, plain.max_coeff);
    expect_matches_reference(c, at::kFloat, 2e-6);
  }
  EXPECT_DOUBLE_EQ(expect_matches_reference({clamped, false}, at::kDouble, 1e-12), 0.1);
  EXPECT_DOUBLE_EQ(expect_matches_reference({floor, false}, at::kDouble, 1e-12), 3.0);
  expect_matches_reference({clamped, false}, at::kFloat, 2e-6);
  expect_matches_reference({floor, false}, at::kFloat, 1e-5);
}

TEST(OptimizerLamb, ZeroParameterNormGivesRatioOne) {
  at::Tensor param = torch::zeros({4}, torch::requires_grad());
  LambOptions o;
  o.min_coeff = 2.0;  // not applied: the ratio is 1 when a norm is 0, as in FusedLamb
  Lamb opt({param}, o);
  param.mutable_grad() = torch::ones({4});
  opt.step();
  EXPECT_DOUBLE_EQ(opt.lamb_coeffs()[0], 1.0);
}

TEST(OptimizerLamb, TwoGroupsUseTheirOwnHyperParameters) {
  at::Tensor a = tensor(values(13, 12), at::kDouble).requires_grad_();
  at::Tensor b = tensor(values(7, 13), at::kDouble).requires_grad_();
  LambOptions oa;
  oa.lr = 0.02;
  oa.weight_decay = 0.1;
  LambOptions ob;
  ob.lr = 0.005;
  ob.betas = {0.8, 0.9};
  ob.max_coeff = 0.3;
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<at::Tensor>{a}, std::make_unique<GroupOptions>(oa.group()));
  groups.emplace_back(std::vector<at::Tensor>{b}, std::make_unique<GroupOptions>(ob.group()));
  Lamb opt(std::move(groups));
  LambReference ra(oa, false, testdata::to_vector(a));
  LambReference rb(ob, false, testdata::to_vector(b));
  for (int s = 0; s < kSteps; ++s) {
    auto ga = values(13, 600 + s);
    auto gb = values(7, 700 + s);
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
