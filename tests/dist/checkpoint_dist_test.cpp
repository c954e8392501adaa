// Engine checkpoints on N Gloo ranks, each phase in new processes: exact resume (N steps, save,
// load in new processes, M steps == N + M uninterrupted, bit for bit) for ZeRO 0/1/2 in fp32 and
// bf16; re-partitioning a ZeRO-1/2 checkpoint for another number of ranks (2 -> 3, 4 -> 2) keeps
// the trajectory, also through DeepSpeed's elastic layout of the optimizer states
// (elastic_checkpoint, on the saving or the loading side); a rank killed (SIGKILL) in the
// middle of a save leaves the previous checkpoint loadable and `latest` naming it.
#include "deepspeed/deepspeed.h"

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <thread>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deepspeed/checkpoint.h"
#include "deepspeed/zero3.h"
#include "support/multi_rank.h"
#include "support/temp_dir.h"
#include "support/tiny_model.h"  // tiny_batch

namespace deepspeed {
namespace {

using testing::in_rank_process;
using testing::run_ranks;
using testing::tiny_batch;
namespace ckpt = checkpoint;

constexpr int64_t kGlobalBatch = 12;  // divisible by the micro-batches of 1-4 ranks below
constexpr int64_t kBefore = 3;        // global steps before the save
constexpr int64_t kAfter = 3;         // and after the load

// Every test keeps its files in one directory that the parent creates and its ranks inherit.
class SharedDir {
 public:
  SharedDir() {
    if (!in_rank_process()) dir_.emplace("ds_ckpt_dist");
    path_ = in_rank_process() ? std::getenv("DS_TEST_CKPT_DIR") : dir_->path();
  }
  const std::string& path() const { return path_; }
  testing::RunOptions options(double timeout_s = 180) const {
    testing::RunOptions o;
    o.timeout_s = timeout_s;
    o.env.push_back({"DS_TEST_CKPT_DIR", path_});
    return o;
  }

 private:
  std::optional<testing::TempDir> dir_;
  std::string path_;
};

json config(int world, int stage, const std::string& dtype, bool elastic = false) {
  // The global batch stays 12 samples whatever the world size, so runs on different numbers of
  // ranks follow the same trajectory.
  const int64_t gas = world == 4 ? 3 : 2;
  json cfg = {{"train_batch_size", kGlobalBatch},
              {"gradient_accumulation_steps", gas},
              {"gradient_clipping", 0.5},
              {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.01}, {"weight_decay", 0.01}}}}},
              {"scheduler",
               {{"type", "WarmupLR"},
                {"params", {{"warmup_min_lr", 0.0}, {"warmup_max_lr", 0.01}, {"warmup_num_steps", 4}}}}},
              {"zero_optimization",
               {{"stage", stage}, {"reduce_bucket_size", 24}, {"elastic_checkpoint", elastic}}},
              {"steps_per_print", 1000}};
  if (dtype == "bf16") cfg["bf16"] = {{"enabled", true}};
  return cfg;
}

