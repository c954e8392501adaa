// The Muon optimizer on 2 Gloo ranks against one process accumulating both ranks' micro-batches
// (the same parameters after K steps), with gradient clipping and weight decay, resumed from a
// checkpoint in the middle: fp32 under ZeRO 0-3, bf16 under 0, 1 and 3, fp16 under 0, 2 and 3
// (also against fp32: the loss scale must not reach the steps; an overflowing step leaves the
// momentum alone), ZeRO-2/3 with CPU offload. Under ZeRO 1/2 a matrix straddles the two ranks'
// flat slices (muon_orthogonalizer.h); under ZeRO-3 every matrix is sharded (stage3_muon.h): one
// sub-group and bucket, a bucket per matrix so that the round-robin owners alternate, or a
// sub-group per matrix. One step of ZeRO-2 moves the straddling matrix by lr times a
// near-orthogonal matrix, not by its gradient. What Muon does not run with yet is refused by name.
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deepspeed/deepspeed.h"
#include "support/expect_throw.h"
#include "support/multi_rank.h"
#include "support/muon_net.h"

namespace deepspeed {
namespace {

using testing::kMuonVocab;
using testing::MuonNet;
using testing::MuonNetImpl;
using testing::rank_output_dir;
using testing::run_ranks;

constexpr int kSteps = 5;

enum class Precision { kFp32, kBf16, kFp16 };

json muon_config(int stage, int accumulation, Precision precision, bool clip = true);

json muon_config(int stage, int accumulation, bool bf16, bool clip = true) {
  return muon_config(stage, accumulation, bf16 ? Precision::kBf16 : Precision::kFp32, clip);
}

json muon_config(int stage, int accumulation, Precision precision, bool clip) {
  json c = json::parse(R"({
    "train_micro_batch_size_per_gpu": 4,
    "optimizer": {"type": "Muon",
                  "params": {"lr": 0.02, "adam_lr": 0.01, "weight_decay": 0.01,
                             "momentum": 0.9}}})");
  c["gradient_accumulation_steps"] = accumulation;
  c["zero_optimization"] = {{"stage", stage}};
  c["gradient_clipping"] = clip ? 1.0 : 0.0;  // DeepSpeed 0.19's default is 1.0
  if (precision == Precision::kBf16) c["bf16"] = {{"enabled", true}};
  // A dynamic scale from 2^12: large enough that Newton-Schulz would see scaled gradients.
  if (precision == Precision::kFp16) c["fp16"] = {{"enabled", true}, {"initial_scale_power", 12}};
  return c;
}

std::pair<at::Tensor, at::Tensor> batch(int step, int part) {
  torch::manual_seed(200 + 10 * step + part);
  return {torch::randint(kMuonVocab, {4, 6}), torch::randint(kMuonVocab, {4, 6})};
}

std::shared_ptr<ModuleEngine<MuonNetImpl>> make_engine(const json& cfg) {
  torch::manual_seed(21);  // the same weights on every rank
  return initialize(MuonNet().ptr(), cfg).engine;
}

// Trains steps [from, to); rank `rank` of `world` takes its share of each step's 2 micro-batches.
void train(ModuleEngine<MuonNetImpl>& engine, int from, int to, int rank, int world) {
  for (int step = from; step < to; ++step) {
    for (int part = rank; part < 2; part += world) {
      auto [x, y] = batch(step, part);
      engine.backward(engine.forward(x, y));
      engine.step();
    }
  }
}

std::vector<at::Tensor> params_of(Engine& engine) {
  std::vector<at::Tensor> out;
  for (const auto& p : engine.module().parameters()) out.push_back(p.detach().to(at::kFloat));
  return out;
}

void expect_same(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b,
                 const std::string& what, double tol) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(torch::allclose(a[i], b[i], tol, tol))
        << what << ": parameter " << i << " differs by "
        << (a[i] - b[i]).abs().max().item<double>();
  }
}

