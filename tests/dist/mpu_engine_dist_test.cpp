// The engine with DeepSpeed's mpu on 4 Gloo ranks: model-parallel size 2 x data-parallel size 2,
// both model-parallel ranks holding the same replicated model (no tensor-parallel layers). ZeRO
// 1/2/3 must train exactly as 2 data-parallel ranks without an mpu, partition over the
// data-parallel group only (checkpoints say 2 partitions, one file set per model-parallel
// rank), and load those checkpoints back.
#include "deepspeed/deepspeed.h"

#include <sys/stat.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deepspeed/checkpoint.h"
#include "deepspeed/zero3.h"
#include "support/multi_rank.h"
#include "support/tiny_model.h"

namespace deepspeed {
namespace {

using testing::run_ranks;
using testing::TinyNetImpl;
using testing::tiny_batch;

constexpr int kMicro = 2;
constexpr int kGas = 2;
constexpr int kSteps = 3;

json mpu_config(int stage) {
  // train_batch_size counts data-parallel ranks: 2 * 2 * 2, not the world's 16.
  return json{{"train_batch_size", kMicro * kGas * 2},
              {"train_micro_batch_size_per_gpu", kMicro},
              {"gradient_accumulation_steps", kGas},
              {"gradient_clipping", 0.05},  // the norm (over both groups) decides the update
              {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.01}, {"weight_decay", 0.01}}}}},
              {"zero_optimization", {{"stage", stage}, {"reduce_bucket_size", 40}}}};
}

// Megatron's way: the caller makes the groups itself and hands DeepSpeed an object that names
// them. Ranks {2k, 2k+1} are model-parallel peers; data-parallel groups stride by 2.
class HandMadeMpu : public Mpu {
 public:
  HandMadeMpu() {
    const int rank = comm::get_rank();
    for (int k = 0; k < 2; ++k) {
      comm::Group g = comm::new_group({2 * k, 2 * k + 1}, "model");
      if (g.is_member()) model_ = g;
    }
    for (int k = 0; k < 2; ++k) {
      comm::Group g = comm::new_group({k, k + 2}, "data");
      if (g.is_member()) data_ = g;
    }
    EXPECT_EQ(model_.rank(), rank % 2);
  }
  comm::Group get_model_parallel_group() const override { return model_; }
  comm::Group get_data_parallel_group() const override { return data_; }

 private:
  comm::Group model_, data_;
};

std::shared_ptr<Mpu> make_mpu(bool hand_made) {
  if (hand_made) return std::make_shared<HandMadeMpu>();
  return std::make_shared<TopologyMpu>(PipeModelDataParallelTopology(1, /*mp=*/2, /*dp=*/2));
}

std::vector<at::Tensor> params_of(torch::nn::Module& m) {
  std::vector<at::Tensor> out;
  for (auto& p : m.parameters()) out.push_back(p.detach().clone());
  return out;
}

// Data-parallel rank `dp_rank` of `dp_world` trains on its slice of every global batch. The
// model's seed depends on the data-parallel rank only: the model-parallel peers start equal,
// the data-parallel replicas only through the engine's broadcast.
// `norm` receives the last step's global gradient norm (AdamW hardly feels clipping, so the
// norm itself is compared).
std::vector<at::Tensor> train(int stage, int dp_rank, int dp_world, std::shared_ptr<Mpu> mpu,
                              double* norm, const std::string& save_dir = "") {
  auto model = std::make_shared<TinyNetImpl>(500 + dp_rank);
  auto [engine, optimizer, sched] =
      initialize(model, mpu_config(stage), nullptr, nullptr, std::move(mpu));
  EXPECT_EQ(engine->dp_world_size(), dp_world);
  EXPECT_EQ(engine->train_batch_size(), kMicro * kGas * dp_world);
  const int64_t global = int64_t{kMicro} * kGas * dp_world;
  for (int s = 0; s < kSteps; ++s) {
    for (int m = 0; m < kGas; ++m) {
      auto [x, y] = tiny_batch(s * global + (int64_t{dp_rank} * kGas + m) * kMicro, kMicro);
      engine->backward(engine->forward(x, y));
      engine->step();
    }
  }
  *norm = engine->get_global_grad_norm().value_or(-1.0);
  if (!save_dir.empty()) engine->save_checkpoint(save_dir, std::string("tag"));
  if (stage == 3) {
    zero::GatheredParameters all(*model);
    return params_of(*model);
  }
  return params_of(*model);
}

