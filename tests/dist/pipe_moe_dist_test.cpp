// MoE layers inside pipeline stages, on Gloo ranks. A model of dense and MoE layers (E = 4
// experts, ep_size 2, top-1, load-balancing loss weighted 0.01) as pipeline layer specs: 2 stages
// x 2 data-parallel replicas on 4 ranks end with the parameters (every expert, on its rank), the
// loss, the load-balancing loss and the gradient norm of the same layers trained by the ordinary
// engine on 2 data-parallel ranks. Each stage back-propagates its own layers' load-balancing
// losses; with a stage without MoE layers, with activation checkpoints and with ZeRO-1 too. A
// checkpoint resumes bit for bit on the same stages; another stage count is refused by name,
// and takes ds_to_universal's conversion (experts by global id).
#include "deepspeed/pipe.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deepspeed/deepspeed.h"
#include "deepspeed/moe.h"
#include "deepspeed/universal_checkpoint.h"
#include "support/moe_net.h"
#include "support/multi_rank.h"
#include "support/shared_run_dir.h"

namespace deepspeed {
namespace {

using testing::run_ranks;
using testing::moe_net::ExpertMlp;
using testing::moe_net::kExperts;
using testing::moe_net::kHidden;
using testing::moe_net::tokens;

constexpr int64_t kTokens = 8;  // per micro-batch
constexpr int kGas = 2;
constexpr int kDp = 2;
constexpr double kAuxCoef = 0.01;

std::string shared_dir() { return std::getenv("DS_PIPE_MOE_OUT"); }

// x + MoE(x), keeping the load-balancing loss of its last forward.
struct MoEBlockImpl : torch::nn::Module {
  MoEBlockImpl() {
    moe::MoEOptions o;
    o.num_experts = kExperts;
    o.ep_size = 2;
    o.k = 1;
    // Routing without random draws: the pipeline runs its stages' layers in another order than
    // one process, so the RNG streams would differ.
    o.drop_tokens = false;
    o.use_rts = false;
    moe = register_module("moe", moe::MoE(kHidden, torch::nn::AnyModule(ExpertMlp()), o));
  }
  at::Tensor forward(const at::Tensor& x) {
    auto [out, aux, counts] = moe->forward(x);
    l_aux = aux;
    return x + out;
  }
  moe::MoE moe{nullptr};
  at::Tensor l_aux;
};
TORCH_MODULE(MoEBlock);

pipe::LayerSpec moe_block_spec() {
  pipe::LayerSpec s;
  s.type_name = "MoEBlock";
  s.build = [] {
    MoEBlock block;
    auto impl = block.ptr();
    pipe::Layer l{impl, [impl](const at::Tensor& x) { return impl->forward(x); }};
    l.aux_loss = [impl] { return impl->l_aux; };
    return l;
  };
  return s;
}

struct TanhLinearImpl : torch::nn::Module {
  TanhLinearImpl(int64_t in, int64_t out) {
    fc = register_module("fc", torch::nn::Linear(in, out));
  }
  at::Tensor forward(const at::Tensor& x) { return torch::tanh(fc(x)); }
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(TanhLinear);

// in (4 -> H) | MoE | dense | MoE (when `second_moe`, else dense) | head (H -> 2). Two stages
// split it 3 | 2: an MoE layer on each stage, or none on the last.
std::vector<pipe::LayerSpec> specs(bool second_moe) {
  using pipe::LayerSpec;
  std::vector<LayerSpec> s;
  s.push_back(LayerSpec::of<TanhLinear>("TanhLinear", int64_t{4}, kHidden));
  s.push_back(moe_block_spec());
  s.push_back(LayerSpec::of<TanhLinear>("TanhLinear", kHidden, kHidden));
  s.push_back(second_moe ? moe_block_spec()
                         : LayerSpec::of<TanhLinear>("TanhLinear", kHidden, kHidden));
  s.push_back(LayerSpec::of<torch::nn::Linear>("Linear", torch::nn::LinearOptions(kHidden, 2)));
  return s;
}

at::Tensor mse(const at::Tensor& out, const at::Tensor& y) {
  return torch::nn::functional::mse_loss(out.to(at::kFloat), y);
}

// The same layers as one module, each built from the seed seed_layers gives it, with the
// pipeline's names ("<layer index>."): loss = MSE + kAuxCoef * the MoE layers' losses.
struct ReferenceImpl : torch::nn::Module {
  explicit ReferenceImpl(bool second_moe) {
    auto all = specs(second_moe);
    for (size_t i = 0; i < all.size(); ++i) {
      torch::manual_seed(1234 + i);
      layers.push_back(all[i].build());
      register_module(std::to_string(i), layers.back().module);
    }
  }
  at::Tensor forward(const at::Tensor& x, const at::Tensor& y) {
    at::Tensor h = x, aux = torch::zeros({});
    for (auto& l : layers) {
      h = l.forward(h);
      if (l.aux_loss) aux = aux + l.aux_loss();
    }
    last_aux = aux.item<double>();
    return mse(h, y) + kAuxCoef * aux;
  }
  std::vector<pipe::Layer> layers;
  double last_aux = 0.0;
};

json config(int zero_stage, bool load_universal = false) {
  json c{{"train_batch_size", kTokens * kGas * kDp},
         {"train_micro_batch_size_per_gpu", kTokens},
         {"gradient_clipping", 0.05},  // below the first steps' norms: clipping is active
         {"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.3}, {"momentum", 0.5}}}}},
         {"zero_optimization", {{"stage", zero_stage}}}};
  if (zero_stage > 0) c["zero_allow_untested_optimizer"] = true;
  if (load_universal) c["checkpoint"] = {{"load_universal", true}};
  return c;
}

// Micro-batch j of step s on data-parallel rank r: the same tokens in both runs.
std::pair<at::Tensor, at::Tensor> micro_batch(int s, int r, int j) {
  return tokens(((int64_t{s} * kDp + r) * kGas + j) * kTokens, kTokens);
}

struct Result {
  std::map<std::string, at::Tensor> params;
  std::vector<double> losses, aux, norms;  // per step
};

void save(const std::string& name, torch::nn::Module& m, const Result& r) {
  std::vector<at::Tensor> ts;
  std::ofstream names(shared_dir() + "/" + name + ".names");
  for (const auto& p : m.named_parameters()) {
    names << p.key() << "\n";
    ts.push_back(p.value().detach().to(at::kFloat).clone());
  }
  ts.push_back(torch::tensor(r.losses, torch::kDouble));
  ts.push_back(torch::tensor(r.aux, torch::kDouble));
  ts.push_back(torch::tensor(r.norms, torch::kDouble));
  torch::save(ts, shared_dir() + "/" + name + ".pt");
}

Result load(const std::string& name) {
  std::vector<at::Tensor> ts;
  torch::load(ts, shared_dir() + "/" + name + ".pt");
  auto vec = [](const at::Tensor& t) {
    return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
  };
  Result r;
  r.norms = vec(ts.back());
  ts.pop_back();
  r.aux = vec(ts.back());
  ts.pop_back();
  r.losses = vec(ts.back());
  ts.pop_back();
  std::ifstream names(shared_dir() + "/" + name + ".names");
  size_t i = 0;
  for (std::string n; std::getline(names, n);) r.params[n] = ts.at(i++);
  return r;
}

void train_reference(bool second_moe, int zero_stage, int steps) {
  const int rank = comm::get_rank();
  auto model = std::make_shared<ReferenceImpl>(second_moe);
  auto [engine, opt, sched] = initialize(model, config(zero_stage));
  Result r;
  for (int s = 0; s < steps; ++s) {
    at::Tensor sums = torch::zeros({2}, torch::kDouble);  // loss, aux over the micro-batches
    for (int j = 0; j < kGas; ++j) {
      auto [x, y] = micro_batch(s, rank, j);
      auto loss = engine->forward(x, y);
      sums[0] += loss.item<double>() / kGas;
      sums[1] += model->last_aux / kGas;
      engine->backward(loss);
      engine->step();
    }
    comm::all_reduce(sums, comm::ReduceOp::kAvg);
    r.losses.push_back(sums[0].item<double>());
    r.aux.push_back(sums[1].item<double>());
    r.norms.push_back(engine->get_global_grad_norm().value_or(-1.0));
  }
  save("ref_r" + std::to_string(rank), *model, r);
}

std::shared_ptr<pipe::PipelineEngine> pipeline(bool second_moe, int zero_stage, int interval,
                                               int stages = 2, bool load_universal = false) {
  pipe::PipelineModuleOptions o;
  o.num_stages = stages;
  o.loss_fn = mse;
  o.seed_layers = true;
  o.partition_method = "uniform";
  o.activation_checkpoint_interval = interval;
  o.aux_loss_coef = kAuxCoef;
  auto module = std::make_shared<pipe::PipelineModule>(specs(second_moe), o);
  return pipe::initialize(module, config(zero_stage, load_universal));
}

void train_steps(pipe::PipelineEngine& engine, int first, int last, Result* r) {
  const int dp_rank = engine.pipeline_module().groups().coord("data");
  for (int s = first; s < last; ++s) {
    int j = 0;
    const double loss =
        engine.train_batch([&] { return micro_batch(s, dp_rank, j++); }).item<double>();
    r->losses.push_back(loss);
    r->aux.push_back(engine.agg_aux_loss());
    r->norms.push_back(engine.get_global_grad_norm().value_or(-1.0));
  }
}

std::string pipe_name(const std::string& prefix, pipe::PipelineEngine& engine) {
  return prefix + "_r" + std::to_string(engine.pipeline_module().groups().coord("data")) + "_s" +
         std::to_string(engine.stage_id());
}

// Every stage's parameters on data-parallel rank r (its experts included) equal the reference's
// rank r, each reference parameter on exactly one stage; the loss, the load-balancing loss and
// the norm agree on every rank.
void compare_with_reference(const std::string& prefix, double rtol) {
  for (int r = 0; r < kDp; ++r) {
    Result ref = load("ref_r" + std::to_string(r));
    std::set<std::string> seen;
    for (int s = 0; s < 2; ++s) {
      const std::string name = prefix + "_r" + std::to_string(r) + "_s" + std::to_string(s);
      Result got = load(name);
      using Series = std::vector<double> Result::*;
      for (auto [key, series] : {std::pair<const char*, Series>{"loss", &Result::losses},
                                 {"aux", &Result::aux}, {"norm", &Result::norms}}) {
        const auto& want = ref.*series;
        const auto& have = got.*series;
        ASSERT_EQ(have.size(), want.size()) << name << " " << key;
        for (size_t i = 0; i < want.size(); ++i) {
          EXPECT_NEAR(have[i], want[i], rtol * std::abs(want[i])) << name << " " << key
                                                                  << " step " << i;
        }
      }
      for (const auto& [pname, t] : got.params) {
        ASSERT_TRUE(ref.params.count(pname)) << name << " has " << pname;
        const at::Tensor& want = ref.params.at(pname);
        const double diff = (t - want).abs().max().item<double>();
        EXPECT_LE(diff, rtol * want.abs().max().item<double>()) << name << " " << pname;
        EXPECT_TRUE(seen.insert(pname).second) << pname << " on two stages";
      }
    }
    EXPECT_EQ(seen.size(), ref.params.size()) << "rank " << r;
  }
  // The first step's parameters moved (the comparison is not between untouched models).
  EXPECT_GT(load("ref_r0").losses.front(), load("ref_r0").losses.back());
}

void check_against_reference(bool second_moe, int zero_stage, int interval) {
  testing::new_shared_run_dir("DS_PIPE_MOE_OUT");
  testing::RunOptions o;
  o.env = {{"DS_SECOND_MOE", second_moe ? "1" : "0"},
           {"DS_ZERO", std::to_string(zero_stage)},
           {"DS_INTERVAL", std::to_string(interval)}};
  auto second = [] { return std::getenv("DS_SECOND_MOE")[0] == '1'; };
  auto zero = [] { return std::atoi(std::getenv("DS_ZERO")); };
  run_ranks(kDp, [&](int, int) { train_reference(second(), zero(), 4); }, o);
  run_ranks(2 * kDp, [&](int, int) {
    auto engine = pipeline(second(), zero(), std::atoi(std::getenv("DS_INTERVAL")));
    EXPECT_EQ(engine->pipeline_module().has_aux_loss(), engine->stage_id() == 0 || second());
    Result r;
    train_steps(*engine, 0, 4, &r);
    save(pipe_name("pipe", *engine), engine->pipeline_module(), r);
  }, o);
  if (testing::in_rank_process()) return;
  compare_with_reference("pipe", 1e-5);
}

TEST(PipeMoEDist, P2xDP2MatchesTheDataParallelEngine) { check_against_reference(true, 0, 0); }

TEST(PipeMoEDist, P2xDP2WithoutMoEOnTheLastStageMatches) { check_against_reference(false, 0, 0); }

TEST(PipeMoEDist, P2xDP2WithActivationCheckpointsMatches) { check_against_reference(true, 0, 1); }

TEST(PipeMoEDist, P2xDP2UnderZero1Matches) { check_against_reference(true, 1, 0); }

// P=2 x DP=2 under ZeRO-1 with MoE on both stages: 4 steps straight ("straight_r<d>_s<s>"),
// and 2 steps saved to <shared dir>/ckpt.
void train_straight_and_save_after_two_steps() {
  testing::new_shared_run_dir("DS_PIPE_MOE_OUT");
  run_ranks(2 * kDp, [](int, int) {
    auto engine = pipeline(true, 1, 0);
    Result r;
    train_steps(*engine, 0, 4, &r);
    save(pipe_name("straight", *engine), engine->pipeline_module(), r);
  });
  run_ranks(2 * kDp, [](int, int) {
    auto engine = pipeline(true, 1, 0);
    Result r;
    train_steps(*engine, 0, 2, &r);
    engine->save_checkpoint(shared_dir() + "/ckpt");
  });
}

// 2 steps, save, resume in new processes for 2 more: bit for bit the 4 steps straight. The
// checkpoint onto one stage is refused by name (ds_to_universal's output loads there, below).
TEST(PipeMoEDist, ResumesExactlyOnTheSameStagesAndRefusesAnotherStageCount) {
  train_straight_and_save_after_two_steps();
  run_ranks(2 * kDp, [](int, int) {
    auto engine = pipeline(true, 1, 0);
    engine->load_checkpoint(shared_dir() + "/ckpt");
    Result r;
    train_steps(*engine, 2, 4, &r);
    save(pipe_name("resumed", *engine), engine->pipeline_module(), r);
  });
  run_ranks(kDp, [](int, int) {
    auto engine = pipeline(true, 1, 0, /*stages=*/1);
    LoadCheckpointOptions o;
    o.load_module_only = true;
    try {
      engine->load_checkpoint(shared_dir() + "/ckpt", std::nullopt, o);
      ADD_FAILURE() << "a pipeline with MoE layers loaded onto another stage count";
    } catch (const NotSupportedError& e) {
      EXPECT_NE(std::string(e.what()).find("MoE"), std::string::npos) << e.what();
    }
  });
  if (testing::in_rank_process()) return;
  for (const char* name : {"_r0_s0", "_r0_s1", "_r1_s0", "_r1_s1"}) {
    Result a = load(std::string("straight") + name), b = load(std::string("resumed") + name);
    for (const auto& [pname, t] : a.params) {
      EXPECT_TRUE(torch::equal(t, b.params.at(pname))) << pname;
    }
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_EQ(b.losses[i], a.losses[2 + i]) << name << " step " << 2 + i;
      EXPECT_EQ(b.aux[i], a.aux[2 + i]) << name << " step " << 2 + i;
    }
  }
}

// The ZeRO-1 checkpoint after 2 steps through ds_to_universal: each stage's experts by global
// id; it resumes on the same 2 stages and on 1 stage (2 data-parallel ranks, the same experts
// per rank) and ends where the 4 steps straight do (float rounding: the norm sums differently).
TEST(PipeMoEDist, UniversalCheckpointResumesOnTwoStagesAndOne) {
  train_straight_and_save_after_two_steps();
  if (!testing::in_rank_process()) {
    const std::string dir = shared_dir() + "/ckpt";
    const auto c =
        checkpoint::ds_to_universal(dir + "/global_step2", dir + "/global_step2_universal");
    EXPECT_EQ(c.pp_degree, 2);
    for (int layer : {1, 3}) {  // the MoE layers of stages 0 and 1
      for (int e = 0; e < kExperts; ++e) {
        const std::string folder = dir + "/global_step2_universal/zero/" +
                                   std::to_string(layer) +
                                   ".moe.deepspeed_moe.experts.deepspeed_experts." +
                                   std::to_string(e) + ".fc1.weight/";
        for (const char* state : {"fp32.pt", "momentum_buffer.pt"}) {  // SGD's
          EXPECT_TRUE(std::filesystem::exists(folder + state)) << folder << state;
        }
      }
    }
  }
  for (int stages : {2, 1}) {
    testing::RunOptions o;
    o.env = {{"DS_STAGES", std::to_string(stages)}};
    run_ranks(stages * kDp, [](int, int) {
      const int p = std::atoi(std::getenv("DS_STAGES"));
      auto engine = pipeline(true, 1, 0, p, /*load_universal=*/true);
      ASSERT_TRUE(engine->load_checkpoint(shared_dir() + "/ckpt").load_path.has_value());
      EXPECT_EQ(engine->global_steps(), 2);
      Result r;
      train_steps(*engine, 2, 4, &r);
      save(pipe_name("universal_p" + std::to_string(p), *engine), engine->pipeline_module(), r);
    }, o);
  }
  if (testing::in_rank_process()) return;
  for (int r = 0; r < kDp; ++r) {
    const std::string rank = "_r" + std::to_string(r);
    std::map<std::string, at::Tensor> straight;
    std::vector<double> losses;
    for (int s = 0; s < 2; ++s) {
      Result part = load("straight" + rank + "_s" + std::to_string(s));
      straight.insert(part.params.begin(), part.params.end());
      losses = part.losses;
    }
    for (const std::string& run : {std::string("universal_p2"), std::string("universal_p1")}) {
      std::map<std::string, at::Tensor> got;
      std::vector<double> got_losses;
      for (int s = 0; s < (run == "universal_p2" ? 2 : 1); ++s) {
        Result part = load(run + rank + "_s" + std::to_string(s));
        got.insert(part.params.begin(), part.params.end());
        got_losses = part.losses;
      }
      ASSERT_EQ(got.size(), straight.size()) << run;
      for (const auto& [name, want] : straight) {
        const double diff = (got.at(name) - want).abs().max().item<double>();
        EXPECT_LE(diff, 1e-5 * want.abs().max().item<double>()) << run << rank << " " << name;
      }
      for (size_t i = 0; i < 2; ++i) {
        EXPECT_NEAR(got_losses[i], losses[2 + i], 1e-5 * losses[2 + i]) << run << " step " << 2 + i;
      }
    }
  }
}

// An auxiliary loss that is not a scalar is a UsageError naming the layer and the shape.
TEST(PipeMoEDist, ANonScalarAuxLossIsNamed) {
  run_ranks(1, [](int, int) {
    pipe::LayerSpec bad;
    bad.type_name = "Bad";
    bad.build = [] {
      auto fc = torch::nn::Linear(2, 2).ptr();
      pipe::Layer l{fc, [fc](const at::Tensor& x) { return fc->forward(x); }};
      l.aux_loss = [fc] { return fc->weight.sum(0); };
      return l;
    };
    pipe::PipelineModuleOptions o;
    o.num_stages = 1;
    o.loss_fn = mse;
    pipe::PipelineModule module({pipe::LayerSpec::of<torch::nn::Linear>("Linear", 2, 2), bad}, o);
    try {
      module.forward(torch::ones({3, 2}));
      ADD_FAILURE() << "a non-scalar auxiliary loss was accepted";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("layer 1's aux_loss gave shape [2]"), std::string::npos)
          << e.what();
    }
  });
}

}  // namespace
}  // namespace deepspeed
