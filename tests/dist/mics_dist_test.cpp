// MiCS (zero_optimization.mics_shard_size) on 4 Gloo ranks: the shard and replica groups are
// DeepSpeed's (and the hierarchical gather's inter- and intra-node groups); each rank holds
// 1/S of every weight's gradient; a checkpoint is ZeRO-3's on S ranks, written by the first
// shard group only: it resumes bit for bit, loads into plain ZeRO-3 on S ranks, and plain
// ZeRO-3's loads into MiCS; bad sizes are refused by key. (zero3_dist_test checks that MiCS
// trains to the parameters of one process.)
#include "deepspeed/deepspeed.h"

#include <dirent.h>

#include <cstdlib>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deepspeed/checkpoint.h"
#include "deepspeed/zero3.h"
#include "runtime/zero/stage3_groups.h"
#include "support/multi_rank.h"
#include "support/shared_run_dir.h"
#include "support/tiny_model.h"  // tiny_batch

namespace deepspeed {
namespace {

using testing::in_rank_process;
using testing::run_ranks;
using testing::tiny_batch;
namespace ckpt = checkpoint;

constexpr int64_t kGlobalBatch = 12;
constexpr int64_t kBefore = 3;
constexpr int64_t kAfter = 2;

json config(int world, int64_t mics_shard_size) {
  json z = {{"stage", 3},
            {"reduce_bucket_size", 24},
            {"stage3_param_persistence_threshold", 0},
            {"sub_group_size", 20}};
  if (mics_shard_size > 0) z["mics_shard_size"] = mics_shard_size;
  return {{"train_batch_size", kGlobalBatch},
          {"gradient_accumulation_steps", world == 4 ? 3 : 2},
          {"gradient_clipping", 0.5},
          {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.01}, {"weight_decay", 0.01}}}}},
          {"zero_optimization", z},
          {"steps_per_print", 1000}};
}

// Units: the Sequential's children; 13 outputs so that no shard size divides the weights.
std::shared_ptr<torch::nn::SequentialImpl> mics_model() {
  torch::manual_seed(4321);
  return torch::nn::Sequential(torch::nn::Linear(4, 13), torch::nn::Functional(torch::tanh),
                               torch::nn::Linear(13, 13), torch::nn::Functional(torch::tanh),
                               torch::nn::Linear(13, 2))
      .ptr();
}

using Engine = ModuleEngine<torch::nn::SequentialImpl>;

void train(Engine& engine, int rank, int64_t from, int64_t to) {
  const int64_t gas = engine.gradient_accumulation_steps();
  const int64_t micro = engine.train_micro_batch_size_per_gpu();
  for (int64_t s = from; s < to; ++s) {
    for (int64_t m = 0; m < gas; ++m) {
      auto [x, y] = tiny_batch(s * kGlobalBatch + (rank * gas + m) * micro, micro);
      engine.backward((engine.forward(x) - y).pow(2).mean());
      engine.step();
    }
  }
}

void dump(Engine& engine, const std::string& path) {
  zero::GatheredParameters gathered(engine.module());
  ckpt::save(ckpt::ivalue_from_tensors(ckpt::module_state_dict(engine.module())), path);
}

ckpt::TensorDict read(const std::string& path) {
  return ckpt::tensors_from_ivalue(ckpt::load(path), path);
}

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") out.push_back(name);
    }
    closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

void expect_equal(const ckpt::TensorDict& got, const ckpt::TensorDict& want,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (const auto& item : want) {
    ASSERT_TRUE(got.contains(item.key())) << what << ": " << item.key();
    EXPECT_TRUE(got[item.key()].equal(item.value())) << what << ": " << item.key();
  }
}

TEST(MicsDist, GroupsFollowDeepSpeedsLayout) {
  testing::RunOptions o;
  o.env.push_back({"NDEV_PER_NODE", "2"});
  run_ranks(4, [](int rank, int) {
    DeepSpeedConfig c = load_config(config(4, 2));
    auto g = runtime::make_mics_groups(c, comm::world(), false);
    ASSERT_TRUE(g.has_value());
    const int first = rank - rank % 2;
    EXPECT_EQ(g->shard.ranks(), (std::vector<int>{first, first + 1}));
    EXPECT_EQ(g->replica.ranks(), (std::vector<int>{rank % 2, rank % 2 + 2}));
    EXPECT_FALSE(g->hierarchical());
    // One shard group over two "nodes" of 2 ranks: across nodes {l, l + 2}, within {2n, 2n + 1}.
    DeepSpeedConfig h = load_config(config(4, 4));
    h.zero_optimization.mics_hierarchical_params_gather = true;
    auto hg = runtime::make_mics_groups(h, comm::world(), false);
    ASSERT_TRUE(hg.has_value() && hg->hierarchical());
    EXPECT_EQ(hg->shard.size(), 4);
    EXPECT_EQ(hg->replica.size(), 1);
    EXPECT_EQ(hg->inter_node.ranks(), (std::vector<int>{rank % 2, rank % 2 + 2}));
    EXPECT_EQ(hg->intra_node.ranks(), (std::vector<int>{first, first + 1}));
    // Without MiCS, or below stage 3: no groups.
    EXPECT_FALSE(runtime::make_mics_groups(load_config(config(4, 0)), comm::world(), false));
  }, o);
}

