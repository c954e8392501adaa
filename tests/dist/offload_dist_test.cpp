// ZeRO-Offload (offload_optimizer.device "cpu") with ZeRO 1 and 2 on 2 Gloo ranks: the same
// parameters after K steps as without offload, bit for bit (both run the CPU-Adam kernel: the
// config's Adam is FusedAdam without offload and DeepSpeedCPUAdam with it, one kernel here);
// DeepSpeed's zero_force_ds_cpu_optimizer rule for client optimizers; the memory report's
// host-held optimizer bytes; and the offload keys this build refuses, by name.
#include "deepspeed/deepspeed.h"
#include "deepspeed/optimizers.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <optional>

#include "deepspeed/aio.h"
#include "deepspeed/zero3.h"
#include "runtime/zero/zero_optimizer.h"
#include "support/expect_throw.h"
#include "support/multi_rank.h"
#include "support/odd_sized_net.h"
#include "support/temp_dir.h"

namespace deepspeed {
namespace {

using testing::run_ranks;

constexpr int kSteps = 4;
constexpr int kGas = 2;

using Net = testing::OddSizedNet;

// The training setup every case shares, around its zero_optimization section.
json with_zero(json zero, const std::string& dtype) {
  json cfg = {{"train_micro_batch_size_per_gpu", 2},
              {"gradient_accumulation_steps", kGas},
              {"gradient_clipping", 0.5},
              {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.01}, {"weight_decay", 0.1}}}}},
              {"zero_optimization", std::move(zero)}};
  if (dtype == "bf16") cfg["bf16"] = {{"enabled", true}};
  return cfg;
}

json config(int stage, bool offload, const std::string& dtype) {
  json zero = {{"stage", stage}, {"reduce_bucket_size", 40}};
  if (offload) zero["offload_optimizer"] = {{"device", "cpu"}, {"pin_memory", true}};
  return with_zero(std::move(zero), dtype);
}

// Trains on this rank's slice of a fixed data set; returns the parameters (as fp32) and the
// memory figures after the last step.
std::pair<std::vector<at::Tensor>, MemoryStats> train(int rank, const json& cfg) {
  auto model = std::make_shared<Net>();
  auto engine = initialize(model, cfg).engine;
  torch::manual_seed(1000 + rank);
  for (int s = 0; s < kSteps * kGas; ++s) {
    engine->backward(engine->forward(torch::randn({2, 7}).to(model->fc1->weight.scalar_type())));
    engine->step();
  }
  std::vector<at::Tensor> out;
  for (auto& p : model->parameters()) out.push_back(p.detach().to(torch::kFloat).clone());
  return {out, engine->memory_stats()};
}

// One rank's body: with and without offload, then compare (template arguments, not environment
// variables, carry the case into the rank processes).
template <int kStage, bool kBf16>
void offload_matches_on_rank(int rank, int) {
  const std::string dtype = kBf16 ? "bf16" : "fp32";
  auto [plain, plain_mem] = train(rank, config(kStage, false, dtype));
  auto [offloaded, mem] = train(rank, config(kStage, true, dtype));
  ASSERT_EQ(plain.size(), offloaded.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_TRUE(torch::equal(plain[i], offloaded[i]))
        << "stage " << kStage << " " << dtype << ", tensor " << i << ": max difference "
        << (plain[i] - offloaded[i]).abs().max().item<double>();
  }
  // The report shows the optimizer's host-held bytes: Adam's two moments of the owned fp32
  // partition, plus the fp32 master copy when the model trains in bf16.
  EXPECT_EQ(plain_mem.offloaded_optimizer_bytes, 0);
  EXPECT_GT(mem.optimizer_state_bytes, 0);
  EXPECT_EQ(mem.offloaded_optimizer_bytes, mem.optimizer_state_bytes + mem.master_param_bytes);
  if (kBf16) {
    EXPECT_GT(mem.master_param_bytes, 0);
  }
}

