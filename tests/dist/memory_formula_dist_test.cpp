// The engine's memory formula (src/runtime/memory_formula.h: what the memory report prints beside
// the ledger and what the autotuner prunes with) against the measured ledger, on 2 Gloo ranks
// after one optimizer step, for every ZeRO stage, with and without overlap_comm, optimizer
// offload, bf16 (with fp32 or bf16 masters and moments) and torch_autocast. Ψ = 3·512·512 (no
// padding on 2 ranks), plus a 512-element gain with torch_autocast.
#include "deepspeed/deepspeed.h"

#include <cstdio>
#include <string>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "runtime/memory_formula.h"
#include "support/multi_rank.h"

namespace deepspeed {
namespace {

using testing::run_ranks;

constexpr int64_t kWeight = 512 * 512;
constexpr int64_t kPsi = 3 * kWeight;

// A 512-element scale, a unit of the Sequential like the layers (so partitioned under ZeRO-3).
struct GainImpl : torch::nn::Module {
  GainImpl() { weight = register_parameter("weight", torch::ones({512})); }
  torch::Tensor forward(const torch::Tensor& x) { return x * weight; }
  torch::Tensor weight;
};
TORCH_MODULE(Gain);

// `gain`: the Gain after the layers, so that under torch_autocast one gradient travels in fp32
// and the three Linear weights in bf16.
struct Net : torch::nn::Module {
  explicit Net(bool gain = false) {
    torch::manual_seed(3);
    auto linear = [] { return torch::nn::Linear(torch::nn::LinearOptions(512, 512).bias(false)); };
    layers = register_module("layers", torch::nn::Sequential(linear(), torch::nn::Tanh(), linear(),
                                                             torch::nn::Tanh(), linear()));
    if (gain) layers->push_back(Gain());
  }
  torch::Tensor forward(const torch::Tensor& x) { return layers->forward(x).pow(2).mean(); }
  torch::nn::Sequential layers{nullptr};
};

struct Case {
  int stage;
  bool overlap;
  bool offload;
  bool bf16;
  bool autocast = false;  // torch_autocast (bf16): two bucket pools under ZeRO 1-3
  bool bf16_masters = false;  // bf16_master_weights_and_grads: no fp32 masters
  bool bf16_states = false;   // bf16_optimizer_states: bf16 moments
};

void check(const Case& c, int) {
  // Two weights per bucket exactly: the largest bucket is the bucket size.
  json zero = {{"stage", c.stage}, {"reduce_bucket_size", 2 * kWeight}, {"overlap_comm", c.overlap}};
  if (c.offload) zero["offload_optimizer"] = {{"device", "cpu"}};
  if (c.autocast) zero["stage3_param_persistence_threshold"] = 0;  // the gain is partitioned too
  json cfg = {{"train_micro_batch_size_per_gpu", 2},
              {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.01}}}}},
              {"bf16",
               {{"enabled", c.bf16},
                {"bf16_master_weights_and_grads", c.bf16_masters},
                {"bf16_optimizer_states", c.bf16_states}}},
              {"zero_optimization", zero}};
  if (c.autocast) cfg["torch_autocast"] = {{"enabled", true}, {"dtype", "bfloat16"}};
  auto model = std::make_shared<Net>(c.autocast);
  auto engine = initialize(model, cfg).engine;
  auto x = torch::randn({2, 512});
  if (c.bf16) x = x.to(torch::kBFloat16);
  engine->backward(engine->forward(x));
  engine->step();
  const MemoryStats m = engine->memory_stats();
  const DeepSpeedConfig parsed = DeepSpeedConfig::from_json(cfg, 2);
  ModelStateInputs in =
      model_state_inputs(parsed, kPsi + (c.autocast ? 512 : 0), kWeight, /*on_cpu=*/true);
  if (c.autocast && c.stage > 0) in.low_precision_numel = kPsi;  // the three Linear weights
  const ModelStateBytes f = estimate_model_state_bytes(in);
  std::printf("stage %d overlap %d offload %d bf16 %d autocast %d bf16 masters %d states %d: "
              "%s\n  ledger: %s\n",
              c.stage, c.overlap, c.offload, c.bf16, c.autocast, c.bf16_masters, c.bf16_states,
              describe_model_state_bytes(in, f).c_str(),
              engine->memory_report("measured").c_str());
  EXPECT_EQ(f.params, m.param_bytes);
  EXPECT_EQ(f.master_params, m.master_param_bytes);
  EXPECT_EQ(f.grads, m.grad_bytes);
  EXPECT_EQ(f.optimizer_states, m.optimizer_state_bytes);
  EXPECT_EQ(f.reduction_buffers, m.comm_buffer_bytes);
  EXPECT_EQ(f.offloaded_optimizer, m.offloaded_optimizer_bytes);
  EXPECT_EQ(f.device(), m.device_bytes());
  // The engine's report prints the same formula (it finds the low-precision weights itself).
  char formula[64];
  std::snprintf(formula, sizeof(formula), "formula: device %.2f MB", f.device() / 1e6);
  EXPECT_NE(engine->memory_report().find(formula), std::string::npos)
      << formula << " in " << engine->memory_report();
}

class MemoryFormulaDist : public ::testing::TestWithParam<Case> {};

TEST_P(MemoryFormulaDist, MatchesTheLedgerOnTwoRanks) {
  const Case c = GetParam();
  run_ranks(2, [c](int rank, int) { check(c, rank); });
}

INSTANTIATE_TEST_SUITE_P(Stages, MemoryFormulaDist,
                         ::testing::Values(Case{0, false, false, false}, Case{1, false, false, false},
                                           Case{2, false, false, false}, Case{2, true, false, false},
                                           Case{3, true, false, false}, Case{2, false, true, false},
                                           Case{2, false, false, true}, Case{1, true, true, true},
                                           Case{0, false, false, false, true},
                                           Case{2, false, false, false, true},
                                           Case{2, true, false, false, true},
                                           Case{3, true, false, false, true},
                                           Case{2, false, true, true, false, true},
                                           Case{3, false, true, true, false, true, true}));

}  // namespace
}  // namespace deepspeed