void train_and_resume_on_two_ranks(int stage, Precision precision,
                                   const json& zero_keys = json::object(),
                                   const std::string& variant = "",
                                   const testing::RunOptions& options = {}) {
  const bool bf16 = precision == Precision::kBf16, fp16 = precision == Precision::kFp16;
  const std::string name = "stage" + std::to_string(stage) + (bf16 ? "_bf16" : "") +
                           (fp16 ? "_fp16" : "") + variant;
  const auto dir = [name] { return rank_output_dir() + "/" + name; };
  const auto config = [&](int accumulation) {
    json c = muon_config(stage, accumulation, precision);
    c["zero_optimization"].update(zero_keys);
    return c;
  };
  run_ranks(2, [&](int rank, int world) {
    auto engine = make_engine(config(1));
    ASSERT_NE(dynamic_cast<optim::Muon*>(engine->optimizer()), nullptr);
    train(*engine, 0, kSteps, rank, world);
    if (rank == 0) torch::save(params_of(*engine), dir() + "_straight.pt");
    auto first = make_engine(config(1));
    train(*first, 0, 3, rank, world);
    first->save_checkpoint(dir() + "_ckpt");
    auto resumed = make_engine(config(1));
    resumed->load_checkpoint(dir() + "_ckpt");
    train(*resumed, 3, kSteps, rank, world);
    if (rank == 0) torch::save(params_of(*resumed), dir() + "_resumed.pt");
  }, options);
  // ZeRO-3's reference is one process under ZeRO-2 (another orthogonalizer; the same order:
  // clipping sees the updates). Stage 0 in fp32 clips the gradients before its step instead.
  const int reference_stage = stage == 3 ? 2 : stage;
  auto reference = make_engine(muon_config(reference_stage, 2, precision));
  train(*reference, 0, kSteps, 0, 1);
  std::vector<at::Tensor> straight, resumed;
  torch::load(straight, dir() + "_straight.pt");
  torch::load(resumed, dir() + "_resumed.pt");
  const auto expected = params_of(*reference);
  // bf16 weights: the two ranks may sum the micro-batches in another order than one process
  // (equal under ZeRO 0-2; a matrix orthogonalized from its own slice alone is 5e-3 off). ZeRO-3
  // reduce-scatters each micro-batch's bf16 gradients: a bias ends one bf16 step (2e-3) apart.
  // fp16 weights: one fp16 step (1e-3 at 1).
  const double tol = bf16 ? (stage == 3 ? 4e-3 : 1e-3) : fp16 ? 1e-3 : 2e-5;
  expect_same(straight, expected, name, tol);
  expect_same(resumed, straight, name + " resumed", bf16 || fp16 ? 1e-3 : 1e-6);
  if (fp16) {
    // The loss scale is gone from the steps: fp32 ends within fp16's rounding (without the
    // update scaled back up, the Muon matrices would hardly move). 16-bit stage 0 steps flat
    // partitions like ZeRO-2 (fp32 stage 0 clips before orthogonalizing).
    auto fp32 = make_engine(muon_config(stage == 0 ? 2 : reference_stage, 2, Precision::kFp32));
    train(*fp32, 0, kSteps, 0, 1);
    expect_same(straight, params_of(*fp32), name + " against fp32", 5e-3);
  }
  // Muon took effect: Adam on every parameter ends elsewhere.
  json adam = muon_config(reference_stage, 2, precision);
  adam["optimizer"] = {{"type", "AdamW"}, {"params", {{"lr", 0.01}}}};
  auto plain = make_engine(adam);
  train(*plain, 0, kSteps, 0, 1);
  EXPECT_FALSE(torch::allclose(params_of(*plain)[1], expected[1], 1e-3, 1e-3));
}

// ZeRO-Offload: the partitions, masters and momentum in host memory, the step's clipping
// coefficient applied inside it; with host buffers (DS_TEST_OFFLOAD_HOST_BUFFERS_ON_CPU), the path
// of a model on a GPU: gradients streamed to host buffers during the backward, before Muon
// rewrites them. fp16: the gradients, and so the momentum, carry the loss scale (as in
// DeepSpeed); the update is scaled back up so that unscaling and clipping treat it as a gradient.
struct MuonCase {
  const char* name;
  int stage;
  Precision precision;
  json zero_keys = json::object();
  bool host_buffers = false;
};

class MuonTraining : public ::testing::TestWithParam<MuonCase> {};

TEST_P(MuonTraining, TrainsAndResumesAsOneProcess) {
  const MuonCase& c = GetParam();
  testing::RunOptions options;
  if (c.host_buffers) options.env = {{"DS_TEST_OFFLOAD_HOST_BUFFERS_ON_CPU", "1"}};
  train_and_resume_on_two_ranks(c.stage, c.precision, c.zero_keys, std::string("_") + c.name,
                                options);
}

