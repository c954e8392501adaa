// checkpointing::checkpoint on one process: identical gradients with dropout (the recomputation
// sees the forward's RNG), the generator left where a plain run leaves it, each way of keeping
// the inputs (reference, host copy, partition of 1, contiguous slots), the boundary options, the
// settings from ds_config and their refusals, and the activation memory it saves.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deepspeed/checkpointing.h"
#include "deepspeed/config.h"
#include "support/counting_allocator.h"
#include "support/dropout_tower.h"
#include "support/expect_throw.h"

namespace deepspeed {
namespace {

using testing::DropoutTower;

struct RunResult {
  torch::Tensor loss, input_grad;
  std::vector<torch::Tensor> grads;
  torch::Tensor rng_after;  // a draw after forward + backward: where the generator was left
};

// Forward and backward of a fresh tower (same weights each time) on a fixed input, with the
// generator seeded for the dropout masks.
RunResult run(bool checkpointed, int layers = 4, bool input_requires_grad = true,
              const std::function<void(torch::Tensor&)>& after_forward = {},
              uint64_t mask_seed = 11) {
  DropoutTower tower(layers, 16);
  torch::manual_seed(5);
  auto x = torch::randn({2, 5, 16}).set_requires_grad(input_requires_grad);
  torch::manual_seed(mask_seed);
  auto y = tower.forward(x, checkpointed);
  if (after_forward) after_forward(x);
  auto loss = (y * y).mean();
  loss.backward();
  RunResult r;
  r.loss = loss.detach();
  r.input_grad = input_requires_grad ? x.grad().clone() : torch::Tensor();
  r.grads = testing::gradients(tower);
  r.rng_after = torch::rand({4});
  return r;
}

void expect_same(const RunResult& a, const RunResult& b) {
  EXPECT_TRUE(torch::equal(a.loss, b.loss))
      << a.loss.item<double>() << " vs " << b.loss.item<double>();
  if (a.input_grad.defined()) {
    EXPECT_TRUE(torch::equal(a.input_grad, b.input_grad))
        << "input grad max |diff| " << (a.input_grad - b.input_grad).abs().max().item<double>();
  }
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (size_t i = 0; i < a.grads.size(); ++i) {
    ASSERT_TRUE(a.grads[i].defined() && b.grads[i].defined()) << "parameter " << i;
    EXPECT_TRUE(torch::equal(a.grads[i], b.grads[i]))
        << "parameter " << i << " max |diff| "
        << (a.grads[i] - b.grads[i]).abs().max().item<double>();
  }
}

// configure(nullptr, nullptr, overrides) with the overrides set by `set`.
void configure_with(const std::function<void(checkpointing::ConfigureOverrides&)>& set) {
  checkpointing::ConfigureOverrides o;
  set(o);
  checkpointing::configure(nullptr, nullptr, o);
}

class Checkpointing : public ::testing::Test {
 protected:
  void SetUp() override {
    checkpointing::configure(nullptr);  // DeepSpeed's defaults
    checkpointing::reset_stats();
  }
  void TearDown() override { checkpointing::configure(nullptr); }
};

TEST_F(Checkpointing, GradientsAreIdenticalWithDropoutOn) {
  const RunResult plain = run(false);
  const RunResult ckpt = run(true);
  expect_same(plain, ckpt);
  const auto s = checkpointing::stats();
  EXPECT_EQ(s.forwards, 4);
  EXPECT_EQ(s.recomputes, 4);
  EXPECT_EQ(s.saved_bytes, 0) << "inputs are released after the backward";
}

TEST_F(Checkpointing, DropoutMasksWouldDifferWithoutTheRestoredRngState) {
  // The claim above is only meaningful if dropout makes the gradients depend on the masks.
  const RunResult a = run(false), b = run(false, 4, true, {}, /*mask_seed=*/12);
  EXPECT_FALSE(torch::equal(a.grads[0], b.grads[0]));
}

TEST_F(Checkpointing, LeavesTheGeneratorWhereAPlainRunDoes) {
  // Forward consumes the same draws; the recomputation's draws are undone after backward.
  EXPECT_TRUE(torch::equal(run(false).rng_after, run(true).rng_after));
}

TEST_F(Checkpointing, ParametersGetGradientsWhenNoInputRequiresGrad) {
  expect_same(run(false, 3, /*input_requires_grad=*/false), run(true, 3, false));
}

TEST_F(Checkpointing, NoGradModeRunsPlainlyAndKeepsNothing) {
  DropoutTower tower(2, 16);
  torch::NoGradGuard no_grad;
  auto x = torch::randn({2, 5, 16});
  tower.eval();
  EXPECT_TRUE(torch::equal(tower.forward(x, false), tower.forward(x, true)));
  EXPECT_EQ(checkpointing::stats().forwards, 0);
  EXPECT_EQ(checkpointing::stats().saved_bytes, 0);
}

TEST_F(Checkpointing, MultipleInputsAndOutputsWithANonFloatOutput) {
  auto a = torch::randn({3, 4}).set_requires_grad(true);
  auto b = torch::randn({3, 4}).set_requires_grad(true);
  auto w = torch::randn({4, 4}).set_requires_grad(true);
  auto fn = [w](const std::vector<at::Tensor>& in) {
    auto h = torch::matmul(in[0], w) * in[1];
    return std::vector<at::Tensor>{h.tanh(), h.sum(), (h > 0).to(torch::kLong)};
  };
  auto plain = fn({a, b});
  (plain[0].sum() + plain[1]).backward();
  const auto ga = a.grad().clone(), gb = b.grad().clone(), gw = w.grad().clone();
  a.mutable_grad().reset();
  b.mutable_grad().reset();
  w.mutable_grad().reset();
  auto out = checkpointing::checkpoint(fn, {a, b});
  ASSERT_EQ(out.size(), 3u);
  EXPECT_FALSE(out[2].requires_grad());
  EXPECT_TRUE(torch::equal(out[2], plain[2]));
  (out[0].sum() + out[1]).backward();
  EXPECT_TRUE(torch::allclose(a.grad(), ga));
  EXPECT_TRUE(torch::allclose(b.grad(), gb));
  EXPECT_TRUE(torch::allclose(w.grad(), gw));
}

TEST_F(Checkpointing, CpuCheckpointingKeepsASeparateHostCopy) {
  configure_with([](auto& o) { o.checkpoint_in_cpu = true; });
  const RunResult plain = run(false);
  // The caller overwrites its input after the forward: only a copy keeps the backward right.
  const RunResult ckpt = run(true, 4, true, [](torch::Tensor& x) { x.detach().zero_(); });
  expect_same(plain, ckpt);
  EXPECT_EQ(checkpointing::stats().host_copies, 4);
  EXPECT_EQ(checkpointing::stats().partitioned_inputs, 0);
}

TEST_F(Checkpointing, WithoutCpuCheckpointingTheInputIsReferenced) {
  // The counterpart of the test above: the default keeps a reference, so the overwrite shows.
  const RunResult plain = run(false);
  const RunResult ckpt = run(true, 4, true, [](torch::Tensor& x) { x.detach().zero_(); });
  EXPECT_FALSE(torch::equal(plain.grads[0], ckpt.grads[0]));
  EXPECT_EQ(checkpointing::stats().host_copies, 0);
}

TEST_F(Checkpointing, PartitionOfOneRankKeepsTheWholeInput) {
  configure_with([](auto& o) { o.partition_activations = true; });
  expect_same(run(false), run(true));
  const auto s = checkpointing::stats();
  EXPECT_EQ(s.partitioned_inputs, 4);
  EXPECT_EQ(s.gathered_inputs, 0) << "nothing to gather with a model-parallel size of 1";
}

TEST_F(Checkpointing, ContiguousSlotsHoldTheCheckpointsUntilBackward) {
  configure_with([](auto& o) {
    o.partition_activations = true;
    o.contiguous_checkpointing = true;
    o.num_checkpoints = 4;
  });
  expect_same(run(false), run(true, 4));
  EXPECT_EQ(checkpointing::stats().contiguous_copies, 4);
  // The backward freed the buffers: another 4 calls fit again, a fifth does not.
  DropoutTower tower(5, 16);
  auto x = torch::randn({2, 5, 16}).set_requires_grad(true);
  EXPECT_THROW_WITH(tower.forward(x, true), UsageError,
                    "checkpoint call 5 since the last backward, but number_checkpoints is 4");
  checkpointing::reset();  // the forward had no backward
  EXPECT_NO_THROW(DropoutTower(4, 16).forward(x, true));
}

TEST_F(Checkpointing, ContiguousSlotsRefuseInputsOfAnotherSize) {
  configure_with([](auto& o) {
    o.partition_activations = true;
    o.contiguous_checkpointing = true;
    o.num_checkpoints = 4;
  });
  DropoutTower tower(1, 16);
  auto keep = tower.forward(torch::randn({2, 5, 16}).set_requires_grad(true), true);
  EXPECT_THROW_WITH(tower.forward(torch::randn({2, 6, 16}).set_requires_grad(true), true),
                    UsageError, "checkpointed input 0 keeps 192 Float elements per rank");
  checkpointing::reset();
}

TEST_F(Checkpointing, SynchronizeAndProfileAtEachBoundary) {
  configure_with([](auto& o) {
    o.synchronize = true;
    o.profile = true;
  });
  ::testing::internal::CaptureStdout();
  run(true, 2);
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(checkpointing::stats().synchronizations, 2 * 4);
  EXPECT_NE(out.find("time (ms) | fwd: "), std::string::npos) << out;
  EXPECT_NE(out.find("time (ms) | backward: "), std::string::npos) << out;
  checkpointing::configure(nullptr);
  checkpointing::reset_stats();
  ::testing::internal::CaptureStdout();
  run(true, 2);
  EXPECT_EQ(::testing::internal::GetCapturedStdout().find("time (ms)"), std::string::npos);
  EXPECT_EQ(checkpointing::stats().synchronizations, 0);
}

TEST_F(Checkpointing, ConfigureReadsTheSectionAndOverridesWin) {
  auto c = DeepSpeedConfig::from_string(R"({"train_batch_size": 4, "activation_checkpointing":
      {"partition_activations": true, "cpu_checkpointing": true, "number_checkpoints": 3,
       "synchronize_checkpoint_boundary": true, "profile": true}})",
                                        1);
  checkpointing::configure(nullptr, &c);
  EXPECT_TRUE(checkpointing::is_configured());
  auto o = checkpointing::options();
  EXPECT_TRUE(o.partition_activations && o.cpu_checkpointing && o.synchronize_checkpoint_boundary &&
              o.profile);
  EXPECT_FALSE(o.contiguous_memory_optimization);
  EXPECT_EQ(o.number_checkpoints, 3);
  checkpointing::configure(nullptr, &c, [] {
    checkpointing::ConfigureOverrides o;
    o.checkpoint_in_cpu = false;
    o.profile = false;
    return o;
  }());
  o = checkpointing::options();
  EXPECT_FALSE(o.cpu_checkpointing);
  EXPECT_FALSE(o.profile);
  EXPECT_TRUE(o.partition_activations);
  checkpointing::configure(nullptr);
  o = checkpointing::options();
  EXPECT_FALSE(o.partition_activations || o.cpu_checkpointing || o.profile ||
               o.number_checkpoints.has_value());
}

