// AutoEP (the expert_parallel section; deepspeed/auto_ep.h) on Gloo ranks against one process:
//  - a sharded TokenChoiceMoE gives every rank's tokens the whole layer's output, and the
//    gradients of the whole layer (inputs, gate summed over the ranks, each rank's expert
//    slice): with random routing, with every token routed to rank 0's experts (rank 1 sends and
//    receives no row), with score_apply "pre" and sigmoid scores, and in bf16;
//  - an engine with expert_parallel (autoep_size 2 on 2 ranks at ZeRO 0/1/2/3; on 4 ranks at
//    ZeRO 2 and 3, two ranks per expert, which ZeRO-3 partitions each expert over; autoep_size
//    1 on 2 ranks at ZeRO-3, also with the optimizer and parameters offloaded to host memory
//    and to NVMe swap files) ends with the
//    parameters of one process that trained the whole batch with the whole layer;
//  - checkpoints: DeepSpeed's per-expert files, an exact resume, and the weights onto
//    autoep_size 1. At ZeRO-3 the experts live in the optimizer shards (ds_autoep_layers says
//    so, per rank), resume exactly on the same placement, and another placement is refused by
//    name. Universal checkpoints (ds_to_universal) of ZeRO-0, -2 and -3 resume on another
//    placement, at ZeRO-3 with frozen experts too;
//  - DeepSeek's group-limited routing from the section trains as one process routing alike;
//  - bad set-ups: an error naming what is wrong.
#include "deepspeed/auto_ep.h"
#include "deepspeed/deepspeed.h"

#include <filesystem>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deepspeed/checkpoint.h"
#include "deepspeed/universal_checkpoint.h"
#include "deepspeed/zero3.h"
#include "support/auto_ep_net.h"
#include "support/multi_rank.h"
#include "support/shared_run_dir.h"

