// OneBitAdam in the engine on 2 and 4 Gloo ranks: warm-up equals Adam (no bias correction),
// the compression stage keeps the replicas identical while sending fewer bytes, the engine
// skips its gradient all-reduce then, and a checkpoint taken mid-compression resumes bit-exactly
// in new processes.
#include "deepspeed/deepspeed.h"

#include <cstdlib>
#include <optional>
#include <sstream>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deepspeed/checkpoint.h"
#include "deepspeed/onebit.h"
#include "runtime/zero/zero_optimizer.h"
#include "support/multi_rank.h"
#include "support/temp_dir.h"
#include "support/tiny_model.h"

namespace deepspeed {
namespace {

// Warm-up is the same algorithm as Adam/LAMB without bias correction; the two differ by float
// rounding only (CPU-Adam's kernel and FusedLamb's tensor ops order their operations
// differently): a few ulps of parameters of magnitude ~1, far below one update (lr 0.01).
constexpr double kWarmupTolerance = 1e-5;

using testing::in_rank_process;
using testing::run_ranks;
using testing::tiny_batch;
using Engine = ModuleEngine<testing::TinyNetImpl>;

constexpr int64_t kGlobalBatch = 8;

// freeze_step for ZeroOneAdam's short schedule (check_zero_one_adam, the resume test).
constexpr int64_t kScheduleTest = 2;

json optimizer_config(const std::string& type, int64_t freeze_step) {
  json params = {{"lr", 0.01}, {"weight_decay", 0.01}};
  if (type == "OneBitAdam" || type == "OneBitLamb") params["freeze_step"] = freeze_step;
  // OnebitAdam's and OnebitLamb's updates have no bias correction.
  if (type == "Adam" || type == "Lamb") params["bias_correction"] = false;
  if (type == "ZeroOneAdam" && freeze_step == kScheduleTest) {
    // Variance updates at steps 1, 2, 4; frozen after step 5; local-step interval 1, 1, then 2.
    params["var_freeze_step"] = 4;
    params["var_update_scaler"] = 2;
    params["local_step_scaler"] = 2;
    params["local_step_clipper"] = 2;
  } else if (type == "ZeroOneAdam") {
    // Every step updates the variance until it freezes; local steps of up to 4.
    params["var_freeze_step"] = freeze_step;
    params["local_step_scaler"] = 8;
    params["local_step_clipper"] = 4;
  }
  return {{"type", type}, {"params", params}};
}

std::shared_ptr<Engine> make_engine(const std::string& type, int64_t freeze_step = 3) {
  json cfg = {{"train_batch_size", kGlobalBatch},
              {"optimizer", optimizer_config(type, freeze_step)},
              {"zero_optimization", {{"stage", 0}}},
              {"steps_per_print", 1000}};
  return initialize(std::make_shared<testing::TinyNetImpl>(), cfg).engine;
}

void train(Engine& engine, int rank, int64_t from, int64_t to) {
  const int64_t micro = engine.train_micro_batch_size_per_gpu();
  for (int64_t s = from; s < to; ++s) {
    auto [x, y] = tiny_batch(s * kGlobalBatch + rank * micro, micro);
    engine.backward(engine.forward(x, y));
    engine.step();
  }
}

std::vector<torch::Tensor> params_of(Engine& engine) {
  std::vector<torch::Tensor> out;
  for (auto& p : engine.module().parameters()) out.push_back(p.detach().clone());
  return out;
}

// max over ranks of |p - p on rank 0|: 0 when the replicas agree.
double replica_spread(const std::vector<torch::Tensor>& params) {
  double spread = 0;
  for (const auto& p : params) {
    auto mine = p.clone().view({-1});
    auto root = mine.clone();
    comm::broadcast(root, 0);
    auto d = (mine - root).abs().max().reshape({1});
    comm::all_reduce(d, comm::ReduceOp::kMax);
    spread = std::max(spread, d.item<double>());
  }
  return spread;
}

void check_warmup_then_compression(int rank, int world) {
  const int64_t freeze = 3;
  auto adam = make_engine("Adam");
  train(*adam, rank, 0, freeze);
  auto onebit = make_engine("OneBitAdam", freeze);
  auto* opt = dynamic_cast<onebit::OneBitAdam*>(onebit->optimizer());
  ASSERT_NE(opt, nullptr);
  EXPECT_EQ(opt->settings().freeze_step, freeze);
  EXPECT_EQ(opt->settings().comm_backend_name, "nccl");

  int64_t warmup_bytes = 0;
  for (int64_t s = 0; s < freeze; ++s) {
    EXPECT_TRUE(opt->backward_allreduce_enabled()) << "step " << s;
    const int64_t before = comm::bytes_sent();
    train(*onebit, rank, s, s + 1);
    warmup_bytes = comm::bytes_sent() - before;
  }
  // Warm-up is Adam without bias correction: the same trajectory up to float rounding (the
  // CPU-Adam kernel multiplies by 1/denominator; OnebitAdam divides).
  auto want = params_of(*adam);
  auto got = params_of(*onebit);
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_LE((want[i] - got[i]).abs().max().item<double>(), kWarmupTolerance) << "parameter " << i;
  }

