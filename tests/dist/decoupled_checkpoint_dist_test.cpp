// checkpoint.writer on Gloo ranks (Note [Decoupled checkpoints], Note [O_DIRECT checkpoint
// writes]): a decoupled save returns before its files are committed, writes the values of save
// time whatever training does meanwhile, moves `latest` at the next optimizer step (or an
// explicit commit), writes the same files byte for byte as a blocking save, and resumes bit for
// bit; a rank whose write fails makes the commit fail on every rank, naming the file there, with
// `latest` left on the previous checkpoint.
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deepspeed/checkpoint.h"
#include "deepspeed/comm.h"
#include "deepspeed/deepspeed.h"
#include "support/expect_throw.h"
#include "support/multi_rank.h"
#include "support/shared_run_dir.h"
#include "support/tiny_model.h"  // tiny_batch

namespace deepspeed {
namespace {

namespace ckpt = checkpoint;
namespace fs = std::filesystem;
using testing::run_ranks;
using testing::tiny_batch;

constexpr int kWorld = 2;
constexpr int64_t kMicro = 2;

std::string new_shared_dir() { return testing::new_shared_run_dir("DS_DECOUPLED_OUT"); }
std::string shared_dir() { return std::getenv("DS_DECOUPLED_OUT"); }

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct NetImpl : torch::nn::Module {
  NetImpl() {
    torch::manual_seed(77);
    fc1 = register_module("fc1", torch::nn::Linear(4, 64));
    fc2 = register_module("fc2", torch::nn::Linear(64, 2));
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& y) {
    return (fc2(torch::tanh(fc1(x))) - y).pow(2).mean();
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

// No writer section: the standard blocking writer.
std::shared_ptr<ModuleEngine<NetImpl>> make_engine(int stage, const json& writer = nullptr) {
  json cfg = {{"train_batch_size", kMicro * kWorld},
              {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.01}}}}},
              {"scheduler", {{"type", "WarmupLR"}, {"params", {{"warmup_num_steps", 3}}}}},
              {"zero_optimization", {{"stage", stage}}},
              {"steps_per_print", 1000}};
  if (!writer.is_null()) cfg["checkpoint"] = {{"writer", writer}};
  return initialize(std::make_shared<NetImpl>(), cfg).engine;
}

// FAST with small staging buffers (many drains per file), decoupled.
json decoupled_fast() {
  return {{"type", "fast"}, {"decoupled", true}, {"io_buffer_size", 16384},
          {"show_statistics", true}};
}

void train(ModuleEngine<NetImpl>& engine, int rank, int64_t from, int64_t to) {
  for (int64_t s = from; s < to; ++s) {
    auto [x, y] = tiny_batch((s * kWorld + rank) * kMicro, kMicro);
    engine.backward(engine.forward(x, y));
    engine.step();
  }
}

void dump(const torch::nn::Module& module, const std::string& name) {
  ckpt::save(ckpt::ivalue_from_tensors(ckpt::module_state_dict(module)),
             shared_dir() + "/" + name + std::to_string(comm::get_rank()) + ".pt");
}

// A checkpoint file's content less its copy of the ds_config (which names the writer), as
// save() writes it.
std::string content_less_config(const std::string& path) {
  c10::IValue value = ckpt::load(path);
  if (value.isGenericDict()) value.toGenericDict().erase("ds_config");
  return ckpt::save_to_string(value);
}

void expect_same_dumps(const std::string& want, const std::string& got) {
  for (int r = 0; r < kWorld; ++r) {
    const std::string want_path = shared_dir() + "/" + want + std::to_string(r) + ".pt";
    const std::string got_path = shared_dir() + "/" + got + std::to_string(r) + ".pt";
    EXPECT_TRUE(read_file(want_path) == read_file(got_path)) << got << " rank " << r;
  }
}

class DecoupledCheckpoint : public ::testing::TestWithParam<int> {};