namespace deepspeed {
namespace {

using nlohmann::json;
using testing::in_rank_process;
using testing::run_ranks;

constexpr int64_t kHidden = testing::kAutoEpHidden, kFfn = testing::kAutoEpFfn,
                  kExperts = testing::kAutoEpExperts, kRows = 6, kSteps = 3;

std::string& dir() {
  static std::string d;
  return d;
}
void share_dir() { dir() = testing::new_shared_run_dir("DS_AUTO_EP_TEST_DIR"); }

struct LayerCase {
  std::string score_func = "softmax", score_apply = "post";
  bool one_sided = false;  // every token to experts 0 and 1 (rank 0's)
  at::ScalarType dtype = at::kFloat;
};

at::Tensor tokens(int rank, const LayerCase& c) {
  torch::manual_seed(100 + rank);
  at::Tensor x = torch::randn({3, kRows, kHidden});
  return (c.one_sided ? x.abs() : x).to(c.dtype);
}

// The sharded layer on each rank against the whole layer on every rank's tokens.
void check_layer(int rank, int world, const LayerCase& c) {
  moe::TokenChoiceOptions o;
  o.num_experts = kExperts;
  o.score_func = c.score_func;
  o.score_apply = c.score_apply;
  torch::manual_seed(7);
  moe::TokenChoiceMoE whole(kHidden, kFfn, o), sharded(kHidden, kFfn, o);
  {
    torch::NoGradGuard no_grad;
    if (c.one_sided) {
      // Positive tokens score experts 0 and 1 above 2 and 3.
      auto w = whole->gate->weight;
      w.narrow(0, 0, 2).fill_(0.5);
      w.narrow(0, 2, 2).fill_(-0.5);
    }
    const auto src = whole->named_parameters();
    for (auto& p : sharded->named_parameters()) p.value().copy_(src[p.key()]);
  }
  whole->to(c.dtype);
  sharded->to(c.dtype);
  const auto& groups = moe::create_expert_and_data_parallel(world, false);
  sharded->shard_experts(&groups);
  ASSERT_EQ(sharded->num_local_experts(), kExperts / world);

  at::Tensor x = tokens(rank, c).requires_grad_(true);
  at::Tensor y = sharded->forward(x);
  torch::manual_seed(200 + rank);
  at::Tensor probe = torch::randn(y.sizes()).to(c.dtype);
  (y * probe).sum().backward();

  at::Tensor ref_y, ref_dx;
  for (int r = 0; r < world; ++r) {
    at::Tensor xr = tokens(r, c).requires_grad_(true);
    at::Tensor yr = whole->forward(xr);
    torch::manual_seed(200 + r);
    (yr * torch::randn(yr.sizes()).to(c.dtype)).sum().backward();
    if (r == rank) {
      ref_y = yr.detach();
      ref_dx = xr.grad();
    }
  }
  const double tol = c.dtype == at::kFloat ? 1e-5 : 2e-2;
  auto close = [tol](const at::Tensor& a, const at::Tensor& b) {
    return torch::allclose(a.to(at::kFloat), b.to(at::kFloat), tol, tol);
  };
  EXPECT_TRUE(close(y, ref_y)) << (y - ref_y).abs().max();
  EXPECT_TRUE(close(x.grad(), ref_dx));
  // The gate is replicated: each rank's gradient is from its own tokens; summed, the whole's.
  at::Tensor gate_grad = sharded->gate->weight.grad().to(at::kFloat).contiguous();
  comm::all_reduce(gate_grad);
  EXPECT_TRUE(close(gate_grad, whole->gate->weight.grad()));
  const int64_t first = sharded->first_expert(), local = sharded->num_local_experts();
  EXPECT_EQ(first, rank * local);
  for (const char* w : {"experts.w1", "experts.w2", "experts.w3"}) {
    const at::Tensor mine = sharded->named_parameters()[w].grad();
    const at::Tensor ref = whole->named_parameters()[w].grad().narrow(0, first, local);
    ASSERT_TRUE(mine.defined()) << w;  // defined even where the experts got no row
    EXPECT_TRUE(close(mine, ref)) << w << " " << (mine - ref).abs().max();
  }
  const at::Tensor counts = sharded->tokens_per_expert();
  EXPECT_EQ(counts.sum().item<int64_t>(), 3 * kRows * o.top_k);
  if (c.one_sided) EXPECT_EQ(counts.narrow(0, 2, 2).sum().item<int64_t>(), 0);
}

TEST(AutoEPDist, ShardedLayerEqualsTheWholeLayer) {
  std::vector<LayerCase> cases(5);
  cases[1].one_sided = true;
  cases[2].score_apply = "pre";
  cases[3].score_func = "sigmoid";
  cases[4].dtype = at::kBFloat16;
  for (const auto& c : cases) {
    run_ranks(2, [&](int rank, int world) { check_layer(rank, world, c); });
  }
}

using Net = testing::AutoEpNet;

// Set by a test whose runs keep the experts' w2 frozen (no gradient, no optimizer state).
bool frozen_w2 = false;
struct FrozenW2 {
  FrozenW2() { frozen_w2 = true; }
  ~FrozenW2() { frozen_w2 = false; }
};

// The seeded net of every run; its experts' w2 frozen while a FrozenW2 lives.
Net new_net() {
  Net net;
  if (frozen_w2) net->block->named_parameters()["experts.w2"].requires_grad_(false);
  return net;
}

// The batches of ranks [first, first + count) at `step`: a rank trains on its own, one process
// on every rank's, concatenated.
std::pair<at::Tensor, at::Tensor> batch(int step, int first, int count) {
  std::vector<at::Tensor> xs, ys;
  for (int r = first; r < first + count; ++r) {
    torch::manual_seed(1000 + 10 * step + r);
    xs.push_back(torch::randn({kRows, kHidden}));
    ys.push_back(torch::randn({kRows, kHidden}));
  }
  return {torch::cat(xs), torch::cat(ys)};
}

json net_config(int stage, int64_t rows, int64_t autoep_size) {
  json c{{"train_micro_batch_size_per_gpu", rows},
         {"gradient_accumulation_steps", 1},
         {"gradient_clipping", 0.5},
         {"optimizer", {{"type", "Adam"}, {"params", {{"lr", 0.02}}}}},
         {"zero_optimization", {{"stage", stage}}}};
  // ZeRO-3 partitions even these small parameters (the unit's are gathered for each use).
  if (stage == 3) c["zero_optimization"]["stage3_param_persistence_threshold"] = 0;
  if (autoep_size > 0) c["expert_parallel"] = {{"enabled", true}, {"autoep_size", autoep_size}};
  return c;
}

// Writes the parameters after `steps` steps: dense ones whole, experts by global id.
void save_params(Net& net, const std::string& tag) {
  if (comm::get_rank() == 0) {
    std::vector<at::Tensor> dense;
    for (const auto& p : net->named_parameters()) {
      if (p.key().find("experts") == std::string::npos) dense.push_back(p.value().detach().clone());
    }
    torch::save(dense, dir() + "/" + tag + "_dense.pt");
  }
  const auto& b = net->block;
  // One writer per expert: the first rank of its expert-data-parallel group.
  if (b->ep_groups() != nullptr && b->ep_groups()->expert_data_parallel.rank() != 0) return;
  for (int64_t i = 0; i < b->num_local_experts(); ++i) {
    std::vector<at::Tensor> w;
    for (const auto& p : b->expert_parameters()) w.push_back(p[i].detach().clone());
    torch::save(w, dir() + "/" + tag + "_expert" + std::to_string(b->first_expert() + i) + ".pt");
  }
}

void train(int world, int stage, int64_t autoep_size, const std::string& tag,
           const json& patch = json::object()) {
  run_ranks(world, [&](int rank, int) {
    Net net = new_net();
    json config = net_config(stage, kRows, autoep_size);
    config.merge_patch(patch);
    auto engine = initialize(net.ptr(), config).engine;
    for (int s = 0; s < kSteps; ++s) {
      auto [x, y] = batch(s, rank, 1);
      engine->backward(engine->forward(x, y));
      engine->step();
    }
    zero::GatheredParameters whole(*net);  // ZeRO-3's partitions, gathered
    save_params(net, tag);
  });
}

void train_reference(int world, const std::string& tag, const json& patch = json::object()) {
  run_ranks(1, [&](int, int) {
    Net net = new_net();
    json config = net_config(0, kRows * world, 0);
    config.merge_patch(patch);
    auto engine = initialize(net.ptr(), config).engine;
    for (int s = 0; s < kSteps; ++s) {
      auto [x, y] = batch(s, 0, world);
      engine->backward(engine->forward(x, y));
      engine->step();
    }
    save_params(net, tag);
  });
}

void expect_same_params(const std::string& ref, const std::string& tag, double tol = 1e-5) {
  std::vector<at::Tensor> a, b;
  torch::load(a, dir() + "/" + ref + "_dense.pt");
  torch::load(b, dir() + "/" + tag + "_dense.pt");
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::allclose(a[i], b[i], tol, tol)) << tag;
  for (int64_t e = 0; e < kExperts; ++e) {
    torch::load(a, dir() + "/" + ref + "_expert" + std::to_string(e) + ".pt");
    torch::load(b, dir() + "/" + tag + "_expert" + std::to_string(e) + ".pt");
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_TRUE(torch::allclose(a[i], b[i], tol, tol))
          << tag << " expert " << e << " w" << i << ": " << (a[i] - b[i]).abs().max();
    }
  }
}