TEST(OffloadDist, CpuOffloadStage1MatchesNoOffloadOn2Ranks) {
  run_ranks(2, offload_matches_on_rank<1, false>);
}
TEST(OffloadDist, CpuOffloadStage2MatchesNoOffloadOn2Ranks) {
  run_ranks(2, offload_matches_on_rank<2, false>);
}
TEST(OffloadDist, CpuOffloadStage3MatchesNoOffloadOn2Ranks) {
  run_ranks(2, offload_matches_on_rank<3, false>);
}
TEST(OffloadDist, CpuOffloadStage2Bf16MatchesNoOffloadOn2Ranks) {
  run_ranks(2, offload_matches_on_rank<2, true>);
}

// The offload path of a model on a GPU runs on CPU with DS_TEST_OFFLOAD_HOST_BUFFERS_ON_CPU:
// stages 1/2 keep separate host masters and gradients, each reduced range copied as its bucket
// completes and the clip scale applied on the host; stage 3 copies reduced buckets into zeroed
// gradient shards and, in later micro-steps, adds them to the shards' sums on the "device". Bit
// for bit the same as without offload, and the copies start during backward, not at the step.
template <int kStage, bool kBf16>
void host_buffers_match_on_rank(int rank, int) {
  const std::string dtype = kBf16 ? "bf16" : "fp32";
  auto [plain, plain_mem] = train(rank, config(kStage, false, dtype));
  auto model = std::make_shared<Net>();
  auto engine = initialize(model, config(kStage, true, dtype)).engine;
  torch::manual_seed(1000 + rank);
  for (int s = 0; s < kSteps * kGas; ++s) {
    engine->backward(engine->forward(torch::randn({2, 7}).to(model->fc1->weight.scalar_type())));
    // Stages 1/2 copy each owned range of a bucket on the accumulation boundary; stage 3 sends
    // each bucket in every backward (copied into zeroed shards, later added on the device).
    const bool copies = kStage == 3 || engine->is_gradient_accumulation_boundary();
    if (copies) {
      EXPECT_GT(engine->reduction_stats().host_copies_in_backward, 0) << "micro-step " << s;
    } else {
      EXPECT_EQ(engine->reduction_stats().host_copies_in_backward, 0) << "micro-step " << s;
    }
    engine->step();
  }
  std::vector<at::Tensor> offloaded;
  for (auto& p : model->parameters()) offloaded.push_back(p.detach().to(torch::kFloat));
  ASSERT_EQ(plain.size(), offloaded.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_TRUE(torch::equal(plain[i], offloaded[i]))
        << "stage " << kStage << " " << dtype << ", tensor " << i << ": max difference "
        << (plain[i] - offloaded[i]).abs().max().item<double>();
  }
}

testing::RunOptions host_buffers_on_cpu() {
  testing::RunOptions options;
  options.env = {{"DS_TEST_OFFLOAD_HOST_BUFFERS_ON_CPU", "1"}};
  return options;
}

TEST(OffloadDist, HostBuffersStage1MatchNoOffloadOn2Ranks) {
  run_ranks(2, host_buffers_match_on_rank<1, false>, host_buffers_on_cpu());
}
TEST(OffloadDist, HostBuffersStage2MatchNoOffloadOn2Ranks) {
  run_ranks(2, host_buffers_match_on_rank<2, false>, host_buffers_on_cpu());
}
TEST(OffloadDist, HostBuffersStage2Bf16MatchNoOffloadOn2Ranks) {
  run_ranks(2, host_buffers_match_on_rank<2, true>, host_buffers_on_cpu());
}
TEST(OffloadDist, HostBuffersStage3MatchNoOffloadOn2Ranks) {
  run_ranks(2, host_buffers_match_on_rank<3, false>, host_buffers_on_cpu());
}
TEST(OffloadDist, HostBuffersStage3Bf16MatchNoOffloadOn2Ranks) {
  run_ranks(2, host_buffers_match_on_rank<3, true>, host_buffers_on_cpu());
}

