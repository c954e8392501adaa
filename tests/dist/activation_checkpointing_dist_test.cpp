// partition_activations on 2 ranks of one model-parallel group (TopologyMpu over
// PipeModelDataParallelTopology(1, 2, 1)): each rank keeps half of every checkpointed input and
// the backward all-gathers it; the gradients equal the ones the same rank computes without
// checkpointing, with dropout on, alone and with cpu_checkpointing / contiguous slots.
#include "deepspeed/checkpointing.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deepspeed/mpu.h"
#include "support/dropout_tower.h"
#include "support/expect_throw.h"
#include "support/multi_rank.h"

namespace deepspeed {
namespace {

using testing::DropoutTower;
using testing::run_ranks;

constexpr int kLayers = 4;
constexpr int64_t kWidth = 16;
// One checkpointed input: [2, 5, 16] fp32.
constexpr int64_t kInputBytes = 2 * 5 * kWidth * 4;

std::vector<torch::Tensor> train_once(bool checkpointed) {
  DropoutTower tower(kLayers, kWidth);  // the same weights on every rank (seeded)
  torch::manual_seed(5);
  auto x = torch::randn({2, 5, kWidth}).set_requires_grad(true);
  torch::manual_seed(11);  // the dropout masks
  auto y = tower.forward(x, checkpointed);
  (y * y).mean().backward();
  auto grads = testing::gradients(tower);
  grads.push_back(x.grad().clone());
  return grads;
}

void expect_equal(const std::vector<torch::Tensor>& want, const std::vector<torch::Tensor>& got,
                  const std::string& what) {
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_TRUE(got[i].defined()) << what << ": tensor " << i;
    EXPECT_TRUE(torch::equal(want[i], got[i]))
        << what << ": tensor " << i << " max |diff| "
        << (want[i] - got[i]).abs().max().item<double>();
  }
}

TEST(ActivationCheckpointingDist, PartitionedInputsGiveTheUncheckpointedGradients) {
  run_ranks(2, [](int, int) {
    TopologyMpu mpu(PipeModelDataParallelTopology(1, /*mp=*/2, /*dp=*/1));
    ASSERT_EQ(mpu.get_model_parallel_world_size(), 2);
    const auto reference = train_once(false);

    for (int mode = 0; mode < 3; ++mode) {
      checkpointing::ConfigureOverrides o;
      o.partition_activations = true;
      if (mode == 1) o.checkpoint_in_cpu = true;
      if (mode == 2) {
        o.contiguous_checkpointing = true;
        o.num_checkpoints = kLayers;
      }
      const std::string what = mode == 0 ? "partitioned"
                               : mode == 1 ? "partitioned + cpu_checkpointing"
                                           : "partitioned + contiguous_memory_optimization";
      checkpointing::configure(&mpu, nullptr, o);
      checkpointing::reset_stats();
      expect_equal(reference, train_once(true), what);
      const auto s = checkpointing::stats();
      EXPECT_EQ(s.partitioned_inputs, kLayers) << what;
      EXPECT_EQ(s.gathered_inputs, kLayers) << what;
      // Half of each block's input on this rank.
      EXPECT_EQ(s.peak_saved_bytes, kLayers * kInputBytes / 2) << what;
      EXPECT_EQ(s.saved_bytes, 0) << what;
      EXPECT_EQ(s.host_copies, mode == 1 ? kLayers : 0) << what;
      EXPECT_EQ(s.contiguous_copies, mode == 2 ? kLayers : 0) << what;
    }
    // Without partitioning every rank keeps the whole input.
    checkpointing::configure(&mpu);
    checkpointing::reset_stats();
    expect_equal(reference, train_once(true), "not partitioned");
    EXPECT_EQ(checkpointing::stats().peak_saved_bytes, kLayers * kInputBytes);
    EXPECT_EQ(checkpointing::stats().gathered_inputs, 0);
  });
}

TEST(ActivationCheckpointingDist, InputThatDoesNotDivideByTheModelParallelSizeIsRefused) {
  run_ranks(2, [](int, int) {
    TopologyMpu mpu(PipeModelDataParallelTopology(1, /*mp=*/2, /*dp=*/1));
    checkpointing::ConfigureOverrides o;
    o.partition_activations = true;
    checkpointing::configure(&mpu, nullptr, o);
    auto x = torch::randn({3, 5}).set_requires_grad(true);
    EXPECT_THROW_WITH(
        checkpointing::checkpoint([](const at::Tensor& t) { return t * 2; }, x), UsageError,
        "partition_activations: checkpointed input 0 has 15 elements, which does not divide by "
        "the model-parallel size 2 (group model(2)");
  });
}

}  // namespace
}  // namespace deepspeed
