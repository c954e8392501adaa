// checkpoint.use_node_local_storage and checkpoint.parallel_write.pipeline_stage on Gloo ranks
// that play several nodes (LOCAL_RANK / LOCAL_WORLD_SIZE as a launcher sets them), each node
// saving into a folder of its own: every folder holds what its node's ranks need (`latest`, the
// model states of every model-parallel rank, its ranks' optimizer files, the experts of MoE
// layers) and resumes them bit for bit as an uninterrupted run (ZeRO-2, ZeRO-3, MiCS with a
// shard group per node, MoE at ZeRO-0, pipelines at ZeRO-1); a pipeline's layer files split
// among the replicas (parallel_write) resume the same. Note [Node-local checkpoint storage].
#include <sys/stat.h>

#include <cstdlib>
#include <string>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deepspeed/checkpoint.h"
#include "deepspeed/comm.h"
#include "deepspeed/deepspeed.h"
#include "deepspeed/moe.h"
#include "deepspeed/pipe.h"
#include "support/moe_net.h"
#include "support/multi_rank.h"
#include "support/shared_run_dir.h"
#include "support/tiny_model.h"  // tiny_batch
#include "support/tiny_pipe_model.h"

namespace deepspeed {
namespace {

namespace ckpt = checkpoint;
using testing::run_ranks;
using testing::tiny_batch;

constexpr int kWorld = 4;
constexpr int kSteps = 4;  // the uninterrupted run; the save is after half of them

std::string new_shared_dir() { return testing::new_shared_run_dir("DS_NODE_LOCAL_OUT"); }
std::string shared_dir() { return std::getenv("DS_NODE_LOCAL_OUT"); }

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// This rank on nodes of `per_node` ranks (contiguous global ranks, as launchers assign them).
int init_on_nodes(int rank, int per_node) {
  ::setenv("LOCAL_RANK", std::to_string(rank % per_node).c_str(), 1);
  ::setenv("LOCAL_WORLD_SIZE", std::to_string(per_node).c_str(), 1);
  comm::init_distributed();
  return rank / per_node;
}

// Node k's own folder.
std::string node_dir(int node) { return shared_dir() + "/node" + std::to_string(node); }

void dump(const torch::nn::Module& module, const std::string& name) {
  ckpt::save(ckpt::ivalue_from_tensors(ckpt::module_state_dict(module)),
             shared_dir() + "/" + name + std::to_string(comm::get_rank()) + ".pt");
}

void expect_resumed_equals_continuous(int world) {
  for (int r = 0; r < world; ++r) {
    const std::string want_path = shared_dir() + "/continuous" + std::to_string(r) + ".pt";
    const std::string got_path = shared_dir() + "/resumed" + std::to_string(r) + ".pt";
    const auto want = ckpt::tensors_from_ivalue(ckpt::load(want_path), want_path);
    const auto got = ckpt::tensors_from_ivalue(ckpt::load(got_path), got_path);
    ASSERT_EQ(want.size(), got.size());
    for (const auto& item : want) {
      EXPECT_TRUE(got[item.key()].equal(item.value())) << "rank " << r << " " << item.key();
    }
  }
}

// --- ZeRO: two nodes of two data-parallel ranks ----------------------------------------------

struct NetImpl : torch::nn::Module {
  NetImpl() {
    torch::manual_seed(77);
    fc1 = register_module("fc1", torch::nn::Linear(4, 8));
    fc2 = register_module("fc2", torch::nn::Linear(8, 2));
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& y) {
    return (fc2(torch::tanh(fc1(x))) - y).pow(2).mean();
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

constexpr int64_t kMicro = 2;

struct ZeroCase {
  int stage;
  int mics_shard_size = -1;  // MiCS: shard groups of this many ranks, one per node here
};

std::shared_ptr<ModuleEngine<NetImpl>> make_engine(const ZeroCase& c) {
  json cfg = {{"train_batch_size", kMicro * kWorld},
              {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.01}}}}},
              {"scheduler", {{"type", "WarmupLR"}, {"params", {{"warmup_num_steps", 3}}}}},
              {"zero_optimization", {{"stage", c.stage}, {"mics_shard_size", c.mics_shard_size}}},
              {"checkpoint", {{"use_node_local_storage", true}}},
              {"steps_per_print", 1000}};
  return initialize(std::make_shared<NetImpl>(), cfg).engine;
}

void train(ModuleEngine<NetImpl>& engine, int rank, int64_t from, int64_t to) {
  for (int64_t s = from; s < to; ++s) {
    auto [x, y] = tiny_batch((s * kWorld + rank) * kMicro, kMicro);
    engine.backward(engine.forward(x, y));
    engine.step();
  }
}

class NodeLocalZero : public ::testing::TestWithParam<ZeroCase> {};