// Matches DeepSpeed's _configure_optimizer: with offload, a client optimizer other than
// DeepSpeedCPUAdam/CPULion is refused unless zero_force_ds_cpu_optimizer is false; then it
// trains like the same optimizer without offload.
TEST(OffloadDist, ClientOptimizerFollowsZeroForceDsCpuOptimizer) {
  run_ranks(2, [](int rank, int) {
    auto run = [&](bool offload, bool force) {
      json cfg = config(2, offload, "fp32");
      cfg.erase("optimizer");
      cfg["zero_force_ds_cpu_optimizer"] = force;
      auto model = std::make_shared<Net>();
      auto opt = std::make_unique<torch::optim::AdamW>(model->parameters(),
                                                      torch::optim::AdamWOptions(0.01));
      auto engine = initialize(model, cfg, std::move(opt)).engine;
      torch::manual_seed(7 + rank);
      for (int s = 0; s < kGas * 2; ++s) {
        engine->backward(engine->forward(torch::randn({2, 7})));
        engine->step();
      }
      std::vector<at::Tensor> out;
      for (auto& p : model->parameters()) out.push_back(p.detach().clone());
      return out;
    };
    EXPECT_THROW_WITH(run(true, true), ConfigError,
                      "You are using ZeRO-Offload with a client provided optimizer "
                      "(torch::optim::AdamW)");
    EXPECT_THROW_WITH(run(true, true), ConfigError, "\"zero_force_ds_cpu_optimizer\": false");
    auto plain = run(false, true);
    auto offloaded = run(true, false);
    for (size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(torch::equal(plain[i], offloaded[i]));
    // deepspeed::optim::Adam is DeepSpeedCPUAdam: accepted as it is.
    json cfg = config(2, true, "fp32");
    cfg.erase("optimizer");
    auto model = std::make_shared<Net>();
    auto adam = std::make_unique<optim::Adam>(model->parameters());
    EXPECT_NO_THROW(initialize(model, cfg, std::move(adam)));
  });
}

// ZeRO-Infinity's optimizer side: stage 3 with offload_optimizer.device "nvme". Sub-groups must
// be at least 1 MiB to be swapped (smaller ones stay in memory, as in DeepSpeed), so this model
// has three 512x512 layers: with sub_group_size 100000 each weight's shard (131072 elements per
// rank on 2 ranks) is a sub-group of its own, 1.5 MiB of master + Adam moments.
struct WideNet : torch::nn::Module {
  WideNet() {
    torch::manual_seed(5);
    layers = register_module(
        "layers", torch::nn::Sequential(torch::nn::Linear(512, 512), torch::nn::Tanh(),
                                        torch::nn::Linear(512, 512), torch::nn::Tanh(),
                                        torch::nn::Linear(512, 512)));
  }
  torch::Tensor forward(const torch::Tensor& x) { return layers->forward(x).pow(2).mean(); }
  torch::nn::Sequential layers{nullptr};
};

// One ZeRO-3 unit holding two 512x512 weights.
struct PairImpl : torch::nn::Module {
  PairImpl() {
    a = register_module("a", torch::nn::Linear(512, 512));
    b = register_module("b", torch::nn::Linear(512, 512));
  }
  torch::Tensor forward(const torch::Tensor& x) { return b(a(x)); }
  torch::nn::Linear a{nullptr}, b{nullptr};
};
struct PairNet : torch::nn::Module {
  PairNet() { pair = register_module("pair", std::make_shared<zero::Unit<PairImpl>>()); }
  torch::Tensor forward(const torch::Tensor& x) { return pair->forward(x).pow(2).mean(); }
  std::shared_ptr<zero::Unit<PairImpl>> pair;
};

json nvme_config(const std::string& offload, const std::string& nvme_path,
                 const std::string& dtype, const std::string& offload_param = "none") {
  json zero = {{"stage", 3}, {"sub_group_size", 100000}, {"reduce_bucket_size", 300000}};
  if (offload_param != "none") {
    zero["offload_param"] = {{"device", offload_param}, {"nvme_path", nvme_path},
                             {"max_in_cpu", 0}};
  }
  if (offload == "nvme") {
    zero["offload_optimizer"] = {{"device", "nvme"}, {"nvme_path", nvme_path},
                                 {"buffer_count", 2}, {"pipeline_read", true},
                                 {"pipeline_write", true}};
  }
  return with_zero(std::move(zero), dtype);
}

template <typename E>
void train_wide(E& engine, int rank, int steps, int seed) {
  torch::manual_seed(seed + rank);
  auto dtype = engine.module().parameters()[0].scalar_type();
  for (int s = 0; s < steps * kGas; ++s) {
    engine.backward(engine.forward(torch::randn({2, 512}).to(dtype)));
    engine.step();
  }
}

std::vector<at::Tensor> wide_params(const std::shared_ptr<WideNet>& model) {
  std::vector<at::Tensor> out;
  for (auto& p : model->parameters()) out.push_back(p.detach().to(torch::kFloat).clone());
  return out;
}

// While the engine lives (offload_param "nvme" leaves the model partitioned when it goes).
std::vector<at::Tensor> gathered_params(const std::shared_ptr<WideNet>& model) {
  zero::GatheredParameters gathered(*model);
  return wide_params(model);
}

template <bool kBf16>
void nvme_matches_on_rank(int rank, int) {
  const std::string dtype = kBf16 ? "bf16" : "fp32";
  testing::TempDir nvme("ds_nvme");
  std::vector<at::Tensor> plain, swapped;
  {
    auto model = std::make_shared<WideNet>();
    auto engine = initialize(model, nvme_config("none", "", dtype)).engine;
    train_wide(*engine, rank, kSteps, 100);
    engine.reset();  // stage 3 leaves the model whole when the engine goes
    plain = wide_params(model);
  }
  {
    auto model = std::make_shared<WideNet>();
    auto engine = initialize(model, nvme_config("nvme", nvme.path(), dtype)).engine;
    const std::string folder = nvme.path() + "/zero_stage_3/optimizer/rank" + std::to_string(rank);
    // Swapped out from the start: masters and both moments of the three weight sub-groups.
    EXPECT_TRUE(std::filesystem::exists(folder + "/0_exp_avg_sq.tensor.swp"));
    train_wide(*engine, rank, kSteps, 100);
    MemoryStats mem = engine->memory_stats();
    // Between steps every swappable sub-group is on disk: only the small bias sub-groups
    // (kept in memory) count as resident optimizer state.
    EXPECT_GE(mem.nvme_optimizer_bytes, 3 * 12 * 131072);
    EXPECT_LT(mem.optimizer_state_bytes, 8 * 131072);
    EXPECT_GT(mem.swap_buffer_bytes, 0);
    EXPECT_LE(mem.swap_buffer_bytes, 2 * (12 * 131072 + 3 * 4096));  // buffer_count 2
    EXPECT_NE(engine->memory_report().find("nvme"), std::string::npos);
    engine.reset();
    swapped = wide_params(model);
  }
  ASSERT_EQ(plain.size(), swapped.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_TRUE(torch::equal(plain[i], swapped[i]))
        << dtype << ", tensor " << i << ": max difference "
        << (plain[i] - swapped[i]).abs().max().item<double>();
  }
  // The swapper removes its files with the engine.
  EXPECT_FALSE(std::filesystem::exists(nvme.path() + "/zero_stage_3/optimizer/rank" +
                                       std::to_string(rank) + "/0_fp32.tensor.swp"));
}

// offload_param "cpu" and "nvme" (alone and with the optimizer on NVMe): the same parameters as
// without offload, bit for bit, over steps that record the trace and then read ahead along it.
// GatheredParameters brings every swapped shard back into the model while the engine lives.
void param_offload_matches_on_rank(int rank, int) {
  testing::TempDir nvme("ds_nvme_param");
  std::vector<at::Tensor> plain;
  {
    auto model = std::make_shared<WideNet>();
    auto engine = initialize(model, nvme_config("none", "", "fp32")).engine;
    train_wide(*engine, rank, kSteps, 200);
    engine.reset();
    plain = wide_params(model);
  }
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"none", "cpu"}, {"none", "nvme"}, {"nvme", "nvme"}};
  for (const auto& [optimizer, param] : cases) {
    auto model = std::make_shared<WideNet>();
    auto engine =
        initialize(model, nvme_config(optimizer, nvme.path(), "fp32", param)).engine;
    const std::string folder =
        nvme.path() + "/zero_stage_3/float32params/rank" + std::to_string(rank);
    EXPECT_EQ(std::filesystem::exists(folder + "/0_param.tensor.swp"), param == "nvme");
    train_wide(*engine, rank, kSteps, 200);
    if (param == "nvme") {
      // Between steps the weights' shards are on disk only; the biases are persistent, their
      // shards (256 elements per rank) stay in host memory.
      EXPECT_EQ(engine->memory_stats().nvme_param_bytes, 3 * 4 * 131072);
      EXPECT_EQ(engine->memory_stats().offloaded_param_bytes, 3 * 4 * 256);
    }
    auto got = gathered_params(model);
    engine.reset();
    if (param == "nvme") {
      // The engine's end leaves the swapped parameters empty, as DeepSpeed's partitioned ones.
      EXPECT_EQ(model->layers[0]->as<torch::nn::Linear>()->weight.numel(), 0);
    }
    for (size_t i = 0; i < plain.size(); ++i) {
      EXPECT_TRUE(torch::equal(plain[i], got[i]))
          << "offload_optimizer " << optimizer << ", offload_param " << param << ", tensor " << i
          << ": max difference " << (plain[i] - got[i]).abs().max().item<double>();
    }
  }
}