void save_params(const std::string& name, const std::vector<at::Tensor>& ps) {
  torch::save(ps, testing::rank_output_dir() + "/" + name + ".pt");
}

std::vector<at::Tensor> load_params(const std::string& dir, const std::string& name) {
  std::vector<at::Tensor> ps;
  torch::load(ps, dir + "/" + name + ".pt");
  return ps;
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

int64_t partition_count(const std::string& path, int stage) {
  const c10::IValue v = checkpoint::load(path);
  if (stage < 3) {
    auto f = checkpoint::ZeroOptimizerFile::from_ivalue(v, path);
    return *std::max_element(f.optimizer_state_dict.partition_count.begin(),
                             f.optimizer_state_dict.partition_count.end());
  }
  return v.toGenericDict().at("optimizer_state_dict").toGenericDict().at("partition_count").toInt();
}

void check_stage(int stage, bool hand_made) {
  testing::RunOptions o;
  o.env.push_back({"DS_TEST_STAGE", std::to_string(stage)});
  o.env.push_back({"DS_TEST_HAND_MADE", hand_made ? "1" : "0"});
  run_ranks(
      4,
      [](int rank, int) {
        const int st = std::stoi(std::getenv("DS_TEST_STAGE"));
        auto mpu = make_mpu(std::string(std::getenv("DS_TEST_HAND_MADE")) == "1");
        const int dp_rank = mpu->get_data_parallel_rank();
        const int mp_rank = mpu->get_model_parallel_rank();
        EXPECT_EQ(mp_rank, rank % 2);  // model-parallel peers are adjacent ranks
        EXPECT_EQ(dp_rank, rank / 2);
        const std::string dir = testing::rank_output_dir() + "/ckpt";
        double norm = 0.0;
        auto trained = train(st, dp_rank, 2, mpu, &norm, dir);
        save_params("mpu" + std::to_string(rank), trained);
        save_params("mpu_norm" + std::to_string(rank), {torch::tensor({norm}, torch::kDouble)});

        // Load into a fresh engine (another initialisation): the weights come back.
        auto model = std::make_shared<TinyNetImpl>(77);
        auto [engine, optimizer, sched] = initialize(model, mpu_config(st), nullptr, nullptr, mpu);
        engine->load_checkpoint(dir, std::string("tag"));
        std::vector<at::Tensor> loaded;
        if (st == 3) {
          zero::GatheredParameters all(*model);
          loaded = params_of(*model);
        } else {
          loaded = params_of(*model);
        }
        ASSERT_EQ(loaded.size(), trained.size());
        for (size_t i = 0; i < loaded.size(); ++i) {
          EXPECT_TRUE(torch::equal(loaded[i], trained[i])) << "rank " << rank << " tensor " << i;
        }
      },
      o);
  const std::string mpu_dir = testing::rank_output_dir();  // each run_ranks gets its own
  // The reference: 2 data-parallel ranks, no mpu. (The processes of this second run_ranks come
  // through the first call, which returns nothing in them.)
  run_ranks(2, [](int rank, int world) {
    const int st = std::stoi(std::getenv("DS_TEST_STAGE"));
    double norm = 0.0;
    save_params("dp" + std::to_string(rank), train(st, rank, world, nullptr, &norm));
    save_params("dp_norm" + std::to_string(rank), {torch::tensor({norm}, torch::kDouble)});
  }, o);
  const std::string dp_dir = testing::rank_output_dir();
  for (int r = 0; r < 4; ++r) {
    const auto got = load_params(mpu_dir, "mpu" + std::to_string(r));
    const auto want = load_params(dp_dir, "dp" + std::to_string(r / 2));
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      const double diff = (got[i] - want[i]).abs().max().item<double>();
      EXPECT_LE(diff, 2e-6) << "stage " << stage << " rank " << r << " tensor " << i;
    }
    const double got_norm = load_params(mpu_dir, "mpu_norm" + std::to_string(r))[0].item<double>();
    const double want_norm = load_params(dp_dir, "dp_norm" + std::to_string(r / 2))[0].item<double>();
    EXPECT_GT(want_norm, 0.05);  // clipping was active
    EXPECT_NEAR(got_norm, want_norm, 1e-9 * want_norm) << "stage " << stage << " rank " << r;
  }
  const std::string tag_dir = mpu_dir + "/ckpt/tag";
  for (int mp = 0; mp < 2; ++mp) {
    const std::string mp_name = "mp_rank_0" + std::to_string(mp);
    if (stage < 3) {
      EXPECT_TRUE(exists(tag_dir + "/" + mp_name + "_model_states.pt")) << mp_name;
    }
    for (int dp = 0; dp < 2; ++dp) {
      const std::string prefix = tag_dir + "/zero_pp_rank_" + std::to_string(dp) + "_" + mp_name;
      if (stage == 3) EXPECT_TRUE(exists(prefix + "_model_states.pt")) << prefix;
      ASSERT_TRUE(exists(prefix + "_optim_states.pt")) << prefix;
      EXPECT_EQ(partition_count(prefix + "_optim_states.pt", stage), 2) << prefix;
    }
    EXPECT_FALSE(exists(tag_dir + "/zero_pp_rank_2_" + mp_name + "_optim_states.pt"));
  }
}

