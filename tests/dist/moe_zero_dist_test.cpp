// MoE expert parallelism under ZeRO stages 1/2 and fp16/bf16 (Note [Expert flat groups] in
// stage1_2.cpp): expert flat groups partitioned and reduced over the expert-data-parallel group.
//  - fp32, drop_tokens off, E = 4: ZeRO 1 and 2 with ep_size 2 on 2 ranks, ZeRO 2 with ep_size 2
//    and 4 on 4 ranks end with the same parameters and gradient norms (within 1e-5) as ep_size 1
//    at ZeRO 0, with gradient clipping.
//  - bf16 and fp16 at ZeRO 0/1/2: ep_size 2 tracks ep_size 1 of the same stage and dtype.
//  - Muon at ZeRO 1/2: ep_size 2 equals ep_size 1.
//  - An inf in one rank's expert gradient skips the step on every rank (the overflow vote covers
//    expert partitions) and halves the loss scale.
//  - Checkpoints: DeepSpeed's MoE layout with zero_pp_rank files (ZeRO 1/2) or the expp_rank files
//    (stage 0), exact resume, and the weights onto another ep_size; zero_to_fp32 names the
//    experts by global id.
//  - Model parallelism (an mpu: 2 model-parallel peers x 2 data-parallel ranks): the expert
//    groups are cut from each peer's data-parallel group, as DeepSpeed's
//    _create_expert_data_and_model_parallel; the peers train exactly as 2 data-parallel ranks
//    without an mpu, save per model-parallel rank and resume exactly.
//  - Universal checkpoints: ds_to_universal names every expert by its global id; loading it
//    (load_universal) resumes the same shape exactly, and onto ep_size 1 at another stage
//    follows the uninterrupted run, optimizer states included.
#include "deepspeed/deepspeed.h"
#include "deepspeed/moe.h"
#include "deepspeed/mpu.h"
#include "deepspeed/topology.h"

#include <cstdlib>
#include <filesystem>
#include <limits>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deepspeed/checkpoint.h"
#include "deepspeed/universal_checkpoint.h"
#include "support/moe_net.h"
#include "support/multi_rank.h"

