// deepspeed::optim::Adam against a double-precision reference of DeepSpeed's formula (reference
// §3.2) and against torch::optim::Adam/AdamW, on both the CPU-Adam kernel path (fp32, contiguous)
// and the tensor path (fp64, non-contiguous fp32, bf16); lazy state after a param swap; the fused
// bf16/fp16 copy-out of the CPU path.
#include <cmath>

#include <gtest/gtest.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

#include "deepspeed/optimizers.h"
#include "optimizer_test_data.h"

namespace deepspeed::optim {
namespace {

using testdata::max_abs_diff;
using testdata::tensor;
using testdata::values;

constexpr size_t kNumel = 37;  // not a multiple of any SIMD width: exercises the kernel's tail
constexpr int kSteps = 6;

// DeepSpeed's Adam, written from the published formula in doubles.
struct AdamReference {
  AdamOptions o;
  bool adam_w_mode;
  std::vector<double> p, m, v;
  int64_t t = 0;

  AdamReference(AdamOptions options, bool w, std::vector<double> p0)
      : o(options), adam_w_mode(w), p(std::move(p0)), m(p.size()), v(p.size()) {}

  void step(const std::vector<double>& grad) {
    ++t;
    const auto [b1, b2] = o.betas;
    const double bc1 = o.bias_correction ? 1 - std::pow(b1, t) : 1.0;
    const double bc2 = o.bias_correction ? 1 - std::pow(b2, t) : 1.0;
    for (size_t i = 0; i < p.size(); ++i) {
      double g = grad[i];
      if (!adam_w_mode) g += o.weight_decay * p[i];
      m[i] = b1 * m[i] + (1 - b1) * g;
      v[i] = b2 * v[i] + (1 - b2) * g * g;
      double update = (m[i] / bc1) / (std::sqrt(v[i] / bc2) + o.eps);
      if (adam_w_mode) update += o.weight_decay * p[i];
      p[i] -= o.lr * update;
    }
  }
};

// Runs kSteps updates of Adam on `param` (built from p0) and of the reference; returns the
// worst absolute difference of the parameters.
double diff_after_steps(AdamOptions o, bool adam_w_mode, at::Tensor param) {
  const auto p0 = testdata::to_vector(param);
  Adam opt({param}, o, adam_w_mode);
  AdamReference ref(o, adam_w_mode, p0);
  for (int s = 0; s < kSteps; ++s) {
    const auto g = values(p0.size(), 100 + s);
    param.mutable_grad() = tensor(g, param.scalar_type()).reshape(param.sizes());
    opt.step();
    ref.step(g);
  }
  return max_abs_diff(param, ref.p);
}

AdamOptions options(double wd, bool bias_correction = true) {
  AdamOptions o;
  o.lr = 0.01;
  o.betas = {0.9, 0.99};
  o.eps = 1e-6;
  o.weight_decay = wd;
  o.bias_correction = bias_correction;
  return o;
}

TEST(OptimizerAdam, AdamWMatchesReference_KernelAndTensorPaths) {
  // fp32 contiguous CPU tensors take the CPU-Adam kernel; fp64 the tensor path in fp64.
  EXPECT_LE(diff_after_steps(options(0.1), true, tensor(values(kNumel, 1)).requires_grad_()),
            2e-6);
  EXPECT_LE(diff_after_steps(options(0.1), true,
                             tensor(values(kNumel, 1), at::kDouble).requires_grad_()),
            1e-12);
}

TEST(OptimizerAdam, L2ModeMatchesReference) {
  EXPECT_LE(diff_after_steps(options(0.1), false, tensor(values(kNumel, 2)).requires_grad_()),
            2e-6);
  EXPECT_LE(diff_after_steps(options(0.1), false,
                             tensor(values(kNumel, 2), at::kDouble).requires_grad_()),
            1e-12);
}

TEST(OptimizerAdam, WithoutBiasCorrectionMatchesReference) {
  for (bool w : {true, false}) {
    EXPECT_LE(diff_after_steps(options(0.05, false), w, tensor(values(kNumel, 3)).requires_grad_()),
              2e-6);
    EXPECT_LE(diff_after_steps(options(0.05, false), w,
                               tensor(values(kNumel, 3), at::kDouble).requires_grad_()),
              1e-12);
  }
}

TEST(OptimizerAdam, NonContiguousAndBf16TakeTheTensorPath) {
  // A transposed leaf is not contiguous, so it cannot go through the kernel.
  at::Tensor base = tensor(values(6 * 7, 4)).reshape({6, 7});
  at::Tensor transposed = base.t().requires_grad_();
  ASSERT_FALSE(transposed.is_contiguous());
  AdamOptions o = options(0.1);
  EXPECT_LE(diff_after_steps(o, true, transposed), 2e-6);
  // bf16 storage, fp32 math: within bf16 rounding of the parameters.
  at::Tensor bf16 = tensor(values(kNumel, 5), at::kBFloat16).requires_grad_();
  EXPECT_LE(diff_after_steps(o, true, bf16), 2e-2);
}

TEST(OptimizerAdam, TwoGroupsUseTheirOwnHyperParameters) {
  at::Tensor a = tensor(values(kNumel, 6)).requires_grad_();
  at::Tensor b = tensor(values(11, 7)).requires_grad_();
  AdamOptions oa = options(0.1);
  AdamOptions ob = options(0.0, /*bias_correction=*/false);
  ob.lr = 0.05;
  ob.betas = {0.8, 0.95};
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<at::Tensor>{a}, std::make_unique<GroupOptions>(oa.group()));
  groups.emplace_back(std::vector<at::Tensor>{b}, std::make_unique<GroupOptions>(ob.group()));
  Adam opt(std::move(groups), AdamOptions{}, true);
  AdamReference ra(oa, true, testdata::to_vector(a));
  AdamReference rb(ob, true, testdata::to_vector(b));
  for (int s = 0; s < kSteps; ++s) {
    auto ga = values(kNumel, 200 + s);
    auto gb = values(11, 300 + s);
    a.mutable_grad() = tensor(ga);
    b.mutable_grad() = tensor(gb);
    opt.step();
    ra.step(ga);
    rb.step(gb);
  }
  EXPECT_LE(max_abs_diff(a, ra.p), 2e-6);
  EXPECT_LE(max_abs_diff(b, rb.p), 2e-6);
  EXPECT_EQ(opt.find_state(a)->step, kSteps);
}

// torch's Adam (L2) and AdamW define the same update as DeepSpeed's with bias correction.
template <typename TorchOptimizer, typename TorchOptions>
void expect_equals_torch(bool adam_w_mode) {
  at::Tensor ours = tensor(values(kNumel, 8)).requires_grad_();
  at::Tensor theirs = ours.detach().clone().requires_grad_();
  AdamOptions o = options(0.1);
  Adam opt({ours}, o, adam_w_mode);
  TorchOptimizer ref({theirs}, TorchOptions(o.lr)
                                   .betas({o.betas.first, o.betas.second})
                                   .eps(o.eps)
                                   .weight_decay(o.weight_decay));
  for (int s = 0; s < kSteps; ++s) {
    at::Tensor g = tensor(values(kNumel, 400 + s));
    ours.mutable_grad() = g.clone();
    theirs.mutable_grad() = g.clone();
    opt.step();
    ref.step();
  }
  EXPECT_LE((ours - theirs).abs().max().item<double>(), 1e-6);
}

TEST(OptimizerAdam, EqualsTorchAdamWAndAdam) {
  expect_equals_torch<torch::optim::AdamW, torch::optim::AdamWOptions>(true);
  expect_equals_torch<torch::optim::Adam, torch::optim::AdamOptions>(false);
}

TEST(OptimizerAdam, StateIsCreatedLazilyForTheTensorInTheGroupAtFirstStep) {
  at::Tensor model_param = torch::ones({4, 3}, torch::requires_grad());
  Adam opt({model_param}, options(0.0));
  EXPECT_TRUE(opt.state().empty());
  // What ZeRO does: the group now holds this rank's flat fp32 partition.
  at::Tensor partition = torch::zeros({5}, torch::requires_grad());
  opt.param_groups()[0].params() = {partition};
  partition.mutable_grad() = torch::full({5}, 0.5);
  opt.step();
  EXPECT_EQ(opt.find_state(model_param), nullptr);
  ParamState* s = opt.find_state(partition);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->step, 1);
  EXPECT_EQ(s->tensor("exp_avg").sizes(), at::IntArrayRef({5}));
  EXPECT_EQ(opt.state().size(), 1u);
  // One step with m_hat = g, v_hat = g^2: p = -lr * g / (|g| + eps).
  EXPECT_NEAR(partition[0].item<double>(), -0.01 * 0.5 / (0.5 + 1e-6), 1e-7);
}

