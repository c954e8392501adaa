// deepspeed::optim::SGD: torch.optim.SGD semantics, equal to torch::optim::SGD and to a double
// reference (momentum, dampening, nesterov, weight decay, maximize); two groups.
#include <gtest/gtest.h>
#include <torch/optim/sgd.h>

#include "deepspeed/optimizers.h"
#include "optimizer_test_data.h"

namespace deepspeed::optim {
namespace {

using testdata::max_abs_diff;
using testdata::tensor;
using testdata::values;

struct SgdReference {
  SGDOptions o;
  std::vector<double> p, buf;
  bool started = false;

  SgdReference(SGDOptions options, std::vector<double> p0) : o(options), p(std::move(p0)) {}

  void step(const std::vector<double>& grad) {
    if (buf.empty()) buf.resize(p.size());
    for (size_t i = 0; i < p.size(); ++i) {
      double d = o.maximize ? -grad[i] : grad[i];
      d += o.weight_decay * p[i];
      if (o.momentum != 0) {
        buf[i] = started ? o.momentum * buf[i] + (1 - o.dampening) * d : d;
        d = o.nesterov ? d + o.momentum * buf[i] : buf[i];
      }
      p[i] -= o.lr * d;
    }
    started = true;
  }
};

std::vector<SGDOptions> cases() {
  SGDOptions plain;
  plain.lr = 0.1;
  SGDOptions momentum = plain;
  momentum.momentum = 0.9;
  momentum.weight_decay = 0.01;
  SGDOptions damped = momentum;
  damped.dampening = 0.3;
  SGDOptions nesterov = momentum;
  nesterov.nesterov = true;
  return {plain, momentum, damped, nesterov};
}

TEST(OptimizerSgd, MatchesReference) {
  auto all = cases();
  SGDOptions maximize = all[1];
  maximize.maximize = true;
  all.push_back(maximize);
  for (const SGDOptions& o : all) {
    for (auto dtype : {at::kDouble, at::kFloat}) {
      at::Tensor param = tensor(values(19, 41), dtype).requires_grad_();
      SGD opt({param}, o);
      SgdReference ref(o, testdata::to_vector(param));
      for (int s = 0; s < 5; ++s) {
        auto g = values(19, 1200 + s);
        param.mutable_grad() = tensor(g, dtype);
        opt.step();
        ref.step(g);
      }
      EXPECT_LE(max_abs_diff(param, ref.p), dtype == at::kDouble ? 1e-12 : 1e-6)
          << "momentum " << o.momentum << " nesterov " << o.nesterov;
    }
  }
}

TEST(OptimizerSgd, EqualsTorchSgd) {
  for (const SGDOptions& o : cases()) {
    at::Tensor ours = tensor(values(19, 42)).requires_grad_();
    at::Tensor theirs = ours.detach().clone().requires_grad_();
    SGD opt({ours}, o);
    torch::optim::SGD ref({theirs}, torch::optim::SGDOptions(o.lr)
                                        .momentum(o.momentum)
                                        .dampening(o.dampening)
                                        .weight_decay(o.weight_decay)
                                        .nesterov(o.nesterov));
    for (int s = 0; s < 5; ++s) {
      at::Tensor g = tensor(values(19, 1300 + s));
      ours.mutable_grad() = g.clone();
      theirs.mutable_grad() = g.clone();
      opt.step();
      ref.step();
    }
    EXPECT_EQ((ours - theirs).abs().max().item<double>(), 0.0) << "momentum " << o.momentum;
  }
}

TEST(OptimizerSgd, TwoGroupsAndNoStateWithoutMomentum) {
  at::Tensor a = tensor(values(7, 43), at::kDouble).requires_grad_();
  at::Tensor b = tensor(values(5, 44), at::kDouble).requires_grad_();
  auto all = cases();
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<at::Tensor>{a}, std::make_unique<GroupOptions>(all[0].group()));
  groups.emplace_back(std::vector<at::Tensor>{b}, std::make_unique<GroupOptions>(all[3].group()));
  SGD opt(std::move(groups));
  SgdReference ra(all[0], testdata::to_vector(a));
  SgdReference rb(all[3], testdata::to_vector(b));
  for (int s = 0; s < 4; ++s) {
    auto ga = values(7, 1400 + s);
    auto gb = values(5, 1500 + s);
    a.mutable_grad() = tensor(ga, at::kDouble);
    b.mutable_grad() = tensor(gb, at::kDouble);
    opt.step();
    ra.step(ga);
    rb.step(gb);
  }
  EXPECT_LE(max_abs_diff(a, ra.p), 1e-12);
  EXPECT_LE(max_abs_diff(b, rb.p), 1e-12);
  EXPECT_FALSE(opt.find_state(a)->tensor("momentum_buffer").defined());
  EXPECT_TRUE(opt.find_state(b)->tensor("momentum_buffer").defined());
}

}  // namespace
}  // namespace deepspeed::optim