const json kOffloadCpu = {{"offload_optimizer", {{"device", "cpu"}}}};
INSTANTIATE_TEST_SUITE_P(
    Muon, MuonTraining,
    ::testing::Values(
        MuonCase{"Zero0", 0, Precision::kFp32}, MuonCase{"Zero1", 1, Precision::kFp32},
        MuonCase{"Zero2", 2, Precision::kFp32}, MuonCase{"Zero3", 3, Precision::kFp32},
        MuonCase{"Bf16Zero0", 0, Precision::kBf16}, MuonCase{"Bf16Zero1", 1, Precision::kBf16},
        MuonCase{"Bf16Zero3", 3, Precision::kBf16}, MuonCase{"Fp16Zero0", 0, Precision::kFp16},
        MuonCase{"Fp16Zero2", 2, Precision::kFp16}, MuonCase{"Fp16Zero3", 3, Precision::kFp16},
        // c_fc, c_proj and mix in buckets of their own: owners rank 0, 1, 0.
        MuonCase{"Zero3BucketPerMatrix", 3, Precision::kFp32, {{"reduce_bucket_size", 200}}},
        // A sub-group per parameter: rank 0 orthogonalizes every matrix.
        MuonCase{"Zero3SubGroupPerMatrix", 3, Precision::kFp32, {{"sub_group_size", 1}}},
        MuonCase{"Zero2OffloadCpu", 2, Precision::kFp32, kOffloadCpu},
        MuonCase{"Zero2OffloadHostBuffers", 2, Precision::kFp32, kOffloadCpu, true},
        MuonCase{"Zero3OffloadCpu", 3, Precision::kFp32, kOffloadCpu},
        MuonCase{"Zero3OffloadHostBuffers", 3, Precision::kFp32, kOffloadCpu, true}),
    [](const ::testing::TestParamInfo<MuonCase>& info) { return std::string(info.param.name); });

// One ZeRO-2 step without clipping or decay from a zero momentum: c_proj (8 x 20, split between
// the ranks' slices) moves by -lr * orthogonalize(g), g its averaged gradient.
TEST(MuonDist, ZeroTwoStepIsTheOrthogonalizedGradient) {
  const auto file = [] { return rank_output_dir() + "/step.pt"; };
  json cfg = muon_config(2, 1, false, /*clip=*/false);
  cfg["optimizer"]["params"]["weight_decay"] = 0.0;
  run_ranks(2, [&](int rank, int world) {
    auto engine = make_engine(cfg);
    train(*engine, 0, 1, rank, world);
    if (rank == 0) torch::save(params_of(*engine), file());
  });
  // The averaged gradient of both micro-batches, from the initial weights.
  torch::manual_seed(21);
  MuonNet net;
  const at::Tensor before = net->c_proj->weight.detach().clone();
  for (int part = 0; part < 2; ++part) {
    auto [x, y] = batch(0, part);
    (net->forward(x, y) / 2).backward();
  }
  const at::Tensor g = net->c_proj->weight.grad();
  const double beta = 0.9;  // momentum (1 - beta) g, Nesterov blend (1 - beta^2) g
  const at::Tensor update = optim::orthogonalize(g * (1 - beta * beta), optim::NsMethod::kGram);
  std::vector<at::Tensor> after;
  torch::load(after, file());
  // Parameters in registration order: embed, c_fc (w, b), c_proj (w, b), mix, lm_head (w, b).
  const at::Tensor moved = after[3] - before;
  EXPECT_TRUE(torch::allclose(moved, -0.02 * update, 1e-6, 1e-6))
      << (moved + 0.02 * update).abs().max().item<double>();
  const at::Tensor s = std::get<1>(at::linalg_svd(moved / 0.02, false));
  EXPECT_GT(s.min().item<double>(), 0.3);
  EXPECT_LT(s.max().item<double>(), 1.6);
}

// An overflowing fp16 step is skipped before Muon runs: the momentum stays zero, on every rank
// and stage (DeepSpeed checks the overflow first too).
TEST(MuonDist, Fp16OverflowLeavesTheMomentumAlone) {
  for (int stage : {1, 3}) {
    json cfg = muon_config(stage, 1, Precision::kFp16);
    // 2^20: the largest gradients overflow fp16, not all of them, so a rank whose slice stays
    // finite would advance its momentum if Muon ran before the overflow vote.
    cfg["fp16"]["initial_scale_power"] = 20;
    run_ranks(2, [&](int rank, int world) {
      auto engine = make_engine(cfg);
      train(*engine, 0, 1, rank, world);
      EXPECT_EQ(engine->skipped_steps(), 1) << "stage " << stage;
      auto* muon = dynamic_cast<optim::Muon*>(engine->optimizer());
      for (const auto& group : muon->param_groups()) {
        for (const auto& p : group.params()) {
          optim::ParamState* state = muon->find_state(p);
          if (state == nullptr) continue;  // no step has made it
          for (auto& [name, t] : state->tensors) {
            if (name == "momentum_buffer" && t.defined()) {
              EXPECT_EQ(t.abs().max().item<double>(), 0.0) << "stage " << stage;
            }
          }
        }
      }
    });
  }
}

TEST(MuonDist, RefusesWhatItDoesNotRunWithByName) {
  auto refused = [](json cfg, const std::string& what) {
    EXPECT_THROW_WITH(make_engine(cfg), NotSupportedError, what);
  };
  json offload = muon_config(3, 1, false);
  offload["zero_optimization"]["offload_optimizer"] = {{"device", "nvme"},
                                                       {"nvme_path", rank_output_dir()}};
  refused(offload, "the Muon optimizer with zero_optimization.offload_optimizer.device \"nvme\" "
                   "at stage 3");
}

}  // namespace
}  // namespace deepspeed
