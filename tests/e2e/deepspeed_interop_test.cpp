// Checkpoints between train_gpt and Python DeepSpeed (0.15.4 on the same python3-torch,
// .venv-deepspeed from scripts/setup_deepspeed_peer.sh; the peer is
// bench/common/deepspeed_train_gpt.py: the same GPT, the same token windows). 2 ranks, fp32,
// AdamW, WarmupLR, clipping, for data parallelism under ZeRO 1, 2 and 3 and for 2 pipeline
// stages (DeepSpeed's PipelineEngine):
//  - DeepSpeed resumes train_gpt's checkpoint of step 2 and its losses at steps 3 and 4 are
//    train_gpt's own resumed ones (the weights, Adam moments and schedule all came across);
//  - train_gpt resumes DeepSpeed's checkpoint of step 4 and its loss at step 5 is the one of
//    train_gpt's uninterrupted resume.
// And universal checkpoints (ZeRO-2 sources), each side loading the other converter's output.
// bf16 is deepspeed_bf16_interop_test's, against DeepSpeed 0.19.8 on torch 2.11: torch 1.13's Gloo
// has no bf16 collectives, so DeepSpeed cannot train in bf16 on it.
#include <filesystem>
#include <ostream>
#include <string>

#include <gtest/gtest.h>

#include "deepspeed_peer.h"

namespace deepspeed {
namespace {

using interop::DeepSpeedPeer;
using interop::expect_losses_near;
using interop::losses_of;

struct Layout {
  const char* name;
  int zero_stage;
  const char* flags;  // train_gpt's and the peer's
  // The pipeline's blocks are bench/gpu/gpt_model.py's (attention rounded otherwise than ours,
  // torch's AdamW against CPU-Adam): measured 2.4e-5 apart. Data parallelism runs gpt_ddp.py's
  // twin of train_gpt's model: measured 1.2e-7. A checkpoint that lost the Adam moments, the
  // schedule or the data position moves the loss by 1e-3 or more.
  double loss_bound;
  // A file that holds DeepSpeed's ZeRO optimizer state must carry its pickled loss scaler (its
  // ZeRO loader calls methods on it): DS_CHECKPOINT_PYTHON_OBJECTS=1 (docs/env.md).
  bool python_objects;
  // A file DeepSpeed's save must have written (its layout, not ours).
  const char* deepspeed_file;
};

const Layout kLayouts[] = {
    {"Zero1", 1, "", 1e-5, true, "global_step4/zero_pp_rank_1_mp_rank_00_optim_states.pt"},
    {"Zero2", 2, "", 1e-5, true, "global_step4/zero_pp_rank_1_mp_rank_00_optim_states.pt"},
    {"Zero3", 3, "", 1e-5, true, "global_step4/zero_pp_rank_1_mp_rank_00_model_states.pt"},
    // The weights are in the layer files; 'module' is None beside them.
    {"Pipeline2Stages", 0, " --pipeline_parallel_size 2", 1e-4, false,
     "global_step4/layer_00-model_states.pt"},
};

void PrintTo(const Layout& layout, std::ostream* os) { *os << layout.name; }

class DeepSpeedInterop : public DeepSpeedPeer, public ::testing::WithParamInterface<Layout> {
 protected:
  void SetUp() override {
    DeepSpeedPeer::SetUp();
    config_path = config("ds_config", GetParam().zero_stage);
  }

  testing::CommandResult ours(const std::string& flags) {
    return DeepSpeedPeer::ours(config_path, GetParam().flags + (" " + flags),
                               GetParam().python_objects ? "DS_CHECKPOINT_PYTHON_OBJECTS=1" : "");
  }

  testing::CommandResult deepspeed(const std::string& flags) {
    return DeepSpeedPeer::deepspeed(config_path, GetParam().flags + (" " + flags));
  }

