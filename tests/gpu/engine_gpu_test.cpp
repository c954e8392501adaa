// The engine on one GPU: ZeRO 0-3 in fp32 and bf16 end where the CPU engine ends for the same
// seed and data; the model, ZeRO's buffers and the batch live on cuda:0; ZeRO-Offload equals no
// offload and trains a model that does not fit the capped GPU without it; fp16 overflow skips;
// torch_autocast fp16 tracks fp32 and its GradScaler backs off on an overflow.
#include "deepspeed/deepspeed.h"

#include <cmath>
#include <memory>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deepspeed/zero3.h"
#include "gpu_test_support.h"
#include "support/temp_dir.h"
#include "runtime/accelerator/accelerator.h"

#ifdef DS_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace deepspeed {
namespace {

using testing::AcceleratorScope;
using testing::GpuNetImpl;
using testing::gpu_net_batch;

json config(int stage, const std::string& precision, const json& optimizer) {
  json c = {{"train_micro_batch_size_per_gpu", 8},
            {"gradient_accumulation_steps", 2},
            {"gradient_clipping", 1.0},
            {"steps_per_print", 1000},
            {"zero_allow_untested_optimizer", true},  // SGD under ZeRO 1-3
            {"optimizer", optimizer},
            {"zero_optimization", {{"stage", stage}}}};
  if (precision == "bf16") c["bf16"] = {{"enabled", true}};
  // hysteresis 1: the first overflow halves the scale (DeepSpeed's default 2 waits for two).
  if (precision == "fp16") {
    c["fp16"] = {{"enabled", true}, {"initial_scale_power", 8}, {"hysteresis", 1}};
  }
  return c;
}

const json kSgd = {{"type", "SGD"}, {"params", {{"lr", 0.05}, {"momentum", 0.9}}}};
const json kAdamW = {{"type", "AdamW"}, {"params", {{"lr", 2e-3}, {"weight_decay", 0.01}}}};
const json kMuon = {{"type", "Muon"}, {"params", {{"lr", 0.02}, {"adam_lr", 2e-3}}}};

struct Trained {
  std::vector<at::Tensor> params;  // fp32 copies on the CPU, in module order
  std::vector<double> losses;
  at::Device device = at::kCPU;
  int64_t skipped = 0;
};

// Trains GpuNet for `steps` optimizer steps on `accelerator`; the engine is destroyed before the
// parameters are read, so ZeRO-3 has gathered them back.
Trained train(const json& cfg, const char* accelerator, int steps) {
  AcceleratorScope scope(accelerator);
  auto model = std::make_shared<GpuNetImpl>();
  Trained out;
  {
    auto engine = initialize(model, cfg).engine;
    out.device = engine->device();
    int64_t batch = 0;
    for (int s = 0; s < steps; ++s) {
      for (int64_t m = 0; m < engine->gradient_accumulation_steps(); ++m) {
        auto [x, y] = gpu_net_batch(batch++, 8);
        // The engine moves the batch; casting it to the model's dtype is the caller's job, as
        // in DeepSpeed (without fp16.auto_cast).
        auto loss = engine->forward(x.to(engine->model_dtype()), y);
        engine->backward(loss);
        engine->step();
        out.losses.push_back(loss.item<double>());
      }
    }
    out.skipped = engine->skipped_steps();
    // Read while the engine lives: offload_param "nvme" leaves the model empty when it goes.
    zero::GatheredParameters gathered(*model);
    for (const auto& p : model->parameters()) {
      out.params.push_back(p.detach().to(at::kCPU, at::kFloat));
    }
  }
  return out;
}

// Largest |a - b| over all parameters, relative to the largest |b|. Both runs must have
// stepped every time: two runs that skipped every step would agree trivially.
double max_relative_gap(const Trained& a, const Trained& b) {
  EXPECT_EQ(a.skipped, 0) << "steps skipped (inf/nan gradients)";
  EXPECT_EQ(b.skipped, 0) << "steps skipped (inf/nan gradients)";
  EXPECT_EQ(a.params.size(), b.params.size());
  double gap = 0.0, scale = 0.0;
  for (size_t i = 0; i < a.params.size() && i < b.params.size(); ++i) {
    gap = std::max(gap, (a.params[i] - b.params[i]).abs().max().item<double>());
    scale = std::max(scale, b.params[i].abs().max().item<double>());
  }
  return gap / scale;
}

class EngineOnGpu : public ::testing::TestWithParam<int> {};

TEST_P(EngineOnGpu, Fp32EqualsTheCpuEngine) {
  DS_REQUIRE_GPU();
  const int stage = GetParam();
  const Trained gpu = train(config(stage, "fp32", kSgd), "cuda", 4);
  const Trained cpu = train(config(stage, "fp32", kSgd), "cpu", 4);
  EXPECT_TRUE(gpu.device.is_cuda()) << gpu.device;
  EXPECT_TRUE(cpu.device.is_cpu()) << cpu.device;
  EXPECT_LT(max_relative_gap(gpu, cpu), 1e-5) << "ZeRO-" << stage;
  for (size_t i = 0; i < gpu.losses.size(); ++i) {
    EXPECT_NEAR(gpu.losses[i], cpu.losses[i], 1e-5 * std::abs(cpu.losses[i]) + 1e-7) << i;
  }
}

TEST_P(EngineOnGpu, Bf16TracksTheFp32CpuEngine) {
  DS_REQUIRE_GPU();
  const int stage = GetParam();
  // bf16 keeps 8 bits of mantissa: the parameters (fp32 masters rounded to bf16) stay within a
  // few bf16 steps of the fp32 run; a wrong update (sign, scale, a lost gradient) is far off.
  const Trained gpu = train(config(stage, "bf16", kAdamW), "cuda", 4);
  const Trained cpu = train(config(stage, "fp32", kAdamW), "cpu", 4);
  EXPECT_LT(max_relative_gap(gpu, cpu), 3e-2) << "ZeRO-" << stage;
  const Trained moved = train(config(stage, "fp32", kAdamW), "cpu", 0);
  EXPECT_GT(max_relative_gap(cpu, moved), 3e-3) << "the steps must move the parameters";
}

TEST_P(EngineOnGpu, TorchAutocastFp16TracksTheFp32CpuEngine) {
  DS_REQUIRE_GPU();
  const int stage = GetParam();
  // torch_autocast on CUDA (its default dtype, fp16): fp32 weights stepped with gradients of
  // fp16 products, loss scaled by the GradScaler schedule; near the fp32 run, as bf16 is.
  json amp = config(stage, "fp32", kAdamW);
  amp["torch_autocast"] = {{"enabled", true}};
  const Trained gpu = train(amp, "cuda", 4);
  const Trained cpu = train(config(stage, "fp32", kAdamW), "cpu", 4);
  EXPECT_LT(max_relative_gap(gpu, cpu), 3e-2) << "ZeRO-" << stage;
}

TEST_P(EngineOnGpu, MuonTracksTheCpuEngine) {
  DS_REQUIRE_GPU();
  const int stage = GetParam();
  // On CUDA Newton-Schulz runs in fp16 ("gram", the default) as DeepSpeed picks it, on the CPU
  // in fp32: the matrices' updates agree to fp16's precision; fp32 and bf16 models alike.
  const Trained cpu = train(config(stage, "fp32", kMuon), "cpu", 4);
  for (const std::string precision : {"fp32", "bf16"}) {
    const Trained gpu = train(config(stage, precision, kMuon), "cuda", 4);
    EXPECT_LT(max_relative_gap(gpu, cpu), 3e-2) << "ZeRO-" << stage << " " << precision;
  }
  const Trained adam = train(config(stage, "fp32", kAdamW), "cpu", 4);
  EXPECT_GT(max_relative_gap(cpu, adam), 3e-3) << "Muon must move the matrices otherwise";
}

INSTANTIATE_TEST_SUITE_P(Stages, EngineOnGpu, ::testing::Values(0, 1, 2, 3),
                         [](const auto& info) { return "ZeRO" + std::to_string(info.param); });

TEST(EngineOnGpuPlacement, ModelBuffersAndBatchLiveOnTheDevice) {
  DS_REQUIRE_GPU();
  AcceleratorScope scope("cuda");
  auto model = std::make_shared<GpuNetImpl>();
  auto engine = initialize(model, config(2, "bf16", kAdamW)).engine;
  EXPECT_EQ(engine->device(), at::Device(at::kCUDA, 0));
  for (const auto& p : model->parameters()) EXPECT_TRUE(p.is_cuda());
  auto [x, y] = gpu_net_batch(0, 8);  // CPU tensors: the engine moves them
  engine->backward(engine->forward(x.to(at::kBFloat16), y));
  engine->step();
  const MemoryStats m = engine->memory_stats();
  EXPECT_GT(m.device_allocated_bytes, m.param_bytes) << "parameters, gradients and states";
  EXPECT_GE(m.device_max_allocated_bytes, m.device_allocated_bytes);
  EXPECT_GE(m.device_reserved_bytes, m.device_allocated_bytes);
  EXPECT_NE(engine->memory_report().find("MA "), std::string::npos) << engine->memory_report();
}

TEST(EngineOnGpuOffload, OptimizerOffloadEqualsNoOffload) {
  DS_REQUIRE_GPU();
  for (int stage : {1, 2}) {
    json offloaded = config(stage, "bf16", kAdamW);
    offloaded["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}, {"pin_memory", true}};
    const Trained host = train(offloaded, "cuda", 4);
    const Trained device = train(config(stage, "bf16", kAdamW), "cuda", 4);
    // CPU-Adam on the host and the fused CUDA Adam compute the same fp32 formula; the bf16
    // copies may differ by one rounding step where the two fp32 results straddle a boundary.
    EXPECT_LT(max_relative_gap(host, device), 1e-2) << "ZeRO-" << stage;
    for (size_t i = 0; i < host.losses.size(); ++i) {
      EXPECT_NEAR(host.losses[i], device.losses[i], 2e-2 * std::abs(device.losses[i])) << i;
    }
  }
}

TEST(EngineOnGpuOffload, Stage3OffloadToCpuAndNvmeEqualsNoOffload) {
  DS_REQUIRE_GPU();
  testing::TempDir nvme("ds_gpu_nvme");
  json plain = config(3, "bf16", kAdamW);
  plain["zero_optimization"]["sub_group_size"] = 5000;  // several sub-groups to step in turn
  const Trained device = train(plain, "cuda", 3);
  struct Case {
    std::string optimizer, param;
  };
  for (const Case& c : {Case{"cpu", "none"}, Case{"cpu", "cpu"}, Case{"nvme", "nvme"}}) {
    json cfg = plain;
    auto& z = cfg["zero_optimization"];
    z["offload_optimizer"] = {{"device", c.optimizer}, {"nvme_path", nvme.path()},
                              {"pin_memory", true}};
    if (c.param != "none") {
      z["offload_param"] = {{"device", c.param}, {"nvme_path", nvme.path()}, {"max_in_cpu", 0},
                            {"pin_memory", true}};
    }
    const Trained host = train(cfg, "cuda", 3);
    EXPECT_TRUE(host.device.is_cuda());
    EXPECT_LT(max_relative_gap(host, device), 1e-2)
        << "offload_optimizer " << c.optimizer << ", offload_param " << c.param;
  }
}

#ifdef DS_WITH_CUDA
// A model whose bf16 weights, fp32 gradient partition and fp32 Adam states (16 bytes per
// parameter) exceed the GPU memory this test allows the process, while offload keeps 6 bytes
// per parameter on the device.
struct WideNetImpl : torch::nn::Module {
  WideNetImpl() {
    torch::manual_seed(3);
    for (int i = 0; i < 8; ++i) {
      layers.push_back(register_module("l" + std::to_string(i), torch::nn::Linear(4096, 4096)));
    }
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = x;
    for (auto& l : layers) h = torch::tanh(l(h));
    return h.to(torch::kFloat).pow(2).mean();
  }
  std::vector<torch::nn::Linear> layers;
};

TEST(EngineOnGpuOffload, OffloadTrainsAModelThatDoesNotFitTheCappedGpu) {
  DS_REQUIRE_GPU();
  AcceleratorScope scope("cuda");
  const int64_t params = 8 * (4096 * 4096 + 4096);  // 134 M
  const int64_t cap = params * 12;                   // between 6 and 16 bytes per parameter
  const auto total = runtime::device_memory(at::Device(at::kCUDA, 0)).total_bytes;
  ASSERT_GT(total, 0);
  c10::cuda::CUDACachingAllocator::emptyCache();
  runtime::reset_device_peaks(at::Device(at::kCUDA, 0));
  c10::cuda::CUDACachingAllocator::setMemoryFraction(static_cast<double>(cap) / total, 0);
  struct Uncap {
    ~Uncap() {
      c10::cuda::CUDACachingAllocator::emptyCache();
      c10::cuda::CUDACachingAllocator::setMemoryFraction(1.0, 0);
    }
  } uncap;
  auto run = [&](bool offload) {
    // A small step on one fixed batch: each step must lower the loss (Adam's first steps move
    // every weight by about lr, which at 2e-3 would be 13% of these layers' initial scale).
    json cfg = config(2, "bf16", {{"type", "AdamW"}, {"params", {{"lr", 1e-5}}}});
    cfg["gradient_accumulation_steps"] = 1;
    cfg["train_micro_batch_size_per_gpu"] = 4;
    if (offload) cfg["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}};
    auto model = std::make_shared<WideNetImpl>();
    auto engine = initialize(model, cfg).engine;
    torch::manual_seed(11);
    const at::Tensor x = torch::randn({4, 4096}).to(at::kBFloat16);
    std::vector<double> losses;
    for (int s = 0; s < 3; ++s) {
      auto loss = engine->forward(x);
      engine->backward(loss);
      engine->step();
      losses.push_back(loss.item<double>());
    }
    const MemoryStats m = engine->memory_stats();
    EXPECT_LE(m.device_max_reserved_bytes, cap);
    return losses;
  };
  const auto losses = run(true);
  EXPECT_LT(losses.back(), losses.front()) << "offloaded training must learn: " << losses[0]
                                           << " -> " << losses[1] << " -> " << losses[2];
  // Without offload the same model does not fit: the cap is real.
  EXPECT_ANY_THROW(run(false));
}

// ZeRO-3 partitions a model built outside zero::Init in host memory before moving it: with
// offload_param the device never holds the model's weights, not even while the engine starts.
TEST(EngineOnGpuOffload, Stage3NeverMovesTheWholeModelToTheGpu) {
  DS_REQUIRE_GPU();
  AcceleratorScope scope("cuda");
  const int64_t model_bytes = 2 * 8 * (4096 * 4096 + 4096);  // bf16
  c10::cuda::CUDACachingAllocator::emptyCache();
  runtime::reset_device_peaks(at::Device(at::kCUDA, 0));
  json cfg = config(3, "bf16", kAdamW);
  cfg["gradient_accumulation_steps"] = 1;
  cfg["train_micro_batch_size_per_gpu"] = 4;
  cfg["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}, {"pin_memory", true}};
  cfg["zero_optimization"]["offload_param"] = {{"device", "cpu"}, {"pin_memory", true}};
  // One reduction buffer as large as one weight (send + receive: a quarter of the model), so
  // that the device holds little else at the start.
  cfg["zero_optimization"]["overlap_comm"] = false;
  cfg["zero_optimization"]["reduce_bucket_size"] = 1000000;
  auto model = std::make_shared<WideNetImpl>();
  auto engine = initialize(model, cfg).engine;
  const MemoryStats at_start = engine->memory_stats();
  EXPECT_LT(at_start.device_max_allocated_bytes, model_bytes / 2)
      << "the engine held " << at_start.device_max_allocated_bytes << " bytes of a "
      << model_bytes << "-byte model on the GPU before the first step";
  torch::manual_seed(11);
  auto loss = engine->forward(torch::randn({4, 4096}).to(at::kBFloat16));
  engine->backward(loss);
  engine->step();
  EXPECT_TRUE(std::isfinite(loss.item<double>()));
}
#endif

// GpuNet with dropout: its masks come from the CUDA generator, which a resume must restore.
struct DropNetImpl : testing::GpuNetImpl {
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& y) {
    auto h = torch::dropout(norm(torch::tanh(in(x))), 0.3, is_training());
    for (auto& l : hidden) h = torch::dropout(torch::tanh(l(h)), 0.3, is_training()) + h;
    return torch::nn::functional::mse_loss(out(h).to(torch::kFloat), y);
  }
};

TEST(EngineOnGpuCheckpoint, ResumeIsExactWithTheCudaGenerator) {
  DS_REQUIRE_GPU();
  AcceleratorScope scope("cuda");
  testing::TempDir dir("ds_gpu_ckpt");
  const json cfg = config(2, "bf16", kAdamW);
  auto run = [&](int from, int to, bool save, bool load) {
    auto model = std::make_shared<DropNetImpl>();
    auto engine = initialize(model, cfg).engine;
    if (load) engine->load_checkpoint(dir.path());
    for (int s = from; s < to; ++s) {
      for (int64_t m = 0; m < 2; ++m) {
        auto [x, y] = gpu_net_batch(s * 2 + m, 8);
        engine->backward(engine->forward(x.to(at::kBFloat16), y));
        engine->step();
      }
    }
    if (save) engine->save_checkpoint(dir.path());
    std::vector<at::Tensor> out;
    for (const auto& p : model->parameters()) out.push_back(p.detach().to(at::kCPU, at::kFloat));
    return out;
  };
  const auto straight = run(0, 4, false, false);
  run(0, 2, true, false);
  const auto resumed = run(2, 4, false, true);
  ASSERT_EQ(straight.size(), resumed.size());
  for (size_t i = 0; i < straight.size(); ++i) EXPECT_TRUE(straight[i].equal(resumed[i])) << i;
}

TEST(EngineOnGpuFp16, OverflowSkipsTheStepAndLeavesTheParameters) {
  DS_REQUIRE_GPU();
  AcceleratorScope scope("cuda");
  auto model = std::make_shared<GpuNetImpl>();
  json cfg = config(2, "fp16", kAdamW);
  cfg["gradient_accumulation_steps"] = 1;
  auto engine = initialize(model, cfg).engine;
  auto [x_fp32, y] = gpu_net_batch(0, 8);
  const at::Tensor x = x_fp32.to(at::kHalf);
  engine->backward(engine->forward(x, y));
  engine->step();
  std::vector<at::Tensor> before;
  for (const auto& p : model->parameters()) before.push_back(p.detach().clone());
  const double scale = engine->loss_scale();
  // An inf in the loss makes every gradient inf: the vote finds it on the device.
  engine->backward(engine->forward(x, y) * std::numeric_limits<float>::infinity());
  engine->step();
  EXPECT_EQ(engine->skipped_steps(), 1);
  EXPECT_LT(engine->loss_scale(), scale);
  auto params = model->parameters();
  for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(params[i].equal(before[i])) << i;
}

TEST(EngineOnGpuAutocast, Fp16ForwardAndGradScalerOverflow) {
  DS_REQUIRE_GPU();
  AcceleratorScope scope("cuda");
  auto model = std::make_shared<GpuNetImpl>();
  json cfg = config(2, "fp32", kAdamW);
  cfg["gradient_accumulation_steps"] = 1;
  cfg["torch_autocast"] = {{"enabled", true}, {"dtype", "float16"}};
  auto engine = initialize(model, cfg).engine;
  EXPECT_EQ(engine->torch_autocast_dtype(), at::kHalf);
  EXPECT_EQ(engine->loss_scale(), 65536.0);  // GradScaler's initial scale
  auto [x, y] = gpu_net_batch(0, 8);
  engine->backward(engine->forward(x, y));
  engine->step();
  EXPECT_EQ(engine->skipped_steps(), 0);
  std::vector<at::Tensor> before;
  for (const auto& p : model->parameters()) {
    EXPECT_EQ(p.scalar_type(), at::kFloat);
    before.push_back(p.detach().clone());
  }
  engine->backward(engine->forward(x, y) * std::numeric_limits<float>::infinity());
  engine->step();
  EXPECT_EQ(engine->skipped_steps(), 1);
  EXPECT_EQ(engine->loss_scale(), 32768.0);  // backoff 0.5
  auto params = model->parameters();
  for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(params[i].equal(before[i])) << i;
}

}  // namespace
}  // namespace deepspeed