TEST_P(NodeLocalZero, EachNodesFolderResumesItsRanksBitForBit) {
  const ZeroCase c = GetParam();
  new_shared_dir();
  testing::RunOptions o;
  o.init_distributed = false;
  run_ranks(kWorld, [&](int rank, int) {
    init_on_nodes(rank, 2);
    auto engine = make_engine(c);
    train(*engine, rank, 0, kSteps);
    dump(engine->module(), "continuous");
  }, o);
  run_ranks(kWorld, [&](int rank, int) {
    const int node = init_on_nodes(rank, 2);
    auto engine = make_engine(c);
    train(*engine, rank, 0, kSteps / 2);
    engine->save_checkpoint(node_dir(node));
  }, o);
  if (!testing::in_rank_process()) {
    for (int node = 0; node < 2; ++node) {
      const std::string tag_dir = node_dir(node) + "/global_step2";
      EXPECT_EQ(ckpt::read_latest(node_dir(node)).value_or(""), "global_step2") << node;
      // File r of the saving run: global rank r's, or under MiCS partition rank r's, whose
      // replica on every node writes it.
      for (int r = 0; r < kWorld; ++r) {
        const bool mine = c.mics_shard_size > 0 ? r < c.mics_shard_size : r / 2 == node;
        const std::string model = c.stage == 3 ? ckpt::zero3_model_states_file_name(r)
                                               : ckpt::model_states_file_name();
        EXPECT_EQ(exists(tag_dir + "/" + model), mine || c.stage != 3) << tag_dir << " " << model;
        const std::string optim = ckpt::zero_optim_states_file_name(r);
        EXPECT_EQ(exists(tag_dir + "/" + optim), mine) << tag_dir << " " << optim;
      }
    }
  }
  run_ranks(kWorld, [&](int rank, int) {
    const int node = init_on_nodes(rank, 2);
    auto engine = make_engine(c);
    torch::manual_seed(1000 + rank);  // the load restores the generator
    ASSERT_TRUE(engine->load_checkpoint(node_dir(node)).load_path.has_value());
    EXPECT_EQ(engine->global_steps(), kSteps / 2);
    train(*engine, rank, kSteps / 2, kSteps);
    dump(engine->module(), "resumed");
  }, o);
  if (!testing::in_rank_process()) expect_resumed_equals_continuous(kWorld);
}

INSTANTIATE_TEST_SUITE_P(Stages, NodeLocalZero,
                         ::testing::Values(ZeroCase{2}, ZeroCase{3}, ZeroCase{3, 2}),
                         [](const auto& info) {
                           return "Stage" + std::to_string(info.param.stage) +
                                  (info.param.mics_shard_size > 0 ? "Mics" : "");
                         });

// --- MoE: ep_size 2 on two nodes of two ranks, each expert on one rank of each node -----------

std::shared_ptr<testing::moe_net::MoENetImpl> moe_model() {
  moe::MoEOptions o;
  o.num_experts = testing::moe_net::kExperts;
  o.ep_size = 2;
  auto model = std::make_shared<testing::moe_net::MoENetImpl>(o, 0.01);
  model->init_experts();
  return model;
}

std::shared_ptr<ModuleEngine<testing::moe_net::MoENetImpl>> make_moe_engine(
    std::shared_ptr<testing::moe_net::MoENetImpl> model) {
  json cfg = {{"train_micro_batch_size_per_gpu", testing::moe_net::kTokensPerRank},
              {"optimizer", {{"type", "Adam"}, {"params", {{"lr", 0.05}}}}},
              {"checkpoint", {{"use_node_local_storage", true}}}};
  return initialize(model, cfg).engine;
}

void train_moe(ModuleEngine<testing::moe_net::MoENetImpl>& engine, int rank, int from, int to) {
  const int64_t n = testing::moe_net::kTokensPerRank;
  for (int s = from; s < to; ++s) {
    auto [x, y] = testing::moe_net::tokens((s * kWorld + rank) * n, n);
    engine.backward(engine.forward(x, y));
    engine.step();
  }
}