  std::string config_path;
};

TEST_P(DeepSpeedInterop, EachResumesTheOthersCheckpoint) {
  const double bound = GetParam().loss_bound;
  auto first = ours("--steps 2 --save_dir " + dir.file("ours"));
  ASSERT_EQ(first.exit_code, 0) << first.out << first.err;
  const auto expected = losses_of(
      ours("--steps 5 --load_dir " + dir.file("ours") + " --metrics_file " +
           dir.file("ours.jsonl")),
      dir.file("ours.jsonl"));
  ASSERT_EQ(expected.size(), 3u);  // steps 3, 4, 5

  // DeepSpeed from our step 2 to step 4, then its own checkpoint.
  const auto theirs = losses_of(
      deepspeed("--steps 4 --load_dir " + dir.file("ours") + " --save_dir " + dir.file("ds") +
                " --metrics_file " + dir.file("ds.jsonl")),
      dir.file("ds.jsonl"));
  expect_losses_near(theirs, {{3, expected.at(3)}, {4, expected.at(4)}}, {3, 4}, bound,
                     "DeepSpeed from train_gpt's checkpoint");
  ASSERT_TRUE(std::filesystem::exists(dir.file("ds/") + GetParam().deepspeed_file));

  const auto again = losses_of(
      ours("--steps 5 --load_dir " + dir.file("ds") + " --metrics_file " + dir.file("back.jsonl")),
      dir.file("back.jsonl"));
  expect_losses_near(again, {{5, expected.at(5)}}, {5}, bound,
                     "train_gpt from DeepSpeed's checkpoint");
}

// Universal checkpoints of a ZeRO-2 run, each side loading the other's converter output:
//  - train_gpt's checkpoint of step 2 through our ds_to_universal: DeepSpeed loads it under
//    ZeRO-1 with the losses at steps 3 and 4 of train_gpt resuming its checkpoint directly;
//  - DeepSpeed's checkpoint of step 4 through its ds_to_universal (0.15.4 converts ZeRO 1/2
//    sources; --inject_missing_state, as its engine writes universal_checkpoint_info only under
//    tensor parallelism): train_gpt loads it under ZeRO-3 with the loss at step 5 that resuming
//    DeepSpeed's checkpoint directly gives.
// (DeepSpeed 0.15.4's own ZeRO-3 universal load reads bare tensors only, so it loads neither its
// converter's output nor ours; 0.19.8's reads both, docs/checkpoints.md.)
TEST_F(DeepSpeedPeer, UniversalCheckpointsLoadBothWays) {
  constexpr double kBound = 1e-5;  // measured: equal to 7 digits
  const std::string universal = R"("checkpoint": {"load_universal": true})";
  const auto zero2 = config("zero2", 2);
  const auto universal_zero1 = config("universal_zero1", 1, universal);
  const auto universal_zero3 = config("universal_zero3", 3, universal);

  auto first = ours(zero2, "--steps 2 --save_dir " + dir.file("ours"));
  ASSERT_EQ(first.exit_code, 0) << first.out << first.err;
  auto converted = testing::run_command(std::string(DS_TO_UNIVERSAL_BIN) + " --input_folder " +
                                        dir.file("ours/global_step2") + " --output_folder " +
                                        dir.file("ours/global_step2_universal"));
  ASSERT_EQ(converted.exit_code, 0) << converted.out << converted.err;
  const std::string resume = "--steps 4 --load_dir " + dir.file("ours") + " --metrics_file ";
  const auto expected = losses_of(ours(zero2, resume + dir.file("ours.jsonl")),
                                  dir.file("ours.jsonl"));
  const auto theirs = losses_of(deepspeed(universal_zero1, resume + dir.file("ds_u.jsonl")),
                                dir.file("ds_u.jsonl"));
  expect_losses_near(theirs, expected, {3, 4}, kBound, "DeepSpeed from our universal checkpoint");

  auto ds = deepspeed(zero2, "--steps 4 --save_dir " + dir.file("ds"));
  ASSERT_EQ(ds.exit_code, 0) << ds.out << ds.err;
  auto ds_converted = testing::run_command(
      std::string("DS_ACCELERATOR=cpu ") + DS_DEEPSPEED_PYTHON +
      " -m deepspeed.checkpoint.ds_to_universal --inject_missing_state --num_extract_workers 1"
      " --num_merge_workers 1 --input_folder " + dir.file("ds/global_step4") +
      " --output_folder " + dir.file("ds/global_step4_universal"));
  ASSERT_EQ(ds_converted.exit_code, 0) << ds_converted.out << ds_converted.err;
  const std::string back = "--steps 5 --load_dir " + dir.file("ds") + " --metrics_file ";
  const auto want = losses_of(ours(zero2, back + dir.file("direct.jsonl")),
                              dir.file("direct.jsonl"));
  const auto got = losses_of(ours(universal_zero3, back + dir.file("back.jsonl")),
                             dir.file("back.jsonl"));
  expect_losses_near(got, want, {5}, kBound, "train_gpt from DeepSpeed's universal checkpoint");
}

INSTANTIATE_TEST_SUITE_P(Layouts, DeepSpeedInterop, ::testing::ValuesIn(kLayouts),
                         [](const ::testing::TestParamInfo<Layout>& info) {
                           return std::string(info.param.name);
                         });

}  // namespace
}  // namespace deepspeed