TEST(OptimizerAdam, ParamsWithoutGradAreSkipped) {
  at::Tensor a = torch::ones({3}, torch::requires_grad());
  at::Tensor b = torch::ones({3}, torch::requires_grad());
  Adam opt({a, b});
  a.mutable_grad() = torch::ones({3});
  opt.step();
  EXPECT_NE(opt.find_state(a), nullptr);
  EXPECT_EQ(opt.find_state(b), nullptr);
  EXPECT_TRUE(torch::equal(b, torch::ones({3})));
}

// Note [Fused copy-out] on the CPU: the CPU-Adam kernel writes the registered bf16/fp16 copy in
// the same pass; a path that cannot (the tensor path) leaves it and says so.
TEST(OptimizerAdam, CopyOutIsWrittenByTheCpuKernel) {
  for (at::ScalarType half : {at::kBFloat16, at::kHalf}) {
    at::Tensor master = tensor(values(kNumel, 9)).requires_grad_();
    at::Tensor fp64 = tensor(values(kNumel, 10), at::kDouble).requires_grad_();
    Adam opt({master, fp64}, options(0.1));
    at::Tensor dst = at::full({static_cast<int64_t>(kNumel)}, 7.0, half);  // poisoned
    at::Tensor dst_fp64 = at::full({static_cast<int64_t>(kNumel)}, 7.0, half);
    opt.set_copy_out(master, dst);
    opt.set_copy_out(fp64, dst_fp64);
    EXPECT_FALSE(opt.wrote_copy_out(master));
    for (int s = 0; s < 3; ++s) {
      master.mutable_grad() = tensor(values(kNumel, 500 + s));
      fp64.mutable_grad() = tensor(values(kNumel, 600 + s), at::kDouble);
      opt.step();
      EXPECT_TRUE(opt.wrote_copy_out(master));
      EXPECT_TRUE(torch::equal(dst, master.detach().to(half))) << half << " step " << s;
      EXPECT_FALSE(opt.wrote_copy_out(fp64));  // fp64 takes the tensor path
    }
    EXPECT_TRUE(torch::equal(dst_fp64, at::full({static_cast<int64_t>(kNumel)}, 7.0, half)));
    // Unregistered: the next step leaves the destination alone.
    opt.set_copy_out(master, at::Tensor());
    const at::Tensor before = dst.clone();
    master.mutable_grad() = tensor(values(kNumel, 700));
    opt.step();
    EXPECT_FALSE(opt.wrote_copy_out(master));
    EXPECT_TRUE(torch::equal(dst, before));
  }
}

