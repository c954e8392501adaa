// bf16 checkpoints between train_gpt and Python DeepSpeed 0.19.8 on torch 2.11
// (.venv-deepspeed-torch2 from `scripts/setup_deepspeed_peer.sh --torch2`: torch 1.13's Gloo,
// which deepspeed_interop_test's DeepSpeed runs on, has no bf16 collectives). 2 ranks, bf16,
// torch's AdamW on both sides (`torch_adam`), WarmupLR, clipping, under ZeRO 0-3; and ZeRO 2/3
// with bf16 master weights (bf16_master_weights_and_grads, offload_optimizer "cpu": each side's
// CPU Adam, fp32 moments; DeepSpeed's masters in its keys are bf16); and ZeRO-3 with the Muon
// optimizer (its momentum partitioned per sub-group beside the Adam half's moments). DeepSpeed writes a layout of
// its own for each: FP16_UnfusedOptimizer's per-parameter fp32 masters in the model states at
// stage 0 (unfused_fp16_layout.h), bf16_zero_pp_rank files at stages 1-3, BF16_Optimizer's at
// stage 1 with fp32 gradient accumulation and in a pipeline (bf16_optimizer_layout.h; that one
// in one direction only, see its test).
//
// Each direction, two checks:
//  - the other side loads the checkpoint and saves it again, untrained, in its own files; the
//    writer resumes from that copy with bit-identical losses and gradient norms to resuming
//    from its own checkpoint: every fp32 master, Adam moment and counter crossed both ways
//    unchanged (the bf16 losses alone are too coarse to show a lost moment). train_gpt's own
//    resume is held to its uninterrupted run, so that a state our save lost cannot pass as the
//    reference;
//  - the other side trains on from the checkpoint and its first loss and gradient norm are the
//    writer's own, to within what two LibTorch builds' bf16 kernels differ by.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "deepspeed/checkpoint.h"
#include "deepspeed_peer.h"

