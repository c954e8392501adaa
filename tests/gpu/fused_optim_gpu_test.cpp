// The fused CUDA optimizers (ops/cuda_optim) against the CPU: ops::fused_adam equals CPU-Adam on
// CPU copies (tensors of odd sizes, unaligned ones, many per call), its bf16/fp16 copy-out equals
// param.to(dtype); optim::Adam and optim::Lamb on CUDA parameters end where they end on the CPU
// after 5 steps, trust ratios and copy-out included. Inputs are random, outputs poisoned first.
// Without a GPU (or in the CPU build) every test skips and says why.
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deepspeed/errors.h"
#include "deepspeed/optimizers.h"
#include "gpu_test_support.h"

#ifdef DS_WITH_CUDA
#include <c10/cuda/CUDAStream.h>

#include "ops/cpu_adam/cpu_adam.h"
#include "ops/cuda_optim/cuda_optim.h"
#endif

namespace deepspeed {
namespace {

// Sizes within one 16 Ki-element chunk, over four chunks and one element (a last chunk of 1),
// over many chunks; none a multiple of the vector width.
const std::vector<int64_t> kOddSizes = {1, 1000, 65537, 3000000};

/// Expects `got` (any device) within rtol/atol of `want`, elementwise, naming the worst element.
void expect_close(const at::Tensor& got, const at::Tensor& want, double rtol, double atol,
                  const std::string& what) {
  ASSERT_EQ(got.numel(), want.numel()) << what;
  if (want.numel() == 0) return;
  const at::Tensor g = got.detach().cpu().to(at::kDouble).reshape({-1});
  const at::Tensor w = want.detach().cpu().to(at::kDouble).reshape({-1});
  const at::Tensor excess = (g - w).abs() - (w.abs() * rtol + atol);
  const int64_t worst = excess.argmax().item<int64_t>();
  EXPECT_LE(excess[worst].item<double>(), 0.0)
      << what << ": element " << worst << " is " << g[worst].item<double>() << ", expected "
      << w[worst].item<double>() << " (rtol " << rtol << ", atol " << atol << ")";
}

/// Random fp32 values on the CPU: N(0, scale^2), or U[0, scale) for a second moment.
at::Tensor random_values(int64_t n, double scale, bool non_negative = false) {
  at::Tensor t = non_negative ? torch::rand({n}) : torch::randn({n});
  return t.mul_(scale);
}

#ifdef DS_WITH_CUDA
void* current_stream() { return c10::cuda::getCurrentCUDAStream().stream(); }

/// A CUDA copy of `cpu` whose storage starts `offset_elements` into a larger buffer: offset 1
/// makes every pointer miss 16-byte alignment, so the kernel takes its scalar loop.
at::Tensor to_cuda_at(const at::Tensor& cpu, int64_t offset_elements) {
  at::Tensor buffer = torch::full({cpu.numel() + offset_elements},
                                  std::numeric_limits<float>::quiet_NaN(),
                                  cpu.options().device(torch::kCUDA));
  at::Tensor view = buffer.narrow(0, offset_elements, cpu.numel());
  view.copy_(cpu);
  return view;
}

/// One tensor's Adam buffers on one device.
struct AdamBuffers {
  at::Tensor param, grad, exp_avg, exp_avg_sq;
};

AdamBuffers random_adam_buffers(int64_t n) {
  return {random_values(n, 1.0), random_values(n, 0.1), random_values(n, 0.01),
          random_values(n, 1e-4, /*non_negative=*/true)};
}

AdamBuffers to_cuda_at(const AdamBuffers& b, int64_t offset) {
  return {to_cuda_at(b.param, offset), to_cuda_at(b.grad, offset), to_cuda_at(b.exp_avg, offset),
          to_cuda_at(b.exp_avg_sq, offset)};
}

ops::AdamTensor adam_tensor(AdamBuffers& b, void* half_copy = nullptr) {
  ops::AdamTensor t;
  t.param = b.param.data_ptr<float>();
  t.grad = b.grad.data_ptr<float>();
  t.exp_avg = b.exp_avg.data_ptr<float>();
  t.exp_avg_sq = b.exp_avg_sq.data_ptr<float>();
  t.half_copy = half_copy;
  t.n = b.param.numel();
  return t;
}

void cpu_adam(const ops::AdamStep& s, AdamBuffers& b) {
  ops::adam_update(s, b.param.data_ptr<float>(), b.grad.data_ptr<float>(),
                   b.exp_avg.data_ptr<float>(), b.exp_avg_sq.data_ptr<float>(),
                   b.param.numel());
}

/// Runs `steps` fused_adam calls over tensors of `sizes` (each also with an unaligned twin) and
/// CPU-Adam over CPU copies; expects the same parameters and moments within 1e-6 relative.
void expect_fused_adam_equals_cpu_adam(ops::AdamStep s, const std::vector<int64_t>& sizes,
                                       int steps, const std::string& what) {
  std::vector<AdamBuffers> cpu;
  std::vector<AdamBuffers> gpu;
  for (int64_t n : sizes) {
    for (int64_t offset : {0, 1}) {
      cpu.push_back(random_adam_buffers(n));
      gpu.push_back(to_cuda_at(cpu.back(), offset));
    }
  }
  for (int step = 1; step <= steps; ++step) {
    s.step = step;
    std::vector<ops::AdamTensor> tensors;
    for (size_t i = 0; i < cpu.size(); ++i) {
      cpu[i].grad = random_values(cpu[i].param.numel(), 0.1);
      gpu[i].grad.copy_(cpu[i].grad);
      tensors.push_back(adam_tensor(gpu[i]));
      cpu_adam(s, cpu[i]);
    }
    ops::fused_adam(s, tensors.data(), static_cast<int>(tensors.size()), ops::HalfKind::kNone,
                    current_stream());
  }
  for (size_t i = 0; i < cpu.size(); ++i) {
    const std::string name = what + " tensor " + std::to_string(i) + " (n " +
                             std::to_string(cpu[i].param.numel()) + ")";
    expect_close(gpu[i].param, cpu[i].param, 1e-6, 1e-9, name + " param");
    expect_close(gpu[i].exp_avg, cpu[i].exp_avg, 1e-6, 1e-9, name + " exp_avg");
    expect_close(gpu[i].exp_avg_sq, cpu[i].exp_avg_sq, 1e-6, 1e-15, name + " exp_avg_sq");
  }
}
#endif

// --- ops::fused_adam ------------------------------------------------------------------------

TEST(FusedAdamGpu, EqualsCpuAdamInEveryMode) {
  DS_REQUIRE_GPU();
#ifdef DS_WITH_CUDA
  torch::manual_seed(1);
  struct Mode {
    const char* name;
    bool adamw_mode;
    bool bias_correction;
    float weight_decay;
    float grad_scale = 1.0f;
  };
  for (const Mode& m : {Mode{"adamw", true, true, 0.01f}, Mode{"l2", false, true, 0.01f},
                        Mode{"adamw no bias correction", true, false, 0.01f},
                        Mode{"l2 no bias correction", false, false, 0.01f},
                        Mode{"no weight decay", true, true, 0.0f},
                        Mode{"adamw, clip coefficient", true, true, 0.01f, 0.37f},
                        Mode{"l2, clip coefficient", false, true, 0.01f, 0.37f}}) {
    ops::AdamStep s;
    s.lr = 1e-3f;
    s.beta1 = 0.9f;
    s.beta2 = 0.999f;
    s.eps = 1e-8f;
    s.weight_decay = m.weight_decay;
    s.adamw_mode = m.adamw_mode;
    s.bias_correction = m.bias_correction;
    s.grad_scale = m.grad_scale;
    expect_fused_adam_equals_cpu_adam(s, kOddSizes, 3, m.name);
  }
#else
  GTEST_SKIP() << "built without DS_BUILD_CUDA";
#endif
}

TEST(FusedAdamGpu, ManyTensorsSpanSeveralLaunches) {
  DS_REQUIRE_GPU();
#ifdef DS_WITH_CUDA
  torch::manual_seed(2);
  // 2 x 70 tensors (over the 48 a launch holds), empty ones included.
  std::vector<int64_t> sizes;
  for (int i = 0; i < 70; ++i) sizes.push_back((i * 977) % 5003);
  ops::AdamStep s;
  s.weight_decay = 0.1f;
  expect_fused_adam_equals_cpu_adam(s, sizes, 2, "many tensors");
#else
  GTEST_SKIP() << "built without DS_BUILD_CUDA";
#endif
}

TEST(FusedAdamGpu, HalfCopyEqualsTheConversionOfTheUpdatedParam) {
  DS_REQUIRE_GPU();
#ifdef DS_WITH_CUDA
  torch::manual_seed(3);
  for (auto [kind, dtype] : {std::pair{ops::HalfKind::kBF16, at::kBFloat16},
                             std::pair{ops::HalfKind::kFP16, at::kHalf}}) {
    std::vector<AdamBuffers> gpu;
    std::vector<at::Tensor> halves;
    std::vector<ops::AdamTensor> tensors;
    for (int64_t n : kOddSizes) {
      for (int64_t offset : {0, 1}) {
        gpu.push_back(to_cuda_at(random_adam_buffers(n), offset));
        // Poisoned; offset 1 also misaligns the 16-bit copy.
        halves.push_back(to_cuda_at(torch::full({n}, -7.0, torch::dtype(dtype)), offset));
      }
    }
    // The last tensor gets no copy: its destination must stay poisoned.
    for (size_t i = 0; i < gpu.size(); ++i) {
      tensors.push_back(adam_tensor(gpu[i], i + 1 < gpu.size() ? halves[i].data_ptr() : nullptr));
    }
    ops::AdamStep s;
    s.weight_decay = 0.01f;
    ops::fused_adam(s, tensors.data(), static_cast<int>(tensors.size()), kind, current_stream());
    for (size_t i = 0; i + 1 < gpu.size(); ++i) {
      EXPECT_TRUE(torch::equal(halves[i], gpu[i].param.to(dtype)))
          << dtype << " copy of tensor " << i << " (n " << gpu[i].param.numel() << ")";
    }
    EXPECT_TRUE(torch::equal(halves.back(), torch::full_like(halves.back(), -7.0)));

    // HalfKind::kNone writes no copy even where half_copy is set.
    const at::Tensor before = halves.front().clone();
    s.step = 2;
    ops::fused_adam(s, tensors.data(), 1, ops::HalfKind::kNone, current_stream());
    EXPECT_TRUE(torch::equal(halves.front(), before));
  }
#else
  GTEST_SKIP() << "built without DS_BUILD_CUDA";
#endif
}

TEST(FusedAdamGpu, BadArgumentsThrowBeforeLaunching) {
  DS_REQUIRE_GPU();
#ifdef DS_WITH_CUDA
  at::Tensor p = torch::zeros({4}, torch::kCUDA);
  ops::AdamTensor t;
  t.param = t.exp_avg = t.exp_avg_sq = p.data_ptr<float>();
  t.grad = p.data_ptr<float>();
  t.n = 4;
  ops::AdamStep s;
  s.step = 0;
  EXPECT_THROW(ops::fused_adam(s, &t, 1, ops::HalfKind::kNone, current_stream()), UsageError);
  s.step = 1;
  ops::AdamTensor negative = t;
  negative.n = -1;
  EXPECT_THROW(ops::fused_adam(s, &negative, 1, ops::HalfKind::kNone, current_stream()),
               UsageError);
  ops::AdamTensor null_grad = t;
  null_grad.grad = nullptr;
  EXPECT_THROW(ops::fused_adam(s, &null_grad, 1, ops::HalfKind::kNone, current_stream()),
               UsageError);
  EXPECT_NO_THROW(ops::fused_adam(s, nullptr, 0, ops::HalfKind::kNone, current_stream()));
  ops::LambStep ls;
  ops::LambTensor lt{p.data_ptr<float>(), p.data_ptr<float>(), p.data_ptr<float>(),
                     p.data_ptr<float>(), 4};
  at::Tensor workspace = torch::empty({ops::fused_lamb_workspace_numel(&lt, 1)}, torch::kCUDA);
  EXPECT_THROW(ops::fused_lamb(ls, &lt, 1, workspace.data_ptr<float>(), nullptr,
                               current_stream()),
               UsageError);
  EXPECT_THROW(ops::fused_lamb(ls, &lt, 1, nullptr, workspace.data_ptr<float>(),
                               current_stream()),
               UsageError);
#else
  GTEST_SKIP() << "built without DS_BUILD_CUDA";
#endif
}

// --- optim::Adam and optim::Lamb on CUDA parameters -----------------------------------------

/// The same parameters on the CPU and on the GPU: the kOddSizes ones, a non-contiguous one (the
/// tensor path on both devices) and one that never gets a gradient.
struct TwinParams {
  std::vector<at::Tensor> cpu;
  std::vector<at::Tensor> gpu;

