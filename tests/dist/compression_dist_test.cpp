// compression_training on 2 Gloo ranks against one process accumulating both ranks' micro-
// batches: the same parameters after K steps
// - with weight quantization in the forward, topk row pruning and l1 sparse pruning switched on
//   at their offsets, under ZeRO 1, 2 and 3, and resumed from a checkpoint in the middle (the
//   scheduler goes on at the saved step: a technique due after the save still switches on
//   when it should);
// - with MoQ (fp16 weights quantized after each step, 6 bits down to 4) under ZeRO 0 and 2.
#include "deepspeed/compression.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deepspeed/deepspeed.h"
#include "support/multi_rank.h"

namespace deepspeed::compression {
namespace {

using testing::rank_output_dir;
using testing::run_ranks;

constexpr int kSteps = 6;

// Projections in and out of a hidden layer, run through the compressed forward. `elementwise`:
// computed without matmul (Debian's LibTorch 1.13 has no fp16 matmul on CPU).
struct NetImpl : torch::nn::Module {
  explicit NetImpl(bool elementwise)
      : elementwise_(elementwise),
        c_fc(register_module("c_fc", torch::nn::Linear(6, 12))),
        c_proj(register_module("c_proj", torch::nn::Linear(12, 6))) {}
  at::Tensor project(const torch::nn::Linear& l, const at::Tensor& x) {
    if (!elementwise_) return linear(l, x);
    return (x.unsqueeze(-2) * l->weight).sum(-1) + l->bias;
  }
  at::Tensor forward(const at::Tensor& x, const at::Tensor& y) {
    const at::Tensor h = project(c_fc, x);
    const at::Tensor act = elementwise_ ? h + h * h * 0.1 : torch::tanh(h);
    const at::Tensor d = project(c_proj, act) - y;
    return (d * d).mean();
  }
  bool elementwise_;
  torch::nn::Linear c_fc, c_proj;
};
TORCH_MODULE(Net);

json with_batching(json cfg, int stage, int accumulation) {
  cfg["gradient_accumulation_steps"] = accumulation;
  cfg["zero_optimization"] = {{"stage", stage}};
  return cfg;
}

json in_forward_config(int stage, int accumulation) {
  return with_batching(json::parse(R"({
    "train_micro_batch_size_per_gpu": 4,
    "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
    "zero_allow_untested_optimizer": true,
    "compression_training": {
      "weight_quantization": {
        "shared_parameters": {"enabled": true, "quantize_weight_in_forward": true,
                              "quantize_groups": 2, "schedule_offset": 1},
        "different_groups": {"w": {"params": {"start_bits": 8, "target_bits": 4},
                                   "modules": ["c_proj"]}}},
      "sparse_pruning": {
        "shared_parameters": {"enabled": true, "schedule_offset": 0},
        "different_groups": {"s": {"params": {"dense_ratio": 0.6}, "modules": ["c_proj"]}}},
      "row_pruning": {
        "shared_parameters": {"enabled": true, "method": "topk", "schedule_offset": 4},
        "different_groups": {"r": {"params": {"dense_ratio": 0.5}, "modules": ["c_fc"]}}}}})"),
                       stage, accumulation);
}

json moq_config(int stage, int accumulation) {
  return with_batching(json::parse(R"({
    "train_micro_batch_size_per_gpu": 4,
    "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
    "zero_allow_untested_optimizer": true,
    "fp16": {"enabled": true, "initial_scale_power": 8},
    "compression_training": {
      "weight_quantization": {
        "shared_parameters": {"enabled": true, "quantize_groups": 2},
        "different_groups": {"w": {"params": {"start_bits": 6, "target_bits": 4,
                                              "quantization_period": 2},
                                   "modules": ["c_fc"]}}}}})"),
                       stage, accumulation);
}

std::pair<at::Tensor, at::Tensor> batch(int step, int part) {
  torch::manual_seed(100 + 10 * step + part);
  return {torch::randn({4, 6}), torch::randn({4, 6})};
}

std::shared_ptr<ModuleEngine<NetImpl>> make_engine(const json& cfg, bool elementwise) {
  torch::manual_seed(11);  // the same weights and topk scores on every rank
  Net net(elementwise);
  init_compression(*net, compression_config(DeepSpeedConfig::from_json(cfg, 1)));
  return initialize(net.ptr(), cfg).engine;
}

// Trains steps [from, to); rank `rank` of `world` takes its share of each step's micro-batches.
void train(ModuleEngine<NetImpl>& engine, int from, int to, int rank, int world,
           at::ScalarType dtype) {
  const int parts = 2;
  for (int step = from; step < to; ++step) {
    for (int part = rank; part < parts; part += world) {
      auto [x, y] = batch(step, part);
      engine.backward(engine.forward(x.to(dtype), y.to(dtype)));
      engine.step();
    }
  }
}