// TinyNet's layers (an unused head, a frozen layer) with a hand-written squared error:
// LibTorch 1.13 has no bf16 mse_loss on the CPU.
struct CkptNetImpl : torch::nn::Module {
  CkptNetImpl() {
    torch::manual_seed(4321);
    fc1 = register_module("fc1", torch::nn::Linear(4, 8));
    fc2 = register_module("fc2", torch::nn::Linear(8, 2));
    unused = register_module("unused", torch::nn::Linear(8, 2));
    frozen = register_module("frozen", torch::nn::Linear(4, 4));
    for (auto& p : frozen->parameters()) p.set_requires_grad(false);
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& y) {
    return (fc2(torch::tanh(fc1(x + frozen(x)))) - y).pow(2).mean();
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, unused{nullptr}, frozen{nullptr};
};

using Engine = ModuleEngine<CkptNetImpl>;

std::shared_ptr<Engine> make_engine(int world, int stage, const std::string& dtype,
                                    bool elastic = false) {
  auto model = std::make_shared<CkptNetImpl>();
  return initialize(model, config(world, stage, dtype, elastic)).engine;
}

// Rank `rank`'s optimizer-states file of `dir/global_step<step>` is in the elastic layout:
// per-group lean states (as many elements as the fp32 partition) and the step beside them.
void expect_elastic_file(const std::string& dir, int64_t step, int rank, bool bf16) {
  const std::string path = ckpt::find_zero_optim_states_file(
      dir + "/global_step" + std::to_string(step), rank, 0, bf16);
  const auto z = ckpt::ZeroOptimizerFile::from_ivalue(ckpt::load(path), path).optimizer_state_dict;
  ASSERT_TRUE(z.elastic()) << path;
  const auto groups = z.base_optimizer_state.toListRef();
  ASSERT_EQ(groups.size(), z.single_partition_of_fp32_groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto state = groups[g].toGenericDict();
    EXPECT_EQ(state.at("exp_avg").toTensor().numel(),
              z.single_partition_of_fp32_groups[g].numel()) << path << " group " << g;
  }
  ASSERT_EQ(z.extra.size(), 1u) << path;
  EXPECT_EQ(z.extra[0].first, "base_optimizer_state_step");
  EXPECT_EQ(z.extra[0].second.toInt(), step);
}

// Global steps [from, to): rank r's micro-batches of each global batch. With `noise` every
// micro-step adds Gaussian noise from the global generator, so that a resume is exact only if
// the RNG state came back too.
void train(Engine& engine, int rank, int world, int64_t from, int64_t to, bool noise) {
  const int64_t gas = engine.gradient_accumulation_steps();
  const int64_t micro = engine.train_micro_batch_size_per_gpu();
  const auto dtype = engine.model_dtype();
  for (int64_t s = from; s < to; ++s) {
    for (int64_t m = 0; m < gas; ++m) {
      auto [x, y] = tiny_batch(s * kGlobalBatch + (rank * gas + m) * micro, micro);
      if (noise) x = x + 0.01 * torch::randn_like(x);
      engine.backward(engine.forward(x.to(dtype), y.to(dtype)).to(torch::kFloat));
      engine.step();
    }
  }
}

void write_params(deepspeed::Engine& engine, const std::string& path) {
  ckpt::TensorDict state = ckpt::module_state_dict(engine.module());
  state.insert("lr", torch::tensor(engine.get_lr()));
  state.insert("global_steps", torch::tensor(engine.global_steps()));
  ckpt::save(ckpt::ivalue_from_tensors(state), path);
}

ckpt::TensorDict read_params(const std::string& path) {
  return ckpt::tensors_from_ivalue(ckpt::load(path), path);
}

struct ResumeCase {
  int world;
  int stage;
  std::string dtype;
  bool elastic = false;  // zero_optimization.elastic_checkpoint
};

class ResumeTest : public ::testing::TestWithParam<ResumeCase> {};

TEST_P(ResumeTest, LoadInNewProcessesIsBitIdenticalToUninterrupted) {
  const ResumeCase c = GetParam();
  SharedDir dir;
  auto o = dir.options();
  o.env.push_back({"DS_TEST_CASE", std::to_string(c.stage) + " " + c.dtype + " " +
                                        std::to_string(int{c.elastic})});
  const auto body = [](int phase) {
    return [phase](int rank, int world) {
      std::istringstream is(std::getenv("DS_TEST_CASE"));
      int stage = 0;
      int elastic = 0;
      std::string dtype;
      is >> stage >> dtype >> elastic;
      const std::string d = std::getenv("DS_TEST_CKPT_DIR");
      const std::string r = std::to_string(rank);
      auto engine = make_engine(world, stage, dtype, elastic != 0);
      if (phase == 0) {  // uninterrupted
        train(*engine, rank, world, 0, kBefore + kAfter, true);
        write_params(*engine, d + "/reference" + r + ".pt");
      } else if (phase == 1) {  // first half, then save
        train(*engine, rank, world, 0, kBefore, true);
        engine->save_checkpoint(d + "/ckpt", std::nullopt, {{"epoch", c10::IValue(int64_t{7})}});
        if (elastic) expect_elastic_file(d + "/ckpt", kBefore, rank, dtype == "bf16");
      } else {  // new processes: load, second half
        torch::manual_seed(999 + rank);  // a different generator state: the load must restore it
        auto loaded = engine->load_checkpoint(d + "/ckpt");
        ASSERT_TRUE(loaded.load_path.has_value());
        EXPECT_EQ(*loaded.load_path, d + "/ckpt/global_step3");
        EXPECT_EQ(loaded.client_state.at("epoch").toInt(), 7);
        EXPECT_FALSE(loaded.client_state.contains("rng_state"));
        EXPECT_EQ(engine->global_steps(), kBefore);
        train(*engine, rank, world, kBefore, kBefore + kAfter, true);
        write_params(*engine, d + "/resumed" + r + ".pt");
      }
    };
  };
  run_ranks(c.world, body(0), o);
  run_ranks(c.world, body(1), o);
  run_ranks(c.world, body(2), o);
  if (in_rank_process()) return;
  for (int r = 0; r < c.world; ++r) {
    auto want = read_params(dir.path() + "/reference" + std::to_string(r) + ".pt");
    auto got = read_params(dir.path() + "/resumed" + std::to_string(r) + ".pt");
    ASSERT_EQ(want.size(), got.size());
    for (const auto& item : want) {
      EXPECT_TRUE(got[item.key()].equal(item.value()))
          << "rank " << r << " " << item.key() << " differs by "
          << (got[item.key()].to(torch::kDouble) - item.value().to(torch::kDouble)).abs().max().item<double>();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Stages, ResumeTest,
    ::testing::Values(ResumeCase{2, 0, "fp32"}, ResumeCase{2, 1, "fp32"}, ResumeCase{2, 2, "fp32"},
                      ResumeCase{2, 2, "bf16"}, ResumeCase{2, 0, "bf16"},
                      ResumeCase{2, 1, "fp32", true}, ResumeCase{2, 2, "bf16", true}),
    [](const auto& info) {
      return "W" + std::to_string(info.param.world) + "Stage" + std::to_string(info.param.stage) +
             info.param.dtype + (info.param.elastic ? "Elastic" : "");
    });

// Saved by `from` ranks, resumed by `to` ranks: the parameters after M more steps match a run
// that never stopped (on `from` ranks) within fp32 reduction-order noise. A fresh optimizer
// state (or misplaced Adam moments) would move them far more than the tolerance.
// `elastic`: which side runs with elastic_checkpoint ("save", "load", "both" or "").
void check_reshape(int from, int to, int stage, const std::string& elastic = "") {
  SharedDir dir;
  auto o = dir.options();
  o.env.push_back({"DS_TEST_STAGE", std::to_string(stage)});
  o.env.push_back({"DS_TEST_ELASTIC", elastic});
  const auto body = [](int phase) {
    return [phase](int rank, int world) {
      const int s = std::atoi(std::getenv("DS_TEST_STAGE"));
      const std::string elastic = std::getenv("DS_TEST_ELASTIC");
      const bool save_elastic = elastic == "save" || elastic == "both";
      const bool load_elastic = elastic == "load" || elastic == "both";
      const std::string d = std::getenv("DS_TEST_CKPT_DIR");
      auto engine = make_engine(world, s, "fp32", phase == 1 ? save_elastic : load_elastic);
      if (phase == 0) {
        train(*engine, rank, world, 0, kBefore + kAfter, false);
        if (rank == 0) write_params(*engine, d + "/reference.pt");
      } else if (phase == 1) {
        train(*engine, rank, world, 0, kBefore, false);
        engine->save_checkpoint(d + "/ckpt");
        if (save_elastic) expect_elastic_file(d + "/ckpt", kBefore, rank, false);
      } else {
        engine->load_checkpoint(d + "/ckpt");
        train(*engine, rank, world, kBefore, kBefore + kAfter, false);
        write_params(*engine, d + "/resumed" + std::to_string(rank) + ".pt");
      }
    };
  };
  run_ranks(from, body(0), o);
  run_ranks(from, body(1), o);
  run_ranks(to, body(2), o);
  if (in_rank_process()) return;
  auto want = read_params(dir.path() + "/reference.pt");
  for (int r = 0; r < to; ++r) {
    auto got = read_params(dir.path() + "/resumed" + std::to_string(r) + ".pt");
    for (const auto& item : want) {
      const auto diff = (got[item.key()] - item.value()).abs();
      const auto tol = item.value().abs() * 1e-5 + 1e-6;
      EXPECT_LE((diff - tol).max().item<double>(), 0.0)
          << from << " -> " << to << " ranks, rank " << r << ": " << item.key()
          << " differs by " << diff.max().item<double>();
    }
  }
}

TEST(CheckpointReshape, Stage2From2To3Ranks) { check_reshape(2, 3, 2); }
TEST(CheckpointReshape, Stage1From4To2Ranks) { check_reshape(4, 2, 1); }
// Note [Elastic ZeRO checkpoints]: 3 ranks pad the last partition, which the elastic layout
// drops; DeepSpeed's elastic loader re-partitions these files, and so does ours.
TEST(CheckpointReshape, Stage2From3To2RanksElastic) { check_reshape(3, 2, 2, "both"); }
TEST(CheckpointReshape, Stage1From2To3RanksElasticSaveRigidLoad) {
  check_reshape(2, 3, 1, "save");
}

bool has_temp_file(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) return false;
  bool found = false;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.rfind(".", 0) == 0 && name.find(".tmp.") != std::string::npos) {
      struct stat st {};
      if (::stat((dir + "/" + name).c_str(), &st) == 0 && st.st_size > 0) found = true;
    }
  }
  ::closedir(d);
  return found;
}