  // Compression: local gradients, compressed momentum; the replicas stay identical.
  EXPECT_FALSE(opt->backward_allreduce_enabled());
  auto frozen_v = [&] {
    std::vector<torch::Tensor> v;
    for (auto& p : onebit->module().parameters()) {
      if (auto* s = opt->find_state(p)) v.push_back(s->tensor("exp_avg_sq").clone());
    }
    return v;
  };
  auto v_at_freeze = frozen_v();
  for (int64_t s = freeze; s < freeze + 4; ++s) {
    const int64_t before = comm::bytes_sent();
    train(*onebit, rank, s, s + 1);
    const int64_t compressed_bytes = comm::bytes_sent() - before;
    EXPECT_LT(compressed_bytes, warmup_bytes) << "step " << s;
    EXPECT_EQ(onebit->reduction_stats().buckets_launched, 0) << "the engine all-reduced";
    EXPECT_EQ(replica_spread(params_of(*onebit)), 0.0) << "step " << s;
  }
  auto v_now = frozen_v();
  ASSERT_EQ(v_now.size(), v_at_freeze.size());
  for (size_t i = 0; i < v_now.size(); ++i) EXPECT_TRUE(torch::equal(v_now[i], v_at_freeze[i]));
  // And the trajectory moved away from Adam's (the compressed steps did something).
  train(*adam, rank, freeze, freeze + 4);
  double diff = 0;
  auto a = params_of(*adam);
  auto b = params_of(*onebit);
  for (size_t i = 0; i < a.size(); ++i) diff = std::max(diff, (a[i] - b[i]).abs().max().item<double>());
  EXPECT_GT(diff, 0.0);
}

TEST(OneBitAdamDist, WarmupIsAdamThenCompressionKeepsReplicasOnTwoRanks) {
  run_ranks(2, check_warmup_then_compression);
}
TEST(OneBitAdamDist, WarmupIsAdamThenCompressionKeepsReplicasOnFourRanks) {
  run_ranks(4, check_warmup_then_compression);
}

// 0/1 Adam: the replicas agree after every step except between local-step synchronizations
// (step 9 here), the engine all-reduces only on variance-update steps, and fewer bytes go over
// the wire than with Adam.
void check_zero_one_adam(int rank, int world) {
  auto adam = make_engine("Adam");
  int64_t adam_bytes = comm::bytes_sent();
  train(*adam, rank, 0, 10);
  adam_bytes = comm::bytes_sent() - adam_bytes;
  auto engine = make_engine("ZeroOneAdam", kScheduleTest);
  auto* opt = dynamic_cast<onebit::ZeroOneAdam*>(engine->optimizer());
  ASSERT_NE(opt, nullptr);
  const std::vector<bool> want_allreduce = {true, true, false, true, false, false,
                                            false, false, false, false};
  int64_t bytes = 0;
  for (int64_t s = 0; s < 10; ++s) {
    EXPECT_EQ(opt->backward_allreduce_enabled(), want_allreduce[s]) << "before step " << s + 1;
    const int64_t before = comm::bytes_sent();
    train(*engine, rank, s, s + 1);
    bytes += comm::bytes_sent() - before;
    EXPECT_EQ(engine->reduction_stats().buckets_launched > 0, want_allreduce[s]) << "step " << s + 1;
    const double spread = replica_spread(params_of(*engine));
    if (s + 1 <= 5) {
      EXPECT_EQ(spread, 0.0) << "step " << s + 1;  // same averaged moments on every rank
    } else if (s + 1 == 9) {
      EXPECT_GT(spread, 1e-5) << "a local step";
    } else {
      // A synchronization undoes the local updates and applies the average; as in DeepSpeed,
      // p - sum(local updates) rounds differently on each rank, so replicas agree to an ulp.
      EXPECT_LE(spread, 1e-6) << "step " << s + 1;
    }
  }
  EXPECT_LT(bytes, adam_bytes);
}

TEST(ZeroOneAdamDist, VarianceFreezingAndLocalStepsOnTwoRanks) { run_ranks(2, check_zero_one_adam); }
TEST(ZeroOneAdamDist, VarianceFreezingAndLocalStepsOnFourRanks) { run_ranks(4, check_zero_one_adam); }

// Convergence on the small regression model: after 30 compressed steps (freeze at 10) each
// 1-bit optimizer's full-data loss is within kConvergenceTolerance of its uncompressed
// counterpart's at the same step (the measured differences are printed).
constexpr double kConvergenceTolerance = 0.05;

double full_data_loss(Engine& engine) {
  torch::NoGradGuard no_grad;
  auto [x, y] = tiny_batch(0, 64);
  return engine.forward(x, y).item<double>();
}

void check_convergence(int rank, int world) {
  const int64_t steps = 40, freeze = 10;
  for (auto [reference, compressed] : std::vector<std::pair<std::string, std::string>>{
           {"Adam", "OneBitAdam"}, {"Adam", "ZeroOneAdam"}, {"Lamb", "OneBitLamb"}}) {
    auto ref = make_engine(reference);
    train(*ref, rank, 0, steps);
    auto ob = make_engine(compressed, freeze);
    train(*ob, rank, 0, steps);
    const double want = full_data_loss(*ref), got = full_data_loss(*ob);
    const double start = full_data_loss(*make_engine(reference));
    if (rank == 0) {
      std::printf("%d ranks, %s vs %s after %lld steps: loss %.5f vs %.5f (start %.5f), relative "
                  "difference %.2f%%\n", world, compressed.c_str(), reference.c_str(),
                  static_cast<long long>(steps), got, want, start,
                  100 * std::abs(got - want) / want);
    }
    EXPECT_LT(std::abs(got - want) / want, kConvergenceTolerance) << compressed;
    EXPECT_LT(got, 0.95 * start) << compressed << " did not learn";
  }
}

TEST(OneBitConvergenceDist, FinalLossNearUncompressedOnTwoRanks) { run_ranks(2, check_convergence); }
TEST(OneBitConvergenceDist, FinalLossNearUncompressedOnFourRanks) { run_ranks(4, check_convergence); }

// Saved mid-compression (0/1 Adam: between two local-step synchronizations), loaded in new processes:
// the error-feedback buffers, frozen variance and counters come back, and the run continues bit
// for bit.
struct ResumeCase {
  std::string type;
  int64_t before;
};

class OneBitResumeTest : public ::testing::TestWithParam<ResumeCase> {};

TEST_P(OneBitResumeTest, CheckpointMidCompressionResumesBitExactly) {
  const ResumeCase c = GetParam();
  std::optional<testing::TempDir> dir;
  if (!in_rank_process()) dir.emplace("ds_onebit_ckpt");
  testing::RunOptions o;
  o.timeout_s = 180;
  if (dir) o.env.push_back({"DS_TEST_CKPT_DIR", dir->path()});
  o.env.push_back({"DS_TEST_CASE", c.type + " " + std::to_string(c.before)});
  constexpr int64_t kFreeze = 2, kAfter = 3;
  auto body = [&](int phase) {
    return [phase](int rank, int) {
      std::istringstream is(std::getenv("DS_TEST_CASE"));
      std::string type;
      int64_t before = 0;
      is >> type >> before;
      const std::string d = std::getenv("DS_TEST_CKPT_DIR");
      const std::string r = std::to_string(rank);
      auto engine = make_engine(type, kFreeze);
      auto save_params = [&](const std::string& name) {
        checkpoint::save(
            checkpoint::ivalue_from_tensors(checkpoint::module_state_dict(engine->module())),
            d + "/" + name + r + ".pt");
      };
      if (phase == 0) {
        train(*engine, rank, 0, before + kAfter);
        save_params("reference");
      } else if (phase == 1) {
        train(*engine, rank, 0, before);
        engine->save_checkpoint(d + "/ckpt");
      } else {
        engine->load_checkpoint(d + "/ckpt");
        auto* cc = dynamic_cast<onebit::CompressedCommunication*>(engine->optimizer());
        ASSERT_NE(cc, nullptr);
        EXPECT_FALSE(cc->backward_allreduce_enabled());
        auto* opt = dynamic_cast<optim::DsOptimizer*>(engine->optimizer());
        bool nonzero_error = false;
        for (auto& p : engine->module().parameters()) {
          if (auto* s = opt->find_state(p)) {
            const auto& e = s->tensor("worker_error");
            if (e.defined()) nonzero_error |= e.abs().sum().item<double>() > 0;
          }
        }
        EXPECT_TRUE(nonzero_error) << "the worker error buffers were not restored";
        train(*engine, rank, before, before + kAfter);
        save_params("resumed");
      }
    };
  };
  run_ranks(2, body(0), o);
  run_ranks(2, body(1), o);
  run_ranks(2, body(2), o);
  if (in_rank_process()) return;
  for (int r = 0; r < 2; ++r) {
    const std::string rs = std::to_string(r);
    auto want = checkpoint::tensors_from_ivalue(checkpoint::load(dir->path() + "/reference" + rs + ".pt"), "ref");
    auto got = checkpoint::tensors_from_ivalue(checkpoint::load(dir->path() + "/resumed" + rs + ".pt"), "res");
    ASSERT_EQ(want.size(), got.size());
    for (const auto& item : want) {
      EXPECT_TRUE(got[item.key()].equal(item.value())) << "rank " << r << " " << item.key();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Optimizers, OneBitResumeTest,
    ::testing::Values(ResumeCase{"OneBitAdam", 4}, ResumeCase{"ZeroOneAdam", 9},
                      ResumeCase{"OneBitLamb", 4}),
    [](const auto& info) { return info.param.type; });

// 1-bit LAMB on 2 and 4 ranks: after the freeze the replicas stay identical, the engine no
// longer all-reduces, and fewer bytes are sent than during warm-up.
void check_onebit_lamb(int rank, int world) {
  const int64_t freeze = 3;
  auto lamb = make_engine("Lamb");
  train(*lamb, rank, 0, freeze);
  auto engine = make_engine("OneBitLamb", freeze);
  int64_t warmup_bytes = 0;
  for (int64_t s = 0; s < freeze; ++s) {
    const int64_t before = comm::bytes_sent();
    train(*engine, rank, s, s + 1);
    warmup_bytes = comm::bytes_sent() - before;
  }
  auto want = params_of(*lamb);
  auto got = params_of(*engine);
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_LE((want[i] - got[i]).abs().max().item<double>(), kWarmupTolerance) << "parameter " << i;
  }
  for (int64_t s = freeze; s < freeze + 4; ++s) {
    const int64_t before = comm::bytes_sent();
    train(*engine, rank, s, s + 1);
    EXPECT_LT(comm::bytes_sent() - before, warmup_bytes) << "step " << s + 1;
    EXPECT_EQ(engine->reduction_stats().buckets_launched, 0);
    EXPECT_EQ(replica_spread(params_of(*engine)), 0.0) << "step " << s + 1;
  }
}

TEST(OneBitLambDist, CompressionKeepsReplicasOnTwoRanks) { run_ranks(2, check_onebit_lamb); }
TEST(OneBitLambDist, CompressionKeepsReplicasOnFourRanks) { run_ranks(4, check_onebit_lamb); }

}  // namespace
}  // namespace deepspeed
