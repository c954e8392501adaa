// Block-sparse attention on the GPU (fp32, and bf16/fp16 as DeepSpeed's kernels run it) against
// the CPU's, outputs and gradients; sparse_attention_test holds the CPU against dense attention.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deepspeed/sparse_attention.h"
#include "gpu_test_support.h"

namespace deepspeed::sparse_attention {
namespace {

TEST(SparseAttentionOnGpu, EqualsTheCpuInOutputsAndGradients) {
  DS_REQUIRE_GPU();
  SparseAttentionConfig c;
  c.mode = "bigbird";
  c.block = 32;
  c.num_random_blocks = 2;
  c.different_layout_per_head = true;
  const at::Tensor layout = SparsityConfig(4, c, 9).make_layout(512);
  torch::manual_seed(5);
  AttentionExtras extras;
  extras.causal = true;
  extras.key_padding_mask = torch::zeros({2, 512});
  extras.key_padding_mask.index_put_({1, torch::indexing::Slice(500, 512)}, -10000.0);
  const at::Tensor w = torch::randn({2, 4, 512, 64});
  auto run = [&](const torch::Device& device, at::ScalarType dtype) {
    torch::manual_seed(6);
    std::vector<at::Tensor> x;
    for (int i = 0; i < 3; ++i) {
      x.push_back(torch::randn({2, 4, 512, 64}).to(device, dtype).requires_grad_(true));
    }
    AttentionExtras e = extras;
    e.key_padding_mask = e.key_padding_mask.to(device);
    const at::Tensor out = block_sparse_attention(x[0], x[1], x[2], layout, 32, 0.125, e);
    (out.to(at::kFloat) * w.to(device)).sum().backward();
    std::vector<at::Tensor> got{out.to(at::kCPU, at::kFloat)};
    for (const auto& t : x) got.push_back(t.grad().to(at::kCPU, at::kFloat));
    return got;
  };
  const auto cpu = run(torch::kCPU, at::kFloat);
  const auto gpu = run(torch::kCUDA, at::kFloat);
  for (size_t i = 0; i < cpu.size(); ++i) {
    EXPECT_TRUE(torch::allclose(gpu[i], cpu[i], 1e-3, 1e-4)) << i;
  }
  for (at::ScalarType t : {at::kBFloat16, at::kHalf}) {
    const auto low = run(torch::kCUDA, t);
    EXPECT_TRUE(torch::allclose(low[0], cpu[0], 5e-2, 5e-2)) << t;
  }
}

}  // namespace
}  // namespace deepspeed::sparse_attention
