// deepspeed::linear::OptimizedLinear against DeepSpeed 0.19.8's own LoRAOptimizedLinear
// (optimized_linear_reference.py, on the CPU): the same weights give the same output, input
// gradient and adapter gradients, the same state-dict names, a frozen base weight. The Python
// environment is .venv-deepspeed-torch2 (CTest fixture deepspeed_peer_torch2).
#include "deepspeed/linear.h"

#include <string>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deepspeed/checkpoint.h"
#include "support/run_command.h"
#include "support/temp_dir.h"

namespace deepspeed {
namespace {

namespace ckpt = deepspeed::checkpoint;

TEST(OptimizedLinearParity, LoraForwardAndGradientsEqualDeepSpeeds) {
  testing::TempDir dir("optimized_linear_parity");
  const int64_t in = 12, out = 10, r = 4;
  const double alpha = 6.0;
  torch::manual_seed(11);
  ckpt::TensorDict inputs;
  inputs.insert("weight", torch::randn({out, in}));
  inputs.insert("lora_weight_1.weight", torch::randn({r, in}));
  inputs.insert("lora_weight_2.weight", torch::randn({out, r}));  // not zero: the adapters count
  inputs.insert("x", torch::randn({3, 5, in}));
  inputs.insert("grad", torch::randn({3, 5, out}));
  inputs.insert("lora_r", torch::tensor(r));
  inputs.insert("lora_alpha", torch::tensor(alpha, torch::kDouble));
  ckpt::save(ckpt::ivalue_from_tensors(inputs), dir.file("in.pt"));
  const auto run = testing::run_command(std::string("OMP_NUM_THREADS=1 DS_ACCELERATOR=cpu ") +
                                        DS_DEEPSPEED_PYTHON + " " + DS_REFERENCE_SCRIPT + " " +
                                        dir.file("in.pt") + " " + dir.file("out.pt") + " 2>&1");
  ASSERT_EQ(run.exit_code, 0) << run.out;
  const auto ref = ckpt::tensors_from_ivalue(ckpt::load(dir.file("out.pt")), "reference");

  linear::LoRAConfig c;
  c.lora_r = r;
  c.lora_alpha = alpha;
  linear::OptimizedLinear layer(in, out, false, c, std::nullopt, at::kFloat);
  layer->load_base_weight(*inputs.find("weight"));
  {
    torch::NoGradGuard no_grad;
    layer->lora_weight_1->weight.copy_(*inputs.find("lora_weight_1.weight"));
    layer->lora_weight_2->weight.copy_(*inputs.find("lora_weight_2.weight"));
  }
  const at::Tensor x = inputs.find("x")->clone().requires_grad_(true);
  const at::Tensor y = layer(x);
  y.backward(*inputs.find("grad"));
  EXPECT_TRUE(torch::allclose(y, *ref.find("y"), 1e-5, 1e-5));
  // Rounding differs between the two BLAS builds: within 1e-5 of values around 10.
  EXPECT_TRUE(torch::allclose(x.grad(), *ref.find("x_grad"), 1e-5, 1e-5))
      << (x.grad() - *ref.find("x_grad")).abs().max().item<double>();
  EXPECT_TRUE(torch::allclose(layer->lora_weight_1->weight.grad(), *ref.find("lora_weight_1_grad"),
                              1e-5, 1e-5));
  EXPECT_TRUE(torch::allclose(layer->lora_weight_2->weight.grad(), *ref.find("lora_weight_2_grad"),
                              1e-5, 1e-5));
  EXPECT_FALSE(ref.find("weight_requires_grad")->item<bool>());
  EXPECT_FALSE(layer->weight.requires_grad());
  const at::Tensor key_bytes = *ref.find("keys");
  const std::string keys(static_cast<const char*>(key_bytes.data_ptr()),
                         static_cast<size_t>(key_bytes.numel()));
  std::string ours;
  for (const auto& p : ckpt::module_state_dict(*layer)) {
    ours += (ours.empty() ? "" : "\n") + p.key();
  }
  EXPECT_EQ(ours, keys);
}

}  // namespace
}  // namespace deepspeed