TEST(OffloadDist, ParamOffloadStage3MatchesNoOffloadOn2Ranks) {
  run_ranks(2, param_offload_matches_on_rank);
}

TEST(OffloadDist, NvmeOffloadStage3MatchesNoOffloadOn2Ranks) {
  run_ranks(2, nvme_matches_on_rank<false>);
}
TEST(OffloadDist, NvmeOffloadStage3Bf16MatchesNoOffloadOn2Ranks) {
  run_ranks(2, nvme_matches_on_rank<true>);
}

// offload_optimizer.ratio 0.5 (Twin-Flow): on 2 ranks the sub-groups are [fc0.w 131072],
// [fc0.b + fc2.w 131328], [fc2.b + fc4.w 131328], [fc4.b 256] elements; only the first stays
// under half of the 393984 when added, so only it is offloaded (and, with nvme, swapped). The
// numbers are those of no offload.
TEST(OffloadDist, RatioOffloadsTheLeadingSubGroupsOnly) {
  run_ranks(2, [](int rank, int) {
    testing::TempDir nvme("ds_ratio");
    std::vector<at::Tensor> plain;
    {
      auto model = std::make_shared<WideNet>();
      auto engine = initialize(model, nvme_config("none", "", "fp32")).engine;
      train_wide(*engine, rank, 2, 300);
      engine.reset();
      plain = wide_params(model);
    }
    for (const std::string device : {"cpu", "nvme"}) {
      json cfg = nvme_config("nvme", nvme.path(), "fp32");
      cfg["zero_optimization"]["offload_optimizer"]["device"] = device;
      cfg["zero_optimization"]["offload_optimizer"]["ratio"] = 0.5;
      auto model = std::make_shared<WideNet>();
      auto engine = initialize(model, cfg).engine;
      train_wide(*engine, rank, 2, 300);
      const MemoryStats m = engine->memory_stats();
      const int64_t device_elements = 131328 + 131328 + 256;
      if (device == "cpu") {
        EXPECT_EQ(m.optimizer_state_bytes, 8 * (131072 + device_elements));
        EXPECT_EQ(m.offloaded_optimizer_bytes, 8 * 131072);
        EXPECT_EQ(m.nvme_optimizer_bytes, 0);
      } else {
        // The swapped sub-group: master and moments on disk; the others' state in memory.
        EXPECT_EQ(m.nvme_optimizer_bytes, 12 * 131072);
        EXPECT_EQ(m.optimizer_state_bytes, 8 * device_elements);
        EXPECT_EQ(m.offloaded_optimizer_bytes, 0);
      }
      engine.reset();
      auto got = wide_params(model);
      for (size_t i = 0; i < plain.size(); ++i) {
        EXPECT_TRUE(torch::equal(plain[i], got[i])) << device << ", tensor " << i;
      }
    }
  });
}