  explicit TwinParams(const std::vector<at::Tensor>& values) {
    for (const at::Tensor& v : values) {
      cpu.push_back(v.clone().requires_grad_());
      gpu.push_back(v.to(torch::kCUDA).requires_grad_());
    }
  }
  /// Fresh random gradients for every parameter but the last (which stays without one).
  void set_grads(double scale, const std::vector<bool>& zero = {}) {
    for (size_t i = 0; i + 1 < cpu.size(); ++i) {
      at::Tensor g = random_values(cpu[i].numel(), scale).reshape(cpu[i].sizes());
      if (i < zero.size() && zero[i]) g.zero_();
      if (!cpu[i].is_contiguous()) g = g.t().contiguous().t();  // same layout as the param
      cpu[i].mutable_grad() = g;
      gpu[i].mutable_grad() = g.to(torch::kCUDA);
    }
  }
};

std::vector<at::Tensor> odd_sized_values(double scale) {
  std::vector<at::Tensor> v;
  for (int64_t n : kOddSizes) v.push_back(random_values(n, scale));
  v.push_back(random_values(37 * 29, scale).reshape({37, 29}).t());  // non-contiguous
  v.push_back(random_values(11, scale));                             // no gradient
  return v;
}

/// Two groups (second: other lr and betas, no bias correction, no weight decay) over `params`.
template <class Options>
std::vector<torch::optim::OptimizerParamGroup> two_groups(const std::vector<at::Tensor>& params,
                                                          Options first, Options second) {
  const size_t half = params.size() / 2;
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<at::Tensor>(params.begin(), params.begin() + half),
                      std::make_unique<optim::GroupOptions>(first.group()));
  groups.emplace_back(std::vector<at::Tensor>(params.begin() + half, params.end()),
                      std::make_unique<optim::GroupOptions>(second.group()));
  return groups;
}

/// Parameters within rtol/atol_param, moments within rtol/atol_moments (an exp_avg near 0 is a
/// cancellation whose absolute error is an ulp of its terms).
void expect_same_state(optim::DsOptimizer& gpu_opt, optim::DsOptimizer& cpu_opt,
                       const TwinParams& twins, double rtol, double atol_param,
                       double atol_moments) {
  for (size_t i = 0; i < twins.cpu.size(); ++i) {
    const std::string name = "param " + std::to_string(i);
    expect_close(twins.gpu[i], twins.cpu[i], rtol, atol_param, name);
    optim::ParamState* gs = gpu_opt.find_state(twins.gpu[i]);
    optim::ParamState* cs = cpu_opt.find_state(twins.cpu[i]);
    ASSERT_EQ(gs == nullptr, cs == nullptr) << name;
    if (cs == nullptr) continue;
    EXPECT_EQ(gs->step, cs->step) << name;
    for (const char* s : {"exp_avg", "exp_avg_sq"}) {
      EXPECT_TRUE(gs->tensor(s).is_cuda()) << name;
      expect_close(gs->tensor(s), cs->tensor(s), rtol, atol_moments, name + " " + s);
    }
  }
}

TEST(AdamOnGpu, EqualsAdamOnCpuAfterFiveSteps) {
  DS_REQUIRE_GPU();
  for (bool adam_w_mode : {true, false}) {
    torch::manual_seed(4);
    TwinParams twins(odd_sized_values(1.0));
    optim::AdamOptions first;
    first.lr = 1e-3;
    first.weight_decay = 0.01;
    optim::AdamOptions second;
    second.lr = 3e-3;
    second.betas = {0.8, 0.95};
    second.bias_correction = false;
    optim::Adam gpu_opt(two_groups(twins.gpu, first, second), {}, adam_w_mode);
    optim::Adam cpu_opt(two_groups(twins.cpu, first, second), {}, adam_w_mode);
    // Copy-outs of two fused parameters, one per kind, and of the non-contiguous one (its path
    // cannot write one); poisoned.
    const std::vector<std::pair<size_t, at::ScalarType>> copies = {
        {1, at::kBFloat16}, {3, at::kHalf}, {4, at::kBFloat16}};
    std::vector<at::Tensor> gpu_dst, cpu_dst;
    for (auto [i, dtype] : copies) {
      gpu_dst.push_back(torch::full({twins.gpu[i].numel()}, -7.0,
                                    torch::dtype(dtype).device(torch::kCUDA)));
      cpu_dst.push_back(torch::full({twins.cpu[i].numel()}, -7.0, torch::dtype(dtype)));
      gpu_opt.set_copy_out(twins.gpu[i], gpu_dst.back());
      cpu_opt.set_copy_out(twins.cpu[i], cpu_dst.back());
    }
    for (int step = 0; step < 5; ++step) {
      twins.set_grads(0.1);
      gpu_opt.step();
      cpu_opt.step();
    }
    SCOPED_TRACE(adam_w_mode ? "adam_w_mode" : "L2 mode");
    expect_same_state(gpu_opt, cpu_opt, twins, 1e-6, 1e-9, 1e-8);
    for (size_t k = 0; k < copies.size(); ++k) {
      const auto [i, dtype] = copies[k];
      const bool contiguous = twins.gpu[i].is_contiguous();
      EXPECT_EQ(gpu_opt.wrote_copy_out(twins.gpu[i]), contiguous) << "param " << i;
      EXPECT_EQ(cpu_opt.wrote_copy_out(twins.cpu[i]), contiguous) << "param " << i;
      if (!contiguous) continue;
      EXPECT_TRUE(torch::equal(gpu_dst[k], twins.gpu[i].detach().to(dtype))) << "param " << i;
      EXPECT_TRUE(torch::equal(cpu_dst[k], twins.cpu[i].detach().to(dtype))) << "param " << i;
      // The masters agree within 1e-6, so their 16-bit copies within one 16-bit ulp.
      expect_close(gpu_dst[k], cpu_dst[k], 8e-3, 0.0, "copy-out of param " + std::to_string(i));
    }
  }
}

TEST(LambOnGpu, EqualsLambOnCpuAfterFiveSteps) {
  DS_REQUIRE_GPU();
  for (bool eps_inside_sqrt : {false, true}) {
    SCOPED_TRACE(eps_inside_sqrt ? "eps_inside_sqrt" : "eps outside sqrt");
    torch::manual_seed(5);
    // Group 1 (no weight decay): kOddSizes with [1] scaled so that ||p|| / ||u|| is far above
    // max_coeff (clamped to 10) and [2] zero (||p|| = 0 at the first step: ratio 1), then
    // [4], whose gradients stay 0 (u = 0, ||u|| = 0: ratio 1 at every step). Group 2 (weight
    // decay, no bias correction, max_coeff 0.5): 60 small tensors over two fused launches, the
    // non-contiguous one (tensor path, between fused ones in the ratio list) and one without a
    // gradient.
    std::vector<at::Tensor> values = odd_sized_values(1.0);
    values[1].mul_(100.0);
    values[2].zero_();
    const size_t zero_grad_index = kOddSizes.size();
    values.insert(values.begin() + zero_grad_index, random_values(513, 1.0));
    const size_t first_group_size = zero_grad_index + 1;
    for (int i = 0; i < 60; ++i) {
      values.insert(values.end() - 2, random_values(i * 31, 1.0));
    }
    TwinParams twins(values);
    std::vector<bool> zero_grads(twins.cpu.size(), false);
    zero_grads[zero_grad_index] = true;
    optim::LambOptions first;
    first.lr = 1e-3;
    optim::LambOptions second;
    second.lr = 2e-3;
    second.betas = {0.8, 0.95};
    second.weight_decay = 0.01;
    second.bias_correction = false;
    second.max_coeff = 0.5;
    auto groups = [&](const std::vector<at::Tensor>& params) {
      std::vector<torch::optim::OptimizerParamGroup> g;
      g.emplace_back(std::vector<at::Tensor>(params.begin(), params.begin() + first_group_size),
                     std::make_unique<optim::GroupOptions>(first.group()));
      g.emplace_back(std::vector<at::Tensor>(params.begin() + first_group_size, params.end()),
                     std::make_unique<optim::GroupOptions>(second.group()));
      return g;
    };
    optim::Lamb gpu_opt(groups(twins.gpu), {}, eps_inside_sqrt);
    optim::Lamb cpu_opt(groups(twins.cpu), {}, eps_inside_sqrt);
    for (int step = 0; step < 5; ++step) {
      twins.set_grads(0.1, zero_grads);
      gpu_opt.step();
      cpu_opt.step();
      const std::vector<double> gpu_coeffs = gpu_opt.lamb_coeffs();
      const std::vector<double> cpu_coeffs = cpu_opt.lamb_coeffs();
      ASSERT_EQ(gpu_coeffs.size(), twins.cpu.size() - 1);  // all but the one without a grad
      ASSERT_EQ(cpu_coeffs.size(), gpu_coeffs.size());
      for (size_t i = 0; i < cpu_coeffs.size(); ++i) {
        // 1e-3: the CPU reference's norms sum 3M fp32 squares in fp32 (its ||u|| was 6.6e-4
        // off the float64 value on torch 2.11; measured); the kernel sums per chunk and then
        // in double, and lands closer to float64. A wrong formula is off by far more.
        EXPECT_NEAR(gpu_coeffs[i], cpu_coeffs[i], 1e-3 * cpu_coeffs[i])
            << "step " << step << " ratio " << i;
      }
      // The cases this test means to reach.
      EXPECT_FLOAT_EQ(gpu_coeffs[1], 10.0f) << "step " << step;
      if (step == 0) {
        EXPECT_EQ(gpu_coeffs[2], 1.0);
      }
      EXPECT_EQ(gpu_coeffs[zero_grad_index], 1.0) << "step " << step;
      EXPECT_FLOAT_EQ(gpu_coeffs[first_group_size + 3], 0.5f) << "step " << step;
    }
    expect_same_state(gpu_opt, cpu_opt, twins, 1e-5, 1e-6, 1e-8);
  }
}

}  // namespace
}  // namespace deepspeed