TEST(AutoEPDist, EngineTrainsAsOneProcessWithTheWholeLayer) {
  share_dir();
  train_reference(2, "ref2");
  train_reference(4, "ref4");
  for (int stage : {0, 1, 2}) {
    const std::string tag = "ep2_s" + std::to_string(stage);
    train(2, stage, 2, tag);
    if (!in_rank_process()) expect_same_params("ref2", tag);
  }
  train(2, 3, 2, "ep2_s3");
  train(2, 3, 1, "ep1_s3");  // each expert partitioned over both ranks
  // ZeRO-Offload: the shards and the optimizer in host buffers, CPU-Adam.
  const json offload = {{"zero_optimization",
                         {{"offload_optimizer", {{"device", "cpu"}}},
                          {"offload_param", {{"device", "cpu"}}}}}};
  train(2, 3, 1, "ep1_s3_offload", offload);
  // ZeRO-Infinity: the shards and the optimizer state in swap files, read back for each use.
  const json nvme = {{"zero_optimization",
                      {{"offload_optimizer", {{"device", "nvme"}, {"nvme_path", dir()}}},
                       {"offload_param",
                        {{"device", "nvme"}, {"nvme_path", dir()}, {"max_in_cpu", 0}}}}}};
  train(2, 3, 1, "ep1_s3_nvme", nvme);
  if (!in_rank_process()) {
    expect_same_params("ref2", "ep2_s3");
    expect_same_params("ref2", "ep1_s3");
    expect_same_params("ref2", "ep1_s3_offload");
    expect_same_params("ref2", "ep1_s3_nvme");
  }
  train(4, 2, 2, "w4_ep2_s2");
  train(4, 1, 4, "w4_ep4_s1");
  train(4, 3, 2, "w4_ep2_s3");  // two experts per rank, each partitioned over two ranks
  if (!in_rank_process()) {
    expect_same_params("ref4", "w4_ep2_s2");
    expect_same_params("ref4", "w4_ep4_s1");
    expect_same_params("ref4", "w4_ep2_s3");
    // The training moved the experts (the comparison is not of untouched weights).
    std::vector<at::Tensor> trained;
    torch::load(trained, dir() + "/ref2_expert3.pt");
    Net fresh;
    EXPECT_FALSE(torch::allclose(trained[0], fresh->block->experts->w1[3], 1e-4, 1e-4));
  }
}

