// The MoE test model and the ep_size comparison the MoE dist tests share (moe_dist_test,
// moe_zero_dist_test): a Linear embedding, one MoE layer of E = 4 two-layer MLP experts with a
// residual connection, a Linear head, an MSE loss plus the auxiliary loss. Each expert starts from
// its own seed whichever rank holds it, so that runs of different ep_size can be compared expert
// by expert (by global id).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deepspeed/deepspeed.h"
#include "deepspeed/moe.h"
#include "support/multi_rank.h"
#include "support/shared_run_dir.h"

namespace deepspeed::testing::moe_net {

constexpr int64_t kHidden = 6;
constexpr int64_t kExperts = 4;
constexpr int64_t kTokensPerRank = 12;
constexpr int kSteps = 4;

// Debian's LibTorch 1.13 has no fp16 matmul on CPU: fp16 weights compute in fp32 there (their
// gradients still come back in fp16, which is what loss scaling is about); bf16 computes in bf16.
inline torch::Tensor linear(torch::nn::Linear l, const torch::Tensor& x) {
  if (l->weight.scalar_type() != torch::kHalf) return l(x.to(l->weight.scalar_type()));
  return torch::nn::functional::linear(x.to(torch::kFloat), l->weight.to(torch::kFloat),
                                       l->bias.to(torch::kFloat));
}

// The expert: a two-layer MLP (Cloneable: the MoE layer deep-copies it per local expert).
struct ExpertMlpImpl : torch::nn::Cloneable<ExpertMlpImpl> {
  ExpertMlpImpl() { reset(); }
  void reset() override {
    fc1 = register_module("fc1", torch::nn::Linear(kHidden, 2 * kHidden));
    fc2 = register_module("fc2", torch::nn::Linear(2 * kHidden, kHidden));
  }
  torch::Tensor forward(const torch::Tensor& x) { return linear(fc2, torch::tanh(linear(fc1, x))); }
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
  // Inputs in fp32; the model may train in fp16/bf16 (see linear()).
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& y) {
    auto h = torch::tanh(linear(embed, x));
    auto [m, l_aux, counts] = moe->forward(h);
    auto loss = torch::nn::functional::mse_loss(linear(head, h + m).to(torch::kFloat), y);
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
inline std::pair<torch::Tensor, torch::Tensor> tokens(int64_t first, int64_t count) {
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
  int stage = 0;                 // zero_optimization.stage
  std::string dtype = "fp32";    // "fp32", "bf16" or "fp16"
  bool muon = false;             // the Muon optimizer instead of SGD
};

inline json case_config(const Case& c, int64_t tokens_per_rank) {
  json config{{"train_micro_batch_size_per_gpu", tokens_per_rank},
              {"gradient_accumulation_steps", 1},
              {"gradient_clipping", c.clip},
              {"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.2}, {"momentum", 0.5}}}}},
              {"zero_optimization", {{"stage", c.stage}}}};
  // SGD is not among ZeRO's tested optimizers.
  if (c.stage > 0) config["zero_allow_untested_optimizer"] = true;
  if (c.muon) {
    config["optimizer"] = {{"type", "Muon"},
                           {"params", {{"lr", 0.05}, {"adam_lr", 0.02}, {"momentum", 0.9}}}};
  }
  if (c.dtype == "bf16") config["bf16"] = {{"enabled", true}};
  // A fixed scale: the comparison is about the reduction, not the scaler's first overflows.
  if (c.dtype == "fp16") config["fp16"] = {{"enabled", true}, {"loss_scale", 128}};
  return config;
}

// The directory every run_ranks() call of the current test shares (set at the test's start).
inline std::string& shared_dir() {
  static std::string dir;
  return dir;
}
inline void share_dir() { shared_dir() = new_shared_run_dir("DS_MOE_TEST_DIR"); }

// Trains on `world` ranks (each rank `tokens_per_rank` tokens a step) and writes every expert by
// global id, the dense parameters and the per-step norms under `tag` (as fp32).
inline void train_and_save(int rank, int world, int64_t ep_size, const Case& c,
                           const std::string& tag, int64_t tokens_per_rank) {
  moe::MoEOptions o;
  o.num_experts = kExperts;
  o.ep_size = ep_size;
  o.k = c.k;
  o.drop_tokens = false;
  o.top2_2nd_expert_sampling = c.top2_sampling;
  auto model = std::make_shared<MoENetImpl>(o, c.aux_coef);
  model->moe->set_deepspeed_parallelism();  // collective: expert ids known before initialize
  model->init_experts();
  auto [engine, opt, sched] = initialize(model, case_config(c, tokens_per_rank));
  // The gating's random draws (RTS, Gumbel) depend only on the rank and the step.
  torch::manual_seed(4242 + rank);
  std::vector<double> norms;
  for (int s = 0; s < kSteps; ++s) {
    auto [x, y] = tokens((s * world + rank) * tokens_per_rank, tokens_per_rank);
    engine->backward(engine->forward(x, y));
    engine->step();
    norms.push_back(engine->get_global_grad_norm().value_or(-1.0));
  }
  EXPECT_EQ(engine->skipped_steps(), 0) << tag;
  const std::string dir = shared_dir();
  auto& moe = *model->moe;
  const bool writer = moe.ep_groups() == nullptr || moe.ep_groups()->expert_data_parallel.rank() == 0;
  if (writer) {
    for (int64_t i = 0; i < moe.num_local_experts(); ++i) {
      std::vector<at::Tensor> ps;
      for (auto& p : moe.deepspeed_moe->experts->deepspeed_experts[i]->parameters()) {
        ps.push_back(p.detach().to(torch::kFloat).clone());
      }
      torch::save(ps, dir + "/" + tag + "_expert" + std::to_string(moe.global_expert_id(i)) + ".pt");
    }
  }
  if (rank == 0) {
    std::vector<at::Tensor> dense;
    for (auto& p : model->named_parameters()) {
      if (p.key().find("deepspeed_experts") == std::string::npos) {
        dense.push_back(p.value().detach().to(torch::kFloat).clone());
      }
    }
    torch::save(dense, dir + "/" + tag + "_dense.pt");
    torch::save(std::vector<at::Tensor>{torch::tensor(norms, torch::kDouble)}, dir + "/" + tag + "_norms.pt");
  }
}

inline std::vector<at::Tensor> load_saved(const std::string& name) {
  std::vector<at::Tensor> ps;
  torch::load(ps, shared_dir() + "/" + name + ".pt");
  return ps;
}

inline void expect_close(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b,
                         const std::string& what, double rtol, double atol) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(torch::allclose(a[i], b[i], rtol, atol))
        << what << " tensor " << i << " max diff " << (a[i] - b[i]).abs().max().item<double>();
  }
}

// Every expert (by global id), the dense parameters and the per-step gradient norms.
inline void expect_same_training(const std::string& ref, const std::string& got,
                                 double rtol = 1e-5, double atol = 1e-7) {
  for (int64_t e = 0; e < kExperts; ++e) {
    expect_close(load_saved(ref + "_expert" + std::to_string(e)),
                 load_saved(got + "_expert" + std::to_string(e)),
                 got + " expert " + std::to_string(e), rtol, atol);
  }
  expect_close(load_saved(ref + "_dense"), load_saved(got + "_dense"), got + " dense", rtol, atol);
  expect_close(load_saved(ref + "_norms"), load_saved(got + "_norms"), got + " grad norms", rtol,
               atol);
}

// The parameters moved: a comparison is not between two untouched models.
inline void expect_trained(const std::string& tag) {
  auto start = MoENetImpl(moe::MoEOptions{}, 0).embed->weight;
  EXPECT_FALSE(torch::allclose(load_saved(tag + "_dense")[0], start)) << tag;
}

}  // namespace deepspeed::testing::moe_net
