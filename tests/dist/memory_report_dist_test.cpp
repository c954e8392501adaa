// The memory report per rank for every ZeRO stage / offload combination (docs/offload.md,
// "Memory report"), on 2 Gloo ranks after one optimizer step: where each training tensor lives
// (device, host offload, NVMe) against the formulas below. fp32, Ψ = 3·512·512 parameters (no
// padding on 2 ranks), S = Ψ/2 elements per rank; every weight's shard is a stage-3 sub-group
// of its own and at least 1 MiB with its Adam moments, so NVMe offload swaps all of it.
#include "deepspeed/deepspeed.h"

#include <cstdio>
#include <optional>
#include <string>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "support/multi_rank.h"
#include "support/temp_dir.h"

namespace deepspeed {
namespace {

using testing::run_ranks;

constexpr int64_t kWeight = 512 * 512;
constexpr int64_t kPsi = 3 * kWeight;
constexpr int64_t kS = kPsi / 2;
constexpr int64_t kBufferCount = 3;

struct Net : torch::nn::Module {
  Net() {
    torch::manual_seed(3);
    auto linear = [] { return torch::nn::Linear(torch::nn::LinearOptions(512, 512).bias(false)); };
    layers = register_module("layers", torch::nn::Sequential(linear(), torch::nn::Tanh(), linear(),
                                                             torch::nn::Tanh(), linear()));
  }
  torch::Tensor forward(const torch::Tensor& x) { return layers->forward(x).pow(2).mean(); }
  torch::nn::Sequential layers{nullptr};
};

struct Combo {
  int stage;
  std::string optimizer;  // offload_optimizer.device
  std::string param;      // offload_param.device
};

json config(const Combo& c, const std::string& nvme) {
  json zero = {{"stage", c.stage},
               {"reduce_bucket_size", 300000},
               {"sub_group_size", 100000},
               {"stage3_param_persistence_threshold", 0}};
  if (c.optimizer != "none") {
    zero["offload_optimizer"] = {{"device", c.optimizer}, {"nvme_path", nvme},
                                 {"buffer_count", kBufferCount}};
  }
  if (c.param != "none") {
    zero["offload_param"] = {{"device", c.param}, {"nvme_path", nvme},
                             {"buffer_count", kBufferCount}, {"buffer_size", kWeight / 2},
                             {"max_in_cpu", 0}};
  }
  return {{"train_micro_batch_size_per_gpu", 2},
          {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.01}}}}},
          {"zero_optimization", zero}};
}

void check_combo(const Combo& c, int rank) {
  testing::TempDir nvme("ds_mem_nvme");
  auto model = std::make_shared<Net>();
  auto engine = initialize(model, config(c, nvme.path())).engine;
  torch::manual_seed(rank);
  engine->backward(engine->forward(torch::randn({2, 512})));
  engine->step();
  const MemoryStats m = engine->memory_stats();
  const std::string what = "stage " + std::to_string(c.stage) + ", offload_optimizer " +
                           c.optimizer + ", offload_param " + c.param;
  if (rank == 0) std::printf("%s\n  %s\n", what.c_str(), engine->memory_report().c_str());
  EXPECT_NE(engine->memory_report().find(c.optimizer == "none" && c.param == "none"
                                             ? "offload none)"
                                             : "offload " + std::string(c.optimizer != "none"
                                                                            ? "optimizer "
                                                                            : "param ")),
            std::string::npos)
      << engine->memory_report();

  const bool opt_off = c.optimizer != "none";
  const bool opt_nvme = c.optimizer == "nvme" && c.stage == 3;
  const bool param_nvme = c.param == "nvme";
  // Adam's moments and (stage 3 with any NVMe) the fp32 masters apart from the shards.
  const int64_t owned = c.stage == 3 ? kS : kPsi / 2;  // elements this rank steps
  const int64_t states = opt_nvme ? 0 : 8 * owned;
  const int64_t masters = (c.stage == 3 && param_nvme && !opt_nvme) ? 4 * kS : 0;
  EXPECT_EQ(m.optimizer_state_bytes, states) << what;
  EXPECT_EQ(m.master_param_bytes, masters) << what;
  EXPECT_EQ(m.offloaded_optimizer_bytes, opt_off ? states + masters : 0) << what;
  EXPECT_EQ(m.nvme_optimizer_bytes, opt_nvme ? 12 * kS : 0) << what;
  // Parameters: the whole flat for stages 1/2; this rank's shards for stage 3 (none in memory
  // when they are swapped: nothing is gathered between steps).
  const int64_t params = c.stage < 3 ? 4 * kPsi : (param_nvme ? 0 : 4 * kS);
  EXPECT_EQ(m.param_bytes, params) << what;
  EXPECT_EQ(m.offloaded_param_bytes, c.param == "cpu" ? 4 * kS : 0) << what;
  EXPECT_EQ(m.nvme_param_bytes, param_nvme ? 4 * kS : 0) << what;
  EXPECT_EQ(m.grad_bytes, 4 * owned) << what;
  // Swap buffers: at most buffer_count per swapper, each as large as its largest transfer.
  const int64_t max_buffers = (opt_nvme ? kBufferCount * 12 * kWeight / 2 : 0) +
                              (param_nvme ? kBufferCount * 4 * kWeight / 2 : 0);
  EXPECT_LE(m.swap_buffer_bytes, max_buffers) << what;
  if (opt_nvme || param_nvme) {
    EXPECT_GT(m.swap_buffer_bytes, 0) << what;
  }
  // The split: everything the engine holds is on the device or offloaded to host memory.
  EXPECT_EQ(m.device_bytes() + m.offloaded_optimizer_bytes + m.offloaded_param_bytes,
            m.param_bytes + m.master_param_bytes + m.grad_bytes + m.optimizer_state_bytes +
                m.comm_buffer_bytes)
      << what;
  EXPECT_EQ(m.host_offload_bytes(),
            m.offloaded_optimizer_bytes + m.offloaded_param_bytes + m.swap_buffer_bytes)
      << what;
  char nvme_mb[64];
  std::snprintf(nvme_mb, sizeof(nvme_mb), "nvme %.2f MB",
                (m.nvme_optimizer_bytes + m.nvme_param_bytes) / 1e6);
  EXPECT_NE(engine->memory_report().find(nvme_mb), std::string::npos)
      << what << ": " << engine->memory_report();
}

TEST(MemoryReportDist, EveryStageAndOffloadCombinationOn2Ranks) {
  run_ranks(2, [](int rank, int) {
    const std::vector<Combo> combos = {
        {1, "none", "none"}, {1, "cpu", "none"},  {1, "nvme", "none"},
        {2, "none", "none"}, {2, "cpu", "none"},  {2, "nvme", "none"}, {3, "none", "none"},
        {3, "cpu", "none"},  {3, "nvme", "none"}, {3, "none", "cpu"},  {3, "cpu", "cpu"},
        {3, "none", "nvme"}, {3, "cpu", "nvme"},  {3, "nvme", "nvme"},
    };
    // Stage 0 has no partition to offload (precision_memory_dist_test covers its figures).
    for (const auto& c : combos) check_combo(c, rank);
  });
}

}  // namespace
}  // namespace deepspeed
