// Muon (MuonWithAuxAdam): Newton-Schulz orthogonalizes (both iterations, every aspect), the
// update is DeepSpeed's muon_update (momentum, Nesterov blend, scale, non-finite gradients), the
// optimizer runs Muon and Adam groups side by side, its state dict has each half's keys, and
// optimizer.type "Muon" splits the model's parameters by name and shape as DeepSpeed does.
// deepspeed_muon_interop_test holds the training against DeepSpeed 0.19.8's.
#include "deepspeed/muon.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "runtime/optim/optimizer_factory.h"
#include "support/expect_throw.h"

namespace deepspeed::optim {
namespace {

at::Tensor singular_values(const at::Tensor& m) {
  return std::get<1>(at::linalg_svd(m.to(at::kDouble), /*full_matrices=*/false));
}

TEST(NewtonSchulz, OrthogonalizesWideTallAndSquareMatrices) {
  torch::manual_seed(3);
  for (NsMethod method : {NsMethod::kGram, NsMethod::kStandard}) {
    for (auto shape : {std::vector<int64_t>{8, 24}, {24, 8}, {12, 12}}) {
      const at::Tensor g = torch::randn(shape) * 5.0;
      const at::Tensor x = newton_schulz(g, 5, method, at::kFloat);
      ASSERT_EQ(x.sizes(), g.sizes());
      // The quintic pushes every singular value into roughly [0.5, 1.5] (not all the way to 1).
      const at::Tensor s = singular_values(x);
      EXPECT_GT(s.min().item<double>(), 0.3) << ns_method_name(method) << " " << g.sizes();
      EXPECT_LT(s.max().item<double>(), 1.6) << ns_method_name(method) << " " << g.sizes();
      // Same singular vectors as g: x is g's U S' V^T, so U^T x V is diagonal.
      const auto [u, unused, vh] = at::linalg_svd(g.to(at::kDouble), false);
      const at::Tensor d = at::matmul(at::matmul(u.transpose(0, 1), x.to(at::kDouble)),
                                      vh.transpose(0, 1));
      const at::Tensor off = d - at::diag_embed(d.diagonal());
      EXPECT_LT(off.abs().max().item<double>(), 1e-4) << ns_method_name(method);
    }
  }
}

TEST(NewtonSchulz, GramIterationEqualsTheStandardOne) {
  torch::manual_seed(4);
  for (auto shape : {std::vector<int64_t>{6, 30}, {30, 6}, {5, 9}}) {
    const at::Tensor g = torch::randn(shape, at::kDouble);
    const at::Tensor a = newton_schulz(g, 5, NsMethod::kGram, at::kDouble);
    const at::Tensor b = newton_schulz(g, 5, NsMethod::kStandard, at::kDouble);
    EXPECT_TRUE(torch::allclose(a, b, 1e-9, 1e-9)) << (a - b).abs().max().item<double>();
  }
}

TEST(MuonUpdate, MomentumNesterovBlendAndScale) {
  torch::manual_seed(5);
  const at::Tensor g = torch::randn({12, 4});  // tall: scaled by sqrt(12 / 4)
  const at::Tensor momentum = torch::randn({12, 4});
  const at::Tensor m0 = momentum.clone();
  const double beta = 0.9;
  const at::Tensor update = muon_update(g.clone(), momentum, beta, NsMethod::kStandard);
  const at::Tensor m1 = m0 * beta + g * (1 - beta);
  EXPECT_TRUE(torch::allclose(momentum, m1, 1e-6, 1e-6));
  const at::Tensor blend = g * (1 - beta) + m1 * beta;
  const at::Tensor want = newton_schulz(blend, 5, NsMethod::kStandard, at::kFloat) * std::sqrt(3.0);
  EXPECT_TRUE(torch::allclose(update, want, 1e-5, 1e-5));
  EXPECT_TRUE(torch::allclose(orthogonalize(blend, NsMethod::kStandard), want, 1e-6, 1e-6));
  // Without Nesterov the momentum itself is orthogonalized.
  const at::Tensor m2 = m1.clone();
  const at::Tensor plain = muon_update(g.clone(), m2, beta, NsMethod::kStandard, 5, false);
  EXPECT_TRUE(torch::allclose(plain, orthogonalize(m2, NsMethod::kStandard), 1e-6, 1e-6));
}

TEST(MuonUpdate, NonFiniteGradientKeepsTheMomentumAndComesBack) {
  at::Tensor g = torch::ones({3, 5});
  g[1][2] = std::numeric_limits<float>::infinity();
  const at::Tensor momentum = torch::full({3, 5}, 0.5);
  const at::Tensor update = muon_update(g, momentum, 0.95, NsMethod::kGram);
  EXPECT_TRUE(torch::equal(momentum, torch::full({3, 5}, 0.5)));
  EXPECT_FALSE(at::isfinite(update).all().item<bool>());
}

TEST(MuonUpdate, ConvolutionFiltersAreOrthogonalizedAsMatrices) {
  torch::manual_seed(6);
  const at::Tensor g = torch::randn({6, 3, 3, 3});
  const at::Tensor update = orthogonalize(g, NsMethod::kGram);
  ASSERT_EQ(update.sizes(), g.sizes());
  const at::Tensor want = newton_schulz(g.reshape({6, 27}), 5, NsMethod::kGram, at::kFloat);
  EXPECT_TRUE(torch::allclose(update.reshape({6, 27}), want, 1e-6, 1e-6));
}

torch::optim::OptimizerParamGroup group_of(std::vector<at::Tensor> params, GroupOptions o) {
  return torch::optim::OptimizerParamGroup(std::move(params), std::make_unique<GroupOptions>(o));
}

TEST(MuonOptimizer, RunsMuonAndAdamGroupsWithDeepSpeedsDefaults) {
  torch::manual_seed(7);
  at::Tensor w = torch::randn({6, 4}).requires_grad_();
  at::Tensor b = torch::randn({4}).requires_grad_();
  GroupOptions muon_group;
  muon_group.set("use_muon", true).set("weight_decay", 0.1);
  GroupOptions adam_group;
  adam_group.set("use_muon", false);
  Muon opt({group_of({w}, muon_group), group_of({b}, adam_group)});
  EXPECT_EQ(opt.group_options(0).number("lr"), 0.02);
  EXPECT_EQ(opt.group_options(0).number("momentum"), 0.95);
  EXPECT_EQ(opt.group_options(0).text("ns_method"), "gram");
  EXPECT_EQ(opt.group_options(1).number("lr"), 3e-4);
  EXPECT_EQ(opt.group_options(1).pair("betas"), std::make_pair(0.9, 0.95));
  EXPECT_EQ(opt.group_options(1).number("eps"), 1e-10);
  EXPECT_FALSE(opt.group_options(1).has("momentum"));
  EXPECT_FALSE(opt.group_options(0).has("betas"));

  at::Tensor w_ref = w.detach().clone();
  at::Tensor momentum = torch::zeros_like(w_ref);
  at::Tensor b_ref = b.detach().clone().requires_grad_();
  AdamOptions adam;
  adam.lr = 3e-4;
  adam.betas = {0.9, 0.95};
  adam.eps = 1e-10;
  Adam reference({b_ref}, adam);
  for (int step = 0; step < 3; ++step) {
    const at::Tensor gw = torch::randn({6, 4});
    const at::Tensor gb = torch::randn({4});
    w.mutable_grad() = gw.clone();
    b.mutable_grad() = gb.clone();
    b_ref.mutable_grad() = gb.clone();
    opt.step();
    reference.step();
    const at::Tensor update = muon_update(gw.clone(), momentum, 0.95, NsMethod::kGram);
    w_ref = w_ref * (1 - 0.02 * 0.1) - 0.02 * update;
  }
  EXPECT_TRUE(torch::allclose(w.detach(), w_ref, 1e-6, 1e-6));
  EXPECT_TRUE(torch::equal(b.detach(), b_ref.detach()));
  EXPECT_TRUE(torch::allclose(opt.find_state(w)->tensor("momentum_buffer"), momentum));
}

TEST(MuonOptimizer, ListsAMuonGroupsMatricesLargestFirst) {
  const at::Tensor square = torch::zeros({8, 8});
  const at::Tensor tall = torch::zeros({20, 8});
  const at::Tensor wide = torch::zeros({8, 20});
  const at::Tensor tall2 = torch::zeros({20, 8});
  const at::Tensor bias = torch::zeros({8});
  GroupOptions m;
  m.set("use_muon", true);
  GroupOptions a;
  a.set("use_muon", false);
  Muon opt({group_of({square, tall, wide, tall2}, m), group_of({bias, square.t()}, a)});
  // As Python sorts torch.Size tuples, descending, ties in their order; Adam groups as given.
  const auto& muon = opt.param_groups()[0].params();
  EXPECT_TRUE(muon[0].is_same(tall));
  EXPECT_TRUE(muon[1].is_same(tall2));
  EXPECT_TRUE(muon[2].is_same(wide));
  EXPECT_TRUE(muon[3].is_same(square));
  EXPECT_TRUE(opt.param_groups()[1].params()[0].is_same(bias));
}

TEST(MuonOptimizer, OrthogonalizedPartitionsStepTheirGradientAsItIs) {
  at::Tensor flat = torch::ones({10}).requires_grad_();
  GroupOptions o;
  o.set("use_muon", true).set("lr", 0.5).set("weight_decay", 0.2);
  // A 1-D parameter may run Muon only as ZeRO's flat partition.
  EXPECT_THROW_WITH(Muon({group_of({flat}, o)}), UsageError, "matrices");
  at::Tensor matrix = torch::ones({2, 5}).requires_grad_();
  Muon opt({group_of({matrix}, o)});
  opt.mark_orthogonalized(matrix);
  matrix.mutable_grad() = torch::full({2, 5}, 2.0);
  opt.step();
  EXPECT_TRUE(torch::allclose(matrix.detach(), torch::full({2, 5}, 1.0 * (1 - 0.1) - 1.0)));
}

TEST(MuonOptimizer, StateDictHasEachHalfsKeysAndResumes) {
  torch::manual_seed(8);
  auto make = [](at::Tensor& w, at::Tensor& b) {
    GroupOptions m;
    m.set("use_muon", true).set("ns_method", std::string("standard"));
    GroupOptions a;
    a.set("use_muon", false);
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.push_back(group_of({w}, m));
    groups.push_back(group_of({b}, a));
    return std::make_unique<Muon>(std::move(groups));
  };
  at::Tensor w = torch::randn({3, 4}).requires_grad_();
  at::Tensor b = torch::randn({4}).requires_grad_();
  auto opt = make(w, b);
  auto step = [](Muon& o, at::Tensor& w, at::Tensor& b, int seed) {
    torch::manual_seed(seed);
    w.mutable_grad() = torch::randn({3, 4});
    b.mutable_grad() = torch::randn({4});
    o.step();
  };
  step(*opt, w, b, 1);
  const auto dict = optimizer_state_dict(*opt).toGenericDict();
  const auto state = dict.at("state").toGenericDict();
  const auto muon_state = state.at(0).toGenericDict();
  EXPECT_TRUE(muon_state.contains("momentum_buffer"));
  EXPECT_FALSE(muon_state.contains("step"));
  const auto adam_state = state.at(1).toGenericDict();
  EXPECT_EQ(adam_state.at("step").toInt(), 1);
  EXPECT_TRUE(adam_state.contains("exp_avg_sq"));
  const auto group0 = dict.at("param_groups").toListRef()[0].toGenericDict();
  EXPECT_EQ(group0.at("ns_method").toStringRef(), "standard");
  EXPECT_TRUE(group0.at("use_muon").toBool());

  at::Tensor w2 = w.detach().clone().requires_grad_();
  at::Tensor b2 = b.detach().clone().requires_grad_();
  auto resumed = make(w2, b2);
  resumed->group_options(0).set("ns_method", std::string("gram"));  // the dict's wins
  load_optimizer_state_dict(*resumed, optimizer_state_dict(*opt));
  EXPECT_EQ(resumed->group_options(0).text("ns_method"), "standard");
  step(*opt, w, b, 2);
  step(*resumed, w2, b2, 2);
  EXPECT_TRUE(torch::equal(w.detach(), w2.detach()));
  EXPECT_TRUE(torch::equal(b.detach(), b2.detach()));
}

OptimizerConfig muon_config(const std::string& params) {
  return OptimizerConfig{true, "Muon", json::parse(params), false};
}

// What DeepSpeed's set_optimizer_flags + _muon_param_groups make of a small model.
TEST(MuonFactory, SplitsTheModelByNameAndShape) {
  const at::Tensor embed = torch::zeros({16, 8}, torch::requires_grad());
  const at::Tensor fc = torch::zeros({24, 8}, torch::requires_grad());
  const at::Tensor fc_bias = torch::zeros({24}, torch::requires_grad());
  const at::Tensor head = torch::zeros({16, 8}, torch::requires_grad());
  OptimizerBuildOptions options;
  options.param_names = {{embed.unsafeGetTensorImpl(), "tok.Embedding.weight"},
                         {fc.unsafeGetTensorImpl(), "blocks.0.c_fc.weight"},
                         {fc_bias.unsafeGetTensorImpl(), "blocks.0.c_fc.bias"},
                         {head.unsafeGetTensorImpl(), "LM_HEAD.weight"}};
  auto built = build_optimizer(
      muon_config(R"({"lr": 0.01, "adam_lr": 0.001, "momentum": 0.9, "weight_decay": 0.1,
                      "betas": [0.8, 0.99], "ns_method": "standard"})"),
      {ParamGroup{{embed, fc, fc_bias, head}}}, "cfg", options);
  auto* muon = dynamic_cast<Muon*>(built.get());
  ASSERT_NE(muon, nullptr);
  EXPECT_TRUE(is_zero_supported_optimizer(*muon));
  ASSERT_EQ(muon->param_groups().size(), 2u);
  const GroupOptions& m = muon->group_options(0);
  EXPECT_EQ(muon->param_groups()[0].params().size(), 1u);
  EXPECT_TRUE(muon->param_groups()[0].params()[0].is_same(fc));
  EXPECT_EQ(m.text("name"), "muon-params");
  EXPECT_EQ(m.number("lr"), 0.01);
  EXPECT_EQ(m.number("momentum"), 0.9);
  EXPECT_EQ(m.number("weight_decay"), 0.1);
  EXPECT_EQ(m.text("ns_method"), "standard");
  const GroupOptions& a = muon->group_options(1);
  EXPECT_EQ(muon->param_groups()[1].params().size(), 3u);
  EXPECT_EQ(a.text("name"), "adam-params");
  EXPECT_EQ(a.number("lr"), 0.001);
  EXPECT_EQ(a.pair("betas"), std::make_pair(0.8, 0.99));
  EXPECT_EQ(a.number("eps"), 1e-10);
  EXPECT_TRUE(muon->adam_w_mode());