TEST_F(Checkpointing, ConfigureRefusesContiguousWithoutPartitionsOrCount) {
  EXPECT_THROW_WITH(configure_with([](auto& o) {
                      o.contiguous_checkpointing = true;
                      o.num_checkpoints = 2;
                    }),
                    ConfigError, "contiguous_memory_optimization needs partition_activations");
  EXPECT_THROW_WITH(configure_with([](auto& o) {
                      o.partition_activations = true;
                      o.contiguous_checkpointing = true;
                    }),
                    ConfigError, "contiguous_memory_optimization needs number_checkpoints");
}

TEST_F(Checkpointing, SecondBackwardThroughTheSameCallIsRefused) {
  auto x = torch::randn({4, 4}).set_requires_grad(true);
  auto y = checkpointing::checkpoint([](const at::Tensor& t) { return t.sin(); }, x);
  auto loss = y.sum();
  loss.backward({}, /*retain_graph=*/true);
  EXPECT_THROW_WITH(loss.backward(), std::exception, "backward ran twice");
}

// Peak activation memory, measured through the CPU allocator: a tower of blocks that each keep
// 8 activations for backward holds 8 per block without checkpointing, 1 per block (its input)
// with it, plus one block's worth while that block is recomputed.
struct DeepBlockImpl : torch::nn::Module {
  explicit DeepBlockImpl(int64_t width) {
    for (int i = 0; i < 4; ++i) {
      fcs.push_back(register_module("fc" + std::to_string(i), torch::nn::Linear(width, width)));
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& fc : fcs) x = torch::gelu(fc(x));
    return x;
  }
  std::vector<torch::nn::Linear> fcs;
};
TORCH_MODULE(DeepBlock);