namespace deepspeed {
namespace {

using testing::run_ranks;
using namespace testing::moe_net;  // NOLINT: the shared MoE test model

std::string tag_of(int world, int64_t ep, const Case& c) {
  return "w" + std::to_string(world) + "_k" + std::to_string(c.k) + "_s" +
         std::to_string(c.stage) + "_" + c.dtype + "_ep" + std::to_string(ep);
}

std::string train(int world, int64_t ep, const Case& c) {
  const std::string tag = tag_of(world, ep, c);
  run_ranks(world, [&](int rank, int w) { train_and_save(rank, w, ep, c, tag, kTokensPerRank); });
  return tag;
}

TEST(MoEZeroDist, Zero1And2EpSize2On2RanksEqualReplicatedExpertsAtZero0) {
  share_dir();
  Case ref{2, true, 0.05};
  const std::string ref_tag = train(2, 1, ref);
  for (int stage : {1, 2}) {
    Case c = ref;
    c.stage = stage;
    const std::string ep1 = train(2, 1, c);
    const std::string ep2 = train(2, 2, c);
    if (!testing::in_rank_process()) {
      expect_same_training(ref_tag, ep1);
      expect_same_training(ref_tag, ep2);
    }
  }
  if (!testing::in_rank_process()) expect_trained(ref_tag);
}

TEST(MoEZeroDist, Zero2EpSizes2And4On4RanksEqualReplicatedExpertsAtZero0) {
  share_dir();
  Case ref{1, true, 0.05};
  const std::string ref_tag = train(4, 1, ref);
  Case c = ref;
  c.stage = 2;
  for (int64_t ep : {2, 4}) {
    const std::string tag = train(4, ep, c);
    if (!testing::in_rank_process()) expect_same_training(ref_tag, tag);
  }
}

// Muon: each expert's matrices are whole on the ranks that hold the expert, so the expert flat
// groups orthogonalize over their expert-data-parallel group like any other. ep_size 2 at ZeRO
// 1/2 equals ep_size 1 at the same stage (Muon's ZeRO stages clip its updates, stage 0 in fp32
// the gradients).
TEST(MoEZeroDist, MuonEpSize2On2RanksEqualsReplicatedExperts) {
  share_dir();
  // The experts' matrices sit in Muon groups of their own (split off for their group), their
  // biases in Adam ones.
  run_ranks(2, [](int, int) {
    moe::MoEOptions o;
    o.num_experts = kExperts;
    o.ep_size = 2;
    auto model = std::make_shared<MoENetImpl>(o, 0.01);
    model->moe->set_deepspeed_parallelism();
    Case c;
    c.muon = true;
    auto engine = initialize(model, case_config(c, kTokensPerRank)).engine;
    auto* muon = dynamic_cast<optim::Muon*>(engine->optimizer());
    ASSERT_NE(muon, nullptr);
    int expert_matrices = 0;
    for (const auto& p : model->moe->deepspeed_moe->experts->parameters()) {
      for (size_t g = 0; g < muon->param_groups().size(); ++g) {
        for (const auto& q : muon->param_groups()[g].params()) {
          if (!q.is_same(p)) continue;
          EXPECT_EQ(optim::Muon::is_muon_group(muon->group_options(g)), p.dim() == 2);
          expert_matrices += p.dim() == 2;
        }
      }
    }
    EXPECT_EQ(expert_matrices, 2 * kExperts / 2);  // fc1 and fc2 of each local expert
  });
  for (int stage : {1, 2}) {
    Case c{2, true, 0.05};
    c.stage = stage;
    c.muon = true;
    const std::string ep1 = train(2, 1, c);
    const std::string ep2 = train(2, 2, c);
    if (!testing::in_rank_process()) {
      expect_same_training(ep1, ep2);
      expect_trained(ep2);
    }
  }
}

// 16-bit: the experts' GEMMs see other row blocks under another ep_size and the sums run in
// another order, so ep_size 2 tracks ep_size 1 to 16-bit precision, not bit for bit.
TEST(MoEZeroDist, SixteenBitEpSize2TracksReplicatedExpertsAtZero0To2) {
  share_dir();
  for (const std::string dtype : {"bf16", "fp16"}) {
    for (int stage : {0, 1, 2}) {
      if (dtype == "fp16" && stage == 1) continue;  // stage 1 differs from 2 only in when it reduces
      Case c{2, true, 0.05};
      c.stage = stage;
      c.dtype = dtype;
      const std::string ep1 = train(2, 1, c);
      const std::string ep2 = train(2, 2, c);
      if (!testing::in_rank_process()) {
        const double tol = dtype == "bf16" ? 5e-3 : 1e-3;
        expect_same_training(ep1, ep2, tol, tol);
        expect_trained(ep2);
      }
    }
  }
}

// Rank 1's expert gradient holds an inf in step 1 (its expert-data-parallel group is rank 1
// alone): every rank skips that step and the dynamic scale halves; the other steps apply.
TEST(MoEZeroDist, AnExpertOverflowOnOneRankSkipsTheStepOnEveryRank) {
  run_ranks(2, [](int rank, int world) {
    moe::MoEOptions o;
    o.num_experts = kExperts;
    o.ep_size = 2;
    o.drop_tokens = false;
    auto model = std::make_shared<MoENetImpl>(o, 0.01);
    model->moe->set_deepspeed_parallelism();
    model->init_experts();
    json config{{"train_micro_batch_size_per_gpu", kTokensPerRank},
                {"gradient_clipping", 1.0},
                {"optimizer", {{"type", "Adam"}, {"params", {{"lr", 0.01}}}}},
                {"fp16", {{"enabled", true}, {"initial_scale_power", 8}, {"hysteresis", 1}}},
                {"zero_optimization", {{"stage", 2}}}};
    auto [engine, opt, sched] = initialize(model, config);
    bool poison = false;
    auto expert_weight = model->moe->deepspeed_moe->experts->deepspeed_experts[0]->parameters()[0];
    expert_weight.register_hook([&poison, rank](const torch::Tensor& g) {
      return poison && rank == 1 ? g * std::numeric_limits<float>::infinity() : g;
    });
    for (int s = 0; s < 3; ++s) {
      poison = s == 1;
      const double scale = engine->loss_scale();
      std::vector<at::Tensor> before;
      for (auto& p : model->parameters()) before.push_back(p.detach().clone());
      auto [x, y] = tokens((s * world + rank) * kTokensPerRank, kTokensPerRank);
      engine->backward(engine->forward(x, y));
      engine->step();
      bool moved = false;
      auto now = model->parameters();
      for (size_t i = 0; i < now.size(); ++i) moved |= !torch::equal(now[i], before[i]);
      EXPECT_EQ(moved, !poison) << "rank " << rank << " step " << s;
      EXPECT_EQ(engine->loss_scale(), poison ? scale / 2 : scale) << "rank " << rank << " step " << s;
    }
    EXPECT_EQ(engine->skipped_steps(), 1) << "rank " << rank;
  });
}

// ---------------------------------------------------------------------------------------------
// Checkpoints in DeepSpeed's MoE layout at stages 0-2, fp32 and bf16.

struct CkptCase {
  const char* name;
  int stage;
  std::string dtype;
};

std::shared_ptr<MoENetImpl> ckpt_model(int64_t ep_size, bool data_before_expert = false) {
  moe::MoEOptions o;
  o.num_experts = kExperts;
  o.ep_size = ep_size;
  o.k = 2;
  o.capacity_factor = 1.0;  // drops tokens: the RTS/Gumbel draws must resume too
  auto model = std::make_shared<MoENetImpl>(o, 0.01);
  model->moe->set_deepspeed_parallelism(data_before_expert);
  model->init_experts();
  return model;
}

json ckpt_config(const CkptCase& c, int stage = -1, bool universal = false) {
  json config{{"train_micro_batch_size_per_gpu", kTokensPerRank},
              {"gradient_clipping", 0.1},
              {"optimizer", {{"type", "Adam"}, {"params", {{"lr", 0.05}}}}},
              {"scheduler", {{"type", "WarmupLR"}, {"params", {{"warmup_num_steps", 3}}}}},
              {"zero_optimization", {{"stage", stage < 0 ? c.stage : stage}}}};
  if (c.dtype == "bf16") config["bf16"] = {{"enabled", true}};
  if (universal) config["checkpoint"] = {{"load_universal", true}};
  return config;
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

// The model's parameters by name, its experts by global id.
checkpoint::TensorDict global_params(MoENetImpl& m) {
  const std::string experts = "moe.deepspeed_moe.experts.deepspeed_experts.";
  checkpoint::TensorDict out;
  for (const auto& p : m.named_parameters()) {
    std::string name = p.key();
    if (name.rfind(experts, 0) == 0) {
      const size_t dot = name.find('.', experts.size());
      const int64_t local = std::stoll(name.substr(experts.size(), dot - experts.size()));
      name = experts + std::to_string(m.moe->global_expert_id(local)) + name.substr(dot);
    }
    out.insert(name, p.value().detach().clone());
  }
  return out;
}

class MoEZeroDistCheckpoint : public ::testing::TestWithParam<CkptCase> {};

TEST_P(MoEZeroDistCheckpoint, DeepSpeedLayoutExactResumeAndAnotherEpSize) {
  const CkptCase c = GetParam();
  share_dir();
  const std::string dir = shared_dir();
  // DS_MOE_CKPT_EXPORT=<dir>: the checkpoints stay in <dir>/<case>, for a check by Python
  // DeepSpeed (docs/moe.md).
  const char* exported = std::getenv("DS_MOE_CKPT_EXPORT");
  const std::string ckpt = exported ? std::string(exported) + "/" + c.name : dir + "/ckpt";
  run_ranks(2, [&](int rank, int world) {
    {
      auto model = ckpt_model(2);
      auto [engine, opt, sched] = initialize(model, ckpt_config(c));
      torch::manual_seed(4242 + rank);
      train_steps(*engine, rank, world, 0, 4);
      torch::save(all_params(*model), dir + "/straight" + std::to_string(rank) + ".pt");
      checkpoint::save(checkpoint::ivalue_from_tensors(global_params(*model)),
                       dir + "/straight_named" + std::to_string(rank) + ".pt");
    }
    auto model = ckpt_model(2);
    auto [engine, opt, sched] = initialize(model, ckpt_config(c));
    torch::manual_seed(4242 + rank);
    train_steps(*engine, rank, world, 0, 2);
    engine->save_checkpoint(ckpt, std::string("step2"));
    for (int64_t i = 0; i < model->moe->num_local_experts(); ++i) {
      torch::save(model->moe->deepspeed_moe->experts->deepspeed_experts[i]->parameters(),
                  dir + "/saved_expert" + std::to_string(model->moe->global_expert_id(i)) + ".pt");
    }
  });
  if (!testing::in_rank_process()) {
    const std::string tag = ckpt + "/step2/";
    for (int e = 0; e < kExperts; ++e) {
      const std::string f = tag + "layer_0_expert_" + std::to_string(e) + "_mp_rank_00_model_states.pt";
      auto d = checkpoint::tensors_from_ivalue(checkpoint::load(f), f);
      EXPECT_NE(d.find("moe.deepspeed_moe.experts.deepspeed_experts." + std::to_string(e) +
                       ".fc1.weight"),
                nullptr) << f;
      EXPECT_EQ(d.size(), 4u) << f;
    }
    const c10::IValue raw = checkpoint::load(tag + "mp_rank_00_model_states.pt");
    auto states = checkpoint::ModelStates::from_ivalue(raw, "model states");
    EXPECT_NE(states.module.find("moe.deepspeed_moe.gate.wg.weight"), nullptr);
    for (const auto& item : states.module) {
      EXPECT_EQ(item.key().find("deepspeed_experts"), std::string::npos) << item.key();
    }
    // Stage 0: rank 0's optimizer state also sits in the model states, as DeepSpeed writes it
    // (its loader reads the expp_rank files); ZeRO: in the zero_pp_rank files only.
    EXPECT_EQ(states.optimizer.isNone(), c.stage > 0);
    ASSERT_TRUE(raw.toGenericDict().contains("num_experts"));
    const auto counts = raw.toGenericDict().at("num_experts").toListRef();
    ASSERT_EQ(counts.size(), 1u);
    EXPECT_EQ(counts[0].toInt(), kExperts);
    for (int r = 0; r < 2; ++r) {
      const std::string expp = tag + "expp_rank_" + std::to_string(r) + "_mp_rank_00_optim_states.pt";
      const std::string zero = tag + (c.dtype == "bf16" ? "bf16_" : "") + "zero_pp_rank_" +
                               std::to_string(r) + "_mp_rank_00_optim_states.pt";
      // DeepSpeed's MoE param groups: the dense one, then the experts' with name and moe.
      const auto expect_moe_groups = [&](const c10::IValue& base, const std::string& where) {
        const auto groups = base.toGenericDict().at("param_groups").toList();
        ASSERT_EQ(groups.size(), 2u) << where;
        EXPECT_FALSE(groups.get(0).toGenericDict().contains("moe")) << where;
        const auto experts = groups.get(1).toGenericDict();
        EXPECT_EQ(experts.at("name").toStringRef(), "ep_size_2") << where;
        EXPECT_TRUE(experts.at("moe").toBool()) << where;
      };
      if (c.stage == 0) {
        const auto file = checkpoint::load(expp).toGenericDict();
        ASSERT_TRUE(file.contains("optimizer")) << expp;
        const c10::IValue optimizer = file.at("optimizer");
        expect_moe_groups(c.dtype == "fp32" ? optimizer
                                            : optimizer.toGenericDict().at("optimizer_state_dict"),
                          expp);
      } else {
        // DeepSpeed writes no expp_rank file under ZeRO: every rank's zero_pp_rank file holds
        // its dense and expert partitions, param groups split as DeepSpeed's MoE groups.
        EXPECT_FALSE(std::filesystem::exists(expp)) << expp;
        auto z = checkpoint::ZeroOptimizerFile::from_ivalue(checkpoint::load(zero), zero);
        EXPECT_EQ(z.optimizer_state_dict.partition_count, (std::vector<int64_t>{2, 1})) << zero;
        expect_moe_groups(z.optimizer_state_dict.base_optimizer_state, zero);
        EXPECT_EQ(states.param_shapes->size(), 2u);
      }
    }
    if (c.stage > 0) {
      // zero_to_fp32: every expert by global id, its fp32 master (the saved weights).
      const auto fp32 = checkpoint::consolidate_zero_checkpoint(ckpt, std::string("step2"));
      EXPECT_EQ(fp32.size(), 5u + 4u * 4u);  // embed, gate, head; 4 experts of 4 tensors
      for (int e = 0; e < kExperts; ++e) {
        std::vector<at::Tensor> saved;
        torch::load(saved, dir + "/saved_expert" + std::to_string(e) + ".pt");
        const std::string name =
            "moe.deepspeed_moe.experts.deepspeed_experts." + std::to_string(e) + ".fc1.weight";
        const at::Tensor* t = fp32.find(name);
        ASSERT_NE(t, nullptr) << name;
        EXPECT_TRUE(torch::equal(t->to(saved[0].scalar_type()), saved[0])) << name;
      }
    }
    // Universal: one folder per expert parameter, named by global id, holding that expert's
    // fp32 master (the saved weights) and Adam's moments.
    std::filesystem::remove_all(dir + "/universal");
    checkpoint::ds_to_universal(tag, dir + "/universal/step2");
    for (int e = 0; e < kExperts; ++e) {
      const std::string folder = dir + "/universal/step2/zero/moe.deepspeed_moe.experts."
                                 "deepspeed_experts." + std::to_string(e) + ".fc1.weight";
      std::vector<at::Tensor> saved;
      torch::load(saved, dir + "/saved_expert" + std::to_string(e) + ".pt");
      const at::Tensor fp32 = checkpoint::load_universal_state(dir + "/universal/step2",
                                                               folder.substr(folder.rfind('/') + 1),
                                                               "fp32");
      EXPECT_TRUE(torch::equal(fp32.to(saved[0].scalar_type()), saved[0])) << folder;
      EXPECT_TRUE(std::filesystem::exists(folder + "/exp_avg_sq.pt")) << folder;
    }
    EXPECT_FALSE(std::filesystem::exists(dir + "/universal/step2/zero/moe.deepspeed_moe.experts."
                                         "deepspeed_experts." + std::to_string(kExperts) +
                                         ".fc1.weight"));
  }
  // Loading <load_dir>/step2 with `config` on the saving shape and training on ends with the
  // same 4 steps' parameters, bit for bit.
  const auto expect_exact_resume = [&](const std::string& load_dir, const json& config) {
    run_ranks(2, [&](int rank, int world) {
      auto model = ckpt_model(2);
      auto [engine, opt, sched] = initialize(model, config);
      engine->load_checkpoint(load_dir, std::string("step2"));
      EXPECT_EQ(engine->global_steps(), 2);
      train_steps(*engine, rank, world, 2, 4);
      std::vector<at::Tensor> straight;
      torch::load(straight, dir + "/straight" + std::to_string(rank) + ".pt");
      auto now = all_params(*model);
      ASSERT_EQ(now.size(), straight.size());
      for (size_t i = 0; i < now.size(); ++i) EXPECT_TRUE(torch::equal(now[i], straight[i])) << i;
    });
  };
  expect_exact_resume(ckpt, ckpt_config(c));
  expect_exact_resume(dir + "/universal", ckpt_config(c, -1, /*universal=*/true));
  // ... and onto ep_size 1 (every rank holds every expert) at another stage: the experts and
  // their moments come by global id, so the run follows the uninterrupted one.
  run_ranks(2, [&](int rank, int world) {
    auto model = ckpt_model(1);
    auto [engine, opt, sched] =
        initialize(model, ckpt_config(c, c.stage == 0 ? 2 : 0, /*universal=*/true));
    engine->load_checkpoint(dir + "/universal", std::string("step2"));
    train_steps(*engine, rank, world, 2, 4);
    checkpoint::TensorDict straight;  // both ranks' experts, by global id
    for (int r = 0; r < world; ++r) {
      const std::string f = dir + "/straight_named" + std::to_string(r) + ".pt";
      for (const auto& item : checkpoint::tensors_from_ivalue(checkpoint::load(f), f)) {
        if (!straight.contains(item.key())) straight.insert(item.key(), item.value());
      }
    }
    const double tol = c.dtype == "bf16" ? 1e-2 : 1e-5;
    const auto now = global_params(*model);
    ASSERT_EQ(now.size(), straight.size());
    for (const auto& item : now) {
      const at::Tensor* expect = straight.find(item.key());
      ASSERT_NE(expect, nullptr) << item.key();
      EXPECT_TRUE(torch::allclose(item.value(), *expect, tol, tol))
          << item.key() << " max diff " << (item.value() - *expect).abs().max().item<double>();
    }
  });
  // ep_size 2 -> 4 on 4 ranks: the optimizer states are refused by name, the weights load.
  run_ranks(4, [&](int rank, int world) {
    auto model = ckpt_model(4);
    auto [engine, opt, sched] = initialize(model, ckpt_config(c));
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
    torch::load(saved, dir + "/saved_expert" + std::to_string(model->moe->global_expert_id(0)) + ".pt");
    auto mine = model->moe->deepspeed_moe->experts->deepspeed_experts[0]->parameters();
    ASSERT_EQ(mine.size(), saved.size());
    for (size_t i = 0; i < mine.size(); ++i) EXPECT_TRUE(torch::equal(mine[i], saved[i]));
    train_steps(*engine, rank, world, 2, 3);  // and it trains on
  });
}

// The other rank layout: with use_data_before_expert_parallelism an expert's partitions sit on
// ranks {0, 1} or {2, 3} (not {0, 2}, {1, 3}). The universal checkpoint holds every expert by
// global id all the same, and loads onto the default layout, where rank 1 holds other experts.
TEST(MoEZeroDistUniversal, DataBeforeExpertLayoutLoadsOntoTheDefaultOne) {
  share_dir();
  const std::string dir = shared_dir();
  const CkptCase c{"Zero2Fp32", 2, "fp32"};
  json saving = ckpt_config(c);
  saving["use_data_before_expert_parallelism"] = true;
  run_ranks(4, [&](int rank, int world) {
    {
      auto model = ckpt_model(2, /*data_before_expert=*/true);
      auto [engine, opt, sched] = initialize(model, saving);
      torch::manual_seed(4242 + rank);
      train_steps(*engine, rank, world, 0, 4);
      checkpoint::save(checkpoint::ivalue_from_tensors(global_params(*model)),
                       dir + "/straight_named" + std::to_string(rank) + ".pt");
    }
    auto model = ckpt_model(2, /*data_before_expert=*/true);
    auto [engine, opt, sched] = initialize(model, saving);
    torch::manual_seed(4242 + rank);
    train_steps(*engine, rank, world, 0, 2);
    engine->save_checkpoint(dir + "/ckpt", std::string("step2"));
    checkpoint::save(checkpoint::ivalue_from_tensors(global_params(*model)),
                     dir + "/saved_named" + std::to_string(rank) + ".pt");
  });
  const auto all_ranks = [&](const std::string& stem) {
    checkpoint::TensorDict out;
    for (int r = 0; r < 4; ++r) {
      const std::string f = dir + "/" + stem + std::to_string(r) + ".pt";
      for (const auto& item : checkpoint::tensors_from_ivalue(checkpoint::load(f), f)) {
        if (!out.contains(item.key())) out.insert(item.key(), item.value());
      }
    }
    return out;
  };
  if (!testing::in_rank_process()) {
    checkpoint::ds_to_universal(dir + "/ckpt/step2", dir + "/universal/step2");
    const auto saved = all_ranks("saved_named");
    EXPECT_EQ(saved.size(), 5u + 4u * 4u);  // embed, gate, head; 4 experts of 4 tensors
    for (const auto& item : saved) {
      const at::Tensor fp32 =
          checkpoint::load_universal_state(dir + "/universal/step2", item.key(), "fp32");
      EXPECT_TRUE(torch::equal(fp32, item.value())) << item.key();
    }
    // zero_to_fp32 of the same layout: every parameter, experts by global id.
    const auto fp32 = checkpoint::consolidate_zero_checkpoint(dir + "/ckpt", std::string("step2"));
    EXPECT_EQ(fp32.size(), saved.size());
    for (const auto& item : saved) {
      const at::Tensor* t = fp32.find(item.key());
      ASSERT_NE(t, nullptr) << item.key();
      EXPECT_TRUE(torch::equal(*t, item.value())) << item.key();
    }
    // Without one of its expert files the conversion names the file.
    std::filesystem::create_directories(dir + "/broken");
    std::filesystem::copy(dir + "/ckpt/step2", dir + "/broken/step2",
                          std::filesystem::copy_options::recursive);
    std::filesystem::remove(dir + "/broken/step2/layer_0_expert_3_mp_rank_00_model_states.pt");
    try {
      checkpoint::ds_to_universal(dir + "/broken/step2", dir + "/broken_universal");
      ADD_FAILURE() << "converted without expert 3's file";
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find("layer_0_expert_3_mp_rank_00_model_states.pt"),
                std::string::npos) << e.what();
    }
  }
  run_ranks(4, [&](int rank, int world) {
    auto model = ckpt_model(2);
    auto [engine, opt, sched] = initialize(model, ckpt_config(c, -1, /*universal=*/true));
    engine->load_checkpoint(dir + "/universal", std::string("step2"));
    train_steps(*engine, rank, world, 2, 4);
    const auto straight = all_ranks("straight_named");
    for (const auto& item : global_params(*model)) {
      const at::Tensor* expect = straight.find(item.key());
      ASSERT_NE(expect, nullptr) << item.key();
      EXPECT_TRUE(torch::allclose(item.value(), *expect, 1e-5, 1e-5))
          << item.key() << " max diff " << (item.value() - *expect).abs().max().item<double>();
    }
  });
}

// An mpu of 2 model-parallel peers x 2 data-parallel ranks (the model replicated over the
// peers, as the mpu test's): each data-parallel group {0, 2}, {1, 3} gets its own expert groups
// of ep_size 2, so the peers train as the 2 data-parallel ranks of a job without an mpu. The
// seed follows the data-parallel rank: the peers draw the same RTS tokens.
TEST(MoEZeroDistModelParallel, PeersTrainAsDataParallelRanksAndResume) {
  share_dir();
  const std::string dir = shared_dir();
  const CkptCase c{"Zero2Fp32", 2, "fp32"};
  const auto model_for = [](const comm::Group* dp) {
    moe::MoEOptions o;
    o.num_experts = kExperts;
    o.ep_size = 2;
    o.k = 2;
    o.capacity_factor = 1.0;
    auto model = std::make_shared<MoENetImpl>(o, 0.01);
    model->moe->set_deepspeed_parallelism(false, dp);
    model->init_experts();
    return model;
  };
  run_ranks(2, [&](int rank, int world) {
    auto model = model_for(nullptr);
    auto [engine, opt, sched] = initialize(model, ckpt_config(c));
    torch::manual_seed(4242 + rank);
    train_steps(*engine, rank, world, 0, 4);
    checkpoint::save(checkpoint::ivalue_from_tensors(global_params(*model)),
                     dir + "/plain" + std::to_string(rank) + ".pt");
  });
  run_ranks(4, [&](int rank, int world) {
    (void)world;
    auto mpu = std::make_shared<TopologyMpu>(PipeModelDataParallelTopology(1, /*mp=*/2, /*dp=*/2));
    const comm::Group dp = mpu->get_data_parallel_group();
    const int dp_rank = dp.rank();
    const std::string plain = dir + "/plain" + std::to_string(dp_rank) + ".pt";
    const auto expect = checkpoint::tensors_from_ivalue(checkpoint::load(plain), plain);
    const auto expect_plain = [&](MoENetImpl& model) {
      const auto now = global_params(model);
      ASSERT_EQ(now.size(), expect.size());
      for (const auto& item : now) {
        const at::Tensor* e = expect.find(item.key());
        ASSERT_NE(e, nullptr) << item.key();
        EXPECT_TRUE(torch::equal(item.value(), *e)) << "rank " << rank << " " << item.key();
      }
    };
    {
      auto model = model_for(&dp);
      auto [engine, opt, sched] = initialize(model, ckpt_config(c), nullptr, nullptr, mpu);
      const auto* groups = model->moe->ep_groups();
      ASSERT_NE(groups, nullptr);
      EXPECT_EQ(groups->expert_parallel.ranks(), dp.ranks());  // ep_size 2 = the dp group
      EXPECT_EQ(groups->expert_data_parallel.ranks(), std::vector<int>{rank});
      torch::manual_seed(4242 + dp_rank);
      train_steps(*engine, dp_rank, 2, 0, 2);
      engine->save_checkpoint(dir + "/mpu_ckpt", std::string("step2"));
      train_steps(*engine, dp_rank, 2, 2, 4);
      expect_plain(*model);
    }
    // Each model-parallel rank's files (experts under mp_rank_XX), and an exact resume.
    EXPECT_TRUE(std::filesystem::exists(dir + "/mpu_ckpt/step2/layer_0_expert_3_mp_rank_" +
                                        std::string(mpu->get_model_parallel_rank() ? "01" : "00") +
                                        "_model_states.pt"));
    auto model = model_for(&dp);
    auto [engine, opt, sched] = initialize(model, ckpt_config(c), nullptr, nullptr, mpu);
    engine->load_checkpoint(dir + "/mpu_ckpt", std::string("step2"));
    train_steps(*engine, dp_rank, 2, 2, 4);
    expect_plain(*model);
  });
  // Groups made over the world before initialize would mix the peers: refused by name, and so
  // is a second layout of the same ep_size in one process.
  run_ranks(4, [&](int, int) {
    auto mpu = std::make_shared<TopologyMpu>(PipeModelDataParallelTopology(1, /*mp=*/2, /*dp=*/2));
    const comm::Group dp = mpu->get_data_parallel_group();
    auto model = model_for(nullptr);
    try {
      initialize(model, ckpt_config(c), nullptr, nullptr, mpu);
      ADD_FAILURE() << "world expert groups under an mpu were accepted";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("outside this rank's data-parallel group"),
                std::string::npos) << e.what();
    }
    try {
      model_for(&dp);
      ADD_FAILURE() << "a second ep_size_2 layout was accepted";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("other data-parallel groups"), std::string::npos)
          << e.what();
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Stages, MoEZeroDistCheckpoint,
                         ::testing::Values(CkptCase{"Zero0Fp32", 0, "fp32"},
                                           CkptCase{"Zero2Fp32", 2, "fp32"},
                                           CkptCase{"Zero1Bf16", 1, "bf16"},
                                           CkptCase{"Zero0Bf16", 0, "bf16"}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace deepspeed