TEST_P(DecoupledCheckpoint, CommitsAtTheNextStepWithTheBytesOfABlockingSave) {
  const int stage = GetParam();
  const std::string root = new_shared_dir();
  run_ranks(kWorld, [&](int rank, int) {  // the reference: blocking saves
    auto engine = make_engine(stage);
    train(*engine, rank, 0, 2);
    engine->save_checkpoint(shared_dir() + "/blocking");
    train(*engine, rank, 2, 4);
    dump(engine->module(), "continuous");
  });
  run_ranks(kWorld, [&](int rank, int) {
    const std::string dir = shared_dir() + "/decoupled";
    auto engine = make_engine(stage, decoupled_fast());
    train(*engine, rank, 0, 2);
    ASSERT_TRUE(engine->save_checkpoint(dir));
    EXPECT_FALSE(ckpt::read_latest(dir).has_value());  // not committed yet
    // Training may change the parameters at once: the files hold the values of save time.
    std::vector<at::Tensor> kept;
    {
      torch::NoGradGuard no_grad;
      for (auto& p : engine->module().parameters()) {
        kept.push_back(p.detach().clone());
        p.fill_(7);
      }
    }
    EXPECT_TRUE(engine->commit_decoupled_checkpoint());
    EXPECT_FALSE(engine->commit_decoupled_checkpoint());  // nothing pending any more
    EXPECT_EQ(ckpt::read_latest(dir).value_or(""), "global_step2");
    {
      torch::NoGradGuard no_grad;
      auto params = engine->module().parameters();
      for (size_t i = 0; i < params.size(); ++i) params[i].copy_(kept[i]);
    }
    train(*engine, rank, 2, 3);
    engine->save_checkpoint(dir);
    EXPECT_EQ(ckpt::read_latest(dir).value_or(""), "global_step2");
    train(*engine, rank, 3, 4);  // its step commits global_step3 first
    EXPECT_EQ(ckpt::read_latest(dir).value_or(""), "global_step3");
    dump(engine->module(), "decoupled_run");
  });
  if (!testing::in_rank_process()) {
    expect_same_dumps("continuous", "decoupled_run");
    const std::string want = root + "/blocking/global_step2";
    const std::string got = root + "/decoupled/global_step2";
    int files = 0;
    for (const auto& entry : fs::directory_iterator(want)) {
      const std::string name = entry.path().filename();
      EXPECT_TRUE(content_less_config(want + "/" + name) ==
                  content_less_config(got + "/" + name)) << name;
      ++files;
    }
    EXPECT_GE(files, stage == 0 ? 1 : 3);
    int got_files = 0;
    for (const auto& entry : fs::directory_iterator(got)) got_files += entry.is_regular_file();
    EXPECT_EQ(got_files, files);  // and no temporaries left behind
  }
  run_ranks(kWorld, [&](int rank, int) {
    auto engine = make_engine(stage, decoupled_fast());
    torch::manual_seed(1000 + rank);  // the load restores the generator
    ASSERT_TRUE(engine->load_checkpoint(shared_dir() + "/decoupled").load_path.has_value());
    EXPECT_EQ(engine->global_steps(), 3);
    train(*engine, rank, 3, 4);
    dump(engine->module(), "resumed");
  });
  if (!testing::in_rank_process()) expect_same_dumps("continuous", "resumed");
}

INSTANTIATE_TEST_SUITE_P(Stages, DecoupledCheckpoint, ::testing::Values(0, 2, 3),
                         [](const auto& info) { return "Stage" + std::to_string(info.param); });

TEST(DecoupledCheckpoint, AFailedWriteFailsTheCommitOnEveryRankAndKeepsLatest) {
  new_shared_dir();
  run_ranks(kWorld, [&](int rank, int) {
    const std::string dir = shared_dir() + "/ckpt";
    json writer = {{"type", "python"}, {"decoupled", true}};
    auto engine = make_engine(2, writer);
    train(*engine, rank, 0, 1);
    engine->save_checkpoint(dir);
    EXPECT_TRUE(engine->commit_decoupled_checkpoint());
    train(*engine, rank, 1, 2);
    // Rank 1's optimizer file cannot replace a directory of its name: its rename fails in the
    // background, after save_checkpoint returned.
    const std::string blocker = dir + "/global_step2/" + ckpt::zero_optim_states_file_name(1);
    if (rank == 1) fs::create_directories(blocker);
    comm::barrier();
    EXPECT_TRUE(engine->save_checkpoint(dir));
    if (rank == 1) {
      EXPECT_THROW_WITH(engine->commit_decoupled_checkpoint(), CheckpointError,
                        ckpt::zero_optim_states_file_name(1));
    } else {
      EXPECT_THROW_WITH(engine->commit_decoupled_checkpoint(), CheckpointError,
                        "committing the decoupled checkpoint " + dir +
                            "/global_step2 failed on rank(s) [1]");
    }
    EXPECT_EQ(ckpt::read_latest(dir).value_or(""), "global_step1");
    // The next checkpoint goes through.
    if (rank == 1) fs::remove_all(blocker);
    comm::barrier();
    engine->save_checkpoint(dir, std::string("again"));
    EXPECT_TRUE(engine->commit_decoupled_checkpoint());
    EXPECT_EQ(ckpt::read_latest(dir).value_or(""), "again");
  });
}

// Alone, an engine destroyed with a pending save commits it.
TEST(DecoupledCheckpoint, ASingleRankEngineCommitsWhenDestroyed) {
  new_shared_dir();
  run_ranks(1, [&](int rank, int) {
    const std::string dir = shared_dir() + "/alone";
    {
      json cfg = {{"train_batch_size", kMicro},
                  {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.01}}}}},
                  {"checkpoint", {{"writer", {{"type", "mock"}, {"decoupled", true}}}}}};
      auto engine = initialize(std::make_shared<NetImpl>(), cfg).engine;
      auto [x, y] = tiny_batch(rank, kMicro);
      engine->backward(engine->forward(x, y));
      engine->step();
      engine->save_checkpoint(dir);
      EXPECT_FALSE(ckpt::read_latest(dir).has_value());
    }
    EXPECT_EQ(ckpt::read_latest(dir).value_or(""), "global_step1");
    // MOCK: every file is there, and empty.
    EXPECT_EQ(fs::file_size(dir + "/global_step1/" + ckpt::model_states_file_name()), 0u);
  });
}

}  // namespace
}  // namespace deepspeed