// DeepSeek's group-limited routing from the section: two groups of two experts, each token's two
// experts within its best group. One process routes the same way over the whole layer
// (autoep_size 1); without the limit the parameters differ.
TEST(AutoEPDist, GroupLimitedRoutingTrainsAsOneProcess) {
  share_dir();
  const json groups = {{"expert_parallel", {{"num_expert_groups", 2}, {"num_limited_groups", 1}}}};
  json whole = groups;
  whole["expert_parallel"]["enabled"] = true;
  whole["expert_parallel"]["autoep_size"] = 1;
  train_reference(2, "ref_groups", whole);
  train_reference(2, "ref_plain");
  train(2, 2, 2, "ep2_groups", groups);
  train(2, 3, 2, "ep2_groups_s3", groups);
  if (in_rank_process()) return;
  expect_same_params("ref_groups", "ep2_groups");
  expect_same_params("ref_groups", "ep2_groups_s3");
  std::vector<at::Tensor> a, b;
  torch::load(a, dir() + "/ref_groups_expert0.pt");
  torch::load(b, dir() + "/ref_plain_expert0.pt");
  EXPECT_FALSE(torch::allclose(a[0], b[0], 1e-5, 1e-5));
}

TEST(AutoEPDist, CheckpointsUseDeepSpeedsExpertFilesAndResumeExactly) {
  share_dir();
  const std::string ckpt = dir() + "/ckpt";
  // Uninterrupted: kSteps steps. Interrupted: 2 steps, save, new processes load, 1 more step.
  train(2, 1, 2, "straight");
  run_ranks(2, [&](int rank, int) {
    Net net;
    auto engine = initialize(net.ptr(), net_config(1, kRows, 2)).engine;
    for (int s = 0; s < 2; ++s) {
      auto [x, y] = batch(s, rank, 1);
      engine->backward(engine->forward(x, y));
      engine->step();
    }
    engine->save_checkpoint(ckpt, "two");
  });
  run_ranks(2, [&](int rank, int) {
    Net net;
    auto engine = initialize(net.ptr(), net_config(1, kRows, 2)).engine;
    engine->load_checkpoint(ckpt, "two");
    auto [x, y] = batch(2, rank, 1);
    engine->backward(engine->forward(x, y));
    engine->step();
    save_params(net, "resumed");
  });
  // The weights alone onto autoep_size 1 (every rank whole): the saved step-2 experts.
  run_ranks(2, [&](int, int) {
    Net net;
    auto engine = initialize(net.ptr(), net_config(0, kRows, 1)).engine;
    LoadCheckpointOptions only;
    only.load_module_only = true;
    engine->load_checkpoint(ckpt, "two", only);
    EXPECT_EQ(net->block->num_local_experts(), kExperts);
    save_params(net, "onto_ep1");
  });
  if (in_rank_process()) return;
  expect_same_params("straight", "resumed", 0.0);
  // DeepSpeed's AutoEP layout: experts by global id, "<layer>.experts.<w>.<id>", and a model
  // states file without them.
  for (int64_t e = 0; e < kExperts; ++e) {
    const std::string f = ckpt + "/two/layer_0_expert_" + std::to_string(e) +
                          "_mp_rank_00_model_states.pt";
    ASSERT_TRUE(std::filesystem::exists(f)) << f;
    const auto saved = checkpoint::tensors_from_ivalue(checkpoint::load(f), f);
    const std::string id = std::to_string(e);
    for (const char* w : {"w1", "w2", "w3"}) {
      const at::Tensor* t = saved.find(std::string("moe.experts.") + w + "." + id);
      ASSERT_NE(t, nullptr) << f << " " << w;
      EXPECT_EQ(t->dim(), 2);
    }
    std::vector<at::Tensor> onto;
    torch::load(onto, dir() + "/onto_ep1_expert" + id + ".pt");
    EXPECT_TRUE(torch::equal(onto[0], *saved.find("moe.experts.w1." + id)));
  }
  const std::string states = ckpt + "/two/mp_rank_00_model_states.pt";
  const auto model = checkpoint::ModelStates::from_ivalue(checkpoint::load(states), states);
  EXPECT_EQ(model.module.find("moe.experts.w1"), nullptr);
  EXPECT_NE(model.module.find("moe.gate.weight"), nullptr);
  // DeepSpeed's ds_autoep_layers: the experts are in per-expert files.
  const auto top = checkpoint::load(states).toGenericDict();
  ASSERT_TRUE(top.contains("ds_autoep_layers"));
  const json layers = checkpoint::json_from_ivalue(top.at("ds_autoep_layers"), states);
  ASSERT_EQ(layers.size(), 1u) << layers.dump();
  EXPECT_EQ(layers[0]["checkpoint_format"], "per_expert_files");
  EXPECT_TRUE(layers[0]["checkpoint_format_version"].is_null());
  EXPECT_EQ(layers[0]["moe_layer_id"], 0);
  EXPECT_EQ(layers[0]["ep_size"], 2);
  EXPECT_EQ(layers[0]["ep_rank"], 0);  // rank 0's file
  EXPECT_EQ(layers[0]["expert_placement"]["ranks"][0]["experts"], json({0, 1}));
  // DeepSpeed's universal_checkpoint_info, which its ds_to_universal requires of AutoEP models.
  ASSERT_TRUE(top.contains("universal_checkpoint_info"));
  const json info = checkpoint::json_from_ivalue(top.at("universal_checkpoint_info"), states);
  EXPECT_EQ(info["expert_parameter_patterns"], json({".*\\.experts\\.w[123]$"}));
  EXPECT_EQ(info["ds_autoep_layers"], layers);
}

