// optimizer_state_dict / load_optimizer_state_dict: Python's layout, a pickle round trip, and
// resuming: step, save, load into a fresh optimizer, step both -> identical. For our optimizers
// and torch::optim's Adam, AdamW, SGD and Adagrad.
#include <functional>
#include <memory>
#include <string>

#include <gtest/gtest.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>
#include <torch/serialize.h>

#include "deepspeed/optimizers.h"
#include "optimizer_test_data.h"
#include "support/expect_throw.h"

namespace deepspeed::optim {
namespace {

using testdata::tensor;
using testdata::values;
using Params = std::vector<at::Tensor>;
using Factory = std::function<std::unique_ptr<torch::optim::Optimizer>(const Params&)>;

// Two groups (params 0-1 and 2), the second with its own lr.
std::vector<torch::optim::OptimizerParamGroup> two_groups(const Params& p, GroupOptions second) {
  std::vector<torch::optim::OptimizerParamGroup> g;
  g.emplace_back(Params{p[0], p[1]});
  g.emplace_back(Params{p[2]}, std::make_unique<GroupOptions>(second));
  return g;
}

Params make_params() {
  return {tensor(values(12, 1)).reshape({3, 4}).requires_grad_(),
          tensor(values(5, 2)).requires_grad_(), tensor(values(9, 3)).requires_grad_()};
}

Params clones(const Params& ps) {
  Params out;
  for (const auto& p : ps) out.push_back(p.detach().clone().requires_grad_());
  return out;
}

// Step with gradients derived from `step` (param 1 gets none on odd steps: state must cope).
void step(torch::optim::Optimizer& opt, const Params& ps, int step) {
  for (size_t i = 0; i < ps.size(); ++i) {
    auto& grad = ps[i].mutable_grad();
    if (i == 1 && step % 2 == 1) {
      grad = at::Tensor();
    } else {
      grad = tensor(values(ps[i].numel(), 100 * step + i)).reshape(ps[i].sizes());
    }
  }
  opt.step();
}

std::vector<std::pair<std::string, Factory>> factories() {
  std::vector<std::pair<std::string, Factory>> f;
  f.emplace_back("Adam", [](const Params& p) {
    AdamOptions second;
    second.lr = 0.05;
    second.betas = {0.8, 0.9};
    return std::make_unique<Adam>(two_groups(p, second.group()), AdamOptions{}, true);
  });
  f.emplace_back("Lamb", [](const Params& p) {
    LambOptions second;
    second.lr = 0.05;
    return std::make_unique<Lamb>(two_groups(p, second.group()));
  });
  f.emplace_back("Lion", [](const Params& p) {
    LionOptions second;
    second.lr = 0.05;
    return std::make_unique<Lion>(two_groups(p, second.group()));
  });
  f.emplace_back("Adagrad", [](const Params& p) {
    AdagradOptions second;
    second.lr = 0.05;
    return std::make_unique<Adagrad>(two_groups(p, second.group(false)));
  });
  f.emplace_back("CPUAdagrad", [](const Params& p) {
    AdagradOptions second;
    second.weight_decay = 0.1;
    return std::make_unique<Adagrad>(two_groups(p, second.group(true)), AdagradOptions{}, true);
  });
  f.emplace_back("SGD", [](const Params& p) {
    SGDOptions first;
    first.lr = 0.1;
    first.momentum = 0.9;
    SGDOptions second = first;
    second.nesterov = true;
    return std::make_unique<SGD>(two_groups(p, second.group()), first);
  });
  f.emplace_back("torch.Adam", [](const Params& p) {
    return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(0.01).amsgrad(true));
  });
  f.emplace_back("torch.AdamW", [](const Params& p) {
    return std::make_unique<torch::optim::AdamW>(p, torch::optim::AdamWOptions(0.01));
  });
  f.emplace_back("torch.SGD", [](const Params& p) {
    return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(0.1).momentum(0.9));
  });
  f.emplace_back("torch.Adagrad", [](const Params& p) {
    return std::make_unique<torch::optim::Adagrad>(p, torch::optim::AdagradOptions(0.1));
  });
  return f;
}

