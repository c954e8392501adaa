// AutoEP at ZeRO-3 (and ZeRO-2's universal checkpoints) against Python DeepSpeed 0.19.8
// (.venv-deepspeed-torch2), through tests/e2e/deepspeed_autoep_interop.py: 4 Gloo ranks,
// autoep_size 2, so that each rank holds 2 of the 4 experts and each expert is partitioned over 2
// ranks. The model is auto_ep_dist_test's (Linear, a TokenChoiceMoE routing to 2 of 4 SwiGLU
// experts, Linear); DeepSpeed's AutoEP finds its Python twin's block by the section's patterns.
// The same initial weights and batches on both sides.
// - Trained side by side, steps 0 and 1 take the same losses.
// - DeepSpeed resumes our checkpoint of step 2 (the experts in the ZeRO-3 optimizer shards,
//   ds_autoep_layers, ds_zero_partition_groups): its step 2 takes the loss and ends at the
//   parameters of our own step 2.
// - We resume DeepSpeed's checkpoint of step 2 alike (its gate is named moe.router.gate there:
//   the module names are not checked, load_module_strict false, as on its side).
// And at ZeRO-2, universal checkpoints DeepSpeed's ds_to_universal makes of ours and of its own
// load here onto another placement (autoep_size 4), and DeepSpeed loads ours (our
// ds_to_universal of our checkpoint) onto that placement.
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "deepspeed/auto_ep.h"
#include "deepspeed/deepspeed.h"
#include "deepspeed/universal_checkpoint.h"
#include "deepspeed/zero3.h"
#include "support/auto_ep_net.h"
#include "support/multi_rank.h"
#include "support/run_command.h"
#include "support/shared_run_dir.h"
#include "support/test_port.h"