// Steps [0, 2) on 2 ranks with autoep_size 2 at ZeRO `stage`, saved as `tag` under `ckpt`.
void save_two_flat_steps(int stage, const std::string& ckpt, const std::string& tag) {
  run_ranks(2, [&](int rank, int) {
    Net net;
    auto engine = initialize(net.ptr(), net_config(stage, kRows, 2)).engine;
    for (int s = 0; s < 2; ++s) {
      auto [x, y] = batch(s, rank, 1);
      engine->backward(engine->forward(x, y));
      engine->step();
    }
    engine->save_checkpoint(ckpt, tag);
  });
}

// Loads the universal checkpoint `universal` (<dir>/<tag>) on `world` ranks at ZeRO `stage` with
// autoep_size `ep` (0: none), and takes step 2 on the `source_world`-rank run's rows, split
// evenly over the ranks; the parameters are saved as `tag`.
void resume_universal(const std::string& universal, int source_world, int world, int stage,
                      int64_t ep, const std::string& tag) {
  run_ranks(world, [&](int rank, int) {
    Net net = new_net();
    const int64_t rows = source_world * kRows / world;
    json config = net_config(stage, rows, ep);
    config["checkpoint"] = {{"load_universal", true}};
    auto engine = initialize(net.ptr(), config).engine;
    const std::filesystem::path folder(universal);
    engine->load_checkpoint(folder.parent_path().string(), folder.filename().string());
    auto [x, y] = batch(2, 0, source_world);
    const int64_t first = rank * rows;
    engine->backward(engine->forward(x.narrow(0, first, rows), y.narrow(0, first, rows)));
    engine->step();
    zero::GatheredParameters whole(*net);
    save_params(net, tag);
  });
}

// ds_to_universal joins each expert-parallel rank's rows of the stacked experts (and their Adam
// states) into one tensor of every expert, marked as DeepSpeed marks them (zero_to_fp32 joins the
// weights alike), and a load takes its own rows: from 2 ranks with autoep_size 2 (ZeRO-0 and
// ZeRO-2) onto one process without AutoEP, onto 4 ranks with autoep_size 2 (each expert over 2
// ranks) and 4; the next step is the uninterrupted run's.
TEST(AutoEPDist, UniversalCheckpointsResumeOnAnyPlacement) {
  share_dir();
  train_reference(2, "ref2_universal");
  for (int stage : {0, 2}) {
    const std::string s = "s" + std::to_string(stage);
    const std::string ckpt = dir() + "/ckpt_flat_" + s, universal = dir() + "/uni_" + s + "/u";
    save_two_flat_steps(stage, ckpt, "two");
    if (!in_rank_process()) {
      std::filesystem::create_directories(dir() + "/uni_" + s);
      const auto conversion = checkpoint::ds_to_universal(ckpt + "/two", universal);
      EXPECT_EQ(conversion.dp_degree, 2);
      // Every expert, stacked: the expert files' weights, marked for DeepSpeed's loader.
      const std::string f = universal + "/zero/moe.experts.w2/fp32.pt";
      const auto d = checkpoint::load(f).toGenericDict();
      EXPECT_TRUE(d.at("is_expert_param").toBool()) << f;
      EXPECT_EQ(d.at("ep_num_experts").toInt(), kExperts);
      EXPECT_EQ(d.at("cat_dim").toInt(), 0);
      const at::Tensor w2 = d.at("param").toTensor();
      ASSERT_EQ(w2.sizes(), (std::vector<int64_t>{kExperts, kHidden, kFfn}));
      for (int64_t e = 0; e < kExperts; ++e) {
        const std::string file = ckpt + "/two/layer_0_expert_" + std::to_string(e) +
                                 "_mp_rank_00_model_states.pt";
        const auto saved = checkpoint::tensors_from_ivalue(checkpoint::load(file), file);
        EXPECT_TRUE(torch::equal(w2[e], *saved.find("moe.experts.w2." + std::to_string(e))));
      }
      EXPECT_EQ(checkpoint::load_universal_state(universal, "moe.experts.w1", "exp_avg").size(0),
                kExperts);
      // zero_to_fp32 joins them alike.
      const auto fp32 = checkpoint::consolidate_zero_checkpoint(ckpt, "two");
      ASSERT_NE(fp32.find("moe.experts.w2"), nullptr);
      EXPECT_TRUE(torch::equal(*fp32.find("moe.experts.w2"), w2));
    }
    resume_universal(universal, 2, 1, 1, 0, "uni1_" + s);
    resume_universal(universal, 2, 4, 2, 2, "uni4ep2_" + s);
    if (stage == 2) resume_universal(universal, 2, 4, 1, 4, "uni4ep4_" + s);
    if (in_rank_process()) continue;
    expect_same_params("ref2_universal", "uni1_" + s);
    expect_same_params("ref2_universal", "uni4ep2_" + s);
    if (stage == 2) expect_same_params("ref2_universal", "uni4ep4_" + s);
  }
}