// What Python's weights_only unpickler accepts: tensors, numbers, strings, bools, tuples, lists
// and dicts with string or int keys.
bool only_plain_values(const c10::IValue& v) {
  if (v.isTensor() || v.isDouble() || v.isInt() || v.isBool() || v.isString()) return true;
  if (v.isTuple()) {
    for (const auto& e : v.toTupleRef().elements()) {
      if (!only_plain_values(e)) return false;
    }
    return true;
  }
  if (v.isList()) {
    if (v.toList().elementType()->kind() != c10::TypeKind::AnyType) return false;
    for (const auto& e : v.toListRef()) {
      if (!only_plain_values(e)) return false;
    }
    return true;
  }
  if (v.isGenericDict()) {
    for (const auto& e : v.toGenericDict()) {
      if (!(e.key().isString() || e.key().isInt()) || !only_plain_values(e.value())) return false;
    }
    return true;
  }
  return false;
}

TEST(OptimizerStateDict, ResumeAfterPickleRoundTripIsIdentical) {
  for (const auto& [name, make] : factories()) {
    SCOPED_TRACE(name);
    Params a = make_params();
    auto opt_a = make(a);
    for (int s = 0; s < 3; ++s) step(*opt_a, a, s);

    // Through bytes, as a checkpoint is written and read.
    c10::IValue saved = optimizer_state_dict(*opt_a);
    EXPECT_TRUE(only_plain_values(saved));
    std::vector<char> bytes = torch::pickle_save(saved);
    c10::IValue loaded = torch::pickle_load(bytes);

    Params b = clones(a);
    auto opt_b = make(b);
    if (name != "torch.Adagrad") EXPECT_TRUE(opt_b->state().empty());  // nothing before load
    load_optimizer_state_dict(*opt_b, loaded);
    for (int s = 3; s < 6; ++s) {
      step(*opt_a, a, s);
      step(*opt_b, b, s);
    }
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_TRUE(torch::equal(a[i], b[i])) << "param " << i;
    }
  }
}

TEST(OptimizerStateDict, PythonLayoutForAdam) {
  Params p = make_params();
  auto opt = factories()[0].second(p);
  for (int s = 0; s < 3; ++s) step(*opt, p, s);
  c10::IValue sd = optimizer_state_dict(*opt);
  auto top = sd.toGenericDict();
  auto groups = top.at("param_groups").toListRef();
  ASSERT_EQ(groups.size(), 2u);
  auto g0 = groups[0].toGenericDict();
  EXPECT_DOUBLE_EQ(g0.at("lr").toDouble(), 1e-3);
  EXPECT_TRUE(g0.at("bias_correction").toBool());
  EXPECT_DOUBLE_EQ(g0.at("eps").toDouble(), 1e-8);
  EXPECT_DOUBLE_EQ(g0.at("weight_decay").toDouble(), 0.0);
  auto betas = g0.at("betas").toTupleRef().elements();
  ASSERT_EQ(betas.size(), 2u);
  EXPECT_DOUBLE_EQ(betas[0].toDouble(), 0.9);
  EXPECT_DOUBLE_EQ(betas[1].toDouble(), 0.999);
  auto ids0 = g0.at("params").toListRef();
  ASSERT_EQ(ids0.size(), 2u);
  EXPECT_EQ(ids0[0].toInt(), 0);
  EXPECT_EQ(ids0[1].toInt(), 1);
  auto g1 = groups[1].toGenericDict();
  EXPECT_DOUBLE_EQ(g1.at("lr").toDouble(), 0.05);
  EXPECT_EQ(g1.at("params").toListRef()[0].toInt(), 2);

  auto state = top.at("state").toGenericDict();
  ASSERT_EQ(state.size(), 3u);
  auto s0 = state.at(int64_t{0}).toGenericDict();
  EXPECT_EQ(s0.at("step").toInt(), 3);
  EXPECT_EQ(s0.at("exp_avg").toTensor().sizes(), at::IntArrayRef({3, 4}));
  EXPECT_TRUE(s0.contains("exp_avg_sq"));
  EXPECT_EQ(state.at(int64_t{1}).toGenericDict().at("step").toInt(), 2);  // skipped step 1

  EXPECT_TRUE(only_plain_values(sd));
  // No typed lists: torch::pickle_save would write those through torch.jit._pickle.build_*list.
  // (It still tags every dict and list with torch.jit._pickle.restore_type_tag, which
  // torch.load(weights_only=True) refuses: a checkpoint writer must pickle without type tags.)
  std::vector<char> bytes = torch::pickle_save(sd);
  std::string raw(bytes.begin(), bytes.end());
  EXPECT_EQ(raw.find("build_intlist"), std::string::npos);
  EXPECT_EQ(raw.find("build_doublelist"), std::string::npos);
}