std::vector<at::Tensor> params_of(Engine& engine) {
  std::vector<at::Tensor> out;
  for (const auto& p : engine.module().parameters()) out.push_back(p.detach().to(at::kFloat));
  return out;
}

void expect_same(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b,
                 const std::string& what, double tol = 1e-6) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(torch::allclose(a[i], b[i], tol, tol))
        << what << ": parameter " << i << " differs by "
        << (a[i] - b[i]).abs().max().item<double>();
  }
}

// One run_ranks() per test: a rank process runs its test body once.
void train_and_resume_on_two_ranks(int stage) {
  // rank_output_dir() is made by run_ranks() for each run.
  const auto dir = [stage] { return rank_output_dir() + "/stage" + std::to_string(stage); };
  run_ranks(2, [&](int rank, int world) {
    auto engine = make_engine(in_forward_config(stage, 1), false);
    train(*engine, 0, kSteps, rank, world, at::kFloat);
    if (rank == 0) torch::save(params_of(*engine), dir() + "_straight.pt");
    // Again, saved after 3 steps and resumed by a new engine.
    auto first = make_engine(in_forward_config(stage, 1), false);
    train(*first, 0, 3, rank, world, at::kFloat);
    first->save_checkpoint(dir() + "_ckpt");
    auto resumed = make_engine(in_forward_config(stage, 1), false);
    resumed->load_checkpoint(dir() + "_ckpt");
    EXPECT_EQ(resumed->compression_scheduler()->training_steps(), 3);
    train(*resumed, 3, kSteps, rank, world, at::kFloat);
    if (rank == 0) torch::save(params_of(*resumed), dir() + "_resumed.pt");
  });
  auto reference = make_engine(in_forward_config(stage, 2), false);
  train(*reference, 0, kSteps, 0, 1, at::kFloat);
  std::vector<at::Tensor> straight, resumed;
  torch::load(straight, dir() + "_straight.pt");
  torch::load(resumed, dir() + "_resumed.pt");
  const auto expected = params_of(*reference);
  expect_same(straight, expected, "ZeRO-" + std::to_string(stage));
  expect_same(resumed, expected, "ZeRO-" + std::to_string(stage) + " resumed");
  // The compression took effect: without it the same steps end elsewhere.
  json plain_config = in_forward_config(stage, 2);
  plain_config.erase("compression_training");
  auto plain = make_engine(plain_config, false);
  train(*plain, 0, kSteps, 0, 1, at::kFloat);
  const auto uncompressed = params_of(*plain);
  // c_fc's weight, bias (and, compressed, row scores), then c_proj's weight.
  EXPECT_FALSE(torch::allclose(uncompressed[0], expected[0], 1e-3, 1e-3));
  EXPECT_FALSE(torch::allclose(uncompressed[2], expected[3], 1e-3, 1e-3));
}

void moq_on_two_ranks(int stage) {
  const auto file = [stage] { return rank_output_dir() + "/moq" + std::to_string(stage) + ".pt"; };
  run_ranks(2, [&](int rank, int world) {
    auto engine = make_engine(moq_config(stage, 1), true);
    train(*engine, 0, kSteps, rank, world, at::kHalf);
    if (rank == 0) torch::save(params_of(*engine), file());
  });
  auto reference = make_engine(moq_config(stage, 2), true);
  train(*reference, 0, kSteps, 0, 1, at::kHalf);
  ASSERT_NE(reference->moq_quantizer(), nullptr);
  // Bits 6, then 5 from step 2 and 4 from step 4 (quantize() also ran in step 0's forwards).
  auto& net = dynamic_cast<NetImpl&>(reference->module());
  EXPECT_EQ(reference->moq_quantizer()->current_bits(*net.c_fc), 4);
  const at::Tensor groups = net.c_fc->weight.detach().to(at::kFloat).reshape({2, -1});
  for (int g = 0; g < 2; ++g) EXPECT_LE(std::get<0>(at::_unique(groups[g])).numel(), 16);
  std::vector<at::Tensor> params;
  torch::load(params, file());
  // fp16 weights: the two ranks reduce in another order than one process accumulates.
  expect_same(params, params_of(*reference), "MoQ ZeRO-" + std::to_string(stage), 4e-3);
}

TEST(CompressionDist, TrainAndResumeAsOneProcessZero1) { train_and_resume_on_two_ranks(1); }
TEST(CompressionDist, TrainAndResumeAsOneProcessZero2) { train_and_resume_on_two_ranks(2); }
TEST(CompressionDist, TrainAndResumeAsOneProcessZero3) { train_and_resume_on_two_ranks(3); }
TEST(CompressionDist, MoqQuantizesAsOneProcessZero0) { moq_on_two_ranks(0); }
TEST(CompressionDist, MoqQuantizesAsOneProcessZero2) { moq_on_two_ranks(2); }

}  // namespace
}  // namespace deepspeed::compression