// Steps [0, 2) on `world` ranks at ZeRO-3 with autoep_size `ep`, saved as `tag`.
void save_after_two_steps(int world, int64_t ep, const std::string& ckpt, const std::string& tag) {
  run_ranks(world, [&](int rank, int) {
    Net net = new_net();
    auto engine = initialize(net.ptr(), net_config(3, kRows, ep)).engine;
    for (int s = 0; s < 2; ++s) {
      auto [x, y] = batch(s, rank, 1);
      engine->backward(engine->forward(x, y));
      engine->step();
    }
    engine->save_checkpoint(ckpt, tag);
  });
}

TEST(AutoEPDist, ZeroThreeKeepsExpertsInItsShardsAndResumesOnTheSamePlacement) {
  share_dir();
  const std::string ckpt = dir() + "/ckpt3";
  train(4, 3, 2, "straight3");
  save_after_two_steps(4, 2, ckpt, "two");
  run_ranks(4, [&](int rank, int) {
    Net net;
    auto engine = initialize(net.ptr(), net_config(3, kRows, 2)).engine;
    engine->load_checkpoint(ckpt, "two");
    auto [x, y] = batch(2, rank, 1);
    engine->backward(engine->forward(x, y));
    engine->step();
    engine.reset();
    save_params(net, "resumed3");
  });
  // Another placement (2 ranks: one rank per expert-parallel slot) is refused, by name.
  run_ranks(2, [&](int, int) {
    Net net;
    auto engine = initialize(net.ptr(), net_config(3, kRows, 2)).engine;
    try {
      engine->load_checkpoint(ckpt, "two");
      ADD_FAILURE() << "an AutoEP ZeRO-3 checkpoint of 4 ranks loaded on 2";
    } catch (const CheckpointError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("expert_data_parallel_world_size 2, this rank has 1"),
                std::string::npos) << what;
      EXPECT_NE(what.find("load only with the parameter placement"), std::string::npos) << what;
    }
  });
  if (in_rank_process()) return;
  expect_same_params("straight3", "resumed3", 0.0);
  // DeepSpeed's ZeRO-3 AutoEP layout: no per-expert files; each rank's model states describe
  // its placement and hold no expert entry.
  EXPECT_FALSE(std::filesystem::exists(ckpt + "/two/layer_0_expert_0_mp_rank_00_model_states.pt"));
  for (int r = 0; r < 4; ++r) {
    const std::string path = ckpt + "/two/" + checkpoint::zero3_model_states_file_name(r);
    const c10::IValue raw = checkpoint::load(path);
    const auto top = raw.toGenericDict();
    ASSERT_TRUE(top.contains("ds_autoep_layers")) << path;
    const json layers = checkpoint::json_from_ivalue(top.at("ds_autoep_layers"), path);
    ASSERT_EQ(layers.size(), 1u) << layers.dump();
    const json& l = layers[0];
    EXPECT_EQ(l["module_path"], "moe");
    EXPECT_EQ(l["expert_key_prefix"], "moe.experts");
    EXPECT_EQ(l["checkpoint_format"], "zero3_partitioned");
    EXPECT_EQ(l["checkpoint_format_version"], 1);
    EXPECT_EQ(l["num_experts"], kExperts);
    EXPECT_EQ(l["num_local_experts"], 2);
    EXPECT_EQ(l["ep_size"], 2);
    EXPECT_EQ(l["ep_group_name"], "ep_size_2");
    // DeepSpeed's groups: expert-parallel {0, 1} and {2, 3}, expert-data-parallel {0, 2}, {1, 3}.
    EXPECT_EQ(l["ep_rank"], r % 2) << path;
    EXPECT_EQ(l["expert_data_parallel_rank"], r / 2) << path;
    EXPECT_EQ(l["expert_data_parallel_world_size"], 2);
    EXPECT_EQ(l["global_expert_start"], 2 * (r % 2));
    EXPECT_EQ(l["global_expert_end"], 2 * (r % 2) + 2);
    EXPECT_EQ(l["expert_placement"]["ranks"][1]["experts"], json({2, 3}));
    EXPECT_EQ(checkpoint::json_from_ivalue(top.at("num_experts"), path), json({kExperts}));
    const auto model = checkpoint::ModelStates::from_ivalue(raw, path);
    EXPECT_EQ(model.module.find("moe.experts.w1"), nullptr) << path;
    EXPECT_NE(model.module.find("moe.gate.weight"), nullptr) << path;
    // DeepSpeed's ds_zero_partition_groups: the dense sub-group over all 4 ranks, the experts'
    // over the 2 ranks holding them.
    const std::string optim =
        ckpt + "/two/" + checkpoint::zero_optim_states_file_name(r, 0, /*bf16=*/false);
    const auto osd = checkpoint::load(optim).toGenericDict().at("optimizer_state_dict");
    const json groups = checkpoint::json_from_ivalue(
        osd.toGenericDict().at("ds_zero_partition_groups"), optim);
    ASSERT_EQ(groups.size(), 2u) << groups.dump();
    EXPECT_EQ(groups[0]["partition_ranks"], json({0, 1, 2, 3}));
    EXPECT_EQ(groups[0]["partition_rank"], r);
    EXPECT_EQ(groups[0]["families"], json({"replicated"}));
    EXPECT_EQ(groups[1]["sub_group"], 1);
    EXPECT_EQ(groups[1]["partition_count"], 2);
    EXPECT_EQ(groups[1]["partition_rank"], r / 2);
    EXPECT_EQ(groups[1]["partition_ranks"], json({r % 2, r % 2 + 2}));
    EXPECT_EQ(groups[1]["families"], json({"autoep_expert"}));
    EXPECT_EQ(groups[1]["group_names"], json({"ep_size_2"}));
  }
}