TEST(OptimizerStateDict, TorchStepIsAFloatTensorAndSgdWithoutMomentumHasNoState) {
  Params p = make_params();
  torch::optim::AdamW adamw(p, torch::optim::AdamWOptions(0.01));
  step(adamw, p, 0);
  auto s = optimizer_state_dict(adamw).toGenericDict().at("state").toGenericDict();
  at::Tensor t = s.at(int64_t{0}).toGenericDict().at("step").toTensor();
  EXPECT_EQ(t.scalar_type(), at::kFloat);
  EXPECT_EQ(t.item<double>(), 1.0);

  SGD sgd(p, SGDOptions{});
  step(sgd, p, 0);
  EXPECT_EQ(optimizer_state_dict(sgd).toGenericDict().at("state").toGenericDict().size(), 0u);
}

TEST(OptimizerStateDict, TorchAdamWStateResumesInOurAdamW) {
  // torch.optim.AdamW and DeepSpeed's Adam share state names and math: a checkpoint of one
  // continues in the other.
  Params a = make_params();
  torch::optim::AdamW theirs(a, torch::optim::AdamWOptions(0.01).weight_decay(0.1));
  for (int s = 0; s < 3; ++s) step(theirs, a, s);
  Params b = clones(a);
  AdamOptions o;
  o.lr = 0.5;  // overwritten by the loaded group
  Adam ours(b, o, true);
  load_optimizer_state_dict(ours, optimizer_state_dict(theirs));
  EXPECT_DOUBLE_EQ(ours.group_options(0).get_lr(), 0.01);
  EXPECT_DOUBLE_EQ(ours.group_options(0).number("weight_decay"), 0.1);
  EXPECT_EQ(ours.find_state(b[0])->step, 3);
  for (int s = 3; s < 6; ++s) {
    step(theirs, a, s);
    step(ours, b, s);
  }
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_LE((a[i] - b[i]).abs().max().item<double>(), 1e-6) << "param " << i;
  }
}

TEST(OptimizerStateDict, LoadRejectsMismatchesByName) {
  Params p = make_params();
  auto opt = factories()[0].second(p);
  for (int s = 0; s < 2; ++s) step(*opt, p, s);
  c10::IValue sd = optimizer_state_dict(*opt);

  Params q = clones(p);
  Adam one_group(q);
  EXPECT_THROW_WITH(load_optimizer_state_dict(one_group, sd), CheckpointError,
                    "optimizer state dict has 2 param groups, the optimizer has 1");

  Params r = clones(p);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(Params{r[0]});
  groups.emplace_back(Params{r[1], r[2]});
  Adam other_split(std::move(groups));
  EXPECT_THROW_WITH(load_optimizer_state_dict(other_split, sd), CheckpointError,
                    "param group 0 has 2 parameters, the optimizer's has 1");

  Params s = clones(p);
  s[0] = torch::zeros({4, 3}, torch::requires_grad());
  auto reshaped = factories()[0].second(s);
  EXPECT_THROW_WITH(load_optimizer_state_dict(*reshaped, sd), CheckpointError,
                    "state[0].exp_avg has shape [3, 4] but its parameter has shape [4, 3]");
  EXPECT_TRUE(reshaped->state().empty());  // a failed load changes nothing

  torch::optim::RMSprop rmsprop(p, torch::optim::RMSpropOptions(0.1));
  EXPECT_THROW(optimizer_state_dict(rmsprop), NotSupportedError);
}

TEST(OptimizerStateDict, LoadedTensorsAreCopies) {
  Params p = make_params();
  auto opt = factories()[0].second(p);
  step(*opt, p, 0);
  c10::IValue sd = optimizer_state_dict(*opt);
  at::Tensor saved = sd.toGenericDict().at("state").toGenericDict().at(int64_t{0})
                         .toGenericDict().at("exp_avg").toTensor();
  at::Tensor before = saved.clone();
  Params q = clones(p);
  auto fresh = factories()[0].second(q);
  load_optimizer_state_dict(*fresh, sd);
  step(*fresh, q, 1);
  EXPECT_TRUE(torch::equal(saved, before));
}

}  // namespace
}  // namespace deepspeed::optim
