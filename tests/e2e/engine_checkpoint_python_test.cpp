// Engine checkpoints across the language boundary (Debian's python3-torch): every file an
// engine save writes (ZeRO 0/1/2, fp32/bf16, 2 ranks) loads in Python under torch's
// weights_only allowlist with DeepSpeed's keys and rebuilds the module's weights by
// zero_to_fp32's rule; and a checkpoint written the way Python DeepSpeed writes it (its pickled
// classes included, 2 ranks) loads into an engine on one rank, weights and Adam state intact.
#include <cstdlib>
#include <string>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deepspeed/checkpoint.h"
#include "deepspeed/deepspeed.h"
#include "deepspeed/optimizers.h"
#include "deepspeed/universal_checkpoint.h"
#include "support/multi_rank.h"
#include "support/run_command.h"
#include "support/temp_dir.h"
#include "support/tiny_model.h"

namespace deepspeed {
namespace {

namespace ckpt = checkpoint;
using testing::in_rank_process;
using testing::run_command;

bool python_torch_available() {
  static const bool ok = run_command(std::string(DS_PYTHON) + " -c 'import torch'").exit_code == 0;
  return ok;
}

std::string python(const std::string& args) {
  auto r = run_command(std::string(DS_PYTHON) + " " + DS_CHECKPOINT_PY + " " + args);
  return r.exit_code == 0 ? "" : "python " + args + " failed:\n" + r.out + r.err;
}

struct TwoLinearImpl : torch::nn::Module {
  TwoLinearImpl() {
    torch::manual_seed(1);
    fc1 = register_module("fc1", torch::nn::Linear(4, 8));
    fc2 = register_module("fc2", torch::nn::Linear(8, 2));
  }
  at::Tensor forward(const at::Tensor& x, const at::Tensor& y) {
    return (fc2(torch::tanh(fc1(x))) - y).pow(2).mean();
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

json config(int stage, bool bf16, const std::string& optimizer = "Adam") {
  return {{"train_micro_batch_size_per_gpu", 2},
          {"optimizer", {{"type", optimizer}, {"params", {{"lr", 0.01}}}}},
          {"scheduler", {{"type", "WarmupLR"}, {"params", {{"warmup_num_steps", 3}}}}},
          {"bf16", {{"enabled", bf16}}},
          {"zero_optimization",
           {{"stage", stage},
            {"stage3_param_persistence_threshold", 0},
            {"stage3_gather_16bit_weights_on_model_save", true}}}};
}

// `optimizer`: a type whose 16-bit stage-0 checkpoint DeepSpeed writes per parameter (Lamb:
// FP16_UnfusedOptimizer) or flat (Adam: FP16_Optimizer).
void check_saved_by_engine(int stage, bool bf16, const std::string& optimizer = "Adam") {
  if (!python_torch_available()) GTEST_SKIP() << "SKIPPED: python3 cannot import torch";
  std::optional<testing::TempDir> tmp;
  if (!in_rank_process()) tmp.emplace("ds_engine_py");
  testing::RunOptions o;
  o.env.push_back({"DS_TEST_DIR", tmp ? tmp->path() : ""});
  o.env.push_back({"DS_TEST_CASE", std::to_string(stage) + (bf16 ? "1" : "0")});
  o.env.push_back({"DS_TEST_OPTIMIZER", optimizer});
  testing::run_ranks(2, [](int rank, int world) {
    const std::string dir = std::getenv("DS_TEST_DIR");
    const std::string c = std::getenv("DS_TEST_CASE");
    const bool half = c[1] == '1';
    const auto dtype = half ? at::kBFloat16 : at::kFloat;
    std::shared_ptr<Engine> e;
    if (c[0] == '3') {  // units: a Sequential's children
      torch::manual_seed(1);
      auto seq = std::make_shared<torch::nn::SequentialImpl>(
          torch::nn::Linear(4, 8), torch::nn::Functional(torch::tanh), torch::nn::Linear(8, 2));
      auto engine = initialize(seq, config(3, half)).engine;
      for (int s = 0; s < 2; ++s) {
        auto [x, y] = testing::tiny_batch(s * 4 + rank * 2, 2);
        engine->backward((engine->forward(x.to(dtype)) - y.to(dtype)).pow(2).mean().to(at::kFloat));
        engine->step();
      }
      e = engine;
    } else {
      auto engine = initialize(std::make_shared<TwoLinearImpl>(),
                               config(c[0] - '0', half, std::getenv("DS_TEST_OPTIMIZER")))
                        .engine;
      for (int s = 0; s < 2; ++s) {
        auto [x, y] = testing::tiny_batch(s * 4 + rank * 2, 2);
        engine->backward(engine->forward(x.to(dtype), y.to(dtype)).to(at::kFloat));
        engine->step();
      }
      e = engine;
    }
    e->save_checkpoint(dir);
    e->save_16bit_model(dir);
  }, o);
  if (in_rank_process()) return;
  EXPECT_EQ(python("check_engine_checkpoint " + tmp->path() + " global_step2 2 " +
                   std::to_string(stage) + (bf16 ? " 1" : " 0")), "");
}

TEST(EngineCheckpointPython, Stage2Fp32FilesLoadInPython) { check_saved_by_engine(2, false); }
TEST(EngineCheckpointPython, Stage1Bf16FilesLoadInPython) { check_saved_by_engine(1, true); }
TEST(EngineCheckpointPython, Stage0Fp32FilesLoadInPython) { check_saved_by_engine(0, false); }
TEST(EngineCheckpointPython, Stage0Bf16LambFilesLoadInPython) {
  check_saved_by_engine(0, true, "Lamb");
}
TEST(EngineCheckpointPython, Stage3Fp32FilesConsolidateInPython) { check_saved_by_engine(3, false); }

TEST(EngineCheckpointPython, LoadsAPythonDeepSpeedCheckpointOnAnotherWorldSize) {
  if (!python_torch_available()) GTEST_SKIP() << "SKIPPED: python3 cannot import torch";
  testing::TempDir dir;
  ASSERT_EQ(python("write_engine_zero2 " + dir.path() + " 2"), "");
  auto model = std::make_shared<TwoLinearImpl>();
  json cfg = config(2, false);
  cfg.erase("scheduler");
  auto e = initialize(model, cfg).engine;
  auto loaded = e->load_checkpoint(dir.path());
  ASSERT_TRUE(loaded.load_path.has_value());
  EXPECT_EQ(e->global_steps(), 3);
  auto expected = ckpt::tensors_from_ivalue(ckpt::load(dir.file("expected.pt")), "expected");
  std::vector<at::Tensor> m1, m2;
  for (const auto& item : model->named_parameters()) {
    EXPECT_TRUE(item.value().equal(expected[item.key()])) << item.key();
    m1.push_back(expected["exp_avg." + item.key()].reshape({-1}));
    m2.push_back(expected["exp_avg_sq." + item.key()].reshape({-1}));
  }
  // Our one flat parameter's Adam state: the four parameters end to end, padding zero.
  auto state = optim::optimizer_state_dict(*e->optimizer()).toGenericDict().at("state")
                   .toGenericDict().at(0).toGenericDict();
  const int64_t n = at::cat(m1).numel();
  EXPECT_TRUE(state.at("exp_avg").toTensor().narrow(0, 0, n).equal(at::cat(m1)));
  EXPECT_TRUE(state.at("exp_avg_sq").toTensor().narrow(0, 0, n).equal(at::cat(m2)));
  // And it trains on from there.
  auto [x, y] = testing::tiny_batch(0, 2);
  e->backward(e->forward(x, y));
  e->step();
  EXPECT_EQ(e->global_steps(), 4);
}

// ds_to_universal's output of a TP=2 (AutoTP: fc1 column-, fc2 row-parallel) ZeRO-1 save reads
// in Python: DeepSpeed's per-parameter files, full tensors joined along their cat_dim.
TEST(EngineCheckpointPython, UniversalCheckpointLoadsInPython) {
  if (!python_torch_available()) GTEST_SKIP() << "SKIPPED: python3 cannot import torch";
  std::optional<testing::TempDir> tmp;
  if (!in_rank_process()) tmp.emplace("ds_universal_py");
  testing::RunOptions o;
  o.env.push_back({"DS_TEST_DIR", tmp ? tmp->path() : ""});
  testing::run_ranks(2, [](int rank, int) {
    auto model = std::make_shared<TwoLinearImpl>();
    json cfg = config(1, false);
    cfg["tensor_parallel"] = {{"autotp_size", 2}};
    auto e = initialize(model, cfg).engine;
    for (int s = 0; s < 2; ++s) {
      auto [x, y] = testing::tiny_batch(s * 2, 2);
      e->backward(e->forward(x, y));
      e->step();
    }
    e->save_checkpoint(std::getenv("DS_TEST_DIR"), std::string("step2"));
    (void)rank;
  }, o);
  if (in_rank_process()) return;
  ckpt::ds_to_universal(tmp->path() + "/step2", tmp->path() + "/step2_universal");
  EXPECT_EQ(python("check_universal " + tmp->path() + "/step2_universal 2"), "");
}

}  // namespace
}  // namespace deepspeed