// A ZeRO-3 AutoEP checkpoint (4 ranks, autoep_size 2: each expert partitioned over 2 ranks)
// converts: each expert-parallel rank's expert-data-parallel shards make its rows, which join
// into every expert (zero_to_fp32 alike); it resumes at ZeRO-3 on 2 ranks with autoep_size 2
// (each expert on one rank) and 1 (each over both), and on one process at ZeRO-2 without
// AutoEP, the next step within 1e-5 of the uninterrupted run.
TEST(AutoEPDist, ZeroThreeUniversalCheckpointsResumeOnAnyPlacement) {
  share_dir();
  const std::string ckpt = dir() + "/ckpt3u", universal = dir() + "/uni3/u";
  train(4, 3, 2, "straight3u");
  save_after_two_steps(4, 2, ckpt, "two");
  if (!in_rank_process()) {
    std::filesystem::create_directories(dir() + "/uni3");
    EXPECT_EQ(checkpoint::ds_to_universal(ckpt + "/two", universal).dp_degree, 4);
    const at::Tensor w1 = checkpoint::load_universal_state(universal, "moe.experts.w1", "fp32");
    EXPECT_EQ(w1.sizes(), (std::vector<int64_t>{kExperts, kFfn, kHidden}));
    const auto fp32 = checkpoint::consolidate_zero_checkpoint(ckpt, "two");
    ASSERT_NE(fp32.find("moe.experts.w1"), nullptr);
    EXPECT_TRUE(torch::equal(*fp32.find("moe.experts.w1"), w1));
  }
  resume_universal(universal, 4, 2, 3, 2, "uni3_w2ep2");
  resume_universal(universal, 4, 2, 3, 1, "uni3_w2ep1");
  resume_universal(universal, 4, 1, 2, 0, "uni3_w1");
  if (in_rank_process()) return;
  expect_same_params("straight3u", "uni3_w2ep2");
  expect_same_params("straight3u", "uni3_w2ep1");
  expect_same_params("straight3u", "uni3_w1");
}

