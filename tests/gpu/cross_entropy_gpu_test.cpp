// chunked_cross_entropy and linear_cross_entropy on the GPU (fp32, bf16) against the CPU in fp32:
// losses and every gradient; cross_entropy_test holds the CPU against cross_entropy.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deepspeed/cross_entropy.h"
#include "gpu_test_support.h"

namespace deepspeed {
namespace {

struct Result {
  at::Tensor loss, grad_hidden, grad_weight;
};

// Loss and gradients of the fused head (fused) or of the logits then the chunked loss, on
// `device` in `dtype`, from the same fp32 inputs; every target of row 5k ignored.
Result run(bool fused, const torch::Device& device, at::ScalarType dtype) {
  torch::manual_seed(21);
  const at::Tensor h0 = torch::randn({64, 96}), w0 = torch::randn({1000, 96}) / 8;
  at::Tensor target = torch::randint(1000, {64}, torch::kLong);
  target.index_put_({torch::arange(0, 64, 5)}, -100);
  at::Tensor h = h0.to(device, dtype).requires_grad_(), w = w0.to(device, dtype).requires_grad_();
  const at::Tensor t = target.to(device);
  at::Tensor loss;
  if (fused) {
    LinearCrossEntropyOptions o;
    o.chunk_size = 7;
    loss = linear_cross_entropy(h, w, t, o);
  } else {
    ChunkedCrossEntropyOptions o;
    o.block_rows = 7;
    loss = chunked_cross_entropy(torch::mm(h, w.t()), t, o);
  }
  loss.backward();
  return {loss.to(at::kCPU), h.grad().to(at::kCPU, at::kFloat), w.grad().to(at::kCPU, at::kFloat)};
}

TEST(CrossEntropyOnGpu, EqualsTheCpuInLossAndGradients) {
  DS_REQUIRE_GPU();
  for (bool fused : {false, true}) {
    const Result cpu = run(fused, torch::kCPU, at::kFloat);
    const Result gpu = run(fused, torch::kCUDA, at::kFloat);
    const char* what = fused ? "linear_cross_entropy" : "chunked_cross_entropy";
    EXPECT_TRUE(torch::allclose(gpu.loss, cpu.loss, 1e-5, 1e-5)) << what;
    EXPECT_TRUE(torch::allclose(gpu.grad_hidden, cpu.grad_hidden, 1e-4, 1e-6)) << what;
    EXPECT_TRUE(torch::allclose(gpu.grad_weight, cpu.grad_weight, 1e-4, 1e-6)) << what;
    const Result bf16 = run(fused, torch::kCUDA, at::kBFloat16);
    EXPECT_EQ(bf16.loss.scalar_type(), at::kFloat) << what << ": the loss is fp32";
    EXPECT_TRUE(torch::allclose(bf16.loss, cpu.loss, 2e-2, 2e-2)) << what;
    EXPECT_TRUE(torch::allclose(bf16.grad_hidden, cpu.grad_hidden, 5e-2, 5e-3)) << what;
    EXPECT_TRUE(torch::allclose(bf16.grad_weight, cpu.grad_weight, 5e-2, 5e-3)) << what;
  }
}

}  // namespace
}  // namespace deepspeed