// ZeRO-0: the experts' files and the expert-parallel ranks' expp_rank optimizer files are
// written on every node by its first expert-data-parallel replica.
TEST(NodeLocalMoE, EachNodesFolderHoldsItsExpertsAndResumesBitForBit) {
  new_shared_dir();
  testing::RunOptions o;
  o.init_distributed = false;
  run_ranks(kWorld, [&](int rank, int) {
    init_on_nodes(rank, 2);
    auto model = moe_model();
    auto engine = make_moe_engine(model);
    torch::manual_seed(31 + rank);
    train_moe(*engine, rank, 0, kSteps);
    dump(*model, "continuous");
  }, o);
  run_ranks(kWorld, [&](int rank, int) {
    const int node = init_on_nodes(rank, 2);
    auto model = moe_model();
    auto engine = make_moe_engine(model);
    torch::manual_seed(31 + rank);
    train_moe(*engine, rank, 0, kSteps / 2);
    engine->save_checkpoint(node_dir(node));
  }, o);
  if (!testing::in_rank_process()) {
    for (int node = 0; node < 2; ++node) {
      const std::string tag_dir = node_dir(node) + "/global_step2/";
      for (int e = 0; e < testing::moe_net::kExperts; ++e) {
        const std::string f = "layer_0_expert_" + std::to_string(e) + "_mp_rank_00_model_states.pt";
        EXPECT_TRUE(exists(tag_dir + f)) << tag_dir << f;
      }
      for (int ep = 0; ep < 2; ++ep) {
        const std::string f = "expp_rank_" + std::to_string(ep) + "_mp_rank_00_optim_states.pt";
        EXPECT_TRUE(exists(tag_dir + f)) << tag_dir << f;
      }
    }
  }
  run_ranks(kWorld, [&](int rank, int) {
    const int node = init_on_nodes(rank, 2);
    auto model = moe_model();
    auto engine = make_moe_engine(model);
    torch::manual_seed(5000 + rank);  // the load restores the generator (the gate's draws)
    ASSERT_TRUE(engine->load_checkpoint(node_dir(node)).load_path.has_value());
    train_moe(*engine, rank, kSteps / 2, kSteps);
    dump(*model, "resumed");
  }, o);
  if (!testing::in_rank_process()) expect_resumed_equals_continuous(kWorld);
}

// --- Pipelines: 2 stages x 2 data-parallel replicas --------------------------------------------

constexpr int kPipeMicro = 2;
constexpr int kPipeGas = 3;

std::shared_ptr<pipe::PipelineEngine> make_pipe_engine(bool node_local) {
  json cfg = {{"train_batch_size", kPipeMicro * kPipeGas * 2},
              {"train_micro_batch_size_per_gpu", kPipeMicro},
              {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.05}}}}},
              {"zero_optimization", {{"stage", 1}}},
              {"checkpoint",
               {{"use_node_local_storage", node_local},
                {"parallel_write", {{"pipeline_stage", true}}}}}};
  pipe::PipelineModuleOptions o;
  o.num_stages = 2;
  o.loss_fn = testing::tiny_pipe_loss;
  o.seed_layers = true;
  auto module = std::make_shared<pipe::PipelineModule>(testing::tiny_pipe_specs(), o);
  return pipe::initialize(module, cfg);
}

void train_pipe(pipe::PipelineEngine& engine, int from, int to) {
  const int64_t dp = engine.dp_rank();
  for (int s = from; s < to; ++s) {
    int j = 0;
    engine.train_batch([&]() {
      return testing::tiny_pipe_batch((int64_t{s} * 2 + dp) * kPipeGas + j++, kPipeMicro);
    });
  }
}

// per_node 0: one folder for all (parallel_write alone); else nodes of per_node ranks with
// use_node_local_storage.
void pipeline_resume(int per_node) {
  new_shared_dir();
  testing::RunOptions o;
  o.init_distributed = false;
  const auto start = [per_node](int rank) {
    if (per_node == 0) {
      comm::init_distributed();
      return shared_dir() + "/shared";
    }
    return node_dir(init_on_nodes(rank, per_node));
  };
  run_ranks(kWorld, [&](int rank, int) {
    start(rank);
    auto engine = make_pipe_engine(per_node > 0);
    train_pipe(*engine, 0, kSteps);
    dump(engine->module(), "continuous");
  }, o);
  run_ranks(kWorld, [&](int rank, int) {
    const std::string dir = start(rank);
    auto engine = make_pipe_engine(per_node > 0);
    train_pipe(*engine, 0, kSteps / 2);
    engine->save_checkpoint(dir);
  }, o);
  run_ranks(kWorld, [&](int rank, int) {
    const std::string dir = start(rank);
    auto engine = make_pipe_engine(per_node > 0);
    ASSERT_TRUE(engine->load_checkpoint(dir).load_path.has_value());
    train_pipe(*engine, kSteps / 2, kSteps);
    dump(engine->module(), "resumed");
  }, o);
  if (!testing::in_rank_process()) expect_resumed_equals_continuous(kWorld);
}

TEST(NodeLocalPipeline, ParallelWriteSplitsTheLayerFilesAndResumesBitForBit) {
  pipeline_resume(0);
}

// One rank per node: each node's folder holds its stage's layer files, all written by its rank.
TEST(NodeLocalPipeline, EachNodesFolderHoldsItsStageAndResumesBitForBit) {
  pipeline_resume(1);
}

}  // namespace
}  // namespace deepspeed