// Frozen experts (w2, without gradients) at ZeRO-3 are partitioned over their
// expert-data-parallel group as the trainable ones: ds_to_universal joins them into every expert
// unchanged (zero_to_fp32 alike), and a load cuts them again on 2 ranks with autoep_size 2 and 1
// and takes them whole on one process at ZeRO-2; the next step is the uninterrupted run's.
TEST(AutoEPDist, ZeroThreeUniversalCheckpointsKeepFrozenExperts) {
  share_dir();
  FrozenW2 frozen;
  const std::string ckpt = dir() + "/ckpt3f", universal = dir() + "/uni3f/u";
  train(4, 3, 2, "straight3f");
  save_after_two_steps(4, 2, ckpt, "two");
  if (!in_rank_process()) {
    std::filesystem::create_directories(dir() + "/uni3f");
    EXPECT_EQ(checkpoint::ds_to_universal(ckpt + "/two", universal).dp_degree, 4);
    const at::Tensor w2 = checkpoint::load_universal_state(universal, "moe.experts.w2", "fp32");
    const at::Tensor initial = Net()->block->named_parameters()["experts.w2"];
    EXPECT_TRUE(torch::equal(w2, initial)) << (w2 - initial).abs().max();
    EXPECT_FALSE(std::filesystem::exists(universal + "/zero/moe.experts.w2/exp_avg.pt"));
    EXPECT_TRUE(std::filesystem::exists(universal + "/zero/moe.experts.w1/exp_avg.pt"));
    const auto fp32 = checkpoint::consolidate_zero_checkpoint(ckpt, "two");
    ASSERT_NE(fp32.find("moe.experts.w2"), nullptr);
    EXPECT_TRUE(torch::equal(*fp32.find("moe.experts.w2"), w2));
  }
  resume_universal(universal, 4, 2, 3, 2, "uni3f_w2ep2");
  resume_universal(universal, 4, 2, 3, 1, "uni3f_w2ep1");
  resume_universal(universal, 4, 1, 2, 0, "uni3f_w1");
  if (in_rank_process()) return;
  expect_same_params("straight3f", "uni3f_w2ep2");
  expect_same_params("straight3f", "uni3f_w2ep1");
  expect_same_params("straight3f", "uni3f_w1");
}

std::string error_of(const json& config) {
  Net net;
  try {
    initialize(net.ptr(), config);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(AutoEPDist, BadSetUpsNameWhatIsWrong) {
  run_ranks(2, [](int, int) {
    json c = net_config(1, kRows, 2);
    c["expert_parallel"]["autoep_size"] = 3;  // neither divides 4 experts nor 2 ranks
    EXPECT_NE(error_of(c).find("autoep_size (3) must divide the data-parallel size (2)"),
              std::string::npos) << error_of(c);
    c = net_config(3, kRows, 2);
    c["zero_optimization"]["zero_hpz_partition_size"] = 2;
    EXPECT_NE(error_of(c).find("does not support hpZeRO secondary tensor groups"),
              std::string::npos) << error_of(c);
    c = net_config(3, kRows, 2);
    c["zero_optimization"]["mics_shard_size"] = 2;
    EXPECT_NE(error_of(c).find("with zero_optimization.mics_shard_size is not supported"),
              std::string::npos) << error_of(c);
    c = net_config(1, kRows, 2);
    c["expert_parallel"]["moe_layer_pattern"] = "model\\.layers\\.\\d+\\.mlp";
    EXPECT_NE(error_of(c).find("no TokenChoiceMoE layer whose name matches"), std::string::npos)
        << error_of(c);
    c = net_config(1, kRows, 2);
    c["expert_parallel"]["num_limited_groups"] = 1;
    EXPECT_NE(error_of(c).find("num_limited_groups requires num_expert_groups to be set in "
                               "layer 'moe'"),
              std::string::npos) << error_of(c);
    c["expert_parallel"]["num_expert_groups"] = 4;  // one expert per group: no two best
    EXPECT_NE(error_of(c).find("leaves 1 expert per group in layer 'moe'"), std::string::npos)
        << error_of(c);
    c["expert_parallel"]["num_expert_groups"] = 3;
    EXPECT_NE(error_of(c).find("num_expert_groups (3) must divide num_experts (4) in layer"),
              std::string::npos) << error_of(c);
    c["expert_parallel"]["num_expert_groups"] = 2;
    c["expert_parallel"]["top_k"] = 3;
    EXPECT_NE(error_of(c).find("top_k (3) exceeds the 2 experts of "
                               "expert_parallel.num_limited_groups (1) groups in layer 'moe'"),
              std::string::npos) << error_of(c);
    c = net_config(1, kRows, 2);
    c["expert_parallel"]["top_k"] = 5;
    EXPECT_NE(error_of(c).find("top_k=5 exceeds num_experts=4 in layer 'moe'"), std::string::npos)
        << error_of(c);
  });
  run_ranks(1, [](int, int) {
    json c = net_config(1, kRows, 1);
    c["expert_parallel"]["moe_layer_pattern"] = "moe";  // fully matches: sharded (ep 1)
    Net net;
    initialize(net.ptr(), c);
    EXPECT_NE(net->block->ep_groups(), nullptr);
  });
}

}  // namespace
}  // namespace deepspeed