TEST(OptimizerAdam, CopyOutLeavesTheUpdateUnchanged) {
  at::Tensor with = tensor(values(kNumel, 11)).requires_grad_();
  at::Tensor without = with.detach().clone().requires_grad_();
  Adam a({with}, options(0.1));
  Adam b({without}, options(0.1));
  a.set_copy_out(with, at::empty({static_cast<int64_t>(kNumel)}, at::kBFloat16));
  for (int s = 0; s < kSteps; ++s) {
    with.mutable_grad() = tensor(values(kNumel, 800 + s));
    without.mutable_grad() = tensor(values(kNumel, 800 + s));
    a.step();
    b.step();
  }
  EXPECT_TRUE(torch::equal(with, without));
}

// Note [Gradient scale in the step]: the scale handed to the optimizer gives the very update
// that multiplying the gradients first gives, on the CPU-Adam kernel (which applies it as it
// reads each gradient and leaves the gradient alone) and on the tensor path (which multiplies
// the gradient in place first), and a scale of 1 is no scale.
TEST(OptimizerAdam, GradScaleEqualsScalingTheGradientsFirst) {
  const double coef = 1.0 / 3.7;  // not a power of two: the product rounds
  for (bool kernel_path : {true, false}) {
    const auto dtype = kernel_path ? at::kFloat : at::kDouble;
    at::Tensor fused = tensor(values(kNumel, 31)).to(dtype).requires_grad_();
    at::Tensor plain = fused.detach().clone().requires_grad_();
    Adam a({fused}, options(0.1));
    Adam b({plain}, options(0.1));
    a.set_copy_out(fused, kernel_path ? at::empty({static_cast<int64_t>(kNumel)}, at::kBFloat16)
                                      : at::Tensor());
    for (int s = 0; s < kSteps; ++s) {
      const at::Tensor grad = tensor(values(kNumel, 900 + s)).to(dtype);
      fused.mutable_grad() = grad.clone();
      plain.mutable_grad() = grad.clone();
      a.set_grad_scale(s % 2 == 0 ? coef : 1.0);
      a.step();
      if (s % 2 == 0) plain.mutable_grad().mul_(coef);
      b.step();
      if (kernel_path) {
        EXPECT_TRUE(torch::equal(fused.grad(), grad)) << "the kernel left the gradient alone";
      } else {
        EXPECT_TRUE(torch::equal(fused.grad(), plain.grad())) << "multiplied in place, step " << s;
      }
    }
    EXPECT_TRUE(torch::equal(fused, plain))
        << (kernel_path ? "kernel" : "tensor") << " path: max difference "
        << (fused - plain).abs().max().item<double>();
  }
}

TEST(OptimizerAdam, SetCopyOutRefusesADestinationThatDoesNotFit) {
  at::Tensor master = torch::zeros({8}, torch::requires_grad());
  Adam opt({master});
  EXPECT_THROW(opt.set_copy_out(master, torch::zeros({8})), UsageError);  // fp32
  EXPECT_THROW(opt.set_copy_out(master, torch::zeros({7}, at::kBFloat16)), UsageError);
  EXPECT_THROW(opt.set_copy_out(master, torch::zeros({4, 2}, at::kHalf).t()), UsageError);
  EXPECT_NO_THROW(opt.set_copy_out(master, torch::zeros({2, 4}, at::kHalf)));
}

}  // namespace
}  // namespace deepspeed::optim
