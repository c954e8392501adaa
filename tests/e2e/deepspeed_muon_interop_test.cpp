// The Muon optimizer against Python DeepSpeed 0.19.8's (.venv-deepspeed-torch2; 0.15.4 has no
// Muon), through tests/e2e/deepspeed_muon_interop.py: the same model, initial weights, batches
// and ds_config ("type": "Muon") trained by deepspeed.initialize and by ours on one process ends
// at the same parameters
// - at ZeRO stage 0 (MuonWithAuxAdam on the parameters themselves, "gram" Newton-Schulz), with
//   DeepSpeed's defaults but lr, unclipped;
// - at ZeRO stage 1 ("standard" Newton-Schulz) and stage 2 (with muon_lr / adam_lr, weight decay
//   and gradient clipping, which DeepSpeed's ZeRO applies to the orthogonalized updates), where
//   DeepSpeed orthogonalizes in its flat partition and we in ours;
// - at ZeRO stage 3 (its reduce_scatter off: DeepSpeed's stage-3 Muon requires it; ours takes
//   either), where both gather each matrix's shards and orthogonalize it whole.
// Which parameters Muon takes is DeepSpeed's name rule on both sides. Newton-Schulz runs in fp32
// on both (see the script).
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "deepspeed/deepspeed.h"
#include "support/muon_net.h"
#include "support/run_command.h"
#include "support/temp_dir.h"
#include "support/test_port.h"

namespace deepspeed {
namespace {

using testing::kMuonVocab;
using testing::MuonNet;
using testing::MuonNetImpl;

constexpr int kSteps = 4;

json configs() {
  auto with = [](int stage, const char* params, bool clip) {
    json c = {{"train_micro_batch_size_per_gpu", 4},
              {"gradient_accumulation_steps", 2},
              {"optimizer", {{"type", "Muon"}, {"params", json::parse(params)}}},
              {"zero_optimization", {{"stage", stage}}}};
    c["gradient_clipping"] = clip ? 0.5 : 0.0;  // both sides default to 1.0
    if (stage == 3) c["zero_optimization"]["reduce_scatter"] = false;
    return c;
  };
  return json::array(
      {with(0, R"({"lr": 0.01})", false),
       with(1, R"({"lr": 0.02, "ns_method": "standard", "momentum": 0.9})", false),
       with(2, R"({"muon_lr": 0.03, "adam_lr": 0.005, "weight_decay": 0.05,
                   "betas": [0.8, 0.98]})", true),
       with(3, R"({"lr": 0.02, "weight_decay": 0.01})", true)});
}

// kSteps steps of 2 micro-batches: [step][micro] -> (tokens, targets).
std::vector<std::vector<std::pair<at::Tensor, at::Tensor>>> batches() {
  torch::manual_seed(31);
  std::vector<std::vector<std::pair<at::Tensor, at::Tensor>>> out(kSteps);
  for (auto& step : out) {
    for (int micro = 0; micro < 2; ++micro) {
      step.emplace_back(torch::randint(kMuonVocab, {4, 6}), torch::randint(kMuonVocab, {4, 6}));
    }
  }
  return out;
}

json as_list(const at::Tensor& t) {
  const at::Tensor c = t.detach().to(at::kDouble).contiguous().reshape({-1});
  return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

json as_int_list(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kLong).contiguous();
  json rows = json::array();
  for (int64_t i = 0; i < c.size(0); ++i) {
    rows.push_back(std::vector<int64_t>(c[i].data_ptr<int64_t>(),
                                        c[i].data_ptr<int64_t>() + c.size(1)));
  }
  return rows;
}

TEST(DeepSpeedMuonInterop, TrainsToDeepSpeedsParameters) {
  testing::TempDir dir;
  torch::manual_seed(41);
  MuonNet initial;
  json initial_params = json::object();
  for (const auto& p : initial->named_parameters()) initial_params[p.key()] = as_list(p.value());
  const auto data = batches();
  json batch_list = json::array();
  for (const auto& step : data) {
    json micro = json::array();
    for (const auto& [tokens, targets] : step) {
      micro.push_back({as_int_list(tokens), as_int_list(targets)});
    }
    batch_list.push_back(micro);
  }
  testing::ReservedPort port;  // DeepSpeed's rendezvous, one process
  std::ofstream(dir.file("cases.json"))
      << json{{"initial", initial_params}, {"batches", batch_list}, {"cases", configs()},
              {"port", port.port()}};
  const auto run = testing::run_command(std::string("OMP_NUM_THREADS=1 ") + DS_DEEPSPEED_PYTHON +
                                        " " + DS_INTEROP_SCRIPT + " " + dir.path());
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  const json theirs = json::parse(std::ifstream(dir.file("deepspeed.json")));

  const json cases = configs();
  ASSERT_EQ(theirs.at("params").size(), cases.size());
  for (size_t c = 0; c < cases.size(); ++c) {
    MuonNet net;
    {
      at::NoGradGuard no_grad;
      for (const auto& p : net->named_parameters()) {
        p.value().copy_(initial->named_parameters()[p.key()]);
      }
    }
    auto engine = initialize(net.ptr(), cases[c]).engine;
    ASSERT_NE(dynamic_cast<optim::Muon*>(engine->optimizer()), nullptr);
    for (const auto& step : data) {
      for (const auto& [tokens, targets] : step) {
        engine->backward(engine->forward(tokens, targets));
        engine->step();
      }
    }
    int moved_by_muon = 0;
    for (const auto& p : net->named_parameters()) {
      const auto want = theirs.at("params")[c].at(p.key()).get<std::vector<double>>();
      const at::Tensor expected = at::tensor(want, at::kDouble).view(p.value().sizes());
      const at::Tensor got = p.value().detach().to(at::kDouble);
      EXPECT_TRUE(torch::allclose(got, expected, 1e-5, 1e-5))
          << "case " << c << " (ZeRO-" << cases[c]["zero_optimization"]["stage"] << "), "
          << p.key() << " differs by " << (got - expected).abs().max().item<double>();
      moved_by_muon += p.value().dim() == 2 && p.key().find("embed") == std::string::npos &&
                       p.key().find("lm_head") == std::string::npos;
    }
    EXPECT_EQ(moved_by_muon, 3);
  }
}

}  // namespace
}  // namespace deepspeed
