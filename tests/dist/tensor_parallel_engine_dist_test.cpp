// The engine with AutoTP (tensor_parallel.autotp_size) on the example GPT: TP=2 on 2 ranks and
// TP=2 x DP=2 on 4 ranks end, after K steps of SGD with momentum and active clipping, with the same full
// parameters (shards gathered) and the same gradient norm as one process training the dense
// model on the same global batches (fp32, 1e-5 relative); ZeRO 0, 1 and 2; ZeRO-3 refused.
// Checkpoints: DeepSpeed's per-model-parallel-rank files and exact resume.
#include "deepspeed/deepspeed.h"

#include <sys/stat.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deepspeed/tensor_parallel.h"
#include "gpt_model.h"
#include "support/multi_rank.h"

namespace deepspeed {
namespace {

namespace tp = tensor_parallel;
using examples::GptConfig;
using examples::GptImpl;
using testing::run_ranks;

constexpr int64_t kGlobalBatch = 4;  // sequences per optimizer step
constexpr int64_t kSeq = 8;
constexpr int kSteps = 3;

GptConfig tiny_gpt() {
  GptConfig c;
  c.vocab_size = 37;
  c.block_size = kSeq;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 16;
  return c;
}

// SGD with momentum for the comparisons with one process: Adam divides by the root of the
// second moment, which turns the rounding noise of a gradient that is zero in exact arithmetic
// (the key bias: softmax ignores a per-query shift) into updates of order lr. AdamW for the
// checkpoint test, which compares tensor-parallel runs bit for bit.
json config(int stage, int autotp, bool adam = false) {
  const int64_t micro = 2;
  json optimizer = adam ? json{{"type", "AdamW"}, {"params", {{"lr", 0.01}, {"weight_decay", 0.01}}}}
                        : json{{"type", "SGD"}, {"params", {{"lr", 0.1}, {"momentum", 0.9}}}};
  json c = {{"train_batch_size", kGlobalBatch},
            {"train_micro_batch_size_per_gpu", micro},
            {"gradient_clipping", 0.5},  // active: the norm decides the update
            {"optimizer", optimizer},
            {"zero_allow_untested_optimizer", true},  // SGD under ZeRO, as DeepSpeed asks
            {"zero_optimization", {{"stage", stage}, {"reduce_bucket_size", 500}}}};
  if (autotp > 1) c["tensor_parallel"] = {{"autotp_size", autotp}};
  return c;
}

// Sequence i of a fixed synthetic token stream (identical in every process): inputs and the
// next-token targets.
std::pair<at::Tensor, at::Tensor> sequences(int64_t first, int64_t count) {
  std::vector<at::Tensor> xs, ys;
  for (int64_t i = first; i < first + count; ++i) {
    auto pos = torch::arange(kSeq + 1, torch::kLong);
    auto stream = (pos * (i % 5 + 2) + i * 3 + (pos * pos) % 7) % 37;
    xs.push_back(stream.narrow(0, 0, kSeq));
    ys.push_back(stream.narrow(0, 1, kSeq));
  }
  return {torch::stack(xs), torch::stack(ys)};
}

// The full value of every parameter by name: tensor-parallel shards all-gathered over their
// group and joined as they were split.
std::map<std::string, at::Tensor> full_parameters(torch::nn::Module& m) {
  std::map<std::string, at::Tensor> out;
  for (const auto& item : m.named_parameters()) {
    at::Tensor p = item.value().detach();
    if (tp::is_tensor_parallel(item.value())) {  // the mark is on the parameter, not a detach
      const tp::ShardInfo s = tp::shard_info(item.value());
      at::Tensor in = p.contiguous();
      at::Tensor flat = at::empty({s.group.size() * in.numel()}, in.options());
      comm::all_gather(flat, in, false, s.group);
      std::vector<at::Tensor> parts;
      for (int r = 0; r < s.group.size(); ++r) {
        parts.push_back(flat.narrow(0, r * in.numel(), in.numel()).view(in.sizes()));
      }
      p = tp::unshard(parts, s.partition_dim, s.partition_stride);
    }
    out[item.key()] = p.clone();
  }
  return out;
}

// Trains kSteps steps (steps [first_step, first_step + kSteps) of the stream) on data-parallel
// rank `dp_rank` of `dp`; the model is built from seed 42 on every rank.
struct Trained {
  std::map<std::string, at::Tensor> params;
  double norm = -1.0;
  std::vector<double> losses;
};

Trained train(const std::shared_ptr<ModuleEngine<GptImpl>>& engine, GptImpl& model, int dp_rank, int dp, int first_step,
              int steps) {
  Trained t;
  const int64_t micro = 2;
  const int64_t gas = kGlobalBatch / (micro * dp);
  for (int s = first_step; s < first_step + steps; ++s) {
    double loss_sum = 0.0;
    for (int64_t m = 0; m < gas; ++m) {
      auto [x, y] = sequences(s * kGlobalBatch + (dp_rank * gas + m) * micro, micro);
      auto loss = engine->forward(x, y);
      loss_sum += loss.item<double>();
      engine->backward(loss);
      engine->step();
    }
    // The step's loss over the global batch: the mean over the data-parallel replicas.
    at::Tensor mean = torch::tensor({loss_sum / gas}, torch::kDouble);
    const comm::Group& dp_group = engine->data_parallel_group();
    if (dp_group.size() > 1) comm::all_reduce(mean, comm::ReduceOp::kAvg, false, dp_group);
    t.losses.push_back(mean.item<double>());
  }
  t.norm = engine->get_global_grad_norm().value_or(-1.0);
  t.params = full_parameters(model);
  return t;
}

void save(const std::string& name, const Trained& t) {
  std::vector<at::Tensor> v;
  for (const auto& [k, p] : t.params) v.push_back(p);
  v.push_back(torch::tensor({t.norm}, torch::kDouble));
  v.push_back(torch::tensor(t.losses, torch::kDouble));
  torch::save(v, testing::rank_output_dir() + "/" + name + ".pt");
}

std::vector<at::Tensor> load(const std::string& dir, const std::string& name) {
  std::vector<at::Tensor> v;
  torch::load(v, dir + "/" + name + ".pt");
  return v;
}

std::string reference_dir(int stage) {
  testing::RunOptions o;
  o.env.push_back({"DS_TEST_STAGE", std::to_string(stage)});
  run_ranks(1, [](int, int) {
    const int st = std::stoi(std::getenv("DS_TEST_STAGE"));
    torch::manual_seed(42);
    auto model = std::make_shared<GptImpl>(tiny_gpt());
    auto engine = initialize(model, config(st, 1)).engine;
    save("ref", train(engine, *model, 0, 1, 0, kSteps));
  }, o);
  return testing::rank_output_dir();
}

void compare(const std::string& got_dir, const std::string& got_name, const std::string& want_dir,
             const std::string& what) {
  if (testing::in_rank_process()) return;  // the ranks of a later run_ranks pass through here
  const auto got = load(got_dir, got_name);
  const auto want = load(want_dir, "ref");
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i + 2 < got.size(); ++i) {
    ASSERT_EQ(got[i].sizes(), want[i].sizes()) << what << " tensor " << i;
    const double diff = (got[i] - want[i]).abs().max().item<double>();
    const double scale = want[i].abs().max().item<double>();
    EXPECT_LE(diff, 1e-5 * std::max(scale, 1e-3)) << what << " tensor " << i;
  }
  const double got_norm = got[got.size() - 2].item<double>();
  const double want_norm = want[want.size() - 2].item<double>();
  EXPECT_GT(want_norm, 0.5) << "clipping must be active";
  EXPECT_NEAR(got_norm, want_norm, 1e-5 * want_norm) << what << " gradient norm";
  EXPECT_TRUE(torch::allclose(got.back(), want.back(), 1e-5, 1e-6)) << what << " losses";
}

void check_tp(int world, int stage, bool engine_makes_groups) {
  const std::string ref = reference_dir(stage);
  testing::RunOptions o;
  o.timeout_s = 240;
  o.env.push_back({"DS_TEST_STAGE", std::to_string(stage)});
  o.env.push_back({"DS_TEST_OWN_MPU", engine_makes_groups ? "0" : "1"});
  run_ranks(world, [](int rank, int world_size) {
    const int st = std::stoi(std::getenv("DS_TEST_STAGE"));
    const int dp = world_size / 2;
    std::shared_ptr<Mpu> mpu;
    if (std::string(std::getenv("DS_TEST_OWN_MPU")) == "1") {
      mpu = std::make_shared<TopologyMpu>(PipeModelDataParallelTopology(1, 2, dp));
    }
    torch::manual_seed(42);
    auto model = std::make_shared<GptImpl>(tiny_gpt());
    auto engine = initialize(model, config(st, 2), nullptr, nullptr, mpu).engine;
    EXPECT_EQ(engine->dp_world_size(), dp);
    EXPECT_EQ(engine->model_parallel_group().size(), 2);
    // AutoTP split q|k|v, fc (column) and both projections (row); the rest stays whole.
    EXPECT_EQ(model->blocks[0]->attn->c_attn->weight.size(0), 3 * 16 / 2);
    EXPECT_EQ(model->blocks[0]->mlp->c_proj->weight.size(1), 4 * 16 / 2);
    EXPECT_TRUE(tp::is_tensor_parallel(model->blocks[1]->mlp->c_fc->bias));
    EXPECT_FALSE(tp::is_tensor_parallel(model->blocks[1]->mlp->c_proj->bias));
    EXPECT_FALSE(tp::is_tensor_parallel(model->wte->weight));
    const int dp_rank = rank / 2;  // tensor-parallel peers are adjacent ranks
    Trained t = train(engine, *model, dp_rank, dp, 0, kSteps);
    if (rank == 0 || rank == world_size - 1) save("tp" + std::to_string(rank), t);
  }, o);
  const std::string dir = testing::rank_output_dir();
  compare(dir, "tp0", ref, "rank 0");
  compare(dir, "tp" + std::to_string(world - 1), ref, "last rank");
}

TEST(TensorParallelEngineDist, Tp2Zero1MatchesOneProcess) { check_tp(2, 1, true); }
TEST(TensorParallelEngineDist, Tp2Zero0And2MatchOneProcess) {
  check_tp(2, 0, true);
  check_tp(2, 2, false);
}
TEST(TensorParallelEngineDist, Tp2xDp2Zero1And2MatchOneProcess) {
  check_tp(4, 1, false);
  check_tp(4, 2, false);
}

TEST(TensorParallelEngineDist, Zero3IsRefusedByName) {
  run_ranks(2, [](int, int) {
    torch::manual_seed(42);
    auto model = std::make_shared<GptImpl>(tiny_gpt());
    try {
      initialize(model, config(3, 2));
      ADD_FAILURE() << "expected NotSupportedError";
    } catch (const NotSupportedError& e) {
      EXPECT_NE(std::string(e.what()).find("zero_optimization.stage 3"), std::string::npos)
          << e.what();
    }
  });
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

TEST(TensorParallelEngineDist, CheckpointPerModelParallelRankResumesExactly) {
  run_ranks(2, [](int rank, int) {
    const std::string dir = testing::rank_output_dir() + "/ckpt";
    torch::manual_seed(42);
    auto model = std::make_shared<GptImpl>(tiny_gpt());
    auto engine = initialize(model, config(1, 2, /*adam=*/true)).engine;
    train(engine, *model, 0, 1, 0, 2);
    engine->save_checkpoint(dir, std::string("step2"));
    Trained uninterrupted = train(engine, *model, 0, 1, 2, 2);
    if (rank == 0) save("uninterrupted", uninterrupted);
  });
  const std::string first = testing::rank_output_dir();
  if (!testing::in_rank_process()) {
    const std::string tag = first + "/ckpt/step2/";
    for (const char* f : {"mp_rank_00_model_states.pt", "mp_rank_01_model_states.pt",
                          "zero_pp_rank_0_mp_rank_00_optim_states.pt",
                          "zero_pp_rank_0_mp_rank_01_optim_states.pt"}) {
      EXPECT_TRUE(exists(tag + f)) << f;
    }
  }
  testing::RunOptions o;
  o.env.push_back({"DS_TEST_CKPT", first + "/ckpt"});
  run_ranks(2, [](int rank, int) {
    torch::manual_seed(7);  // another initialization: everything comes from the checkpoint
    auto model = std::make_shared<GptImpl>(tiny_gpt());
    auto engine = initialize(model, config(1, 2, /*adam=*/true)).engine;
    engine->load_checkpoint(std::getenv("DS_TEST_CKPT"), std::string("step2"));
    Trained resumed = train(engine, *model, 0, 1, 2, 2);
    if (rank == 0) save("resumed", resumed);
  }, o);
  const auto want = load(first, "uninterrupted");
  const auto got = load(testing::rank_output_dir(), "resumed");
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(torch::equal(got[i], want[i])) << "tensor " << i;
  }
}

}  // namespace
}  // namespace deepspeed