// A checkpoint of a swapped engine holds the swapped state, and loading one (from a run with or
// without NVMe) puts the loaded state into the swap files: the continuation matches an
// uninterrupted run exactly.
TEST(OffloadDist, NvmeOffloadStage3CheckpointResumesExactly) {
  // The ranks share the parent's checkpoint folder (named to them through the environment).
  std::optional<testing::TempDir> ckpt;
  testing::RunOptions options;
  if (!testing::in_rank_process()) {
    ckpt.emplace("ds_ckpt");
    options.env = {{"DS_TEST_NVME_CKPT_DIR", ckpt->path()}};
  }
  run_ranks(2, [](int rank, int) {
    testing::TempDir nvme("ds_nvme");
    const std::string dir = std::getenv("DS_TEST_NVME_CKPT_DIR");
    std::vector<at::Tensor> uninterrupted;
    {
      auto model = std::make_shared<WideNet>();
      auto engine = initialize(model, nvme_config("nvme", nvme.path(), "fp32")).engine;
      train_wide(*engine, rank, 2, 10);
      engine->save_checkpoint(dir, "mid");
      train_wide(*engine, rank, 2, 20);
      engine.reset();
      uninterrupted = wide_params(model);
    }
    for (const std::string offload : {"nvme", "none", "nvme+param"}) {
      auto model = std::make_shared<WideNet>();
      const bool param = offload == "nvme+param";
      auto engine = initialize(model, nvme_config(param ? "nvme" : offload, nvme.path(), "fp32",
                                                  param ? "nvme" : "none"))
                        .engine;
      engine->load_checkpoint(dir, "mid");
      train_wide(*engine, rank, 2, 20);
      auto resumed = gathered_params(model);
      engine.reset();
      for (size_t i = 0; i < resumed.size(); ++i) {
        EXPECT_TRUE(torch::equal(uninterrupted[i], resumed[i]))
            << "resumed with offload " << offload << ", tensor " << i;
      }
    }
  }, options);
}