  // Two incoming groups keep their overrides, each split in two and named by its prefix; a
  // group's use_muon puts all of it in one half.
  built = build_optimizer(muon_config(R"({"muon_lr": 0.05, "adam_w_mode": false})"),
                          {ParamGroup{{fc, head}, json{{"weight_decay", 0.3}, {"name", "decay"}}},
                           ParamGroup{{embed, fc_bias}, json{{"use_muon", false}}}},
                          "cfg", options);
  muon = dynamic_cast<Muon*>(built.get());
  ASSERT_EQ(muon->param_groups().size(), 3u);
  EXPECT_EQ(muon->group_options(0).text("name"), "decay-muon-params");
  EXPECT_EQ(muon->group_options(0).number("lr"), 0.05);
  EXPECT_EQ(muon->group_options(0).number("weight_decay"), 0.3);
  EXPECT_EQ(muon->group_options(1).text("name"), "decay-adam-params");
  EXPECT_EQ(muon->group_options(1).number("weight_decay"), 0.3);
  EXPECT_EQ(muon->group_options(2).text("name"), "group1-adam-params");
  EXPECT_EQ(muon->param_groups()[2].params().size(), 2u);
  EXPECT_FALSE(muon->adam_w_mode());
}

TEST(MuonFactory, ErrorsNameTheKey) {
  const at::Tensor w = torch::zeros({4, 4}, torch::requires_grad());
  OptimizerBuildOptions options;
  options.param_names = {{w.unsafeGetTensorImpl(), "w"}};
  auto build = [&](const std::string& params, json group = json::object()) {
    return build_optimizer(muon_config(params), {ParamGroup{{w}, group}}, "cfg", options);
  };
  EXPECT_THROW_WITH(build(R"({"ns_method": "svd"})"), ConfigError,
                    "optimizer.params.ns_method is \"svd\"");
  EXPECT_THROW_WITH(build(R"({"bias_correction": false})"), ConfigError,
                    "bias_correction is not a parameter of Muon");
  EXPECT_THROW_WITH(build(R"({"per_head_muon": true})"), NotSupportedError, "per_head_muon");
  EXPECT_THROW_WITH(build(R"({"torch_adam": true})"), NotSupportedError, "torch_adam");
  EXPECT_THROW_WITH(build("{}", json{{"amsgrad", true}}), ConfigError,
                    "amsgrad is not a param-group key of Muon");
  EXPECT_THROW_WITH(build("{}", json{{"lr", -1}}), ConfigError, "lr is -1");
  const at::Tensor stranger = torch::zeros({4, 4}, torch::requires_grad());
  EXPECT_THROW_WITH(build_optimizer(muon_config("{}"), {ParamGroup{{stranger}}}, "cfg", options),
                    ConfigError, "not one of the model's");
}

}  // namespace
}  // namespace deepspeed::optim
