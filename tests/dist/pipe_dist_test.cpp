// PipelineEngine on Gloo ranks against the single-process engine: P=2 on 2 ranks, P=4 on 4
// ranks and P=2 x DP=2 on 4 ranks train a tiny GPT-shaped model (tied embedding and head,
// several micro-batches, gradient clipping active) and must end with the single-process
// parameters, loss and gradient norm after K steps, with SGD and with Muon; bf16 tracks fp32.
// Bad inputs fail with messages naming the problem.
#include "deepspeed/pipe.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <map>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deepspeed/deepspeed.h"
#include "support/expect_throw.h"
#include "support/multi_rank.h"
#include "support/shared_run_dir.h"
#include "support/tiny_pipe_model.h"

namespace deepspeed {
namespace {

using testing::run_ranks;

std::string new_shared_dir() { return testing::new_shared_run_dir("DS_PIPE_OUT"); }
std::string shared_dir() { return std::getenv("DS_PIPE_OUT"); }

constexpr int kMicro = 2;
constexpr int kSteps = 4;

// DS_PIPE_MUON=1: the Muon optimizer instead of SGD. Each stage holds its matrices whole; the
// tied embedding stays on Muon's Adam half by DeepSpeed's name rule.
bool muon_run() {
  const char* v = std::getenv("DS_PIPE_MUON");
  return v != nullptr && std::string(v) == "1";
}

json pipe_config(int gas, int dp, int stage, const std::string& dtype = "fp32") {
  json c{{"train_batch_size", kMicro * gas * dp},
         {"train_micro_batch_size_per_gpu", kMicro},
         {"gradient_accumulation_steps", gas},
         {"gradient_clipping", 0.5},  // below the norm of the first steps: clipping is active
         {"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.2}, {"momentum", 0.9}}}}},
         {"zero_optimization", {{"stage", stage}}}};
  if (dtype == "bf16") c["bf16"] = {{"enabled", true}};
  if (dtype == "bf16_immediate") c["bf16"] = {{"enabled", true}, {"immediate_grad_update", true}};
  if (stage > 0) c["zero_allow_untested_optimizer"] = true;  // SGD under ZeRO, as DeepSpeed asks
  if (muon_run()) {
    c["optimizer"] = {{"type", "Muon"},
                      {"params", {{"lr", 0.02}, {"adam_lr", 0.01}, {"momentum", 0.9}}}};
  }
  return c;
}

// DS_PIPE_CURRICULUM=1: a "seqlen" curriculum over the kPipeSeq tokens; global steps 1, 2, 3
// train on 2, 3 and 4 of them, every later step on 4.
bool curriculum_run() {
  const char* v = std::getenv("DS_PIPE_CURRICULUM");
  return v != nullptr && std::string(v) == "1";
}
const json kCurriculum = {{"enabled", true},
                          {"curriculum_type", "seqlen"},
                          {"min_difficulty", 2},
                          {"max_difficulty", testing::kPipeSeq},
                          {"schedule_type", "fixed_linear"},
                          {"schedule_config",
                           {{"total_curriculum_step", 3}, {"difficulty_step", 1}}}};
std::pair<at::Tensor, at::Tensor> first_tokens(std::pair<at::Tensor, at::Tensor> batch,
                                               int64_t n) {
  return {batch.first.narrow(1, 0, n).contiguous(), batch.second.narrow(1, 0, n).contiguous()};
}

using NamedParams = std::map<std::string, at::Tensor>;

void save_named(const std::string& name, const NamedParams& ps, double loss, double norm,
                double eval_loss) {
  std::vector<at::Tensor> tensors;
  std::string names;
  for (const auto& [n, t] : ps) {
    names += n + "\n";
    tensors.push_back(t.to(at::kFloat));
  }
  tensors.push_back(torch::tensor({loss, norm, eval_loss}, torch::kDouble));
  torch::save(tensors, shared_dir() + "/" + name + ".pt");
  std::ofstream(shared_dir() + "/" + name + ".names") << names;
}

NamedParams load_named(const std::string& dir, const std::string& name, double* loss,
                       double* norm, double* eval_loss) {
  std::vector<at::Tensor> tensors;
  torch::load(tensors, dir + "/" + name + ".pt");
  std::ifstream in(dir + "/" + name + ".names");
  NamedParams out;
  std::string n;
  size_t i = 0;
  while (std::getline(in, n)) out[n] = tensors.at(i++);
  *loss = tensors.back()[0].item<double>();
  *norm = tensors.back()[1].item<double>();
  *eval_loss = tensors.back()[2].item<double>();
  return out;
}

// The single-process engine: the same global batches as `gas` micro-batches of `dp` replicas,
// i.e. gas * dp micro-batches in order. dtype "bf16_fp32_sums": bf16 at ZeRO stage 1 with
// fp32 gradient accumulation, which sums the micro-steps in fp32 (DeepSpeed's BF16_Optimizer).
void train_reference(int gas, int dp, const std::string& dtype) {
  auto model = std::make_shared<testing::TinyPipeReferenceImpl>();
  // Muon's ZeRO stages clip its updates, stage 0 in fp32 the gradients: the reference takes the
  // pipeline's stage.
  const int stage = muon_run() ? std::atoi(std::getenv("DS_PIPE_ZERO")) : 0;
  json config = pipe_config(gas * dp, 1, stage, dtype);
  if (dtype == "bf16_fp32_sums") {
    config = pipe_config(gas * dp, 1, 1, "bf16");
    config["data_types"] = {{"grad_accum_dtype", "fp32"}};
  }
  auto [engine, opt, sched] = initialize(model, config);
  for (int s = 0; s < kSteps; ++s) {
    const int64_t length = curriculum_run() ? std::min<int64_t>(s + 2, testing::kPipeSeq)
                                            : testing::kPipeSeq;
    for (int j = 0; j < gas * dp; ++j) {
      auto [x, y] =
          first_tokens(testing::tiny_pipe_batch(int64_t{s} * gas * dp + j, kMicro), length);
      engine->backward(engine->forward(x, y));
      engine->step();
    }
  }
  // Held-out micro-batches 1000.. (gas * dp of them), without gradients.
  double eval_loss = 0.0;
  {
    torch::NoGradGuard no_grad;
    for (int j = 0; j < gas * dp; ++j) {
      auto [x, y] = testing::tiny_pipe_batch(1000 + j, kMicro);
      eval_loss += model->forward(x, y).item<double>() / (gas * dp);
    }
  }
  NamedParams ps;
  for (const auto& p : model->named_parameters()) ps[p.key()] = p.value().detach().clone();
  save_named("reference", ps, engine->last_loss(), engine->get_global_grad_norm().value_or(-1),
             eval_loss);
}

// One rank of the pipeline; data-parallel rank 0 of each stage saves its stage's parameters.
void train_pipeline(int stages, int gas, int zero_stage, const std::string& dtype) {
  pipe::PipelineModuleOptions o;
  o.num_stages = stages;
  o.loss_fn = testing::tiny_pipe_loss;
  o.seed_layers = true;
  // DS_PIPE_CKPT_INTERVAL: the stages recompute their layers in backward (activation checkpoints).
  if (const char* v = std::getenv("DS_PIPE_CKPT_INTERVAL")) {
    o.activation_checkpoint_interval = std::atoi(v);
  }
  auto module = std::make_shared<pipe::PipelineModule>(testing::tiny_pipe_specs(), o);
  const int dp = module->groups().data().size();
  const int dp_rank = module->groups().coord("data");
  json config = pipe_config(gas, dp, zero_stage, dtype);
  if (curriculum_run()) config["curriculum_learning"] = kCurriculum;
  auto engine = pipe::initialize(module, config);
  ASSERT_EQ(engine->micro_batches(), gas);
  // A curriculum's data iterator cuts its sequences to the difficulty train_batch set.
  auto length = [&]() -> int64_t {
    const CurriculumScheduler* c = engine->curriculum_scheduler_legacy();
    return c == nullptr ? testing::kPipeSeq : c->get_current_difficulty();
  };
  int64_t loaded = 0;
  double loss = 0.0;
  for (int s = 0; s < kSteps; ++s) {
    int j = 0;
    auto iter = [&]() {
      ++loaded;
      return first_tokens(
          testing::tiny_pipe_batch(int64_t{s} * gas * dp + int64_t{dp_rank} * gas + j++, kMicro),
          length());
    };
    loss = engine->train_batch(iter).item<double>();
  }
  // eval_batch over the held-out micro-batches: the mean over micro-batches and replicas.
  int e = 0;
  const double eval_loss = engine->eval_batch([&]() {
    return testing::tiny_pipe_batch(1000 + int64_t{dp_rank} * gas + e++, kMicro);
  }).item<double>();
  loaded += e;
  // The data iterator is consumed on the first and last stages only, once per micro-batch.
  const bool loads = engine->is_first_stage() || engine->is_last_stage();
  EXPECT_EQ(loaded, loads ? int64_t{kSteps + 1} * gas : 0) << "stage " << engine->stage_id();
  EXPECT_EQ(engine->global_steps(), kSteps);
  if (dp_rank != 0) return;
  NamedParams ps;
  for (const auto& p : module->named_parameters()) ps[p.key()] = p.value().detach().clone();
  save_named("stage" + std::to_string(engine->stage_id()), ps, loss,
             engine->get_global_grad_norm().value_or(-1), eval_loss);
}

// Every parameter of the reference is on some stage (the tied embedding on two), equal within
// `rtol` relative to the largest element; loss and global norm agree on every stage (the
// losses within 1e-6 at least: the pipeline averages its micro-batches' in another order).
void compare(const std::string& dir, int stages, double rtol) {
  const double loss_rtol = std::max(rtol, 1e-6);
  double ref_loss = 0, ref_norm = 0, ref_eval = 0;
  NamedParams ref = load_named(dir, "reference", &ref_loss, &ref_norm, &ref_eval);
  std::map<std::string, int> seen;
  for (int s = 0; s < stages; ++s) {
    double loss = 0, norm = 0, eval = 0;
    NamedParams got = load_named(dir, "stage" + std::to_string(s), &loss, &norm, &eval);
    EXPECT_NEAR(loss, ref_loss, loss_rtol * std::abs(ref_loss)) << "stage " << s;
    EXPECT_NEAR(eval, ref_eval, loss_rtol * std::abs(ref_eval)) << "eval_batch on stage " << s;
    EXPECT_NEAR(norm, ref_norm, rtol * std::abs(ref_norm)) << "stage " << s;
    for (const auto& [name, t] : got) {
      ASSERT_TRUE(ref.count(name)) << "stage " << s << " has " << name;
      const at::Tensor& r = ref.at(name);
      const double diff = (t - r).abs().max().item<double>();
      const double scale = r.abs().max().item<double>();
      EXPECT_LE(diff, rtol * scale) << name << " on stage " << s << ": max |diff| " << diff;
      ++seen[name];
    }
  }
  for (const auto& [name, t] : ref) {
    EXPECT_EQ(seen[name], name.rfind("tied_modules.", 0) == 0 && stages > 1 ? 2 : 1) << name;
  }
}

void check_against_reference(int world, int stages, int gas, int zero_stage,
                             const std::string& dtype, double rtol, int ckpt_interval = 0,
                             bool curriculum = false,
                             const std::string& reference_dtype = "fp32", bool muon = false) {
  new_shared_dir();
  testing::RunOptions o;
  o.env = {{"DS_PIPE_MUON", muon ? "1" : "0"},
           {"DS_PIPE_REFERENCE_DTYPE", reference_dtype},
           {"DS_PIPE_CURRICULUM", curriculum ? "1" : "0"},
           {"DS_PIPE_CKPT_INTERVAL", std::to_string(ckpt_interval)},
           {"DS_PIPE_STAGES", std::to_string(stages)},
           {"DS_PIPE_GAS", std::to_string(gas)},
           {"DS_PIPE_ZERO", std::to_string(zero_stage)},
           {"DS_PIPE_DTYPE", dtype},
           {"DS_PIPE_DP", std::to_string(world / stages)}};
  // The reference trains in fp32 unless told otherwise: bf16 is compared with it.
  run_ranks(1, [](int, int) {
    train_reference(std::atoi(std::getenv("DS_PIPE_GAS")), std::atoi(std::getenv("DS_PIPE_DP")),
                    std::getenv("DS_PIPE_REFERENCE_DTYPE"));
  }, o);
  run_ranks(world, [](int, int) {
    train_pipeline(std::atoi(std::getenv("DS_PIPE_STAGES")), std::atoi(std::getenv("DS_PIPE_GAS")),
                   std::atoi(std::getenv("DS_PIPE_ZERO")), std::getenv("DS_PIPE_DTYPE"));
  }, o);
  if (testing::in_rank_process()) return;
  compare(shared_dir(), stages, rtol);
}

TEST(PipeDist, P2MatchesSingleProcessAfter4Steps_Fp32) {
  check_against_reference(2, 2, 4, 0, "fp32", 1e-5);
}

TEST(PipeDist, P4MatchesSingleProcessAfter4Steps_Fp32) {
  check_against_reference(4, 4, 4, 0, "fp32", 1e-5);
}

TEST(PipeDist, P2xDP2MatchesSingleProcessAfter4Steps_Fp32) {
  check_against_reference(4, 2, 3, 0, "fp32", 1e-5);
}

TEST(PipeDist, P2xDP2MatchesSingleProcessAfter4Steps_Zero1) {
  check_against_reference(4, 2, 3, 1, "fp32", 1e-5);
}

// Muon: at stage 0 in fp32 each stage's optimizer orthogonalizes its own matrices after the
// pipeline-wide clipping; under ZeRO-1 each stage's data-parallel pair orthogonalizes its flat
// slices (all-gathered over the pair) before it.
TEST(PipeDist, P2MuonMatchesSingleProcess_Fp32) {
  check_against_reference(2, 2, 4, 0, "fp32", 1e-5, 0, false, "fp32", /*muon=*/true);
}
TEST(PipeDist, P2xDP2MuonMatchesSingleProcess_Zero1) {
  check_against_reference(4, 2, 2, 1, "fp32", 1e-5, 0, false, "fp32", /*muon=*/true);
}

TEST(PipeDist, P2WithActivationCheckpointsMatchesSingleProcess) {
  check_against_reference(2, 2, 4, 0, "fp32", 1e-5, /*ckpt_interval=*/1);
}

// The sequence length changes between batches: the stages negotiate the activation shapes again
// (DeepSpeed's reset_activation_shape) and train as the single process on the cut batches.
TEST(PipeDist, P2WithSeqlenCurriculumMatchesSingleProcess) {
  check_against_reference(2, 2, 2, 0, "fp32", 1e-5, 0, /*curriculum=*/true);
}

TEST(PipeDist, P2Bf16TracksFp32) { check_against_reference(2, 2, 4, 0, "bf16", 3e-2); }

// Matches DeepSpeed's BF16_Optimizer, which a bf16 pipeline trains with: the micro-batches'
// gradients are summed in fp32 (Note [fp32 gradient accumulation]). One stage, so that the
// tied embedding's two uses sum inside autograd as in the single process: then the pipeline
// ends exactly where the engine ends that sums in fp32 (ZeRO 1, fp32 gradient accumulation),
// and a bf16 sum in param.grad would not. bf16.immediate_grad_update sums the same.
TEST(PipeDist, OneStageBf16SumsMicroBatchesInFp32) {
  check_against_reference(1, 1, 4, 0, "bf16", 0.0, 0, false, "bf16_fp32_sums");
  check_against_reference(1, 1, 4, 0, "bf16_immediate", 0.0, 0, false, "bf16_fp32_sums");
}

// fp16 with elementwise layers only (Debian's LibTorch 1.13 has no fp16 matmul on CPU).
struct ScaleImpl : torch::nn::Module {
  explicit ScaleImpl(double init) { w = register_parameter("w", torch::full({4}, init)); }
  at::Tensor forward(const at::Tensor& x) { return x.to(w.scalar_type()) * w; }
  at::Tensor w;
};
TORCH_MODULE(Scale);

bool g_inject_overflow = false;  // the last stage's hook turns its gradient into inf

// An overflow in the last stage's gradients alone skips the step on every stage (the vote spans
// the pipeline); the next step applies everywhere.
TEST(PipeDist, Fp16OverflowOnOneStageSkipsTheStepEverywhere) {
  run_ranks(2, [](int, int) {
    std::vector<pipe::LayerSpec> specs;
    for (int i = 0; i < 4; ++i) specs.push_back(pipe::LayerSpec::of<Scale>("Scale", 1.0 + 0.1 * i));
    pipe::PipelineModuleOptions o;
    o.num_stages = 2;
    o.partition_method = "uniform";
    o.loss_fn = [](const at::Tensor& out, const at::Tensor& y) {
      return torch::mse_loss(out.to(at::kFloat), y);
    };
    auto module = std::make_shared<pipe::PipelineModule>(specs, o);
    json c = pipe_config(2, 1, 0);
    c["fp16"] = {{"enabled", true}, {"initial_scale_power", 8}};
    auto engine = pipe::initialize(module, c);
    if (engine->is_last_stage()) {
      module->layer_module(3)->named_parameters()["w"].register_hook([](const at::Tensor& g) {
        return g_inject_overflow ? g * std::numeric_limits<float>::infinity() : g;
      });
    }
    auto snapshot = [&] {
      std::vector<at::Tensor> ps;
      for (const auto& p : module->parameters()) ps.push_back(p.detach().clone());
      return ps;
    };
    auto iter = [] {
      return std::make_pair(torch::linspace(-1, 1, 8).reshape({2, 4}), torch::zeros({2, 4}));
    };
    const auto before = snapshot();
    g_inject_overflow = true;
    engine->train_batch(iter);
    EXPECT_EQ(engine->skipped_steps(), 1) << "stage " << engine->stage_id();
    const auto after_skip = snapshot();
    for (size_t i = 0; i < before.size(); ++i) EXPECT_TRUE(torch::equal(before[i], after_skip[i]));
    g_inject_overflow = false;
    engine->train_batch(iter);
    EXPECT_EQ(engine->skipped_steps(), 1);
    EXPECT_FALSE(torch::equal(snapshot()[0], before[0])) << "stage " << engine->stage_id();
  });
}

pipe::PipelineModuleOptions options(int stages) {
  pipe::PipelineModuleOptions o;
  o.num_stages = stages;
  o.loss_fn = testing::tiny_pipe_loss;
  o.seed_layers = true;
  return o;
}

TEST(PipeDist, BadTopologiesAreConfigErrorsOnEveryRank) {
  run_ranks(2, [](int, int) {
    EXPECT_THROW_WITH(pipe::PipelineModule(testing::tiny_pipe_specs(), options(3)), ConfigError,
                      "num_stages (3) must divide the world size (2)");
    // Every stage needs a layer.
    std::vector<pipe::LayerSpec> one{testing::tiny_pipe_specs().at(1)};
    EXPECT_THROW_WITH(pipe::PipelineModule(one, options(2)), ConfigError,
                      "2 stages for 1 layers");
  });
}

TEST(PipeDist, ZeroStage2And3AndAWrongStageCountAreRefusedByName) {
  run_ranks(2, [](int, int) {
    auto module = std::make_shared<pipe::PipelineModule>(testing::tiny_pipe_specs(), options(2));
    for (int stage : {2, 3}) {
      EXPECT_THROW_WITH(pipe::initialize(module, pipe_config(2, 1, stage)), NotSupportedError,
                        "zero_optimization.stage is " + std::to_string(stage) +
                            "; ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism");
    }
    json c = pipe_config(2, 1, 0);
    c["pipeline"] = {{"stages", 4}};
    EXPECT_THROW_WITH(pipe::initialize(module, c), ConfigError,
                      "pipeline.stages is 4 but the PipelineModule has 2 stages");
    c["pipeline"] = {{"stages", 2}, {"activation_checkpoint_interval", 1}};
    auto every_two_options = options(2);
    every_two_options.activation_checkpoint_interval = 2;
    auto every_two =
        std::make_shared<pipe::PipelineModule>(testing::tiny_pipe_specs(), every_two_options);
    EXPECT_THROW_WITH(pipe::initialize(every_two, c), ConfigError,
                      "pipeline.activation_checkpoint_interval is 1 but the PipelineModule was "
                      "built with 2");
    c["pipeline"] = {{"stages", "auto"}, {"partition", "uniform"}, {"seed_layers", true},
                     {"pipe_partitioned", false}, {"grad_partitioned", false}};
    auto engine = pipe::initialize(module, c);
    EXPECT_EQ(engine->num_stages(), 2);
  });
}

// The second micro-batch is larger than the first: the sending stage names both shapes; the
// receiving stage's wait fails instead of hanging.
TEST(PipeDist, MismatchedMicroBatchShapesAreNamed) {
  testing::RunOptions o;
  o.comm_timeout_ms = 5000;
  run_ranks(2, [](int, int) {
    auto module = std::make_shared<pipe::PipelineModule>(testing::tiny_pipe_specs(), options(2));
    auto engine = pipe::initialize(module, pipe_config(4, 1, 0));
    int j = 0;
    auto iter = [&]() {
      auto b = testing::tiny_pipe_batch(j, j == 0 ? kMicro : kMicro + 1);
      ++j;
      return b;
    };
    if (engine->is_first_stage()) {
      EXPECT_THROW_WITH(engine->train_batch(iter), UsageError,
                        "a micro-batch's activation has shape [3, 4, 8] but the shape "
                        "negotiated with stage 1 on the first micro-batch is [2, 4, 8]");
    } else {
      EXPECT_THROW_WITH(engine->train_batch(iter), CommError, "from rank 0");
    }
  }, o);
}

}  // namespace
}  // namespace deepspeed