namespace deepspeed {
namespace {

using nlohmann::json;
using testing::in_rank_process;
using testing::run_ranks;

constexpr int kRanks = 4;
constexpr int64_t kHidden = testing::kAutoEpHidden, kExperts = testing::kAutoEpExperts,
                  kRows = 6;

using Net = testing::AutoEpNet;

json config(int stage = 3, int64_t autoep_size = 2) {
  return {{"train_micro_batch_size_per_gpu", kRows},
          {"gradient_accumulation_steps", 1},
          {"gradient_clipping", 0.5},
          {"optimizer", {{"type", "Adam"}, {"params", {{"lr", 0.02}, {"torch_adam", true}}}}},
          {"zero_optimization", {{"stage", stage}, {"stage3_param_persistence_threshold", 0}}},
          // DeepSpeed finds a custom block by these; ours by type (and warns about them).
          {"expert_parallel",
           {{"enabled", true}, {"autoep_size", autoep_size}, {"moe_layer_pattern", "moe"},
            {"router_pattern", "gate"}, {"expert_pattern", "experts"}, {"expert_w1", "w1"},
            {"expert_w2", "w2"}, {"expert_w3", "w3"}, {"top_k", 2}, {"score_func", "softmax"},
            {"route_norm", true}, {"score_apply", "post"}}}};
}

json as_list(const at::Tensor& t) {
  const at::Tensor c = t.detach().to(at::kDouble).contiguous().reshape({-1});
  return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

at::Tensor from_list(const json& j, at::IntArrayRef shape) {
  return at::tensor(j.get<std::vector<double>>(), at::kDouble).view(shape);
}

// Step s's batch of rank r.
std::pair<at::Tensor, at::Tensor> batch(int s, int r) {
  torch::manual_seed(1000 + 10 * s + r);
  at::Tensor x = torch::randn({kRows, kHidden});
  return {x, torch::randn({kRows, kHidden})};
}

// What a side writes after step 2: its losses, the dense parameters and its experts by id.
void write_result(Net& net, const std::map<int, double>& losses, const std::string& path) {
  json out{{"losses", json::object()}, {"dense", json::object()}, {"experts", json::object()}};
  for (const auto& [s, l] : losses) out["losses"][std::to_string(s)] = l;
  for (const auto& p : net->named_parameters()) {
    if (p.key().find(".experts.") == std::string::npos) out["dense"][p.key()] = as_list(p.value());
  }
  const auto& b = net->block;
  for (int64_t i = 0; i < b->num_local_experts(); ++i) {
    json w = json::array();
    for (const auto& p : b->expert_parameters()) w.push_back(as_list(p[i]));
    out["experts"][std::to_string(b->first_expert() + i)] = w;
  }
  std::ofstream(path) << out.dump();
}

// Every rank's result of `a` against `b`'s: the losses of the steps both ran, the parameters.
// `b`'s experts are taken from whichever rank holds them: the two may place them differently.
void expect_same(const std::string& dir, const std::string& a, const std::string& b) {
  Net shapes;
  const auto read = [&](const std::string& side, int r) {
    return json::parse(std::ifstream(dir + "/" + side + "_" + std::to_string(r) + ".json"));
  };
  json b_experts = json::object();
  for (int r = 0; r < kRanks; ++r) b_experts.update(read(b, r)["experts"]);
  for (int r = 0; r < kRanks; ++r) {
    const json x = read(a, r), y = read(b, r);
    const std::string what = a + " vs " + b + ", rank " + std::to_string(r);
    int common = 0;
    for (const auto& [s, loss] : x["losses"].items()) {
      if (!y["losses"].contains(s)) continue;
      ++common;
      EXPECT_NEAR(loss.get<double>(), y["losses"][s].get<double>(),
                  1e-6 * std::abs(loss.get<double>()))
          << what << ", step " << s;
    }
    EXPECT_GE(common, 1) << what;
    for (const auto& p : shapes->named_parameters()) {
      if (p.key().find(".experts.") != std::string::npos) continue;
      const at::Tensor u = from_list(x["dense"].at(p.key()), p.value().sizes());
      const at::Tensor v = from_list(y["dense"].at(p.key()), p.value().sizes());
      EXPECT_TRUE(torch::allclose(u, v, 1e-5, 1e-6))
          << what << ", " << p.key() << ": " << (u - v).abs().max().item<double>();
    }
    ASSERT_GE(x["experts"].size(), 1u) << what;
    for (const auto& [id, weights] : x["experts"].items()) {
      ASSERT_TRUE(b_experts.contains(id)) << what << ", expert " << id;
      for (size_t w = 0; w < 3; ++w) {
        const auto list = [](const json& j) { return j.get<std::vector<double>>(); };
        const at::Tensor u = at::tensor(list(weights[w]), at::kDouble);
        const at::Tensor v = at::tensor(list(b_experts[id][w]), at::kDouble);
        EXPECT_TRUE(torch::allclose(u, v, 1e-5, 1e-6))
            << what << ", expert " << id << " w" << w + 1 << ": "
            << (u - v).abs().max().item<double>();
      }
    }
  }
}

testing::CommandResult run_deepspeed(const std::string& mode, const std::string& dir) {
  testing::ReservedPort port;
  return testing::run_command(std::string("OMP_NUM_THREADS=1 ") + DS_DEEPSPEED_PYTHON +
                              " -m torch.distributed.run --nproc_per_node " +
                              std::to_string(kRanks) + " --master_port " +
                              std::to_string(port.port()) + " " + DS_INTEROP_SCRIPT + " " + mode +
                              " " + dir);
}

// case.json for the Python side: `cfg`, the initial weights, every rank's batches.
void write_case(const std::string& dir, const json& cfg) {
  Net initial;
  json params = json::object();
  for (const auto& p : initial->named_parameters()) params[p.key()] = as_list(p.value());
  const auto rows = [](const at::Tensor& t) {
    json out = json::array();
    for (int64_t i = 0; i < t.size(0); ++i) out.push_back(as_list(t[i]));
    return out;
  };
  json batches = json::array();
  for (int s = 0; s < 3; ++s) {
    json ranks = json::array();
    for (int r = 0; r < kRanks; ++r) {
      auto [x, y] = batch(s, r);
      ranks.push_back(json::array({rows(x), rows(y)}));
    }
    batches.push_back(ranks);
  }
  std::ofstream(dir + "/case.json")
      << json{{"config", cfg}, {"initial", params}, {"batches", batches}}.dump();
}

// Ours with `cfg`: steps 0 and 1, the checkpoint (<dir>/ours/two), step 2; results as "ours".
void train_ours(const std::string& dir, const json& cfg) {
  run_ranks(kRanks, [&](int rank, int) {
    Net net;
    auto engine = initialize(net.ptr(), cfg).engine;
    std::map<int, double> losses;
    for (int s = 0; s < 3; ++s) {
      if (s == 2) engine->save_checkpoint(dir + "/ours", "two");
      auto [x, y] = batch(s, rank);
      at::Tensor loss = engine->forward(x, y);
      losses[s] = loss.item<double>();
      engine->backward(loss);
      engine->step();
    }
    engine.reset();  // the model whole again
    write_result(net, losses, dir + "/ours_" + std::to_string(rank) + ".json");
  });
}

TEST(DeepSpeedAutoEPInterop, Zero3CheckpointsResumeBothWays) {
  const std::string dir = testing::new_shared_run_dir("DS_AUTOEP_INTEROP_DIR");
  ::setenv("DS_CHECKPOINT_PYTHON_OBJECTS", "1", 1);  // DeepSpeed's LossScaler, for its resume
  if (!in_rank_process()) write_case(dir, config());
  train_ours(dir, config());
  if (!in_rank_process()) {
    const auto trained = run_deepspeed("train", dir);
    ASSERT_EQ(trained.exit_code, 0) << trained.out << trained.err;
    const auto resumed = run_deepspeed("resume", dir);
    ASSERT_EQ(resumed.exit_code, 0) << resumed.out << resumed.err;
  }
  // Ours from DeepSpeed's checkpoint: step 2.
  run_ranks(kRanks, [&](int rank, int) {
    Net net;
    auto engine = initialize(net.ptr(), config()).engine;
    LoadCheckpointOptions o;
    o.load_module_strict = false;
    engine->load_checkpoint(dir + "/deepspeed", "two", o);
    auto [x, y] = batch(2, rank);
    at::Tensor loss = engine->forward(x, y);
    const double l = loss.item<double>();
    engine->backward(loss);
    engine->step();
    engine.reset();
    write_result(net, {{2, l}}, dir + "/ours_resumed_" + std::to_string(rank) + ".json");
  });
  if (in_rank_process()) return;
  expect_same(dir, "ours", "train");            // steps 0-2 side by side
  expect_same(dir, "resume", "ours");           // DeepSpeed from our checkpoint
  expect_same(dir, "ours_resumed", "train");    // ours from DeepSpeed's
}

// ZeRO-2 (autoep_size 2, each rank's experts its own). DeepSpeed's ds_to_universal converts our
// checkpoint (its universal_checkpoint_info and per-expert files) and its own, and we load both
// onto autoep_size 4 (one expert per rank, another placement than either saved): step 2 from
// ours ends where our uninterrupted run ends, from DeepSpeed's where its run ends (its gate is
// router.gate in its universal folders). DeepSpeed loads our ds_to_universal's folder of our
// checkpoint onto autoep_size 4 alike: its step 2 ends where ours does (the folder carries the
// gate under DeepSpeed's name too).
TEST(DeepSpeedAutoEPInterop, Zero2UniversalCheckpointsOfBothLoadOnAnotherPlacement) {
  const std::string dir = testing::new_shared_run_dir("DS_AUTOEP_UNIVERSAL_DIR");
  ::setenv("DS_CHECKPOINT_PYTHON_OBJECTS", "1", 1);  // the fragment addresses DeepSpeed reads
  if (!in_rank_process()) write_case(dir, config(2));
  train_ours(dir, config(2));
  if (!in_rank_process()) {
    const auto trained = run_deepspeed("train", dir);
    ASSERT_EQ(trained.exit_code, 0) << trained.out << trained.err;
    for (const std::string side : {"ours", "deepspeed"}) {
      const auto converted = testing::run_command(
          std::string("DS_ACCELERATOR=cpu ") + DS_DEEPSPEED_PYTHON +
          " -m deepspeed.checkpoint.ds_to_universal --input_folder " + dir + "/" + side +
          "/two --output_folder " + dir + "/" + side + "_universal/u 2>&1");
      ASSERT_EQ(converted.exit_code, 0) << side << ": " << converted.out;
    }
    checkpoint::ds_to_universal(dir + "/ours/two", dir + "/ours_cpp_universal/u");
    const auto loaded = run_deepspeed("universal", dir);
    ASSERT_EQ(loaded.exit_code, 0) << loaded.out << loaded.err;
  }
  for (const std::string side : {"ours", "deepspeed"}) {
    run_ranks(kRanks, [&](int rank, int) {
      Net net;
      json cfg = config(1, 4);
      cfg["checkpoint"] = {{"load_universal", true}};
      auto engine = initialize(net.ptr(), cfg).engine;
      engine->load_checkpoint(dir + "/" + side + "_universal", "u");
      auto [x, y] = batch(2, rank);
      at::Tensor loss = engine->forward(x, y);
      const double l = loss.item<double>();
      engine->backward(loss);
      engine->step();
      write_result(net, {{2, l}},
                   dir + "/" + side + "_universal_" + std::to_string(rank) + ".json");
    });
  }
  if (in_rank_process()) return;
  expect_same(dir, "ours", "train");  // side by side at ZeRO-2
  expect_same(dir, "ours_universal", "ours");
  expect_same(dir, "deepspeed_universal", "train");
  expect_same(dir, "universal", "ours");  // DeepSpeed from our universal folder
}

}  // namespace
}  // namespace deepspeed