struct MemoryFigures {
  int64_t after_forward = 0;  // bytes held once the forward returned (activations + output)
  int64_t peak = 0;           // the most held during forward and backward
};

MemoryFigures measure(bool checkpointed, int layers, int64_t batch, int64_t width) {
  auto& counting = testing::CountingAllocator::install();
  torch::manual_seed(3);
  std::vector<DeepBlock> blocks;
  for (int i = 0; i < layers; ++i) blocks.emplace_back(width);
  auto x = torch::randn({batch, width}).set_requires_grad(true);
  for (auto& b : blocks) {  // grads exist before measuring, so both runs count the same memory
    for (auto& p : b->parameters()) p.mutable_grad() = torch::zeros_like(p);
  }
  x.mutable_grad() = torch::zeros_like(x);
  const int64_t before = counting.live();
  counting.reset_peak();
  MemoryFigures m;
  {
    torch::Tensor h = x;
    for (auto& b : blocks)
      h = checkpointed ? checkpointing::checkpoint_module(b, h) : b->forward(h);
    m.after_forward = counting.live() - before;
    h.sum().backward();
  }
  m.peak = counting.peak() - before;
  return m;
}

TEST_F(Checkpointing, LowersPeakActivationMemoryOfAnEightLayerModel) {
  constexpr int kLayers = 8;
  constexpr int64_t kBatch = 512, kWidth = 64;
  constexpr int64_t kActivation = kBatch * kWidth * 4;  // one [batch, width] fp32 tensor
  const MemoryFigures plain = measure(false, kLayers, kBatch, kWidth);
  const MemoryFigures ckpt = measure(true, kLayers, kBatch, kWidth);
  std::printf(
      "activation memory after forward: %lld B plain, %lld B checkpointed; peak %lld B "
      "plain, %lld B checkpointed\n",
      static_cast<long long>(plain.after_forward), static_cast<long long>(ckpt.after_forward),
      static_cast<long long>(plain.peak), static_cast<long long>(ckpt.peak));
  // Plain: each layer keeps each linear's input and each gelu's input.
  EXPECT_GE(plain.after_forward, kLayers * 8 * kActivation * 9 / 10);
  // Checkpointed: the blocks' inputs (x itself is the caller's) and the output.
  EXPECT_LE(ckpt.after_forward, (kLayers + 1) * kActivation);
  EXPECT_LT(ckpt.peak * 2, plain.peak);
}

}  // namespace
}  // namespace deepspeed
