// MoE with expert parallelism on Gloo ranks. With drop_tokens off, E = 4 experts: ep_size 2 on 2
// ranks, ep_size 2 and 4 on 4 ranks end with the same parameters (every expert, by global id,
// and the dense ones) and the same global gradient norms as ep_size 1 (experts replicated) on
// the same ranks, top-1 and top-2, with and without clipping; with the auxiliary loss off, as the
// single-process model trained on all ranks' tokens. A rank whose expert gets no token neither
// hangs nor moves it. ZeRO-3 and expert parallelism with ZeRO 1/2 are refused by name.
#include "deepspeed/deepspeed.h"
#include "deepspeed/moe.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deepspeed/checkpoint.h"
#include "support/multi_rank.h"
#include "support/shared_run_dir.h"

namespace deepspeed {
namespace {

using testing::run_ranks;

constexpr int64_t kHidden = 6;
constexpr int64_t kExperts = 4;
constexpr int64_t kTokensPerRank = 12;

// The expert: a two-layer MLP (Cloneable: the MoE layer deep-copies it per local expert).
struct ExpertMlpImpl : torch::nn::Cloneable<ExpertMlpImpl> {
  ExpertMlpImpl() { reset(); }
  void reset() override {
    fc1 = register_module("fc1", torch::nn::Linear(kHidden, 2 * kHidden));
    fc2 = register_module("fc2", torch::nn::Linear(2 * kHidden, kHidden));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::tanh(fc1(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(ExpertMlp);

struct MoENetImpl : torch::nn::Module {
  MoENetImpl(const moe::MoEOptions& o, double aux_coef) : aux_coef(aux_coef) {
    torch::manual_seed(77);
    embed = register_module("embed", torch::nn::Linear(4, kHidden));
    moe = register_module("moe", moe::MoE(kHidden, torch::nn::AnyModule(ExpertMlp()), o));
    head = register_module("head", torch::nn::Linear(kHidden, 2));
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& y) {
    auto h = torch::tanh(embed(x));
    auto [m, l_aux, counts] = moe->forward(h);
    auto loss = torch::nn::functional::mse_loss(head(h + m), y);
    last_aux = l_aux.item<double>();
    return aux_coef != 0.0 ? loss + aux_coef * l_aux : loss;
  }
  // Expert `global` starts from its own seed, whichever rank holds it.
  void init_experts() {
    torch::NoGradGuard ng;
    for (int64_t i = 0; i < moe->num_local_experts(); ++i) {
      torch::manual_seed(1000 + moe->global_expert_id(i));
      for (auto& p : moe->deepspeed_moe->experts->deepspeed_experts[i]->parameters()) {
        p.copy_(torch::randn(p.sizes()) * 0.5);
      }
    }
  }
  double aux_coef;
  double last_aux = 0.0;
  torch::nn::Linear embed{nullptr}, head{nullptr};
  moe::MoE moe{nullptr};
};

// Token t of the global stream (the same in every process).
std::pair<torch::Tensor, torch::Tensor> tokens(int64_t first, int64_t count) {
  auto g = torch::arange(first, first + count, torch::kFloat).unsqueeze(1);
  auto x = torch::cat({torch::sin(g), torch::cos(g * 0.7), torch::sin(g * 1.3), torch::cos(g * 0.2)}, 1);
  auto y = torch::cat({torch::sin(g * 0.5), torch::cos(g * 0.3)}, 1);
  return {x, y};
}

struct Case {
  int64_t k = 1;
  bool top2_sampling = true;
  double clip = 0.0;
  double aux_coef = 0.01;
  int stage = 0;
};

constexpr int kSteps = 4;

// The directory every run_ranks() call of the current test shares (set at the test's start).
std::string g_dir;
void share_dir() { g_dir = testing::new_shared_run_dir("DS_MOE_TEST_DIR"); }

// Trains on `world` ranks (each rank `tokens_per_rank` tokens a step) and writes every expert by
// global id, the dense parameters and the per-step norms under `tag`.
void train_and_save(int rank, int world, int64_t ep_size, const Case& c, const std::string& tag,
                    int64_t tokens_per_rank) {
  moe::MoEOptions o;
  o.num_experts = kExperts;
  o.ep_size = ep_size;
  o.k = c.k;
  o.drop_tokens = false;
  o.top2_2nd_expert_sampling = c.top2_sampling;
  auto model = std::make_shared<MoENetImpl>(o, c.aux_coef);
  model->moe->set_deepspeed_parallelism();  // collective: expert ids known before initialize
  model->init_experts();
  json config{{"train_micro_batch_size_per_gpu", tokens_per_rank},
              {"gradient_accumulation_steps", 1},
              {"gradient_clipping", c.clip},
              {"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.2}, {"momentum", 0.5}}}}},
              {"zero_optimization", {{"stage", c.stage}}}};
  auto [engine, opt, sched] = initialize(model, config);
  // The gating's random draws (RTS, Gumbel) depend only on the rank and the step.
  torch::manual_seed(4242 + rank);
  std::vector<double> norms;
  for (int s = 0; s < kSteps; ++s) {
    auto [x, y] = tokens((s * world + rank) * tokens_per_rank, tokens_per_rank);
    engine->backward(engine->forward(x, y));
    engine->step();
    norms.push_back(engine->get_global_grad_norm().value_or(-1.0));
  }
  const std::string dir = g_dir;
  auto& moe = *model->moe;
  const bool writer = moe.ep_groups() == nullptr || moe.ep_groups()->expert_data_parallel.rank() == 0;
  if (writer) {
    for (int64_t i = 0; i < moe.num_local_experts(); ++i) {
      std::vector<at::Tensor> ps;
      for (auto& p : moe.deepspeed_moe->experts->deepspeed_experts[i]->parameters()) {
        ps.push_back(p.detach().clone());
      }
      torch::save(ps, dir + "/" + tag + "_expert" + std::to_string(moe.global_expert_id(i)) + ".pt");
    }
  }
  if (rank == 0) {
    std::vector<at::Tensor> dense;
    for (auto& p : model->named_parameters()) {
      if (p.key().find("deepspeed_experts") == std::string::npos) dense.push_back(p.value().detach().clone());
    }
    torch::save(dense, dir + "/" + tag + "_dense.pt");
    torch::save(std::vector<at::Tensor>{torch::tensor(norms, torch::kDouble)}, dir + "/" + tag + "_norms.pt");
  }
}

std::vector<at::Tensor> load(const std::string& name) {
  std::vector<at::Tensor> ps;
  torch::load(ps, g_dir + "/" + name + ".pt");
  return ps;
}

void expect_close(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b,
                  const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(torch::allclose(a[i], b[i], 1e-5, 1e-7))
        << what << " tensor " << i << " max diff " << (a[i] - b[i]).abs().max().item<double>();
  }
}

void expect_same_training(const std::string& ref, const std::string& got) {
  for (int64_t e = 0; e < kExperts; ++e) {
    expect_close(load(ref + "_expert" + std::to_string(e)), load(got + "_expert" + std::to_string(e)),
                 got + " expert " + std::to_string(e));
  }
  expect_close(load(ref + "_dense"), load(got + "_dense"), got + " dense");
  expect_close(load(ref + "_norms"), load(got + "_norms"), got + " grad norms");
}

void compare_ep_sizes(int world, const std::vector<int64_t>& ep_sizes, const Case& c) {
  share_dir();
  const std::string base = "w" + std::to_string(world) + "_k" + std::to_string(c.k);
  for (int64_t ep : ep_sizes) {
    const std::string tag = base + "_ep" + std::to_string(ep);
    run_ranks(world, [&](int rank, int w) { train_and_save(rank, w, ep, c, tag, kTokensPerRank); });
  }
  if (testing::in_rank_process()) return;
  for (int64_t ep : ep_sizes) {
    if (ep != 1) expect_same_training(base + "_ep1", base + "_ep" + std::to_string(ep));
  }
  // The parameters moved: the comparison is not between two untouched models.
  auto start = MoENetImpl(moe::MoEOptions{}, 0).embed->weight;
  EXPECT_FALSE(torch::allclose(load(base + "_ep1_dense")[0], start));
}

TEST(MoEDist, Top1EpSize2On2RanksEqualsReplicatedExperts) {
  compare_ep_sizes(2, {1, 2}, Case{1, true, 0.0});
}
TEST(MoEDist, Top2EpSize2On2RanksEqualsReplicatedExpertsWithClipping) {
  compare_ep_sizes(2, {1, 2}, Case{2, true, 0.05});
}
TEST(MoEDist, Top1EpSizes2And4On4RanksEqualReplicatedExpertsWithClipping) {
  compare_ep_sizes(4, {1, 2, 4}, Case{1, true, 0.05});
}
TEST(MoEDist, Top2EpSizes2And4On4RanksEqualReplicatedExperts) {
  compare_ep_sizes(4, {1, 2, 4}, Case{2, true, 0.0});
}

// Without the auxiliary loss (a product of per-rank means) the ranks' average gradient is the
// gradient of the whole batch: ep_size 2 on 2 ranks and 4 on 4 ranks train as one process
// seeing every token.
TEST(MoEDist, WithoutAuxLossExpertParallelEqualsTheSingleProcessModel) {
  share_dir();
  for (int64_t k : {1, 2}) {
    Case c{k, /*top2_sampling=*/false, 0.05, /*aux_coef=*/0.0};
    const std::string base = "single_k" + std::to_string(k);
    for (int world : {2, 4}) {
      run_ranks(1, [&](int rank, int) {
        train_and_save(rank, 1, 1, c, base + "_w" + std::to_string(world) + "_ref",
                       kTokensPerRank * world);
      });
      // One process over `world` ranks' tokens reads them in the same order.
      run_ranks(world, [&](int rank, int w) {
        train_and_save(rank, w, w, c, base + "_w" + std::to_string(w) + "_ep", kTokensPerRank);
      });
      if (!testing::in_rank_process()) {
        expect_same_training(base + "_w" + std::to_string(world) + "_ref",
                             base + "_w" + std::to_string(world) + "_ep");
      }
    }
  }
}

// Every token goes to expert 0 (a zero gate picks the first expert): rank 1's expert gets no
// token. Nobody hangs, its gradient is zero (it does not move), expert 0 does.
TEST(MoEDist, AnExpertWithoutTokensDoesNotHangAndGetsZeroGradients) {
  for (bool drop : {false, true}) {
    run_ranks(2, [drop](int rank, int) {
      moe::MoEOptions o;
      o.num_experts = 2;
      o.ep_size = 2;
      o.drop_tokens = drop;
      o.capacity_factor = 2.0;
      auto model = std::make_shared<MoENetImpl>(o, 0.01);
      {
        torch::NoGradGuard ng;
        model->moe->deepspeed_moe->gate->wg->weight.zero_();
      }
      model->moe->deepspeed_moe->gate->wg->weight.set_requires_grad(false);
      json config{{"train_micro_batch_size_per_gpu", kTokensPerRank},
                  {"gradient_clipping", 1.0},
                  {"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.5}}}}}};
      auto [engine, opt, sched] = initialize(model, config);
      auto expert = model->moe->deepspeed_moe->experts->deepspeed_experts[0]->parameters();
      std::vector<at::Tensor> before;
      for (auto& p : expert) before.push_back(p.detach().clone());
      for (int s = 0; s < 3; ++s) {
        auto [x, y] = tokens((s * 2 + rank) * kTokensPerRank, kTokensPerRank);
        auto loss = engine->forward(x, y);
        auto counts = model->moe->deepspeed_moe->exp_counts;
        EXPECT_EQ(counts[1].item<int64_t>(), 0);
        engine->backward(loss);
        if (rank == 1) {
          for (auto& p : expert) EXPECT_EQ(p.grad().abs().max().item<double>(), 0.0);
        }
        engine->step();
      }
      bool moved = false;
      for (size_t i = 0; i < expert.size(); ++i) moved |= !torch::equal(expert[i], before[i]);
      EXPECT_EQ(moved, rank == 0) << "rank " << rank << " drop_tokens " << drop;
    });
  }
}

TEST(MoEDist, RefusesZero3AndExpertParallelZero12ByName) {
  run_ranks(2, [](int, int) {
    for (int stage : {1, 2, 3}) {
      moe::MoEOptions o;
      o.num_experts = 2;
      o.ep_size = stage == 3 ? 1 : 2;
      auto model = std::make_shared<MoENetImpl>(o, 0.01);
      json config{{"train_micro_batch_size_per_gpu", 4},
                  {"optimizer", {{"type", "Adam"}, {"params", {{"lr", 0.1}}}}},
                  {"zero_optimization", {{"stage", stage}}}};
      try {
        initialize(model, config);
        ADD_FAILURE() << "stage " << stage << " was accepted";
      } catch (const NotSupportedError& e) {
        EXPECT_NE(std::string(e.what()).find(stage == 3 ? "Stage 3" : "ZeRO stage 0"),
                  std::string::npos)
            << e.what();
      }
    }
    // ep_size 1 is plain data parallelism: ZeRO-2 takes it.
    moe::MoEOptions o;
    o.num_experts = 2;
    auto model = std::make_shared<MoENetImpl>(o, 0.01);
    json config{{"train_micro_batch_size_per_gpu", 4},
                {"optimizer", {{"type", "Adam"}, {"params", {{"lr", 0.1}}}}},
                {"zero_optimization", {{"stage", 2}}}};
    auto [engine, opt, sched] = initialize(model, config);
    auto [x, y] = tokens(0, 4);
    engine->backward(engine->forward(x, y));
    engine->step();
  });
}

// Checkpoints: DeepSpeed's MoE layout, exact resume, and the experts onto another ep_size.
std::shared_ptr<MoENetImpl> ckpt_model(int64_t ep_size) {
  moe::MoEOptions o;
  o.num_experts = kExperts;
  o.ep_size = ep_size;
  o.k = 2;
  o.capacity_factor = 1.0;  // drops tokens: the RTS/Gumbel draws must resume too
  auto model = std::make_shared<MoENetImpl>(o, 0.01);
  model->moe->set_deepspeed_parallelism();
  model->init_experts();
  return model;
}

json ckpt_config() {
  return json{{"train_micro_batch_size_per_gpu", kTokensPerRank},
              {"gradient_clipping", 0.1},
              {"optimizer", {{"type", "Adam"}, {"params", {{"lr", 0.05}}}}},
              {"scheduler", {{"type", "WarmupLR"}, {"params", {{"warmup_num_steps", 3}}}}}};
}

void train_steps(ModuleEngine<MoENetImpl>& engine, int rank, int world, int from, int to) {
  for (int s = from; s < to; ++s) {
    auto [x, y] = tokens((s * world + rank) * kTokensPerRank, kTokensPerRank);
    engine.backward(engine.forward(x, y));
    engine.step();
  }
}

std::vector<at::Tensor> all_params(torch::nn::Module& m) {
  std::vector<at::Tensor> out;
  for (auto& p : m.parameters()) out.push_back(p.detach().clone());
  return out;
}

TEST(MoEDistCheckpoint, DeepSpeedLayoutExactResumeAndAnotherEpSize) {
  share_dir();
  const std::string ckpt = g_dir + "/ckpt";
  // 4 steps straight, and 2 steps + save.
  run_ranks(2, [&](int rank, int world) {
    {
      auto model = ckpt_model(2);
      auto [engine, opt, sched] = initialize(model, ckpt_config());
      torch::manual_seed(4242 + rank);
      train_steps(*engine, rank, world, 0, 4);
      torch::save(all_params(*model), g_dir + "/straight" +
                                          std::to_string(rank) + ".pt");
    }
    auto model = ckpt_model(2);
    auto [engine, opt, sched] = initialize(model, ckpt_config());
    torch::manual_seed(4242 + rank);
    train_steps(*engine, rank, world, 0, 2);
    engine->save_checkpoint(ckpt, std::string("step2"));
    // What expert `global` held at the save, for the reshape check.
    for (int64_t i = 0; i < model->moe->num_local_experts(); ++i) {
      torch::save(model->moe->deepspeed_moe->experts->deepspeed_experts[i]->parameters(),
                  g_dir + "/saved_expert" +
                      std::to_string(model->moe->global_expert_id(i)) + ".pt");
    }
  });
  if (!testing::in_rank_process()) {
    const std::string tag = ckpt + "/step2/";
    for (int e = 0; e < kExperts; ++e) {
      const std::string f = tag + "layer_0_expert_" + std::to_string(e) + "_mp_rank_00_model_states.pt";
      auto d = checkpoint::tensors_from_ivalue(checkpoint::load(f), f);
      EXPECT_NE(d.find("moe.deepspeed_moe.experts.deepspeed_experts." + std::to_string(e) + ".fc1.weight"),
                nullptr) << f;
      EXPECT_EQ(d.size(), 4u) << f;
    }
    for (int r = 0; r < 2; ++r) {
      const std::string f = tag + "expp_rank_" + std::to_string(r) + "_mp_rank_00_optim_states.pt";
      EXPECT_TRUE(checkpoint::load(f).toGenericDict().contains("optimizer")) << f;
    }
    auto states = checkpoint::ModelStates::from_ivalue(
        checkpoint::load(tag + "mp_rank_00_model_states.pt"), "model states");
    EXPECT_NE(states.module.find("moe.deepspeed_moe.gate.wg.weight"), nullptr);
    for (const auto& item : states.module) {
      EXPECT_EQ(item.key().find("deepspeed_experts"), std::string::npos) << item.key();
    }
  }
  // Resume: the same 4 steps' parameters, bit for bit.
  run_ranks(2, [&](int rank, int world) {
    auto model = ckpt_model(2);
    auto [engine, opt, sched] = initialize(model, ckpt_config());
    engine->load_checkpoint(ckpt, std::string("step2"));
    EXPECT_EQ(engine->global_steps(), 2);
    train_steps(*engine, rank, world, 2, 4);
    std::vector<at::Tensor> straight;
    torch::load(straight, g_dir + "/straight" + std::to_string(rank) + ".pt");
    auto now = all_params(*model);
    ASSERT_EQ(now.size(), straight.size());
    for (size_t i = 0; i < now.size(); ++i) EXPECT_TRUE(torch::equal(now[i], straight[i])) << i;
  });
  // ep_size 2 -> 4 on 4 ranks: each rank's expert is the saved expert of its global id; the
  // experts' optimizer states cannot follow (refused by name), the weights can.
  run_ranks(4, [&](int rank, int world) {
    auto model = ckpt_model(4);
    auto [engine, opt, sched] = initialize(model, ckpt_config());
    try {
      engine->load_checkpoint(ckpt, std::string("step2"));
      ADD_FAILURE() << "optimizer states across ep_size were accepted";
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find("ep_size"), std::string::npos) << e.what();
    }
    LoadCheckpointOptions weights_only;
    weights_only.load_optimizer_states = false;
    engine->load_checkpoint(ckpt, std::string("step2"), weights_only);
    std::vector<at::Tensor> saved;
    torch::load(saved, g_dir + "/saved_expert" +
                           std::to_string(model->moe->global_expert_id(0)) + ".pt");
    auto mine = model->moe->deepspeed_moe->experts->deepspeed_experts[0]->parameters();
    ASSERT_EQ(mine.size(), saved.size());
    for (size_t i = 0; i < mine.size(); ++i) EXPECT_TRUE(torch::equal(mine[i], saved[i]));
    train_steps(*engine, rank, world, 2, 3);  // and it trains on
  });
}

}  // namespace
}  // namespace deepspeed