// A swap folder that cannot be created, and a swap file gone bad between steps: errors that
// name the path.
TEST(OffloadConfig, NvmeSwapFileErrorsNameTheFile) {
  testing::TempDir tmp("ds_nvme");
  testing::write_text_file(tmp.file("a_file"), "not a folder");
  EXPECT_THROW_WITH(initialize(std::make_shared<WideNet>(),
                               nvme_config("nvme", tmp.file("a_file"), "fp32")),
                    aio::AioError, "cannot create the optimizer swap folder " + tmp.file("a_file"));

  auto model = std::make_shared<WideNet>();
  json cfg = nvme_config("nvme", tmp.path(), "fp32");
  cfg["gradient_accumulation_steps"] = 1;
  // Neither read-ahead nor write-behind: a write still in flight when step() returns would
  // land after the truncation below and restore the file's size.
  cfg["zero_optimization"]["offload_optimizer"]["pipeline_read"] = false;
  cfg["zero_optimization"]["offload_optimizer"]["pipeline_write"] = false;
  auto engine = initialize(model, cfg).engine;
  train_wide(*engine, 0, 1, 3);
  const std::string victim = tmp.path() + "/zero_stage_3/optimizer/rank0/1_exp_avg.tensor.swp";
  ASSERT_TRUE(std::filesystem::exists(victim));
  std::filesystem::resize_file(victim, 4096);
  engine->backward(engine->forward(torch::randn({2, 512})));
  EXPECT_THROW_WITH(engine->step(), aio::AioError, victim);
}

// The parameter side: an uncreatable folder, a swap file gone bad before the forward that
// reads it, and buffers too small for a shard or for a unit.
TEST(OffloadConfig, NvmeParamSwapErrorsNameTheFileOrKey) {
  testing::TempDir tmp("ds_nvme_param");
  testing::write_text_file(tmp.file("a_file"), "not a folder");
  EXPECT_THROW_WITH(initialize(std::make_shared<WideNet>(),
                               nvme_config("none", tmp.file("a_file"), "fp32", "nvme")),
                    aio::AioError, "cannot create the parameter swap folder " + tmp.file("a_file"));

  json small = nvme_config("none", tmp.path(), "fp32", "nvme");
  small["zero_optimization"]["offload_param"]["buffer_size"] = 1000;
  EXPECT_THROW_WITH(initialize(std::make_shared<WideNet>(), small), ConfigError,
                    "zero_optimization.offload_param.buffer_size (1000 elements) is smaller than "
                    "a parameter shard of 262144 elements");

  // One unit with two weights needs two shards at once: one buffer of one shard is too few.
  {
    json few = nvme_config("none", tmp.path(), "fp32", "nvme");
    few["zero_optimization"]["offload_param"]["buffer_count"] = 1;
    few["zero_optimization"]["offload_param"]["buffer_size"] = 262144;
    auto model = std::make_shared<PairNet>();
    auto engine = initialize(model, few).engine;
    EXPECT_THROW_WITH(engine->forward(torch::randn({2, 512})), ConfigError,
                      "zero_optimization.offload_param.buffer_count (1) buffers of 262144 "
                      "elements (offload_param.buffer_size 262144) cannot hold the 2 parameter "
                      "shards");
  }

  auto model = std::make_shared<WideNet>();
  auto engine = initialize(model, nvme_config("none", tmp.path(), "fp32", "nvme")).engine;
  const std::string victim = tmp.path() + "/zero_stage_3/float32params/rank0/1_param.tensor.swp";
  ASSERT_TRUE(std::filesystem::exists(victim));
  std::filesystem::remove(victim);
  EXPECT_THROW_WITH(engine->forward(torch::randn({2, 512})), aio::AioError, victim);
}