// A wider model so that a save takes long enough to be interrupted.
struct WideNetImpl : torch::nn::Module {
  WideNetImpl() {
    torch::manual_seed(5);
    fc1 = register_module("fc1", torch::nn::Linear(4, 1024));
    fc2 = register_module("fc2", torch::nn::Linear(1024, 1024));
    fc3 = register_module("fc3", torch::nn::Linear(1024, 2));
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& y) {
    return torch::nn::functional::mse_loss(fc3(torch::tanh(fc2(torch::tanh(fc1(x))))), y);
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};

TEST(CheckpointCrash, KillDuringSaveLeavesPreviousCheckpointLoadable) {
  SharedDir dir;
  auto o = dir.options();
  o.comm_timeout_ms = 5000;
  const auto engine_for = [](int world) {
    json cfg = config(world, 2, "fp32");
    cfg.erase("scheduler");
    return initialize(std::make_shared<WideNetImpl>(), cfg).engine;
  };
  // Phase 0: a good checkpoint, then rank 1 kills itself (SIGKILL, as kill -9) as soon as its
  // optimizer file of the second save is being written.
  run_ranks(2, [&](int rank, int world) {
    const std::string d = std::getenv("DS_TEST_CKPT_DIR");
    auto engine = engine_for(world);
    auto [x, y] = tiny_batch(rank * 6, 6);
    for (int m = 0; m < 2; ++m) {
      engine->backward(engine->forward(x, y));
      engine->step();
    }
    engine->save_checkpoint(d + "/ckpt", std::string("good"));
    write_params(*engine, d + "/good" + std::to_string(rank) + ".pt");
    for (int m = 0; m < 2; ++m) {
      engine->backward(engine->forward(x, y));
      engine->step();
    }
    std::atomic<bool> stop{false};
    std::thread killer;
    if (rank == 1) {
      killer = std::thread([&] {
        while (!stop) {
          if (has_temp_file(d + "/ckpt/bad")) ::raise(SIGKILL);
        }
      });
    }
    engine->save_checkpoint(d + "/ckpt", std::string("bad"));
    stop = true;
    if (killer.joinable()) killer.join();
    ADD_FAILURE() << "rank " << rank << " finished a save that rank 1 should not have survived";
  }, [&] { auto x = o; x.expect_failure = true; return x; }());
  if (!in_rank_process()) {
    EXPECT_EQ(ckpt::read_latest(dir.path() + "/ckpt").value_or(""), "good");
    EXPECT_FALSE(std::ifstream(dir.path() + "/ckpt/bad/zero_pp_rank_1_mp_rank_00_optim_states.pt").good())
        << "the killed rank's file must never appear under its final name";
  }
  // Phase 1: new processes resume from `latest` and get exactly the good state.
  run_ranks(2, [&](int rank, int world) {
    const std::string d = std::getenv("DS_TEST_CKPT_DIR");
    auto engine = engine_for(world);
    auto loaded = engine->load_checkpoint(d + "/ckpt");
    ASSERT_TRUE(loaded.load_path.has_value());
    EXPECT_EQ(*loaded.load_path, d + "/ckpt/good");
    write_params(*engine, d + "/loaded" + std::to_string(rank) + ".pt");
  }, o);
  if (in_rank_process()) return;
  for (int r = 0; r < 2; ++r) {
    auto want = read_params(dir.path() + "/good" + std::to_string(r) + ".pt");
    auto got = read_params(dir.path() + "/loaded" + std::to_string(r) + ".pt");
    for (const auto& item : want) {
      if (item.key() == "lr") continue;
      EXPECT_TRUE(got[item.key()].equal(item.value())) << "rank " << r << " " << item.key();
    }
  }
}

// ZeRO-3 on a Sequential (every child a unit) with a frozen middle layer: resume in new
// processes is bit-identical; resuming on 3 ranks re-lays the shards (and Adam's moments) and
// follows the same trajectory; zero_to_fp32 consolidates the per-rank files into exactly the
// gathered weights.
std::shared_ptr<torch::nn::SequentialImpl> zero3_model() {
  torch::manual_seed(21);
  auto seq = std::make_shared<torch::nn::SequentialImpl>(
      torch::nn::Linear(4, 8), torch::nn::Functional(torch::tanh), torch::nn::Linear(8, 8),
      torch::nn::Functional(torch::tanh), torch::nn::Linear(8, 2));
  for (auto& p : seq->ptr(2)->parameters()) p.set_requires_grad(false);
  return seq;
}

void train_zero3(ModuleEngine<torch::nn::SequentialImpl>& engine, int rank, int64_t from,
                 int64_t to, bool noise) {
  const int64_t gas = engine.gradient_accumulation_steps();
  const int64_t micro = engine.train_micro_batch_size_per_gpu();
  for (int64_t s = from; s < to; ++s) {
    for (int64_t m = 0; m < gas; ++m) {
      auto [x, y] = tiny_batch(s * kGlobalBatch + (rank * gas + m) * micro, micro);
      if (noise) x = x + 0.01 * torch::randn_like(x);
      engine.backward((engine.forward(x) - y).pow(2).mean());
      engine.step();
    }
  }
}

TEST(CheckpointZero3, ResumeReshapeAndConsolidate) {
  SharedDir dir;
  // Phases 0-2 with input noise (the resume must restore the RNG), 3-5 without (3 ranks cannot
  // take 2 ranks' generator states): uninterrupted, first half + save, load + second half.
  const auto body = [](int phase) {
    return [phase](int rank, int world) {
      const bool noise = phase < 3;
      const std::string d = std::getenv("DS_TEST_CKPT_DIR");
      const std::string ckpt_dir = d + (noise ? "/ckpt" : "/ckpt_plain");
      json cfg = config(world, 3, "fp32");
      cfg["zero_optimization"]["stage3_param_persistence_threshold"] = 0;
      cfg["zero_optimization"]["sub_group_size"] = 20;
      auto engine = initialize(zero3_model(), cfg).engine;
      const auto dump = [&](const std::string& name) {
        zero::GatheredParameters gathered(engine->module());
        write_params(*engine, d + "/" + name + std::to_string(rank) + ".pt");
      };
      const std::string tag = noise ? "" : "plain_";
      if (phase % 3 == 0) {
        train_zero3(*engine, rank, 0, kBefore + kAfter, noise);
        dump(tag + "reference");
      } else if (phase % 3 == 1) {
        train_zero3(*engine, rank, 0, kBefore, noise);
        engine->save_checkpoint(ckpt_dir);
        dump(tag + "saved");
      } else {
        torch::manual_seed(77 + rank);
        engine->load_checkpoint(ckpt_dir);
        EXPECT_EQ(engine->global_steps(), kBefore);
        train_zero3(*engine, rank, kBefore, kBefore + kAfter, noise);
        dump(tag + "resumed");
      }
    };
  };
  auto o = dir.options();
  run_ranks(2, body(0), o);
  run_ranks(2, body(1), o);
  run_ranks(2, body(2), o);
  run_ranks(2, body(3), o);
  run_ranks(2, body(4), o);
  run_ranks(3, body(5), o);
  if (in_rank_process()) return;
  auto want = read_params(dir.path() + "/reference0.pt");
  auto resumed = read_params(dir.path() + "/resumed1.pt");
  for (const auto& item : want) {
    EXPECT_TRUE(resumed[item.key()].equal(item.value())) << "resume: " << item.key();
  }
  // Saved by 2 ranks, resumed by 3: fp32 reduction-order noise only (a fresh optimizer state
  // or misplaced Adam moments would move the weights far more).
  auto plain = read_params(dir.path() + "/plain_reference0.pt");
  for (int r = 0; r < 3; ++r) {
    auto reshaped = read_params(dir.path() + "/plain_resumed" + std::to_string(r) + ".pt");
    for (const auto& item : plain) {
      const auto diff = (reshaped[item.key()] - item.value()).abs();
      EXPECT_LE((diff - item.value().abs() * 1e-5 - 1e-6).max().item<double>(), 0.0)
          << "reshape 2 -> 3, rank " << r << ": " << item.key() << " differs by "
          << diff.max().item<double>();
    }
  }
  auto saved = read_params(dir.path() + "/saved0.pt");
  auto full = ckpt::consolidate_zero_checkpoint(dir.path() + "/ckpt");
  for (const auto& item : saved) {
    if (item.key() == "global_steps" || item.key() == "lr") continue;
    ASSERT_TRUE(full.contains(item.key())) << item.key();
    EXPECT_TRUE(full[item.key()].equal(item.value())) << "zero_to_fp32: " << item.key();
  }
}

// ZeRO-3 keeps 1/W of each weight per rank: save_16bit_model gathers the whole model when
// stage3_gather_16bit_weights_on_model_save is set (the file then equals the stage-0 weights
// after the same training) and, as in DeepSpeed, declines without it.
TEST(CheckpointZero3, Save16BitModelGathersThePartitionedWeights) {
  SharedDir dir;
  const auto run = [](int stage, bool gather, const std::string& out, int rank) {
    torch::manual_seed(9);
    auto model = std::make_shared<torch::nn::SequentialImpl>(
        torch::nn::Linear(4, 8), torch::nn::Functional(torch::tanh), torch::nn::Linear(8, 2));
    json cfg = {{"train_batch_size", 8}, {"gradient_accumulation_steps", 1},
                {"optimizer", {{"type", "Adam"}, {"params", {{"lr", 0.01}}}}},
                {"zero_optimization", {{"stage", stage},
                                       {"stage3_param_persistence_threshold", 0},
                                       {"stage3_gather_16bit_weights_on_model_save", gather}}}};
    auto engine = initialize(model, cfg).engine;
    for (int s = 0; s < 2; ++s) {
      auto [x, y] = tiny_batch(s * 8 + rank * 4, 4);
      engine->backward((engine->forward(x) - y).pow(2).mean());
      engine->step();
    }
    return engine->save_16bit_model(out);
  };
  run_ranks(2, [&](int rank, int) {
    const std::string d = std::getenv("DS_TEST_CKPT_DIR");
    EXPECT_FALSE(run(3, false, d + "/declined", rank));
    EXPECT_TRUE(run(3, true, d + "/zero3", rank));
    EXPECT_TRUE(run(0, false, d + "/zero0", rank));
  }, dir.options());
  if (in_rank_process()) return;
  EXPECT_FALSE(std::ifstream(dir.path() + "/declined/pytorch_model.bin").good());
  auto got = read_params(dir.path() + "/zero3/pytorch_model.bin");
  auto want = read_params(dir.path() + "/zero0/pytorch_model.bin");
  ASSERT_EQ(got.size(), 4u);
  for (const auto& item : want) {
    ASSERT_EQ(got[item.key()].sizes(), item.value().sizes()) << item.key();
    EXPECT_TRUE(got[item.key()].allclose(item.value(), 1e-6, 1e-7)) << item.key();
  }
}

}  // namespace
}  // namespace deepspeed
