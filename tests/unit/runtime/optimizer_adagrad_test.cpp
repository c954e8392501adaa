// deepspeed::optim::Adagrad: torch.optim.Adagrad semantics (equal to torch::optim::Adagrad and to
// a double reference) and DeepSpeedCPUAdagrad's raw-gradient numerator (reference §3.5).
#include <cmath>

#include <gtest/gtest.h>
#include <torch/optim/adagrad.h>

#include "deepspeed/optimizers.h"
#include "optimizer_test_data.h"

namespace deepspeed::optim {
namespace {

using testdata::max_abs_diff;
using testdata::tensor;
using testdata::values;

struct AdagradReference {
  AdagradOptions o;
  bool cpu_adagrad;
  std::vector<double> p, sum;
  int64_t t = 0;

  AdagradReference(AdagradOptions options, bool cpu, std::vector<double> p0)
      : o(options), cpu_adagrad(cpu), p(std::move(p0)),
        sum(p.size(), cpu ? 0.0 : options.initial_accumulator_value) {}

  void step(const std::vector<double>& grad) {
    ++t;
    for (size_t i = 0; i < p.size(); ++i) {
      if (cpu_adagrad) {
        const double decayed = grad[i] + o.weight_decay * p[i];
        sum[i] += decayed * decayed;
        p[i] -= o.lr * grad[i] / (std::sqrt(sum[i]) + o.eps);
      } else {
        double g = o.maximize ? -grad[i] : grad[i];
        g += o.weight_decay * p[i];
        const double clr = o.lr / (1 + (t - 1) * o.lr_decay);
        sum[i] += g * g;
        p[i] -= clr * g / (std::sqrt(sum[i]) + o.eps);
      }
    }
  }
};

std::vector<double> run(AdagradOptions o, bool cpu, at::ScalarType dtype, double tol) {
  at::Tensor param = tensor(values(23, 31), dtype).requires_grad_();
  Adagrad opt({param}, o, cpu);
  AdagradReference ref(o, cpu, testdata::to_vector(param));
  for (int s = 0; s < 5; ++s) {
    auto g = values(23, 1000 + s);
    param.mutable_grad() = tensor(g, dtype);
    opt.step();
    ref.step(g);
  }
  EXPECT_LE(max_abs_diff(param, ref.p), tol);
  return testdata::to_vector(param);
}

TEST(OptimizerAdagrad, TorchSemanticsMatchReference) {
  AdagradOptions o;
  o.lr = 0.05;
  o.weight_decay = 0.1;
  o.lr_decay = 0.01;
  o.initial_accumulator_value = 0.2;
  run(o, false, at::kDouble, 1e-12);
  run(o, false, at::kFloat, 1e-6);
  o.maximize = true;
  run(o, false, at::kDouble, 1e-12);
}

TEST(OptimizerAdagrad, CpuAdagradNumeratorIsTheRawGradient) {
  AdagradOptions o;
  o.lr = 0.05;
  o.weight_decay = 0.1;
  auto cpu = run(o, true, at::kDouble, 1e-12);
  run(o, true, at::kFloat, 1e-6);
  auto torch_like = run(o, false, at::kDouble, 1e-12);
  EXPECT_NE(cpu, torch_like);  // the variants differ with weight decay...
  o.weight_decay = 0.0;
  EXPECT_EQ(run(o, true, at::kDouble, 1e-12), run(o, false, at::kDouble, 1e-12));  // ...not without
}

TEST(OptimizerAdagrad, EqualsTorchAdagrad) {
  at::Tensor ours = tensor(values(23, 32)).requires_grad_();
  at::Tensor theirs = ours.detach().clone().requires_grad_();
  AdagradOptions o;
  o.lr = 0.05;
  o.weight_decay = 0.1;
  o.lr_decay = 0.01;
  o.initial_accumulator_value = 0.2;
  o.eps = 1e-8;
  Adagrad opt({ours}, o);
  torch::optim::Adagrad ref({theirs}, torch::optim::AdagradOptions(o.lr)
                                          .lr_decay(o.lr_decay)
                                          .weight_decay(o.weight_decay)
                                          .initial_accumulator_value(o.initial_accumulator_value)
                                          .eps(o.eps));
  for (int s = 0; s < 5; ++s) {
    at::Tensor g = tensor(values(23, 1100 + s));
    ours.mutable_grad() = g.clone();
    theirs.mutable_grad() = g.clone();
    opt.step();
    ref.step();
  }
  EXPECT_LE((ours - theirs).abs().max().item<double>(), 1e-6);
}

TEST(OptimizerAdagrad, StateNamesFollowTheVariant) {
  at::Tensor p = torch::ones({3}, torch::requires_grad());
  Adagrad torch_like({p}, AdagradOptions{}, false);
  Adagrad cpu({p}, AdagradOptions{}, true);
  p.mutable_grad() = torch::ones({3});
  torch_like.step();
  cpu.step();
  EXPECT_NO_THROW(torch_like.find_state(p)->tensor("sum"));
  EXPECT_NO_THROW(cpu.find_state(p)->tensor("exp_avg_sq"));
}

}  // namespace
}  // namespace deepspeed::optim