namespace deepspeed {
namespace {

using interop::DeepSpeedPeer;
using interop::rows_of;
using interop::StepRow;

// The two sides' bf16 gradients differ (torch 2.11's kernels against Debian's LibTorch 1.13, and
// where they accumulate over the micro-steps): the first resumed step's gradient norm measured
// up to 6.3e-4 apart relative, the bf16 losses equal (one bf16 step near 7 is 2^-5). Weights
// that came across wrong move the norm by far more; a lost Adam moment or master shows in the
// resave checks, which are exact.
constexpr double kLossBound = 0.04;
constexpr double kNormRelBound = 5e-3;

struct Layout {
  const char* name;
  int zero_stage;
  const char* deepspeed_file;  // a file DeepSpeed's save of this layout writes
  const char* extra_config;    // JSON members added to the config
  // bf16.bf16_master_weights_and_grads with offload_optimizer "cpu": both sides step the bf16
  // masters with their CPU Adam (fp32 moments) instead of torch's AdamW.
  bool bf16_masters = false;
  // The Muon optimizer (MuonWithAuxAdam) instead of AdamW: at ZeRO-3 both sides keep its
  // momentum as a flat partition per sub-group, Adam's moments beside it. DeepSpeed's stage 3
  // runs Muon only with reduce_scatter off.
  bool muon = false;
};

const Layout kLayouts[] = {
    {"Zero0", 0, "mp_rank_00_model_states.pt", ""},
    {"Zero1", 1, "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt", ""},
    // DeepSpeed's BF16_Optimizer: no zero_stage in the rank files, partitions with padding.
    {"Zero1Fp32Accumulation", 1, "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt",
     R"("data_types": {"grad_accum_dtype": "fp32"})"},
    {"Zero2", 2, "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt", ""},
    {"Zero3", 3, "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt", ""},
    {"Zero2Bf16Masters", 2, "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt", "", true},
    {"Zero3Bf16Masters", 3, "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt", "", true},
    {"Zero3Muon", 3, "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt", "", false, true},
};

void PrintTo(const Layout& layout, std::ostream* os) { *os << layout.name; }

void expect_identical(const std::map<int, StepRow>& got, const std::map<int, StepRow>& want,
                      const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (const auto& [step, row] : want) {
    ASSERT_EQ(got.count(step), 1u) << what << ": no step " << step;
    std::printf("step %d: %s loss %.9g grad norm %.17g, expected %.9g, %.17g\n", step, what,
                got.at(step).loss, got.at(step).grad_norm, row.loss, row.grad_norm);
    EXPECT_EQ(got.at(step).loss, row.loss) << what << " at step " << step;
    EXPECT_EQ(got.at(step).grad_norm, row.grad_norm) << what << " at step " << step;
  }
}

void expect_near(const StepRow& got, const StepRow& want, const char* what) {
  std::printf("%s: loss %.9g grad norm %.9g, expected %.9g, %.9g\n", what, got.loss,
              got.grad_norm, want.loss, want.grad_norm);
  EXPECT_NEAR(got.loss, want.loss, kLossBound) << what;
  EXPECT_NEAR(got.grad_norm, want.grad_norm, kNormRelBound * want.grad_norm) << what;
}

// Both sides in bf16 on torch's AdamW (or, with bf16 masters, on their CPU Adam).
class Bf16Peer : public DeepSpeedPeer {
 protected:
  // Writes the bf16 config at this ZeRO stage, plus `extra` (JSON members); nothing when the
  // test is skipped.
  void use_config(int zero_stage, const std::string& extra = "", bool bf16_masters = false,
                  bool muon = false) {
    if (IsSkipped()) return;
    config_path = config("ds_config", zero_stage,
                         std::string(R"("bf16": {"enabled": true})") +
                             (extra.empty() ? "" : ", " + extra));
    auto json = nlohmann::json::parse(std::ifstream(config_path));
    json["optimizer"]["params"]["torch_adam"] = !bf16_masters;
    if (bf16_masters) {
      json["bf16"]["bf16_master_weights_and_grads"] = true;
      json["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}};
    }
    if (muon) {
      // The peer runs Muon's Adam half inline and Newton-Schulz in fp32, as ours does.
      json["optimizer"] = {{"type", "Muon"},
                           {"params", {{"muon_lr", 0.02}, {"adam_lr", 3e-3},
                                       {"weight_decay", 0.1}, {"torch_adam", false}}}};
      json["zero_optimization"]["reduce_scatter"] = false;
    }
    std::ofstream(config_path) << json.dump();
  }

  // DeepSpeed's ZeRO loaders call methods on the pickled loss scaler (docs/env.md).
  testing::CommandResult ours(const std::string& flags) {
    return DeepSpeedPeer::ours(config_path, flags, "DS_CHECKPOINT_PYTHON_OBJECTS=1");
  }
  testing::CommandResult deepspeed(const std::string& flags) {
    return DeepSpeedPeer::deepspeed(config_path, flags);
  }
  // Runs `run` (its flags) writing metrics to NAME.jsonl, and reads them.
  template <class Run>
  std::map<int, StepRow> metrics(Run run, const std::string& flags, const std::string& name) {
    const std::string path = dir.file(name + ".jsonl");
    return rows_of(run(flags + " --metrics_file " + path), path);
  }
  auto by_ours() {
    return [this](const std::string& flags) { return ours(flags); };
  }
  auto by_deepspeed() {
    return [this](const std::string& flags) { return deepspeed(flags); };
  }

  std::string config_path;
};

// A ZeRO rank file's masters (DeepSpeed's "fp32" keys) are bf16: the writer ran with bf16
// master weights.
void expect_bf16_masters(const std::string& path, int zero_stage) {
  const auto sd = checkpoint::load(path).toGenericDict().at("optimizer_state_dict").toGenericDict();
  const char* key = zero_stage == 3 ? "fp32_flat_groups" : "single_partition_of_fp32_groups";
  for (const auto& m : sd.at(key).toListRef()) {
    EXPECT_EQ(m.toTensor().scalar_type(), at::kBFloat16) << path << ": " << key;
  }
}

class DeepSpeedBf16Interop : public Bf16Peer, public ::testing::WithParamInterface<Layout> {
 protected:
  void SetUp() override {
    Bf16Peer::SetUp();
    use_config(GetParam().zero_stage, GetParam().extra_config, GetParam().bf16_masters,
               GetParam().muon);
  }
};

TEST_P(DeepSpeedBf16Interop, DeepSpeedCarriesOursCheckpoint) {
  auto straight = metrics(by_ours(), "--steps 4", "straight");
  const auto saved = ours("--steps 2 --save_dir " + dir.file("ours"));
  ASSERT_EQ(saved.exit_code, 0) << saved.out << saved.err;
  if (GetParam().bf16_masters) {
    expect_bf16_masters(dir.file("ours/global_step2/") + GetParam().deepspeed_file,
                        GetParam().zero_stage);
  }
  const std::string resume = "--steps 4 --load_dir ";
  auto expected = metrics(by_ours(), resume + dir.file("ours"), "ours");
  ASSERT_EQ(expected.size(), 2u);  // steps 3 and 4: step 4 follows the moments
  // Our own resume is exact, so that what the copy is held to is the state itself.
  straight.erase(1);
  straight.erase(2);
  expect_identical(expected, straight, "train_gpt from its own checkpoint");

  // DeepSpeed loads it and saves it again at step 2 in its own files.
  const auto copied = deepspeed("--steps 2 --load_dir " + dir.file("ours") + " --save_dir " +
                                dir.file("ds_copy"));
  ASSERT_EQ(copied.exit_code, 0) << copied.out << copied.err;
  ASSERT_TRUE(std::filesystem::exists(dir.file("ds_copy/global_step2/") +
                                      GetParam().deepspeed_file));
  auto back = metrics(by_ours(), resume + dir.file("ds_copy"), "back");
  if (GetParam().bf16_masters) {
    // DeepSpeed 0.19.8 loads the fp32 moments into bf16: torch's Optimizer.load_state_dict
    // casts state to its parameter's dtype, and DeepSpeedCPUAdam's parameters are the bf16
    // masters (its own resume rounds them the same way). The masters cross exactly (step 3);
    // step 4 follows the rounded moments.
    ASSERT_EQ(back.count(4), 1u);
    expect_near(back.at(4), expected.at(4), "train_gpt from DeepSpeed's copy, step 4");
    back.erase(4);
    expected.erase(4);
  }
  expect_identical(back, expected, "train_gpt from DeepSpeed's copy");

  const auto theirs = metrics(by_deepspeed(), resume + dir.file("ours"), "ds");
  ASSERT_EQ(theirs.count(3), 1u);
  expect_near(theirs.at(3), expected.at(3), "DeepSpeed from train_gpt's checkpoint, step 3");
}

TEST_P(DeepSpeedBf16Interop, OursCarriesDeepSpeedsCheckpoint) {
  // The peer reads the token cache that train_gpt writes beside the corpus on its first run.
  const auto tokenized = ours("--steps 1");
  ASSERT_EQ(tokenized.exit_code, 0) << tokenized.out << tokenized.err;
  const auto saved = deepspeed("--steps 2 --save_dir " + dir.file("ds"));
  ASSERT_EQ(saved.exit_code, 0) << saved.out << saved.err;
  ASSERT_TRUE(std::filesystem::exists(dir.file("ds/global_step2/") + GetParam().deepspeed_file));
  if (GetParam().bf16_masters) {
    expect_bf16_masters(dir.file("ds/global_step2/") + GetParam().deepspeed_file,
                        GetParam().zero_stage);
  }
  const std::string resume = "--steps 4 --load_dir ";
  const auto expected = metrics(by_deepspeed(), resume + dir.file("ds"), "ds");
  ASSERT_EQ(expected.size(), 2u);  // steps 3 and 4: step 4 follows the moments

  // train_gpt loads it and, with nothing to train, saves it again in its own files.
  const auto copied =
      ours("--steps 2 --load_dir " + dir.file("ds") + " --save_dir " + dir.file("ours_copy"));
  ASSERT_EQ(copied.exit_code, 0) << copied.out << copied.err;
  ASSERT_NE(copied.out.find("nothing to train"), std::string::npos) << copied.out;
  expect_identical(metrics(by_deepspeed(), resume + dir.file("ours_copy"), "back"), expected,
                   "DeepSpeed from train_gpt's copy");

  const auto ours_from = metrics(by_ours(), resume + dir.file("ds"), "ours");
  ASSERT_EQ(ours_from.count(3), 1u);
  expect_near(ours_from.at(3), expected.at(3), "train_gpt from DeepSpeed's checkpoint, step 3");
}

// One pipeline stage's fp32 masters and Adam moments, each flattened in parameter order.
struct StageState {
  at::Tensor fp32, exp_avg, exp_avg_sq;
};

// From DeepSpeed's BF16_Optimizer rank file of one data-parallel rank (the whole stage here).
StageState bf16_optimizer_state(const std::string& path) {
  const auto sd = checkpoint::load(path).toGenericDict().at("optimizer_state_dict").toGenericDict();
  const auto state = sd.at("base_optimizer_state").toGenericDict().at("state").toGenericDict();
  const auto flat = state.at(int64_t{0}).toGenericDict();
  return {sd.at("single_partition_of_fp32_groups").toListRef()[0].toTensor(),
          flat.at("exp_avg").toTensor(), flat.at("exp_avg_sq").toTensor()};
}

// From train_gpt's model states with torch's AdamW (FP16_UnfusedOptimizer's layout).
StageState unfused_optimizer_state(const std::string& path) {
  const auto opt = checkpoint::load(path).toGenericDict().at("optimizer").toGenericDict();
  std::vector<at::Tensor> fp32, exp_avg, exp_avg_sq;
  for (const auto& t : opt.at("fp32_groups").toListRef()[0].toListRef()) {
    fp32.push_back(t.toTensor().reshape(-1));
  }
  const auto state = opt.at("optimizer_state_dict").toGenericDict().at("state").toGenericDict();
  for (size_t i = 0; i < fp32.size(); ++i) {
    const auto entry = state.at(static_cast<int64_t>(i)).toGenericDict();
    exp_avg.push_back(entry.at("exp_avg").toTensor().reshape(-1));
    exp_avg_sq.push_back(entry.at("exp_avg_sq").toTensor().reshape(-1));
  }
  return {at::cat(fp32), at::cat(exp_avg), at::cat(exp_avg_sq)};
}

// Under pipeline parallelism DeepSpeed trains bf16 with its BF16_Optimizer, whose masters and
// Adam state sit in bf16_zero_pp_rank files, partitioned over the data-parallel ranks. train_gpt
// resumes from them: its re-save holds each stage's masters and moments bit for bit, and its
// first step trains on as DeepSpeed's uninterrupted run does. (DeepSpeed 0.19.8 cannot resume
// such a checkpoint itself: its stage-0 load indexes the model states' dict by rank.)
TEST_F(Bf16Peer, OursCarriesDeepSpeedsBf16PipelineCheckpoint) {
  use_config(0);
  if (IsSkipped()) return;
  const std::string pipeline = " --pipeline_parallel_size 2";
  const auto tokenized = ours("--steps 1" + pipeline);
  ASSERT_EQ(tokenized.exit_code, 0) << tokenized.out << tokenized.err;
  const auto straight = metrics(by_deepspeed(), "--steps 3" + pipeline, "straight");
  ASSERT_EQ(straight.count(3), 1u);
  const auto saved = deepspeed("--steps 2 --save_dir " + dir.file("ds") + pipeline);
  ASSERT_EQ(saved.exit_code, 0) << saved.out << saved.err;

  const auto copied = ours("--steps 2 --load_dir " + dir.file("ds") + " --save_dir " +
                           dir.file("ours_copy") + pipeline);
  ASSERT_EQ(copied.exit_code, 0) << copied.out << copied.err;
  for (const char* stage : {"00", "01"}) {
    const StageState theirs = bf16_optimizer_state(
        dir.file("ds/global_step2/bf16_zero_pp_rank_0_mp_rank_") + stage + "_optim_states.pt");
    const StageState mine = unfused_optimizer_state(
        dir.file("ours_copy/global_step2/mp_rank_") + stage + "_model_states.pt");
    const int64_t n = mine.fp32.numel();
    ASSERT_GE(theirs.fp32.numel(), n) << "stage " << stage;
    EXPECT_TRUE(mine.fp32.equal(theirs.fp32.narrow(0, 0, n))) << "fp32 masters, stage " << stage;
    EXPECT_TRUE(mine.exp_avg.equal(theirs.exp_avg.narrow(0, 0, n))) << "exp_avg, stage " << stage;
    EXPECT_TRUE(mine.exp_avg_sq.equal(theirs.exp_avg_sq.narrow(0, 0, n)))
        << "exp_avg_sq, stage " << stage;
  }

  const auto ours_from = metrics(by_ours(), "--steps 3 --load_dir " + dir.file("ds") + pipeline,
                                 "ours");
  ASSERT_EQ(ours_from.count(3), 1u);
  expect_near(ours_from.at(3), straight.at(3), "train_gpt from DeepSpeed's pipeline, step 3");
}

// zero_optimization.elastic_checkpoint (Note [Elastic ZeRO checkpoints]): ZeRO-2 with bf16
// master weights and each side's CPU Adam, whose step is a number (DeepSpeed's elastic loader
// cannot take torch AdamW's 0-dim step tensors: it joins them across ranks). Each side's
// elastic loader carries the other's elastic files:
//  - DeepSpeed's checkpoint of step 2 through train_gpt's copy: DeepSpeed resumes from the copy
//    exactly as its uninterrupted run goes on (DeepSpeed cannot resume its own file: it omits
//    base_optimizer_state_step for optimizers without a step in the param group, and then
//    requires it);
//  - train_gpt's checkpoint of step 2 through DeepSpeed's copy: train_gpt resumes from it
//    exactly as from its own.
// A constant learning rate: the elastic layout has no param_groups, and DeepSpeed's first step
// after an elastic load runs the learning rate its scheduler had before the load.
TEST_F(Bf16Peer, ElasticCheckpointsCrossBothWays) {
  use_config(2, "", /*bf16_masters=*/true);
  if (IsSkipped()) return;
  auto json = nlohmann::json::parse(std::ifstream(config_path));
  json.erase("scheduler");
  json["zero_optimization"]["elastic_checkpoint"] = true;
  std::ofstream(config_path) << json.dump();
  const auto elastic_file = [](const std::string& path) {
    return checkpoint::ZeroOptimizerFile::from_ivalue(checkpoint::load(path), path)
        .optimizer_state_dict;
  };
  const std::string rank1 = "/global_step2/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt";
  const std::string resume = "--steps 4 --load_dir ";

  const auto tokenized = ours("--steps 1");
  ASSERT_EQ(tokenized.exit_code, 0) << tokenized.out << tokenized.err;
  auto ds_straight = metrics(by_deepspeed(), "--steps 4", "ds_straight");
  const auto ds_saved = deepspeed("--steps 2 --save_dir " + dir.file("ds"));
  ASSERT_EQ(ds_saved.exit_code, 0) << ds_saved.out << ds_saved.err;
  const auto theirs = elastic_file(dir.file("ds") + rank1);
  EXPECT_TRUE(theirs.elastic());
  for (const auto& [key, value] : theirs.extra) EXPECT_NE(key, "base_optimizer_state_step");
  const auto copied =
      ours("--steps 2 --load_dir " + dir.file("ds") + " --save_dir " + dir.file("ours_copy"));
  ASSERT_EQ(copied.exit_code, 0) << copied.out << copied.err;
  ASSERT_NE(copied.out.find("nothing to train"), std::string::npos) << copied.out;
  EXPECT_TRUE(elastic_file(dir.file("ours_copy") + rank1).elastic());
  ds_straight.erase(1);
  ds_straight.erase(2);
  expect_identical(metrics(by_deepspeed(), resume + dir.file("ours_copy"), "ds_back"),
                   ds_straight, "DeepSpeed from train_gpt's copy of its elastic checkpoint");

  auto straight = metrics(by_ours(), "--steps 4", "straight");
  const auto saved = ours("--steps 2 --save_dir " + dir.file("ours"));
  ASSERT_EQ(saved.exit_code, 0) << saved.out << saved.err;
  EXPECT_TRUE(elastic_file(dir.file("ours") + rank1).elastic());
  const auto ds_copied = deepspeed("--steps 2 --load_dir " + dir.file("ours") + " --save_dir " +
                                   dir.file("ds_copy"));
  ASSERT_EQ(ds_copied.exit_code, 0) << ds_copied.out << ds_copied.err;
  EXPECT_TRUE(elastic_file(dir.file("ds_copy") + rank1).elastic());
  straight.erase(1);
  straight.erase(2);
  expect_identical(metrics(by_ours(), resume + dir.file("ds_copy"), "back"), straight,
                   "train_gpt from DeepSpeed's copy of its elastic checkpoint");
}

INSTANTIATE_TEST_SUITE_P(Layouts, DeepSpeedBf16Interop, ::testing::ValuesIn(kLayouts),
                         [](const ::testing::TestParamInfo<Layout>& info) {
                           return std::string(info.param.name);
                         });

}  // namespace
}  // namespace deepspeed