TEST(MpuEngineDist, Stage1ModelParallel2x2MatchesTwoDataParallelRanks) { check_stage(1, false); }
TEST(MpuEngineDist, Stage2HandMadeMpuMatchesTwoDataParallelRanks) { check_stage(2, true); }
TEST(MpuEngineDist, Stage3ModelParallel2x2MatchesTwoDataParallelRanks) { check_stage(3, false); }

// 16-bit stage 0 keeps one replicated partition: its gradient norm is the averaged gradient's,
// not the sum over the data-parallel ranks of identical copies. loss = sum(w * x_r) with
// x_r = (r + 1) * [1, 2, 3, 4]: the averaged gradient is 1.5 * [1, 2, 3, 4].
struct LinearSum : torch::nn::Module {
  LinearSum() { w = register_parameter("w", torch::zeros({4})); }
  torch::Tensor forward(const torch::Tensor& x) { return (w * x).sum(); }
  torch::Tensor w;
};

TEST(MpuEngineDist, Bf16Stage0NormIsTheAveragedGradientsNorm) {
  run_ranks(2, [](int rank, int) {
    json cfg = {{"train_batch_size", 2},
                {"bf16", {{"enabled", true}}},
                {"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.01}}}}},
                {"zero_optimization", {{"stage", 0}}}};
    auto model = std::make_shared<LinearSum>();
    auto [engine, optimizer, sched] = initialize(model, cfg);
    auto x = torch::tensor({1.0f, 2.0f, 3.0f, 4.0f}, torch::kBFloat16) * (rank + 1);
    engine->backward(engine->forward(x));
    engine->step();
    const double want = 1.5 * std::sqrt(30.0);
    EXPECT_NEAR(engine->get_global_grad_norm().value_or(-1.0), want, 1e-6 * want);
  });
}

TEST(MpuEngineDist, BatchTriadUsesTheMpuDataParallelSize) {
  run_ranks(4, [](int, int) {
    auto mpu = make_mpu(false);
    // 2 * 2 * world (4) = 16 would be right without an mpu; with it the size is 2.
    json cfg = mpu_config(1);
    cfg["train_batch_size"] = 16;
    EXPECT_THROW(load_config(cfg, mpu.get()), ConfigError);
    EXPECT_EQ(load_config(mpu_config(1), mpu.get()).batch.gradient_accumulation_steps, kGas);
    // A config resolved for the world is refused by an engine that has an mpu.
    json world_cfg = mpu_config(1);
    world_cfg["train_batch_size"] = 16;
    try {
      initialize(std::make_shared<TinyNetImpl>(), load_config(world_cfg), nullptr, nullptr, mpu);
      ADD_FAILURE() << "expected a ConfigError";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("this job has 2 (the mpu's data-parallel size)"),
                std::string::npos)
          << e.what();
    }
  });
}

}  // namespace
}  // namespace deepspeed