// Single process: what this build refuses, by key.
TEST(OffloadConfig, RefusesWhatItDoesNotImplementByName) {
  auto init = [](json zero) {
    json cfg = {{"train_batch_size", 2},
                {"optimizer", {{"type", "AdamW"}}},
                {"zero_optimization", zero}};
    return initialize(std::make_shared<Net>(), cfg);
  };
  EXPECT_THROW_WITH(init({{"stage", 0}, {"offload_optimizer", {{"device", "cpu"}}}}),
                    ConfigError, "offload_optimizer needs zero_optimization.stage 1, 2 or 3");
  // Matches DeepSpeed: stages 1/2 take "nvme" as host-memory offload; the config says so.
  {
    json zero = {{"stage", 2}, {"offload_optimizer", {{"device", "nvme"}, {"nvme_path", "/tmp"}}}};
    auto cfg = DeepSpeedConfig::from_json(
        {{"train_batch_size", 2}, {"optimizer", {{"type", "AdamW"}}}, {"zero_optimization", zero}},
        1, "ds_config.json");
    ASSERT_EQ(cfg.warnings.size(), 1u);
    EXPECT_NE(cfg.warnings[0].find("offload_optimizer.device \"nvme\" with ZeRO stage 2: the "
                                   "optimizer state stays in host memory"),
              std::string::npos)
        << cfg.warnings[0];
    EXPECT_NO_THROW(init(zero));
  }
  EXPECT_THROW_WITH(init({{"stage", 1}, {"offload_optimizer", {{"device", "cpu"}, {"ratio", 0.5}}}}),
                    NotSupportedError, "offload_optimizer.ratio < 1 with ZeRO stage 1");
  EXPECT_THROW_WITH(
      init({{"stage", 2}, {"offload_optimizer", {{"device", "cpu"}, {"super_offload", true}}}}),
      NotSupportedError, "offload_optimizer.super_offload");
  // offload_param with stages 0-2: ignored with a warning by name, as DeepSpeed ignores it.
  {
    json zero = {{"stage", 2}, {"offload_param", {{"device", "cpu"}}}};
    auto cfg = DeepSpeedConfig::from_json(
        {{"train_batch_size", 2}, {"optimizer", {{"type", "AdamW"}}}, {"zero_optimization", zero}},
        1, "ds_config.json");
    ASSERT_EQ(cfg.warnings.size(), 1u);
    EXPECT_NE(cfg.warnings[0].find("offload_param.device \"cpu\" is ignored with ZeRO stage 2"),
              std::string::npos)
        << cfg.warnings[0];
  }
  // Accepted: the keys that mean nothing without a GPU or NVMe (docs/offload.md).
  EXPECT_NO_THROW(init({{"stage", 2},
                        {"offload_optimizer",
                         {{"device", "cpu"}, {"pin_memory", false}, {"buffer_count", 2},
                          {"fast_init", true}, {"pipeline_read", true}}}}));
  EXPECT_NO_THROW(init({{"stage", 1}, {"cpu_offload", true}}));  // deprecated spelling
}

}  // namespace
}  // namespace deepspeed
