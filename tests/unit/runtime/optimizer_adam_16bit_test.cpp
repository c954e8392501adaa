// deepspeed::optim::Adam on bf16/fp16 CPU parameters (ZeRO's 16-bit masters, Note [16-bit
// parameters on CPU-Adam]): equal bit for bit to the fp32 CPU-Adam kernel run on the widened
// values with the result rounded to the parameter's dtype after every step (and the moments too
// when they are 16-bit), across the 1 Mi-element slices the update walks; fp32 moments when
// asked (DeepSpeedCPUAdam's fp32_optimizer_states), kept through a state-dict round trip.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deepspeed/optimizers.h"

namespace deepspeed::optim {
namespace {

constexpr int64_t kNumel = (int64_t{1} << 20) + 37;  // crosses a slice; odd SIMD tail
constexpr int kSteps = 3;

struct Case {
  at::ScalarType dtype;
  bool fp32_moments;
};

class Adam16Bit : public ::testing::TestWithParam<Case> {};

AdamOptions options() {
  AdamOptions o;
  o.lr = 0.01;
  o.weight_decay = 0.1;
  return o;
}

TEST_P(Adam16Bit, EqualsTheFp32KernelRoundedEachStep) {
  const auto [dtype, fp32_moments] = GetParam();
  torch::manual_seed(5);
  at::Tensor param = torch::randn({kNumel}).to(dtype);
  Adam adam({param}, options(), /*adam_w_mode=*/true);
  adam.set_fp32_optimizer_states(fp32_moments);
  // The reference: fp32 tensors on the kernel's fp32 path.
  at::Tensor ref = param.to(torch::kFloat);
  Adam ref_adam({ref}, options(), /*adam_w_mode=*/true);
  for (int s = 0; s < kSteps; ++s) {
    const at::Tensor grad = torch::randn({kNumel}).to(dtype);
    param.mutable_grad() = grad;
    ref.mutable_grad() = grad.to(torch::kFloat);
    // The unscale/clip coefficient the step applies as it reads the gradients.
    adam.set_grad_scale(0.5);
    ref_adam.set_grad_scale(0.5);
    adam.step();
    ref_adam.step();
    torch::NoGradGuard no_grad;
    ref.copy_(ref.to(dtype));
    ParamState* ref_state = ref_adam.find_state(ref);
    ASSERT_NE(ref_state, nullptr);
    if (!fp32_moments) {
      for (const char* name : {"exp_avg", "exp_avg_sq"}) {
        at::Tensor& m = ref_state->tensor(name);
        m.copy_(m.to(dtype));
      }
    }
    ASSERT_TRUE(torch::equal(param, ref.to(dtype))) << "step " << s;
    ParamState* state = adam.find_state(param);
    ASSERT_NE(state, nullptr);
    for (const char* name : {"exp_avg", "exp_avg_sq"}) {
      const at::Tensor& m = state->tensor(name);
      EXPECT_EQ(m.scalar_type(), fp32_moments ? torch::kFloat : dtype) << name;
      EXPECT_TRUE(torch::equal(m, ref_state->tensor(name).to(m.scalar_type())))
          << name << " at step " << s;
    }
  }
}

TEST_P(Adam16Bit, Fp32MomentsSurviveAStateDictRoundTrip) {
  const auto [dtype, fp32_moments] = GetParam();
  at::Tensor param = torch::randn({5, 3}).to(dtype);
  Adam adam({param}, options());
  adam.set_fp32_optimizer_states(fp32_moments);
  param.mutable_grad() = torch::randn({5, 3}).to(dtype);
  adam.step();
  const c10::IValue saved = optimizer_state_dict(adam);
  at::Tensor other = param.clone();
  Adam loaded({other}, options());
  loaded.set_fp32_optimizer_states(fp32_moments);
  load_optimizer_state_dict(loaded, saved);
  ParamState* state = loaded.find_state(other);
  ASSERT_NE(state, nullptr);
  const at::Tensor& m = state->tensor("exp_avg");
  EXPECT_EQ(m.scalar_type(), fp32_moments ? torch::kFloat : dtype);
  EXPECT_TRUE(torch::equal(m, adam.find_state(param)->tensor("exp_avg")));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, Adam16Bit,
                         ::testing::Values(Case{torch::kBFloat16, true},
                                           Case{torch::kBFloat16, false},
                                           Case{torch::kHalf, true}, Case{torch::kHalf, false}),
                         [](const auto& info) {
                           return std::string(info.param.dtype == torch::kHalf ? "Fp16" : "Bf16") +
                                  (info.param.fp32_moments ? "Fp32Moments" : "SameMoments");
                         });

}  // namespace
}  // namespace deepspeed::optim