TEST(MicsDist, EachRankHoldsOneShardGroupsShareOfTheGradients) {
  run_ranks(4, [](int, int) {
    auto engine = initialize(mics_model(), config(4, 2)).engine;
    int64_t shard_elements = 0;
    for (const auto& p : engine->module().parameters()) shard_elements += (p.numel() + 1) / 2;
    EXPECT_EQ(engine->memory_stats().grad_bytes, 4 * shard_elements);
  });
}

TEST(MicsDist, CheckpointIsZero3OnTheShardGroup) {
  const std::string dir = testing::new_shared_run_dir("DS_TEST_MICS_DIR");
  const auto body = [](int phase) {
    return [phase](int rank, int world) {
      const std::string d = std::getenv("DS_TEST_MICS_DIR");
      const std::string r = std::to_string(rank);
      const bool mics = world == 4;
      auto engine = initialize(mics_model(), config(world, mics ? 2 : 0)).engine;
      switch (phase) {
        case 0:  // MiCS, uninterrupted
          train(*engine, rank, 0, kBefore + kAfter);
          dump(*engine, d + "/reference" + r + ".pt");
          break;
        case 1:  // MiCS, first half and save
          train(*engine, rank, 0, kBefore);
          engine->save_checkpoint(d + "/mics");
          dump(*engine, d + "/saved" + r + ".pt");
          break;
        case 2:  // MiCS, resumed
          engine->load_checkpoint(d + "/mics");
          EXPECT_EQ(engine->global_steps(), kBefore);
          train(*engine, rank, kBefore, kBefore + kAfter);
          dump(*engine, d + "/resumed" + r + ".pt");
          break;
        case 3:  // plain ZeRO-3 on 2 ranks loads MiCS' checkpoint
          engine->load_checkpoint(d + "/mics");
          dump(*engine, d + "/zero3_loaded" + r + ".pt");
          break;
        case 4:  // plain ZeRO-3 on 2 ranks saves
          train(*engine, rank, 0, kBefore);
          engine->save_checkpoint(d + "/zero3");
          dump(*engine, d + "/zero3_saved" + r + ".pt");
          break;
        case 5:  // MiCS loads it
          engine->load_checkpoint(d + "/zero3");
          dump(*engine, d + "/mics_loaded" + r + ".pt");
          break;
      }
    };
  };
  for (int phase = 0; phase < 6; ++phase) {
    run_ranks(phase == 3 || phase == 4 ? 2 : 4, body(phase));
  }
  if (in_rank_process()) return;
  const auto saved = read(dir + "/saved0.pt");
  for (int r = 0; r < 4; ++r) {
    const std::string rs = std::to_string(r);
    expect_equal(read(dir + "/resumed" + rs + ".pt"), read(dir + "/reference0.pt"),
                 "resumed on rank " + rs);
    expect_equal(read(dir + "/saved" + rs + ".pt"), saved, "replicas agree, rank " + rs);
    expect_equal(read(dir + "/mics_loaded" + rs + ".pt"), read(dir + "/zero3_saved0.pt"),
                 "plain ZeRO-3 into MiCS, rank " + rs);
  }
  for (int r = 0; r < 2; ++r) {
    expect_equal(read(dir + "/zero3_loaded" + std::to_string(r) + ".pt"), saved,
                 "MiCS into plain ZeRO-3, rank " + std::to_string(r));
  }
  // The first shard group's files alone, as ZeRO-3's on 2 ranks.
  std::vector<std::string> zero_files;
  for (const auto& f : files_in(dir + "/mics/global_step3")) {
    if (f.rfind("zero_pp_rank_", 0) == 0) zero_files.push_back(f);
  }
  EXPECT_EQ(zero_files, (std::vector<std::string>{
                            "zero_pp_rank_0_mp_rank_00_model_states.pt",
                            "zero_pp_rank_0_mp_rank_00_optim_states.pt",
                            "zero_pp_rank_1_mp_rank_00_model_states.pt",
                            "zero_pp_rank_1_mp_rank_00_optim_states.pt"}));
  auto full = ckpt::consolidate_zero_checkpoint(dir + "/mics");
  for (const auto& item : saved) {
    ASSERT_TRUE(full.contains(item.key())) << item.key();
    EXPECT_TRUE(full[item.key()].equal(item.value())) << "zero_to_fp32: " << item.key();
  }
}

void expect_config_error(int64_t shard, bool hierarchical, const std::string& key) {
  testing::RunOptions o;
  o.env.push_back({"DS_TEST_MICS", std::to_string(shard) + (hierarchical ? " h" : "")});
  o.env.push_back({"DS_TEST_KEY", key});
  run_ranks(4, [](int, int) {
    const std::string spec = std::getenv("DS_TEST_MICS");
    json cfg = config(4, std::stoll(spec));
    const bool hierarchical = spec.find('h') != std::string::npos;
    cfg["zero_optimization"]["mics_hierarchical_params_gather"] = hierarchical;
    try {
      initialize(mics_model(), cfg);
      ADD_FAILURE() << "expected a ConfigError for " << spec;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(std::getenv("DS_TEST_KEY")), std::string::npos)
          << e.what();
    }
  }, o);
}

TEST(MicsDist, AShardSizeThatDoesNotDivideTheWorldIsAConfigError) {
  expect_config_error(3, false, "zero_optimization.mics_shard_size (3) does not divide");
}

TEST(MicsDist, AHierarchicalGatherInsideOneNodeIsAConfigError) {
  // The launcher's local world is all 4 ranks: one node.
  expect_config_error(4, true, "mics_hierarchical_params_gather needs a shard group that spans");
}

}  // namespace
}  // namespace deepspeed
